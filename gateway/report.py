"""`citewarden report AUDIT.jsonl`: summarise the gateway's audit events into JSON — decisions,
failure reasons, rates by route, verification latency percentiles, policies seen.

Other log lines are skipped; lines that are not JSON are counted, never fatal.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

TOP_REASONS = 5


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    value = sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
    return round(value, 3)


def _latency(values: list[float]) -> dict[str, float | int | None]:
    values.sort()
    return {
        "count": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
    }


def _rate(n: int, total: int) -> float:
    return round(n / total, 4) if total else 0.0


@dataclass
class _Tally:
    requests: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    shadow: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    verification_ms: list[float] = field(default_factory=list)
    support: _SupportTally = field(default_factory=lambda: _SupportTally())

    def add(self, event: dict[str, Any], decision: str) -> None:
        self.support.add(event)
        self.requests += 1
        self.decisions[decision] += 1
        shadow = event.get("shadow_decision")
        if isinstance(shadow, str):
            self.shadow[shadow] += 1
        reasons = event.get("reasons")
        if isinstance(reasons, list):
            # Each request counts a reason once, however many of its claims failed for it.
            self.reasons.update({r for r in reasons if isinstance(r, str)})
        timings = event.get("timings")
        if isinstance(timings, dict):
            ms = timings.get("verification_ms")
            if isinstance(ms, int | float) and not isinstance(ms, bool) and math.isfinite(ms):
                self.verification_ms.append(float(ms))

    def summary(self) -> dict[str, object]:
        n = self.requests
        out: dict[str, object] = {
            "requests": n,
            "decisions": dict(self.decisions.most_common()),
            "abstention_rate": _rate(self.decisions["abstained"], n),
            "strip_rate": _rate(self.decisions["partial"], n),
            "block_rate": _rate(self.decisions["blocked"], n),
            "review_rate": _rate(self.decisions["review"], n),
            "top_reasons": [[r, c] for r, c in self.reasons.most_common(TOP_REASONS)],
            "verification_ms": _latency(self.verification_ms),
        }
        if self.shadow:
            out["shadow_decisions"] = dict(self.shadow.most_common())
        out["judge"] = self.support.advice(n)
        return out


# Advice on the judge pass (DESIGN §10), from the claims' verdicts in the audit events.
_INFRA_PREFIX = "judge_"
# A route where this share of answers fails only on `unsupported` is where a judge pays off.
JUDGE_WORTH = 0.05
JUDGE_NOT_WORTH = 0.01


@dataclass
class _SupportTally:
    claims: int = 0
    unsupported: int = 0  # claims failed by `unsupported`
    deterministic: int = 0  # claims failed by any other check
    unsupported_answers: int = 0  # answers whose only failures are `unsupported`
    judged_answers: int = 0
    judge_calls: int = 0
    judge_errors: int = 0
    cache_hits: int = 0
    cache_lookups: int = 0

    def add(self, event: dict[str, Any]) -> None:
        claims = event.get("claims")
        reasons: set[str] = set()
        if isinstance(claims, list):
            for c in claims:
                if not isinstance(c, dict):
                    continue
                self.claims += 1
                reason = c.get("reason")
                if c.get("verdict") == "failed" and isinstance(reason, str):
                    reasons.add(reason)
                    if reason == "unsupported":
                        self.unsupported += 1
                    else:
                        self.deterministic += 1
                elif (
                    c.get("verdict") == "errored"
                    and isinstance(reason, str)
                    and reason.startswith(_INFRA_PREFIX)
                ):
                    self.judge_errors += 1
        if reasons == {"unsupported"}:
            self.unsupported_answers += 1
        judge = event.get("judge")
        if isinstance(judge, dict):
            self.judged_answers += 1
            calls = judge.get("calls")
            if isinstance(calls, dict):
                self.judge_calls += sum(v for v in calls.values() if isinstance(v, int))
            cache = judge.get("cache")
            if isinstance(cache, dict):
                hit, miss = cache.get("hit"), cache.get("miss")
                if isinstance(hit, int) and isinstance(miss, int):
                    self.cache_hits += hit
                    self.cache_lookups += hit + miss

    def advice(self, requests: int) -> dict[str, object]:
        """Whether the judge pass is worth enabling on this route, and why."""
        share = _rate(self.unsupported_answers, requests)
        failed = self.unsupported + self.deterministic
        unsupported_mix = _rate(self.unsupported, failed)
        out: dict[str, object] = {
            "unsupported_claims": self.unsupported,
            "deterministic_failures": self.deterministic,
            "answers_failing_only_unsupported": share,
        }
        if self.judged_answers:
            out["enabled"] = True
            out["calls_per_judged_answer"] = round(self.judge_calls / self.judged_answers, 2)
            out["judge_errors"] = self.judge_errors
            out["cache_hit_rate"] = _rate(self.cache_hits, self.cache_lookups)
            if self.judge_errors and self.judge_errors >= self.judged_answers * 0.05:
                out["advice"] = (
                    "judge errors on 5% or more of judged answers: they abstain; check the "
                    "judge endpoint, timeout and max_concurrency"
                )
            else:
                out["advice"] = "judge pass on; measure its quality with citewarden eval"
            return out
        out["enabled"] = False
        if requests == 0 or self.claims == 0:
            out["advice"] = "no verified claims yet"
        elif share >= JUDGE_WORTH and unsupported_mix >= 0.5:
            out["advice"] = (
                "worth enabling: many answers fail only on `unsupported` and deterministic "
                "failures are few; a judge can tell the lexically borderline ones apart "
                "(calibrate with citewarden eval)"
            )
        elif share < JUDGE_NOT_WORTH or unsupported_mix < 0.5:
            out["advice"] = (
                "not worth enabling: `unsupported` failures are rare or deterministic "
                "failures dominate; fix those first (the judge cannot rescue them)"
            )
        else:
            out["advice"] = "borderline: measure with citewarden eval on labelled claims"
        return out


def _parse(line: str) -> object:
    try:
        return json.loads(line)
    except ValueError:
        # `kubectl logs --timestamps` and some collectors prefix each line: try from the object.
        brace = line.find("{")
        if brace <= 0:
            raise
        return json.loads(line[brace:])


def summarise(lines: Iterable[str]) -> dict[str, object]:
    """Summarise audit JSONL `lines` (one event per line; blank and non-audit lines skipped)."""
    overall = _Tally()
    routes: dict[str, _Tally] = {}
    policies: set[str] = set()
    skipped = unparseable = 0
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        try:
            event = _parse(line)
        except ValueError:
            unparseable += 1
            continue
        if not isinstance(event, dict):
            unparseable += 1
            continue
        if event.get("event") != "audit":
            skipped += 1
            continue
        decision = event.get("decision")
        if not isinstance(decision, str):
            unparseable += 1
            continue
        route = event.get("route")
        route = route if isinstance(route, str) else "unknown"
        overall.add(event, decision)
        tally = routes.get(route)
        if tally is None:
            tally = routes[route] = _Tally()
        tally.add(event, decision)
        policy = event.get("policy")
        if isinstance(policy, str):
            policies.add(policy)

    total = overall.requests
    result: dict[str, object] = {
        "total": total,
        "decisions": dict(overall.decisions.most_common()),
        "decision_rates": {d: _rate(c, total) for d, c in overall.decisions.most_common()},
        "failure_reasons": dict(overall.reasons.most_common()),
        "verification_ms": _latency(overall.verification_ms),
        "routes": {name: routes[name].summary() for name in sorted(routes)},
        "policies": sorted(policies),
        "skipped_lines": skipped,
        "unparseable_lines": unparseable,
    }
    if overall.shadow:
        result["shadow_decisions"] = dict(overall.shadow.most_common())
    return result


def run(
    path: str | os.PathLike[str],
    out: TextIO | None = None,
    err: TextIO | None = None,
    fmt: str = "json",
) -> int:
    """`citewarden report PATH` ("-" reads stdin): print the summary as JSON, or with
    `fmt="text"` as a short summary for a person. Exit 0, or 2 when the file cannot be read."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    try:
        if os.fspath(path) == "-":
            summary = summarise(sys.stdin)
        else:
            # A stray undecodable byte must not abort a whole report: it becomes U+FFFD.
            with open(path, encoding="utf-8", errors="replace") as f:
                summary = summarise(f)
    except OSError as e:
        reason = e.strerror or str(e)
        err.write(f"citewarden report: cannot read {os.fspath(path)}: {reason}\n")
        return 2
    out.write(text_summary(summary) if fmt == "text" else json.dumps(summary, indent=2) + "\n")
    return 0


def _pct(rate: object) -> str:
    return f"{100 * rate:.1f}%" if isinstance(rate, int | float) else "-"


def _ms_line(latency: object) -> str:
    if not isinstance(latency, dict) or not latency.get("count"):
        return "no verification timings"
    return "  ".join(f"{q} {latency[q]} ms" for q in ("p50", "p95", "p99"))


def text_summary(summary: dict[str, object]) -> str:
    """`report --format text`: the decision mix, top failure reasons, latency and routes."""
    total = summary["total"]
    decisions = summary["decisions"]
    rates = summary["decision_rates"]
    reasons = summary["failure_reasons"]
    routes = summary["routes"]
    assert isinstance(decisions, dict) and isinstance(rates, dict)
    assert isinstance(reasons, dict) and isinstance(routes, dict)
    policies = summary["policies"]
    names = ", ".join(str(p) for p in policies) if isinstance(policies, list) else ""
    lines = [f"{total} requests" + (f"  policies {names}" if names else "")]
    if decisions:
        mix = ", ".join(f"{d} {n} ({_pct(rates.get(d))})" for d, n in decisions.items())
        lines.append(f"decisions        {mix}")
    shadow = summary.get("shadow_decisions")
    if isinstance(shadow, dict) and shadow:
        lines.append("shadow would-be  " + ", ".join(f"{d} {n}" for d, n in shadow.items()))
    if reasons:
        top = list(reasons.items())[:TOP_REASONS]
        lines.append("failure reasons  " + ", ".join(f"{r} {n}" for r, n in top))
    lines.append(f"verification     {_ms_line(summary['verification_ms'])}")
    for name, route in routes.items():
        assert isinstance(route, dict)
        lines.append(
            f"  route {name}: {route['requests']} requests, "
            f"abstained {_pct(route['abstention_rate'])}, partial {_pct(route['strip_rate'])}, "
            f"blocked {_pct(route['block_rate'])}"
        )
        judge = route.get("judge")
        if isinstance(judge, dict) and "advice" in judge:
            lines.append(f"    judge pass: {judge['advice']}")
    skipped, bad = summary["skipped_lines"], summary["unparseable_lines"]
    if skipped or bad:
        lines.append(f"({skipped} other log lines skipped, {bad} unreadable)")
    return "\n".join(lines) + "\n"

"""`citewarden report` advice on the judge pass: worth it when many answers fail only on
`unsupported`, not when deterministic failures dominate; judge stats when it is on."""

from __future__ import annotations

import json
from typing import Any

from gateway.report import summarise


def _event(route: str, *reasons: str, judge: dict[str, Any] | None = None) -> str:
    claims = [{"index": i, "verdict": "failed" if r else "verified", "reason": r or None,
               "cited": ["a:1"]} for i, r in enumerate(reasons)]
    event: dict[str, Any] = {"event": "audit", "route": route, "decision": "released",
                             "claims": claims, "reasons": [r for r in reasons if r]}
    if judge is not None:
        event["judge"] = judge
    return json.dumps(event)


def _advice(lines: list[str], route: str) -> dict[str, Any]:
    routes = summarise(lines)["routes"]
    assert isinstance(routes, dict)
    advice: dict[str, Any] = routes[route]["judge"]
    return advice


def test_many_unsupported_few_deterministic_is_worth_it() -> None:
    lines = [_event("kb", "", "unsupported") for _ in range(20)]
    lines += [_event("kb", "") for _ in range(80)]
    advice = _advice(lines, "kb")
    assert advice["enabled"] is False
    assert advice["advice"].startswith("worth enabling")
    assert advice["answers_failing_only_unsupported"] == 0.2


def test_deterministic_failures_dominating_is_not_worth_it() -> None:
    lines = [_event("kb", "hallucinated_citation", "number_mismatch") for _ in range(30)]
    lines += [_event("kb", "unsupported")] + [_event("kb", "") for _ in range(69)]
    assert _advice(lines, "kb")["advice"].startswith("not worth enabling")


def test_rare_unsupported_is_not_worth_it() -> None:
    lines = [_event("kb", "")] * 500 + [_event("kb", "unsupported")]
    assert _advice(lines, "kb")["advice"].startswith("not worth enabling")


def test_judge_on_reports_calls_errors_and_cache() -> None:
    judge = {"calls": {"ok": 2}, "cache": {"hit": 1, "miss": 3}, "claims": []}
    lines = [_event("chat", "", judge=judge) for _ in range(10)]
    advice = _advice(lines, "chat")
    assert advice["enabled"] is True
    assert advice["calls_per_judged_answer"] == 2.0
    assert advice["cache_hit_rate"] == 0.25

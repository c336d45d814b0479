"""The release decision (one exhaustive match), partial-answer rebuild and templates.

An answer is released only when every claim verified or is exempt; an unknown state raises.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway import policy
from gateway.types import Claim, ClaimReport, Decision, Outcome, Report, TemplateName

__all__ = ["decide", "rebuild_text", "template_text"]


def _state(report: Report) -> str:
    if report.any_errored:
        return "errored"
    if report.all_verified:
        return "clean"
    if any(c.verdict == "failed" for c in report.claims):
        return "failed"
    return "unknown"


def _first(report: Report, verdict: str) -> ClaimReport:
    return next(c for c in report.claims if c.verdict == verdict)


def decide(report: Report, release: policy.Release) -> Outcome:
    """What happens to an answer with this report under this release policy (DESIGN §5)."""
    kept = frozenset(c.claim.index for c in report.claims if c.verdict in ("verified", "exempt"))
    passing = any(c.verdict == "verified" for c in report.claims)
    match _state(report), release.on_infrastructure_failure, release.on_unverified:
        case "errored", "abstain", _:
            e = _first(report, "errored")
            return Outcome(Decision.ABSTAINED, e.error_kind, e.claim.index, "verifier_unavailable")
        case "errored", "block", _:
            e = _first(report, "errored")
            return Outcome(Decision.BLOCKED, e.error_kind, e.claim.index)
        case "clean", _, _:
            return Outcome(Decision.RELEASED)
        case "failed", _, "block":
            f = _first(report, "failed")
            return Outcome(Decision.BLOCKED, f.reason, f.claim.index)
        case "failed", _, "strip" if passing:
            f = _first(report, "failed")
            return Outcome(Decision.PARTIAL, f.reason, f.claim.index, "partial", kept)
        case "failed", _, "strip":
            f = _first(report, "failed")
            return Outcome(Decision.ABSTAINED, f.reason, f.claim.index, "no_evidence")
        case "failed", _, "abstain":
            f = _first(report, "failed")
            template: TemplateName = "stale_source" if f.reason == "stale_source" else "no_evidence"
            return Outcome(Decision.ABSTAINED, f.reason, f.claim.index, template)
        case "failed", _, "review":
            f = _first(report, "failed")
            return Outcome(Decision.REVIEW, f.reason, f.claim.index, "review_required")
        case state, infra, unverified:
            raise ValueError(f"no release rule for {state!r} / {infra!r} / {unverified!r}")


def template_text(outcome: Outcome, templates: policy.Templates) -> str | None:
    """The policy text of the template an outcome names, or None when it names none."""
    match outcome.template:
        case None:
            return None
        case "no_evidence":
            return templates.no_evidence
        case "verifier_unavailable":
            return templates.verifier_unavailable
        case "partial":
            return templates.partial
        case "review_required":
            return templates.review_required
        case "stale_source":
            return templates.stale_source


_LIST_PREFIX = re.compile(r"[ \t]*(?:[-*+]|\d{1,9}[.)])[ \t]+$|[ \t]+$")


def _line_prefix(text: str, start: int) -> str:
    """The list marker / indentation before a claim on its line, if that is all there is."""
    line_start = text.rfind("\n", 0, start) + 1
    prefix = text[line_start:start]
    return prefix if _LIST_PREFIX.fullmatch(prefix) else ""


def rebuild_text(text: str, kept: Sequence[Claim], disclosure: str | None) -> str:
    """The kept claims' text verbatim, in order, then a blank line and the disclosure.

    Claims on one line are joined by a space; a claim that started a new line in `text` starts
    one here too (keeping its list marker), and a paragraph break stays a blank line. Claims of
    one channel only; claims without a span in `text` (unlocated structured claims) are joined
    as separate lines.
    """
    parts: list[str] = []
    prev: Claim | None = None
    for claim in sorted(kept, key=lambda c: c.index):
        if claim.start < 0:
            if parts:
                parts.append("\n")
            parts.append(claim.text)
            prev = None
            continue
        body = text[claim.start : claim.end]
        if prev is None:
            if parts:
                parts.append("\n")
            parts.append(_line_prefix(text, claim.start) + body)
        else:
            gap = text[prev.end : claim.start]
            newlines = gap.count("\n")
            if newlines == 0:
                parts.append(" " + body)
            else:
                blank = newlines > 1 and "\n\n" in gap.replace(" ", "").replace("\t", "")
                sep = "\n\n" if blank else "\n"
                parts.append(sep + _line_prefix(text, claim.start) + body)
        prev = claim
    out = "".join(parts)
    if disclosure:
        out = f"{out}\n\n{disclosure}" if out else disclosure
    return out

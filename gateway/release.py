"""The release decision (one exhaustive match) and the text of its templates.

An answer is released only when every claim verified or is exempt; an unknown state raises.
"""

from __future__ import annotations

from gateway import policy
from gateway.types import ClaimReport, Decision, Outcome, Report, TemplateName

__all__ = ["decide", "template_text"]


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
    """The policy text an outcome shows: the template it names, else its decision's own
    (abstained: no_evidence, review: review_required); None when it shows none (released,
    blocked)."""
    name = outcome.template
    if name is None:
        match outcome.decision:
            case Decision.ABSTAINED:
                name = "no_evidence"
            case Decision.REVIEW:
                name = "review_required"
            case _:
                return None
    match name:
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

import pytest

from gateway.policy import Release, Templates
from gateway.release import decide, template_text
from gateway.types import Claim, ClaimReport, Decision, Outcome, Report, Verdict


def report(*verdicts: "tuple[Verdict, str | None]") -> Report:
    claims = []
    for i, (v, why) in enumerate(verdicts):
        c = Claim(i, 0, f"c{i}", 0, 0)
        if v == "failed":
            claims.append(ClaimReport(c, v, reason=why, check=why))  # type: ignore[arg-type]
        elif v == "errored":
            claims.append(ClaimReport(c, v, error_kind=why, check="judge"))
        else:
            claims.append(ClaimReport(c, v))
    return Report(tuple(claims), "fp")


V = tuple[Verdict, str | None]
OK: V = ("verified", None)
EX: V = ("exempt", None)
HALL: V = ("failed", "hallucinated_citation")
STALE: V = ("failed", "stale_source")
TIMEOUT: V = ("errored", "timeout")


def rel(**kw: object) -> Release:
    return Release.model_validate(kw)


def test_released_when_all_pass_or_exempt() -> None:
    assert decide(report(OK, EX), rel()) == Outcome(Decision.RELEASED)
    assert decide(report(), rel()).decision is Decision.RELEASED


@pytest.mark.parametrize("on_unverified", ["block", "strip", "abstain", "review"])
def test_infrastructure_failure_abstains_by_default(on_unverified: str) -> None:
    out = decide(report(OK, HALL, TIMEOUT), rel(on_unverified=on_unverified))
    assert out == Outcome(Decision.ABSTAINED, "timeout", 2, "verifier_unavailable")


def test_infrastructure_failure_can_block() -> None:
    out = decide(report(TIMEOUT), rel(on_infrastructure_failure="block"))
    assert out == Outcome(Decision.BLOCKED, "timeout", 0)


def test_block() -> None:
    assert decide(report(OK, HALL, STALE), rel()) == Outcome(
        Decision.BLOCKED, "hallucinated_citation", 1
    )


def test_strip_keeps_passing_claims() -> None:
    out = decide(report(OK, HALL, EX, OK), rel(on_unverified="strip"))
    assert out == Outcome(
        Decision.PARTIAL, "hallucinated_citation", 1, "partial", frozenset({0, 2, 3})
    )


def test_strip_with_only_exempt_passing_abstains() -> None:
    out = decide(report(EX, HALL), rel(on_unverified="strip"))
    assert out == Outcome(Decision.ABSTAINED, "hallucinated_citation", 1, "no_evidence")


def test_abstain_templates() -> None:
    assert decide(report(HALL, STALE), rel(on_unverified="abstain")).template == "no_evidence"
    assert decide(report(OK, STALE, HALL), rel(on_unverified="abstain")).template == (
        "stale_source"
    )


def test_review() -> None:
    assert decide(report(HALL), rel(on_unverified="review")) == Outcome(
        Decision.REVIEW, "hallucinated_citation", 0, "review_required"
    )


def test_unknown_state_raises() -> None:
    weird = Report((ClaimReport(Claim(0, 0, "x", 0, 1), "mystery"),), "fp")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        decide(weird, rel())


def test_template_text() -> None:
    t = Templates(no_evidence="NE", partial="P")
    assert template_text(Outcome(Decision.ABSTAINED, template="no_evidence"), t) == "NE"
    assert template_text(Outcome(Decision.PARTIAL, template="partial"), t) == "P"
    assert template_text(Outcome(Decision.RELEASED), t) is None
    for name in ("verifier_unavailable", "review_required", "stale_source"):
        got = template_text(Outcome(Decision.ABSTAINED, template=name), t)
        assert got == getattr(t, name)



def test_template_text_of_an_outcome_naming_none_is_its_decisions() -> None:
    t = Templates(no_evidence="NE", review_required="RR")
    assert template_text(Outcome(Decision.ABSTAINED), t) == "NE"
    assert template_text(Outcome(Decision.REVIEW), t) == "RR"
    assert template_text(Outcome(Decision.BLOCKED, "hallucinated_citation", 0), t) is None

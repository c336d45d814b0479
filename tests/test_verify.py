import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.types
from gateway.checks.base import ClaimFacts, FactsCheck, run_safely
from gateway.checks.ids import MissingCitation, StaleSource
from gateway.policy import Policy
from gateway.types import (
    Answer,
    Channel,
    CheckResult,
    Chunk,
    Citation,
    Claim,
    ContextSet,
    Document,
    NativeLocation,
    Status,
)
from gateway.verify import Verifier


def make_policy(**kw: Any) -> Policy:
    base: dict[str, Any] = {
        "name": "t",
        "routes": [{"name": "r", "match": {"path": "/x"}, "protocol": "openai-chat"}],
    }
    return Policy.model_validate(base | kw)


def answer(*texts: str, kind: str = "content") -> Answer:
    return Answer(
        protocol="rag-json",
        body={},
        channels=[Channel(kind=kind, path=("answer",), text=t) for t in texts],  # type: ignore[arg-type]
    )


CTX = ContextSet()
CTX.extend(
    [
        Chunk("a:1", "The plant opened in 2021 and serves 1200 homes.", "v1"),
        Chunk("b:2", "It runs on wind power."),
    ]
)


def test_all_verified() -> None:
    report = Verifier(make_policy()).verify(
        answer("The plant opened in 2021 [a:1]. It runs on wind [b:2]."), CTX
    )
    assert [c.verdict for c in report.claims] == ["verified", "verified"]
    assert report.all_verified and report.context_fingerprint == CTX.fingerprint
    assert report.seconds >= 0


def test_the_context_is_hashed_only_when_the_fingerprint_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the audit line needs the fingerprint, and it is written after the answer left."""
    hashed: list[int] = []
    real = gateway.types._fingerprint

    def counting(chunks: Sequence[Chunk]) -> str:
        hashed.append(len(chunks))
        return real(chunks)

    monkeypatch.setattr(gateway.types, "_fingerprint", counting)
    ctx = ContextSet()
    ctx.extend(CTX.chunks.values())
    report = Verifier(make_policy()).verify(answer("It runs on wind [b:2]."), ctx)
    assert report.all_verified and hashed == []
    assert report.context_fingerprint == real(tuple(CTX.chunks.values()))
    assert report.context_fingerprint == ctx.fingerprint and hashed == [2]


def test_first_failure_in_policy_order_decides() -> None:
    text = "It opened in 2020 [z:9]."  # hallucinated id and a wrong number
    r1 = Verifier(make_policy()).verify(answer(text), CTX).claims[0]
    assert (r1.verdict, r1.reason, r1.check) == ("failed", "hallucinated_citation",
                                                 "hallucinated_citation")
    p2 = make_policy(checks=["number_mismatch", "hallucinated_citation"])
    r2 = Verifier(p2).verify(answer(text), CTX).claims[0]
    assert r2.reason == "number_mismatch"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("The plant opened in 2021.", "missing_citation"),
        ("The plant opened [a:].", "malformed_citation"),
        ("The plant opened [q:1].", "hallucinated_citation"),
        ("The plant opened [a:1@v0].", "stale_source"),
        ('It said "serves 1300 homes" [a:1].', "quote_mismatch"),
        ("It serves 1300 homes [a:1].", "number_mismatch"),
    ],
)
def test_each_failure_reason(text: str, reason: str) -> None:
    r = Verifier(make_policy()).verify(answer(text), CTX).claims[0]
    assert (r.verdict, r.reason) == ("failed", reason)


def test_unsupported_and_source_text_unavailable() -> None:
    p = make_policy(checks=["unsupported"])
    ctx = ContextSet()
    ctx.extend([*CTX.chunks.values(), Chunk("id:only")])
    assert Verifier(p).verify(answer("Bananas are yellow fruit [a:1]."), ctx).claims[0].reason == (
        "unsupported"
    )
    assert Verifier(p).verify(answer("Bananas are yellow [id:only]."), ctx).claims[0].reason == (
        "source_text_unavailable"
    )


def test_exempt_and_zero_claims() -> None:
    v = Verifier(make_policy())
    r = v.verify(answer("I don't know. It runs on wind [b:2]."), CTX)
    assert [c.verdict for c in r.claims] == ["exempt", "verified"]
    empty = v.verify(answer("", "# Only a heading\n```\ncode\n```"), CTX)
    assert empty.claims == () and empty.all_verified


def test_claim_indices_span_channels_in_order() -> None:
    claims = Verifier(make_policy()).claims(answer("One [a:1]. Two [b:2].", "Three [a:1]."))
    assert [(c.index, c.channel, c.text) for c in claims] == [
        (0, 0, "One [a:1]."),
        (1, 0, "Two [b:2]."),
        (2, 1, "Three [a:1]."),
    ]


def test_channel_kinds_follow_policy() -> None:
    a = Answer("openai-chat", {}, [
        Channel("content", ("c",), "Content [a:1]."),
        Channel("reasoning", ("r",), "Thinking aloud."),
        Channel("tool_arguments", ("t",), '{"q": "x", "note": "The pack stores 62.5 kWh."}'),
        Channel("refusal", ("f",), "Refused."),
        Channel("transcript", ("s",), "Spoken."),
    ])
    default = Verifier(make_policy()).claims(a)
    assert [c.channel for c in default] == [0, 2, 3, 4]
    # Only the prose string of the tool arguments is a claim; the query "x" is a parameter.
    assert [c.text for c in default if c.channel == 2] == ["The pack stores 62.5 kWh."]
    withheld = Verifier(make_policy(channels={"tool_calls": "pass"})).claims(a)
    assert [c.channel for c in withheld] == [0, 3, 4]
    reasoning = Verifier(make_policy(channels={"reasoning": "verify"})).claims(a)
    assert [c.channel for c in reasoning] == [0, 1, 2, 3, 4]


def test_tool_argument_json_quotes_are_not_quotations() -> None:
    text = '{"summary": "The pack stores 62.5 kWh [a:1].", "id": "abc"}'
    a = Answer("openai-chat", {}, [Channel("tool_arguments", ("t",), text)])
    v = Verifier(make_policy())
    (claim,) = v.claims(a)
    assert text[claim.start : claim.end] == claim.text == "The pack stores 62.5 kWh [a:1]."
    (cit,) = claim.citations
    assert text[cit.start : cit.end] == "a:1"
    ctx = ContextSet({"a:1": Chunk("a:1", "The pack stores 62.5 kWh of energy.")})
    assert [r.verdict for r in v.verify_claims([claim], ctx)] == ["verified"]
    broken = Answer("openai-chat", {}, [Channel("tool_arguments", ("t",), '{"summary": "Oops')])
    assert v.claims(broken), "arguments that are not JSON are segmented as text (fail closed)"


def test_structured_claims() -> None:
    text = "It runs on wind. Opened in 2021 [a:1]."
    ch = Channel("content", ("answer",), text,
                 structured=(("It runs on wind.", ("b:2",)),
                             ("Opened in 2021 [a:1].", ("a:1@v0",)),
                             ("Elsewhere.", ())))
    v = Verifier(make_policy())
    claims = v.claims(Answer("rag-json", {}, [ch]))
    assert [c.text for c in claims] == [s[0] for s in ch.structured or ()]
    assert claims[0].citations[0].id == "b:2" and claims[0].start == 0
    assert [(c.id, c.version) for c in claims[1].citations] == [("a:1", "v0"), ("a:1", None)]
    assert text[claims[1].start : claims[1].end] == claims[1].text
    assert claims[2].start == -1
    verdicts = [(c.verdict, c.reason) for c in v.verify_claims(claims, CTX)]
    assert verdicts == [("verified", None), ("failed", "stale_source"),
                        ("failed", "missing_citation")]


def test_native_citations_attach_by_overlap() -> None:
    loc = NativeLocation("char_location", "wind power", document_index=0, start=11, end=21)
    cit = Citation("", "", native=loc)
    text = "It is windy. It uses wind power. Unrelated."
    ch = Channel("content", ("content", 0), text, native=((13, 32, cit),))
    ctx = ContextSet(documents=[Document(0, "text", "It runs on wind power.")])
    v = Verifier(make_policy(checks=["missing_citation", "quote_mismatch"]))
    claims = v.claims(Answer("anthropic-messages", {}, [ch]))
    assert [len(c.citations) for c in claims] == [0, 1, 0]
    report = v.verify_claims(claims, ctx)
    assert [r.verdict for r in report] == ["failed", "verified", "failed"]


class _Judge:
    """A stand-in for a remote LLM judge: says YES unless the claim mentions 'moon'."""

    name = "unsupported"

    def __init__(self, delay: float = 0.0, crash: bool = False, short: bool = False) -> None:
        self.delay, self.crash, self.short = delay, crash, short
        self.seen: list[int] = []

    async def run_batch(
        self, claims: Sequence[Claim], ctx: ContextSet, deadline: float
    ) -> list[CheckResult]:
        self.seen = [c.index for c in claims]
        await asyncio.sleep(self.delay)
        if self.crash:
            raise ConnectionError("judge down")
        out = [
            CheckResult.fail(self.name, "unsupported") if "moon" in c.text
            else CheckResult.ok(self.name)
            for c in claims
        ]
        return out[:-1] if self.short else out


async def test_async_check_runs_in_batch() -> None:
    judge = _Judge()
    v = Verifier(make_policy(), checks=[MissingCitation(), judge])
    r = await v.averify(answer("I don't know. Wind [b:2]. The moon [a:1]."), CTX, 1.0)
    assert [(c.verdict, c.reason) for c in r.claims] == [
        ("exempt", None), ("verified", None), ("failed", "unsupported"),
    ]
    assert judge.seen == [1, 2]  # exempt claims are not sent


async def test_async_check_timeout_is_error_never_pass() -> None:
    v = Verifier(make_policy(), checks=[MissingCitation(), _Judge(delay=0.5)])
    r = await v.averify(answer("Wind [b:2]."), CTX, 0.05)
    c = r.claims[0]
    assert (c.verdict, c.error_kind, c.check) == ("errored", "timeout", "unsupported")
    assert r.any_errored


@pytest.mark.parametrize("judge", [_Judge(crash=True), _Judge(short=True)])
async def test_async_check_crash_is_error(judge: _Judge) -> None:
    v = Verifier(make_policy(), checks=[judge])
    r = await v.averify(answer("Wind [b:2]. Sun [a:1]."), CTX, 1.0)
    assert [(c.verdict, c.error_kind) for c in r.claims] == [("errored", "crash")] * 2


async def test_expired_deadline_is_timeout() -> None:
    v = Verifier(make_policy(), checks=[_Judge()])
    r = await v.averify(answer("Wind [b:2]."), CTX, 0.0)
    assert r.claims[0].error_kind == "timeout"


def test_sync_verify_cannot_pass_an_async_check() -> None:
    v = Verifier(make_policy(), checks=[_Judge()])
    r = v.verify(answer("Wind [b:2]."), CTX)
    assert (r.claims[0].verdict, r.claims[0].error_kind) == ("errored", "async_unavailable")


def test_sync_failure_before_async_check_decides() -> None:
    v = Verifier(make_policy(), checks=[MissingCitation(), _Judge()])
    r = asyncio.run(v.averify(answer("No citation about the moon."), CTX, 1.0))
    assert r.claims[0].reason == "missing_citation"


def test_crashing_sync_check_is_errored() -> None:
    class Boom:
        name = "boom"

        def run(self, claim: Claim, ctx: ContextSet) -> CheckResult:
            raise KeyError("x")

    r = Verifier(make_policy(), checks=[Boom()]).verify(answer("Wind [b:2]."), CTX)
    assert (r.claims[0].verdict, r.claims[0].error_kind) == ("errored", "crash")


class _CrashingFacts(FactsCheck):
    name = "boom"

    def check(self, facts: ClaimFacts) -> CheckResult:
        raise KeyError("x")


class _NoResult(FactsCheck):
    name = "none"

    def check(self, facts: ClaimFacts) -> CheckResult:
        return "pass"  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("checks", "check", "detail"),
    [
        ([MissingCitation(), _CrashingFacts()], "boom", "KeyError"),
        ([_NoResult(), MissingCitation()], "none", "check returned no CheckResult"),
    ],
)
def test_a_crashing_facts_check_errors_its_claim_only(
    checks: list[FactsCheck], check: str, detail: str
) -> None:
    # Each check runs isolated: the crash is reported for the check that crashed, on every
    # claim it reaches, and an earlier failing check still decides its own claims first.
    r = Verifier(make_policy(), checks=checks).verify(answer("Wind [b:2]. No citation."), CTX)
    first, second = r.claims
    assert (first.verdict, first.error_kind, first.check, first.detail) == (
        "errored", "crash", check, detail
    )
    if check == "boom":
        assert (second.verdict, second.reason) == ("failed", "missing_citation")
    else:
        assert (second.verdict, second.check) == ("errored", "none")


class _StricterStale(StaleSource):
    def check(self, facts: ClaimFacts) -> CheckResult:
        return CheckResult.fail(self.name, "stale_source", "always")


def test_only_the_id_checks_themselves_are_skipped_for_plain_citations() -> None:
    # A plain claim skips missing/malformed/hallucinated/stale, which pass it; a subclass of
    # one of them decides for itself and still runs.
    v = Verifier(make_policy(), checks=[MissingCitation(), StaleSource()])
    assert v.verify(answer("Wind [b:2]."), CTX).claims[0].verdict == "verified"
    v = Verifier(make_policy(), checks=[MissingCitation(), _StricterStale()])
    r = v.verify(answer("Wind [b:2]."), CTX).claims[0]
    assert (r.verdict, r.check, r.detail) == ("failed", "stale_source", "always")


def test_rejects_objects_that_are_not_checks() -> None:
    with pytest.raises(TypeError):
        Verifier(make_policy(), checks=[object()])  # type: ignore[list-item]


_WORDS = st.sampled_from(
    [
        "The plant", " opened in 2021", " serves 1,200 homes", " 80%", " 62.5 kWh", " wind power",
        ' "runs on wind"', " “on wind power”", " [a:1]", " [b:2]", " [c:3]", " [a:1@v2]", ".",
        " e.g.", "\n", "\n- ", " it’s", " $3.2 million", " [a:1@v1]", " [d:4]", " [a:]",
        " -5", " 1.200",
    ]
)
_CHUNK_TEXTS = st.lists(
    st.sampled_from(
        ["The plant opened in 2021", " and serves 1200 homes.", " It runs on wind power.",
         " 80 percent of 62.5 kWh", " $3,200,000", " it's"]
    ),
    max_size=6,
).map("".join)
_ALL_CHECKS = [
    "missing_citation", "malformed_citation", "hallucinated_citation", "stale_source",
    "quote_mismatch", "number_mismatch", "unsupported",
]


@settings(max_examples=200, deadline=None)
@given(st.lists(_WORDS, max_size=30).map("".join), _CHUNK_TEXTS, _CHUNK_TEXTS)
def test_shared_claim_facts_give_the_verdicts_of_checks_run_alone(
    text: str, a_text: str, b_text: str
) -> None:
    # The verifier shares one claim's body and indexed sources among its checks; running
    # each check on its own through the Check protocol must decide every claim the same way.
    ctx = ContextSet()
    ctx.extend([Chunk("a:1", a_text, "v1"), Chunk("b:2", b_text), Chunk("c:3", None)])
    v = Verifier(make_policy(checks=_ALL_CHECKS))
    claims = v.claims(answer(text))
    got = v.verify_claims(claims, ctx)
    for claim, report in zip(claims, got, strict=True):
        alone = (run_safely(c, claim, ctx) for c in v.checks)
        first = next((r for r in alone if r.status is not Status.PASS), None)
        if claim.exempt:
            assert report.verdict == "exempt"
        elif first is None:
            assert report.verdict == "verified"
        else:
            assert (report.check, report.reason, report.detail) == (
                first.check, first.reason, first.detail
            )


class _Counted(FactsCheck):
    """A check that counts its runs and gives a fixed result."""

    def __init__(self, name: str, result: CheckResult | None = None) -> None:
        self.name = name
        self.result = result if result is not None else CheckResult.ok(name)
        self.runs = 0

    def check(self, facts: ClaimFacts) -> CheckResult:
        self.runs += 1
        return self.result


def test_decide_with_runs_only_the_checks_after_the_one_decided() -> None:
    """The judge pass's verdict settles `unsupported`; the checks before it passed when the
    claim was verified and are not run again, the ones after it run in policy order."""
    before = _Counted("before")
    after = _Counted("after", CheckResult.fail("after", "number_mismatch"))
    v = Verifier(make_policy(), checks=[before, _Counted("unsupported"), after])
    (claim,) = v.claims(answer("The plant opened in 2021 [a:1]."))
    yes = CheckResult.ok("unsupported")
    no = CheckResult.fail("unsupported", "unsupported")
    failed = v.decide_with(claim, CTX, "unsupported", yes)
    assert (failed.verdict, failed.reason, failed.check) == ("failed", "number_mismatch", "after")
    assert (before.runs, after.runs) == (0, 1)
    refused = v.decide_with(claim, CTX, "unsupported", no)
    assert (refused.verdict, refused.reason) == ("failed", "unsupported")
    assert after.runs == 1  # a failing verdict decides: nothing after it runs
    after.result = CheckResult.ok("after")
    assert v.decide_with(claim, CTX, "unsupported", yes).verdict == "verified"
    unknown = v.decide_with(claim, CTX, "judge", yes)
    assert (unknown.verdict, unknown.error_kind) == ("errored", "crash")

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import checks
from gateway.checks.base import ClaimFacts, run_safely
from gateway.checks.ids import (
    PASS_PLAIN,
    HallucinatedCitation,
    MalformedCitation,
    MissingCitation,
    StaleSource,
)
from gateway.citations import CitationParser
from gateway.policy import Citations, Policy
from gateway.types import (
    CheckResult,
    Chunk,
    Citation,
    Claim,
    ContextSet,
    Document,
    NativeLocation,
    Status,
)

PARSER = CitationParser(Citations())


def claim(text: str, *extra: Citation, exempt: bool = False) -> Claim:
    return Claim(0, 0, text, 0, len(text), (*PARSER.find(text), *extra), exempt)


CTX = ContextSet()
CTX.extend([Chunk("a:1", "alpha text", "v1"), Chunk("b:2", "beta"), Chunk("c:3", None, "2")])


def test_missing_citation() -> None:
    check = MissingCitation()
    assert check.run(claim("No citation here."), CTX).reason == "missing_citation"
    assert check.run(claim("Cited [a:1]."), CTX).status is Status.PASS
    assert check.run(claim("I don't know.", exempt=True), CTX).status is Status.PASS


def test_malformed_citation() -> None:
    check = MalformedCitation()
    r = check.run(claim("Bad [a:] marker."), CTX)
    assert (r.status, r.reason, r.detail) == (Status.FAIL, "malformed_citation", "empty half")
    assert check.run(claim("Bidi [a\u202e:1]."), CTX).reason == "malformed_citation"
    assert check.run(claim("Fine [a:1]."), CTX).status is Status.PASS


def test_hallucinated_citation() -> None:
    check = HallucinatedCitation()
    assert check.run(claim("Real [a:1][b:2]."), CTX).status is Status.PASS
    assert check.run(claim("Made up [z:9]."), CTX).reason == "hallucinated_citation"
    assert check.run(claim("Mixed [a:1][z:9]."), CTX).reason == "hallucinated_citation"
    # a malformed marker is malformed_citation's business, not this check's
    assert check.run(claim("Bad [a:]."), CTX).status is Status.PASS


def test_homoglyph_is_hallucinated() -> None:
    r = HallucinatedCitation().run(claim("Looks right [а:1]."), CTX)  # Cyrillic а
    assert r.reason == "hallucinated_citation"


def test_native_citation_out_of_range_is_hallucinated() -> None:
    ctx = ContextSet(documents=[Document(0, "text", "Hello world")])
    ok = NativeLocation("char_location", "Hello", document_index=0, start=0, end=5)
    bad = NativeLocation("char_location", "Hello", document_index=3, start=0, end=5)
    sr = NativeLocation("search_result_location", "x", search_result_index=0, start=0, end=1)
    check = HallucinatedCitation()
    assert check.run(claim("Hi.", Citation("", "", native=ok)), ctx).status is Status.PASS
    assert check.run(claim("Hi.", Citation("", "", native=bad)), ctx).reason == (
        "hallucinated_citation"
    )
    assert check.run(claim("Hi.", Citation("", "", native=sr)), ctx).reason == (
        "hallucinated_citation"
    )


def test_stale_source() -> None:
    check = StaleSource()
    assert check.run(claim("Same [a:1@v1]."), CTX).status is Status.PASS
    assert check.run(claim("Old [a:1@v0]."), CTX).reason == "stale_source"
    # A version the chunk does not have: no version the model was given.
    assert check.run(claim("Chunk unversioned [b:2@v9]."), CTX).reason == "stale_source"
    assert check.run(claim("Chunk unversioned, none cited [b:2]."), CTX).status is Status.PASS
    assert check.run(claim("No version cited [a:1]."), CTX).status is Status.PASS
    assert check.run(claim("Unknown chunk [q:1@v1]."), CTX).status is Status.PASS
    assert check.run(claim("Id only chunk [c:3@1]."), CTX).reason == "stale_source"


def test_build_follows_policy_order() -> None:
    p = Policy.model_validate(
        {
            "name": "t",
            "routes": [{"name": "r", "match": {"path": "/x"}, "protocol": "openai-chat"}],
            "checks": ["number_mismatch", "missing_citation", "unsupported"],
            "support": {"threshold": 0.7},
        }
    )
    built = checks.build(p)
    assert [c.name for c in built] == ["number_mismatch", "missing_citation", "unsupported"]


def test_default_policy_builds_all_default_checks() -> None:
    p = Policy.model_validate(
        {"name": "t", "routes": [{"name": "r", "match": {"path": "/x"}, "protocol": "openai-chat"}]}
    )
    assert [c.name for c in checks.build(p)] == p.checks


class _Boom:
    name = "boom"

    def run(self, claim: Claim, ctx: ContextSet) -> CheckResult:
        raise RuntimeError("bug")


class _Liar:
    name = "liar"

    def run(self, claim: Claim, ctx: ContextSet) -> CheckResult:
        return None  # type: ignore[return-value]


@pytest.mark.parametrize("check", [_Boom(), _Liar()])
def test_crashing_check_is_an_error_not_an_exception(check: checks.Check) -> None:
    r = run_safely(check, claim("x [a:1]."), CTX)
    assert r.status is Status.ERROR and r.kind == "crash"


_NATIVE = NativeLocation("char_location", "alpha", document_index=0, start=0, end=5)
_CITATIONS = st.lists(
    st.builds(
        Citation,
        id=st.sampled_from(["a:1", "b:2", "c:3", "z:9", "а:1"]),
        raw=st.just(""),
        start=st.just(-1),
        end=st.just(-1),
        version=st.sampled_from([None, "v1", "v2", "2"]),
        malformed=st.sampled_from([None, None, None, "empty half"]),
        native=st.sampled_from([None, None, None, _NATIVE]),
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(_CITATIONS)
def test_plain_claims_pass_every_id_check(cits: list[Citation]) -> None:
    # The verifier skips these checks for a claim with plain citations: each must pass it.
    c = Claim(0, 0, "Some claim.", 0, 11, tuple(cits))
    results = [k().run(c, CTX) for k in PASS_PLAIN]
    facts = ClaimFacts(c, CTX)
    if facts.plain():
        assert all(r.status is Status.PASS for r in results)
    # what `plain` finds of the sources on the way is what `sources` finds
    assert facts.sources() == ClaimFacts(c, CTX).sources()
    if all(r.status is Status.PASS for r in results) and all(
        x.native is None and x.malformed is None for x in cits
    ):
        # and it is no stricter than the checks, but for natives and malformed markers
        # (which some of these checks pass), left to the checks themselves
        assert ClaimFacts(c, CTX).plain()


def test_plain_claims_examples() -> None:
    assert ClaimFacts(claim("Cited [a:1][b:2]."), CTX).plain()
    assert ClaimFacts(claim("At its version [a:1@v1][b:2]."), CTX).plain()
    assert not ClaimFacts(claim("A version it lacks [b:2@v9]."), CTX).plain()
    assert not ClaimFacts(claim("Nothing cited."), CTX).plain()
    assert not ClaimFacts(claim("Stale [a:1@v0]."), CTX).plain()
    assert not ClaimFacts(claim("Unknown [z:9]."), CTX).plain()
    assert not ClaimFacts(claim("Bad [a:]."), CTX).plain()

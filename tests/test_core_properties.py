"""The core invariant as properties: no hallucinated citation is released, and a partial
answer (rebuilt as the proxy rebuilds it) never carries a failing claim's text."""

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.claims import ClaimSegmenter, segment
from gateway.policy import Policy
from gateway.protocols.base import claim_core, rebuild_with_map
from gateway.release import decide, template_text
from gateway.types import Answer, Channel, Chunk, ContextSet, Decision
from gateway.verify import Verifier

CTX = ContextSet()
CTX.extend([Chunk(f"doc:{i}", f"Fact{i} holds in region {i}.") for i in range(5)])

_GOOD = st.integers(0, 4).map(lambda i: (f"Fact{i} holds", f"[doc:{i}]"))
_BAD = st.sampled_from(["[doc:9]", "[dос:1]", "[ghost:1]", "[doc:1\u200b]", "[doc:]", ""])
_SEP = st.sampled_from([" ", "\n", "\n\n", "\n- ", "\n1. "])


def _policy(**kw: Any) -> Policy:
    base: dict[str, Any] = {
        "name": "p",
        "routes": [{"name": "r", "match": {"path": "/x"}, "protocol": "openai-chat"}],
    }
    return Policy.model_validate(base | kw)


@st.composite
def answers(draw: st.DrawFn) -> tuple[str, list[bool]]:
    """Sentences with distinct words; returns the text and which sentences are good."""
    n = draw(st.integers(1, 8))
    parts: list[str] = []
    good: list[bool] = []
    for k in range(n):
        if draw(st.booleans()):
            words, cite = draw(_GOOD)
            ok = True
        else:
            words, cite = f"Claim{k} says", draw(_BAD)
            ok = False
        period_first = draw(st.booleans())
        sentence = f"{words}. {cite}" if period_first and cite else f"{words} {cite}."
        parts.append(sentence)
        parts.append(draw(_SEP))
        good.append(ok)
    return "".join(parts), good


def _answer(text: str) -> Answer:
    return Answer(protocol="rag-json", body={},
                  channels=[Channel(kind="content", path=("answer",), text=text)])


@settings(max_examples=200, deadline=None)
@given(answers(), st.sampled_from(["block", "strip", "abstain", "review"]))
def test_bad_citation_is_never_released(sample: tuple[str, list[bool]], mode: str) -> None:
    text, good = sample
    p = _policy(release={"on_unverified": mode})
    report = Verifier(p).verify(_answer(text), CTX)
    out = decide(report, p.release)
    assert len(report.claims) == len(good)
    if all(good):
        assert out.decision is Decision.RELEASED
    else:
        assert out.decision is not Decision.RELEASED


@settings(max_examples=200, deadline=None)
@given(answers())
def test_partial_never_contains_a_failing_claim(sample: tuple[str, list[bool]]) -> None:
    text, _ = sample
    p = _policy(release={"on_unverified": "strip"})
    v = Verifier(p)
    report = v.verify(_answer(text), CTX)
    out = decide(report, p.release)
    if out.decision is not Decision.PARTIAL:
        return
    kept = [c.claim for c in report.claims if c.claim.index in out.kept]
    # What every adapter's partial render calls (rag-json through base.rebuild_text).
    rebuilt, mapping = rebuild_with_map(text, kept, template_text(out, p.release.templates))
    failing = [c.claim for c in report.claims if c.verdict == "failed"]
    assert failing
    for claim in failing:
        assert claim.text not in rebuilt
        assert claim_core(claim) not in rebuilt
    assert "Claim" not in rebuilt  # only failing sentences have the word: no piece survives
    # every kept claim survives, in order, where the map says (citation offsets follow it)
    assert len(mapping) == len(kept)
    at = 0
    for claim in sorted(kept, key=lambda c: c.start):
        at = rebuilt.index(claim.text, at) + len(claim.text)
    for old_start, old_end, new_start in mapping:
        assert rebuilt[new_start : new_start + old_end - old_start] == text[old_start:old_end]
    # what remains verifies on its own
    again = decide(v.verify(_answer(rebuild_with_map(text, kept, None)[0]), CTX), p.release)
    assert again.decision is Decision.RELEASED


@settings(max_examples=500, deadline=None)
@given(answers(), st.lists(st.integers(0, 400), max_size=20))
def test_feed_at_split_points_equals_segment(
    sample: tuple[str, list[bool]], cuts: list[int]
) -> None:
    text, _ = sample
    v = Verifier(_policy())
    seg = v.segmenter()
    assert isinstance(seg, ClaimSegmenter)
    got = []
    prev = 0
    for cut in sorted(min(c, len(text)) for c in cuts):
        got.extend(seg.feed(text[prev:cut]))
        prev = cut
    got.extend(seg.feed(text[prev:]))
    got.extend(seg.finish())
    assert got == segment(text, v.parser, v.policy.claims.exempt_re)

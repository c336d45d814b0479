"""Sans-io stream verification: StreamVerifier and ProgressiveRelease fed SSE events directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.claims import ClaimSegmenter, Segment
from gateway.pipeline import RoutePipeline
from gateway.policy import load_policy
from gateway.sse import SSEDecoder, SSEEvent
from gateway.stream import ProgressiveRelease, StreamVerifier
from gateway.types import Chunk, ContextSet
from tests.gateway_harness import write_policy
from tests.upstream_app import anthropic_sse, openai_sse, split_random

CTX = ContextSet()
CTX.add(Chunk("a:1", "The pump moves 40 litres per minute and weighs 12 kg.", "1"))
TEXT = (
    "The pump moves 40 litres per minute [a:1].\n"
    "It weighs 12 kg [a:1].\n"
    "It was built on Mars [a:9].\n"
    "It weighs 99 kg [a:1]."
)


def _pipeline(tmp_path: Path, protocol: str, **policy: str) -> RoutePipeline:
    loaded = load_policy(write_policy(tmp_path, **policy))
    route = next(r for r in loaded.policy.routes if r.protocol == protocol)
    return RoutePipeline(loaded, route)


def _events(frames: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    return decoder.feed(b"".join(frames)) + decoder.finish()


@settings(max_examples=25, deadline=None)
@given(
    chunk_size=st.integers(min_value=1, max_value=40),
    anthropic=st.booleans(),
    n=st.integers(min_value=1, max_value=2),
)
def test_verdicts_reached_while_streaming_equal_a_fresh_judgement(
    tmp_path_factory: object, chunk_size: int, anthropic: bool, n: int
) -> None:
    import tempfile

    tmp = Path(tempfile.mkdtemp())
    protocol = "anthropic-messages" if anthropic else "openai-chat"
    pipeline = _pipeline(tmp, protocol, on_unverified="strip")
    frames = (
        anthropic_sse(TEXT, chunk_size=chunk_size)
        if anthropic
        else openai_sse(TEXT, chunk_size=chunk_size, n=n)  # choice 1 is verified after choice 0
    )
    verifier = StreamVerifier(pipeline, CTX)
    seen = [r for ev in _events(frames) for r in verifier.feed(ev)[1]]
    rest, answer = verifier.finish()
    assert len(seen) + len(rest) == 4
    fresh = pipeline.judge(answer, CTX)
    for streamed_text in (None, verifier.text):
        reused = pipeline.judge(answer, CTX, verifier.known, streamed_text)
        assert reused.claims == fresh.claims
        assert [(r.claim, r.verdict, r.reason) for r in reused.report.claims] == [
            (r.claim, r.verdict, r.reason) for r in fresh.report.claims
        ]
        assert reused.outcome == fresh.outcome
    assert [r.reason for r in fresh.report.claims][:4] == [
        None, None, "hallucinated_citation", "number_mismatch",
    ]


def test_progressive_release_emits_verified_claims_before_the_stream_ends(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "openai-chat", on_unverified="strip", streaming="progressive")
    release = ProgressiveRelease(pipeline, CTX, "req-1", include_usage=False)
    events = _events(openai_sse(TEXT, chunk_size=5))
    first_claim_out = None
    out = b""
    for i, ev in enumerate(events):
        out += release.feed([ev])
        if first_claim_out is None and b"litres" in out:
            first_claim_out = i
    out += release.finish()
    # The event that starts the third line's text: the first claim must be out before it.
    third_line = TEXT.index("It was built")
    sent, third = 0, None
    for i, ev in enumerate(events):
        if ev.data != "[DONE]":
            for choice in json.loads(ev.data)["choices"]:
                sent += len(choice["delta"].get("content") or "")
        if third is None and sent > third_line:
            third = i
    assert first_claim_out is not None and third is not None and first_claim_out < third
    assert b"Mars" not in out and b"99 kg" not in out
    assert out.rstrip().endswith(b"data: [DONE]")
    assert release.decision == "partial"


def test_progressive_frames_keep_an_upstream_integer_beyond_64_bits(tmp_path: Path) -> None:
    # Released frames are serialised with orjson, which refuses such integers; the upstream's
    # own head fields (here `created`) may still carry one, and the frame must keep it.
    pipeline = _pipeline(tmp_path, "openai-chat", on_unverified="strip", streaming="progressive")
    release = ProgressiveRelease(pipeline, CTX, "req-1", include_usage=False)
    events = []
    for ev in _events(openai_sse(TEXT, chunk_size=5)):
        if ev.data != "[DONE]":
            chunk = json.loads(ev.data)
            chunk["created"] = 2**70
            ev = SSEEvent(data=json.dumps(chunk))
        events.append(ev)
    out = release.feed(events) + release.finish()
    released = [json.loads(ev.data) for ev in _events([out]) if ev.data != "[DONE]"]
    assert released and all(chunk["created"] == 2**70 for chunk in released)
    text = "".join(
        c["delta"].get("content") or "" for chunk in released for c in chunk["choices"]
    )
    assert text.startswith("The pump moves 40 litres per minute [a:1].")
    assert release.decision == "partial"


def test_progressive_release_blocks_with_an_error_event(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "anthropic-messages", streaming="progressive")
    release = ProgressiveRelease(pipeline, CTX, "req-2", include_usage=False)
    out = release.feed(_events(anthropic_sse(TEXT, chunk_size=7))) + release.finish()
    assert b"event: error" in out
    assert b"message_stop" not in out
    assert b"Mars" not in out
    assert b"12 kg" in out  # the claims before the failure were verified and released
    assert release.decision == "blocked"
    summary = release.summary()  # what the audit event reports
    assert summary is not None
    assert summary.outcome.reason == "hallucinated_citation"
    assert summary.outcome.claim_index == 2
    assert [c.verdict for c in summary.report.claims] == ["verified", "verified", "failed"]


def test_a_stream_cut_short_ends_with_an_error_event(tmp_path: Path) -> None:
    pipeline = _pipeline(tmp_path, "openai-chat", streaming="progressive")
    release = ProgressiveRelease(pipeline, CTX, "req-3", include_usage=False)
    good = "The pump moves 40 litres per minute [a:1]. It weighs 12 kg [a:1]."
    frames = openai_sse(good, chunk_size=5, done=False)
    out = release.feed(_events(frames)) + release.finish()
    assert b'"error"' in out
    assert b"data: [DONE]\n" not in out.splitlines(keepends=True)
    assert release.decision == "error"


def test_native_citations_are_attached_while_streaming(tmp_path: Path) -> None:
    """Claims verified mid-stream carry the same Anthropic native citations as the final
    answer's claims, so their verdicts are reused rather than re-checked."""
    fixtures = Path(__file__).parent / "fixtures" / "anthropic_messages"
    pipeline = _pipeline(tmp_path, "anthropic-messages")
    request = json.loads((fixtures / "request_stream.json").read_text())
    ctx = pipeline.context(request, None, {})
    verifier = StreamVerifier(pipeline, ctx)
    decoder = SSEDecoder()
    for piece in split_random((fixtures / "native_good.sse").read_bytes(), seed=2, max_piece=11):
        for ev in decoder.feed(piece):
            verifier.feed(ev)
    for ev in decoder.finish():
        verifier.feed(ev)
    _, answer = verifier.finish()
    final = pipeline.verifier.claims(answer)
    streamed = {(c.start, c.end, c.text): c for c in (r.claim for r in verifier.known.values())}
    assert final and all(c.citations for c in final)
    for claim in final:
        assert streamed[(claim.start, claim.end, claim.text)].citations == claim.citations
    assert pipeline.judge(answer, ctx, verifier.known).outcome.decision.value == "released"


def test_the_final_judgement_does_not_segment_the_streamed_text_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = _pipeline(tmp_path, "openai-chat", on_unverified="strip")
    verifier = StreamVerifier(pipeline, CTX)
    for ev in _events(openai_sse(TEXT, chunk_size=9)):
        verifier.feed(ev)
    _, answer = verifier.finish()
    fed: list[int] = []
    original_feed, original_whole = ClaimSegmenter.feed, ClaimSegmenter.whole

    def counting_feed(self: ClaimSegmenter, delta: str) -> list[Segment]:
        fed.append(len(delta))
        return original_feed(self, delta)

    def counting_whole(self: ClaimSegmenter, text: str) -> list[Segment]:
        fed.append(len(text))
        return original_whole(self, text)

    monkeypatch.setattr(ClaimSegmenter, "feed", counting_feed)
    monkeypatch.setattr(ClaimSegmenter, "whole", counting_whole)
    pipeline.judge(answer, CTX, verifier.known, verifier.text)
    assert sum(fed) == 0
    pipeline.judge(answer, CTX, verifier.known)  # without the streamed text: segmented again
    assert sum(fed) == len(TEXT)

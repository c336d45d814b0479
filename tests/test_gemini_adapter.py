"""The gemini adapter's pure parts: UTF-8 byte ↔ str offsets, grounding supports located,
verified and re-indexed after stripping (property tests in non-ASCII text), stream assembly
(metadata early or re-sent accumulated), the field table, and `citewarden verify` over the
fixtures with the shipped policy."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ProtocolError
from gateway.offline import verify_exchange
from gateway.policy import load_policy
from gateway.protocols import ADAPTERS
from gateway.protocols.gemini.offsets import to_bytes, to_chars
from gateway.protocols.gemini.parse import parse_body
from gateway.protocols.gemini.stream import merge_grounding
from gateway.types import Decision, Outcome, Report
from gateway.verify import Verifier
from tests.test_protocol_helpers import parse_stream

ROOT = Path(__file__).parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "gemini"
SHIPPED = ROOT / "policies" / "gemini.yaml"
GEMINI = ADAPTERS["gemini"]


def body_with(text: str, supports: list[dict[str, Any]], n_chunks: int = 2) -> dict[str, Any]:
    chunks = [
        {"retrievedContext": {"uri": f"gs://kb/{i}", "title": f"T{i}", "text": f"chunk {i}"}}
        for i in range(n_chunks)
    ]
    return {
        "candidates": [{
            "content": {"role": "model", "parts": [{"text": text}]},
            "finishReason": "STOP",
            "index": 0,
            "groundingMetadata": {"groundingChunks": chunks, "groundingSupports": supports},
        }],
        "modelVersion": "gemini-2.5-flash",
    }


def seg(text: str, piece: str) -> dict[str, Any]:
    start = text.index(piece)
    b0 = len(text[:start].encode())
    return {"startIndex": b0, "endIndex": b0 + len(piece.encode()), "text": piece}


# -- offsets ---------------------------------------------------------------------------------

TEXT = st.text(
    alphabet=st.sampled_from([*"ab .é保証🔋ü\u00a0", "\U0001f600"]), max_size=40
)


@given(TEXT)
def test_byte_offsets_round_trip_at_every_character(text: str) -> None:
    for i in range(len(text) + 1):
        b = to_bytes(text, i)
        assert b == len(text[:i].encode())
        assert to_chars(text, b) == i


@given(TEXT)
def test_offsets_inside_a_character_or_outside_locate_nothing(text: str) -> None:
    data = text.encode()
    boundaries = {len(text[:i].encode()) for i in range(len(text) + 1)}
    for b in range(len(data) + 3):
        got = to_chars(text, b)
        assert (got is not None) == (b in boundaries)
    assert to_chars(text, -1) is None


# -- supports --------------------------------------------------------------------------------


def test_supports_become_native_citations_of_the_claims_they_locate() -> None:
    text = "Café ⚡ costs 3 €. 保証 lasts 10 years 🔋."
    a, b = "Café ⚡ costs 3 €.", "保証 lasts 10 years 🔋."
    body = body_with(text, [
        {"segment": seg(text, a), "groundingChunkIndices": [0]},
        {"segment": seg(text, b), "groundingChunkIndices": [1, 5]},
    ])
    answer = parse_body(body)
    [content] = [c for c in answer.channels if c.kind == "content"]
    spans = [(text[s:e], c.id) for s, e, c in content.native]
    assert spans == [(a, "gs://kb/0"), (b, "gs://kb/1"), (b, "groundingChunks[5]")]


def test_a_segment_whose_text_differs_is_a_malformed_citation() -> None:
    text = "Café costs 3 €."
    s = {**seg(text, text), "text": "Cafe costs 3 €."}
    answer = parse_body(body_with(text, [{"segment": s, "groundingChunkIndices": [0]}]))
    [(_, _, cit)] = answer.channels[0].native
    assert cit.malformed is not None


@pytest.mark.parametrize(
    "segment",
    [
        {"startIndex": 0, "endIndex": 99},  # past the end
        {"startIndex": 4, "endIndex": 6},  # inside "é" (bytes 3..5)
        {"startIndex": 0, "endIndex": 3, "partIndex": 4},  # no such part
    ],
)
def test_a_segment_that_locates_nothing_is_ambiguous(segment: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        parse_body(body_with("Café costs 3 €.", [{"segment": segment,
                                                  "groundingChunkIndices": [0]}]))


def test_part_index_counts_within_its_part_after_a_thought() -> None:
    text = "Ünï costs 3 €."
    body = body_with(text, [{"segment": {**seg(text, "costs"), "partIndex": 1},
                             "groundingChunkIndices": [0]}])
    body["candidates"][0]["content"]["parts"].insert(0, {"text": "hmm", "thought": True})
    answer = parse_body(body)
    [content] = [c for c in answer.channels if c.kind == "content"]
    (s, e, _), = content.native
    assert text[s:e] == "costs"


WORDS = ["Café", "保証", "naïve", "🔋", "Ünïcode", "日本", "plain", "x"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
                       st.integers(1, 99)), min_size=1, max_size=6),
    st.data(),
)
def test_partial_reindexes_supports_to_valid_byte_offsets(
    sentences: list[tuple[list[str], int]], data: st.DataObject
) -> None:
    parts = [f"The {' '.join(words)} holds {n} units." for words, n in sentences]
    text = " ".join(parts)
    supports = []
    cursor = 0
    for k, p in enumerate(parts):
        at = text.index(p, cursor)
        cursor = at + len(p)
        b0 = len(text[:at].encode())
        supports.append({"segment": {"startIndex": b0, "endIndex": b0 + len(p.encode()),
                                     "text": p}, "groundingChunkIndices": [k % 2]})
    body = body_with(text, supports)
    policy = load_policy(str(SHIPPED)).policy
    answer = GEMINI.parse(body, policy.routes[0])
    claims = Verifier(policy).claims(answer)
    assert [c.text for c in claims] == parts
    kept = data.draw(st.sets(st.sampled_from(range(len(claims)))))
    outcome = Outcome(Decision.PARTIAL, "hallucinated_citation", 0, "partial", frozenset(kept))
    out = GEMINI.render(answer, claims, outcome, Report((), "x"), policy)
    cand = out["candidates"][0]  # type: ignore[index]
    released = cand["content"]["parts"][0]["text"]
    raw = released.encode()
    got = cand["groundingMetadata"]["groundingSupports"]
    for s in got:
        g = s["segment"]
        assert raw[g["startIndex"] : g["endIndex"]].decode() == g["text"]
    assert [s["segment"]["text"] for s in got] == [parts[i] for i in sorted(kept)]
    assert [s["groundingChunkIndices"] for s in got] == [[i % 2] for i in sorted(kept)]
    again = parse_body(out)  # the rendered body is a valid answer of its own
    assert again.channels[0].text == released


# -- streams ---------------------------------------------------------------------------------


def test_grounding_metadata_early_then_re_sent_accumulated() -> None:
    chunks = [{"web": {"uri": "https://a.example/"}}]
    s1 = {"segment": {"startIndex": 0, "endIndex": 1, "partIndex": 3}, "groundingChunkIndices": [0]}
    s2 = {"segment": {"startIndex": 2, "endIndex": 3}, "groundingChunkIndices": [0]}
    held = merge_grounding(None, {"groundingChunks": chunks})
    held = merge_grounding(held, {"groundingSupports": [s1]})
    held = merge_grounding(held, {"groundingChunks": chunks, "groundingSupports": [s1, s2]})
    assert held["groundingChunks"] == chunks
    assert [s["segment"] for s in held["groundingSupports"]] == [
        {"startIndex": 0, "endIndex": 1}, {"startIndex": 2, "endIndex": 3}]
    # Sent piece by piece instead: appended.
    held = merge_grounding(merge_grounding(None, {"groundingSupports": [s2]}),
                           {"groundingSupports": [s1]})
    assert len(held["groundingSupports"]) == 2


def test_streamed_segments_index_the_accumulated_text() -> None:
    text = "Café ⚡ costs 3 €. 保証 lasts 10 years 🔋."
    b = "保证"
    full = body_with(text, [{"segment": seg(text, "保証 lasts 10 years 🔋."),
                             "groundingChunkIndices": [1]}])
    cand = full["candidates"][0]
    frames = []
    for k in range(0, len(text), 5):
        frames.append({"candidates": [{"content": {"parts": [{"text": text[k:k + 5]}]},
                                       "index": 0}]})
    frames.append({"candidates": [{"content": {"parts": [{"text": ""}]}, "index": 0,
                                   "finishReason": "STOP",
                                   "groundingMetadata": cand["groundingMetadata"]}]})
    wire = b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames)
    answer = parse_stream("gemini", [wire[i : i + 3] for i in range(0, len(wire), 3)])
    [content] = [c for c in answer.channels if c.kind == "content"]
    assert content.text == text and b not in content.text
    (s, e, c), = content.native
    assert (text[s:e], c.id) == ("保証 lasts 10 years 🔋.", "gs://kb/1")


def test_a_stream_without_a_finish_reason_is_cut_short() -> None:
    with pytest.raises(ProtocolError):
        parse_stream("gemini", [(FIXTURES / "truncated.sse").read_bytes()])
    with pytest.raises(ProtocolError):
        parse_stream("gemini", [b""])


def test_the_path_chooses_streaming() -> None:
    from gateway.protocols.gemini import Gemini

    path = Gemini().streams_by_path
    assert path("/v1beta/models/gemini-2.5-flash:streamGenerateContent")
    assert path("/v1beta/models/gemini-2.5-flash%3AstreamGenerateContent")
    assert not path("/v1beta/models/gemini-2.5-flash:generateContent")
    assert not GEMINI.request_info({"stream": True}).stream


# -- field table -----------------------------------------------------------------------------


def test_field_table_withholds_prose_and_unknown_fields() -> None:
    answer = parse_body(json.loads((FIXTURES / "unknown_field.json").read_text()))
    assert ("x_trace",) in answer.unknown_fields
    assert ("candidates", 0, "content", "parts", 1, "executableCode") in answer.unknown_fields
    grounded = parse_body(json.loads((FIXTURES / "grounded.json").read_text()))
    withheld = {p[-1] for p in grounded.unknown_fields}
    assert {"title", "text", "webSearchQueries"} <= withheld
    bad_shape = parse_body({"candidates": [], "responseId": "has spaces in it",
                            "modelVersion": {"x": 1}})
    assert "responseId" not in bad_shape.body and "modelVersion" not in bad_shape.body
    assert len(bad_shape.dropped) == 2


# -- offline verify with the shipped policy --------------------------------------------------

EXPECTED = [
    ("good.json", "released", None, None, 0),
    ("good.sse", "released", None, None, 1),  # re-framed: CRLF captures are not relayed as is
    ("hallucinated.json", "partial", "hallucinated_citation", 1, 1),
    ("grounded.json", "released", None, None, 1),
    ("grounded.sse", "released", None, None, 1),
    ("grounded_partial.json", "partial", "hallucinated_citation", 1, 1),
    ("segment_mismatch.json", "partial", "malformed_citation", 0, 1),
    ("web_number.json", "partial", "source_text_unavailable", 1, 1),
    ("thought_tool.json", "released", None, None, 1),
    ("thought_tool.sse", "released", None, None, 1),
    ("two_candidates.json", "partial", "hallucinated_citation", 3, 1),
    ("unknown_field.json", "released", None, None, 1),
    ("truncated.sse", None, None, None, 2),
    ("error_midstream.sse", None, None, None, 2),
]


@pytest.mark.parametrize(("name", "decision", "reason", "index", "code"), EXPECTED)
def test_offline_verify_over_the_fixtures(
    name: str, decision: str | None, reason: str | None, index: int | None, code: int
) -> None:
    out, err = io.StringIO(), io.StringIO()
    # The path says whether the request streams, as in the proxy.
    method = "streamGenerateContent?alt=sse" if name.endswith(".sse") else "generateContent"
    rc = verify_exchange(
        policy_path=str(SHIPPED), protocol="gemini", request_path=str(FIXTURES / "request.json"),
        response_path=str(FIXTURES / name), route_name=None, out=out, err=err,
        path=f"/v1beta/models/gemini-2.5-flash:{method}",
    )
    assert rc == code, err.getvalue()
    if decision is None:
        return
    report = json.loads(out.getvalue())
    assert (report["decision"], report["reason"], report["claim_index"]) == (
        decision, reason, index)
    if decision == "partial":
        body = report["body"]
        if isinstance(body, str):
            return
        assert "Moon" not in json.dumps(body, ensure_ascii=False)


def test_unnamed_grounding_chunks_of_two_candidates_never_share_an_id() -> None:
    from gateway.pipeline import RoutePipeline

    loaded = load_policy(str(SHIPPED))
    pipeline = RoutePipeline(loaded, loaded.policy.routes[0])
    text = "The K7 stores 13.5 kWh."
    cands = []
    for i, source in enumerate(("The K7 stores 13.5 kWh.", "The K7 stores 99 kWh.")):
        cands.append({
            "content": {"role": "model", "parts": [{"text": text}]},
            "finishReason": "STOP", "index": i,
            "groundingMetadata": {
                "groundingChunks": [{"retrievedContext": {"text": source}}],
                "groundingSupports": [{"segment": seg(text, text),
                                       "groundingChunkIndices": [0]}],
            },
        })
    body = {"candidates": cands}
    answer = pipeline.adapter.parse(body, pipeline.route)
    ctx = pipeline.context({}, body, None)
    assert set(ctx.chunks) == {"groundingChunks[0]", "candidates[1].groundingChunks[0]"}
    judgement = pipeline.judge(answer, ctx)
    assert [(c.verdict, c.reason) for c in judgement.report.claims] == [
        ("verified", None), ("failed", "number_mismatch")]


# -- grounding chunk ids: several chunks of one file, candidates of one index ---------------------


def _chunk(uri: str | None, text: str | None) -> dict[str, Any]:
    if text is None:
        return {"web": {"uri": uri}}
    rc: dict[str, Any] = {"text": text}
    if uri is not None:
        rc["uri"] = uri
    return {"retrievedContext": rc}


def _cands(*chunk_lists: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"content": {"role": "model", "parts": [{"text": "x"}]}, "index": i,
         "groundingMetadata": {"groundingChunks": chunks}}
        for i, chunks in enumerate(chunk_lists)
    ]


def test_a_uri_several_chunks_share_with_different_texts_names_none_of_them() -> None:
    from gateway.protocols.gemini.parse import grounding_ids

    same = [_chunk("gs://kb/m.pdf", "page one"), _chunk("gs://kb/m.pdf", "page two"),
            _chunk("gs://kb/other.pdf", "other")]
    assert grounding_ids(_cands(same)) == [
        ["groundingChunks[0]", "groundingChunks[1]", "gs://kb/other.pdf"]]
    # Across candidates too; a web chunk (no text) and a retrieved one of one uri differ.
    assert grounding_ids(_cands([_chunk("gs://a", "one")], [_chunk("gs://a", "two")])) == [
        ["groundingChunks[0]"], ["candidates[1].groundingChunks[0]"]]
    assert grounding_ids(_cands([_chunk("https://w/a", None), _chunk("https://w/a", "t")])) == [
        ["groundingChunks[0]", "groundingChunks[1]"]]
    # The same text under one uri (a chunk repeated) keeps the uri as its id.
    assert grounding_ids(_cands([_chunk("gs://a", "one")], [_chunk("gs://a", "one")])) == [
        ["gs://a"], ["gs://a"]]


def test_chunks_of_one_file_in_the_context_under_the_ids_supports_cite() -> None:
    from gateway.protocols.gemini.context import grounding_chunks

    text = "The K7 stores 13.5 kWh."
    body = body_with(text, [{"segment": seg(text, text), "groundingChunkIndices": [1]}])
    for c, source in zip(body["candidates"][0]["groundingMetadata"]["groundingChunks"],
                         ("The K7 stores 99 kWh.", text), strict=True):
        c["retrievedContext"].update(uri="gs://kb/manual.pdf", text=source)
    answer = parse_body(body)
    (cit,) = [c for _, _, c in answer.channels[0].native]
    chunks = {c.id: c.text for c in grounding_chunks(body)}
    assert cit.id == "groundingChunks[1]" and chunks[cit.id] == text
    assert "gs://kb/manual.pdf" not in chunks


@pytest.mark.parametrize("indices", [(0, 0), (None, 0), (1, None), (3, 3)])
def test_candidates_of_one_number_are_refused(indices: tuple[int | None, int | None]) -> None:
    cands = _cands([_chunk(None, "a")], [_chunk(None, "b")])
    for cand, index in zip(cands, indices, strict=True):
        if index is None:
            del cand["index"]
        else:
            cand["index"] = index
    with pytest.raises(ProtocolError, match="same index"):
        parse_body({"candidates": cands})


@pytest.mark.parametrize("index", [False, True, None, -1, "0", 0.0, 64])
def test_a_candidate_index_that_is_no_index_is_refused_as_a_stream_refuses_it(
    index: object,
) -> None:
    """`false` would pass for 0 in the body while the stream refuses it: both refuse."""
    cands = _cands([_chunk(None, "a")])
    cands[0]["index"] = index
    with pytest.raises(ProtocolError, match="candidate index"):
        parse_body({"candidates": cands})


@pytest.mark.parametrize("where", ["candidate", "chunk"])
def test_a_candidate_or_chunk_that_is_no_object_is_refused(where: str) -> None:
    """The field table would drop it and shift the positions chunk ids count."""
    cands: list[Any] = _cands([_chunk(None, "a"), _chunk(None, "b")])
    if where == "candidate":
        cands.insert(0, None)
    else:
        cands[0]["groundingMetadata"]["groundingChunks"].insert(0, "junk")
    with pytest.raises(ProtocolError, match="not an object"):
        parse_body({"candidates": cands})


def test_stream_grounding_chunks_join_the_context_when_the_stream_ends() -> None:
    """Ids depend on every chunk of the answer: a uri that looked unique when candidate 0's
    chunks came is shared once candidate 1's come, and neither text is bound under it."""
    from gateway.policy import ContextSpec
    from gateway.sse import SSEEvent
    from gateway.types import ContextSet

    parser = GEMINI.stream_parser(None)  # type: ignore[arg-type]
    ctx = ContextSet()
    parser.bind_context(ctx, ContextSpec())  # every source, `response` among them
    for i, source in enumerate(("The K7 stores 13.5 kWh.", "The K7 stores 99 kWh.")):
        chunk = {"candidates": [{
            "content": {"role": "model", "parts": [{"text": "x"}]}, "index": i,
            "finishReason": "STOP",
            "groundingMetadata": {"groundingChunks": [_chunk("gs://kb/m.pdf", source)]}}]}
        parser.feed(SSEEvent(data=json.dumps(chunk)))
        assert not ctx.chunks
    parser.finish()
    assert {k: c.text for k, c in ctx.chunks.items()} == {
        "groundingChunks[0]": "The K7 stores 13.5 kWh.",
        "candidates[1].groundingChunks[0]": "The K7 stores 99 kWh."}

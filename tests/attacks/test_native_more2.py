"""Native citations that name the wrong source, or outlive the claim they cite.

Gemini: a grounding support that failed on text that is no claim (a list marker) must leave a
partial answer with the claim it cites; grounding chunks that share a URI (several chunks of one
file, the usual Vertex AI Search / RAG Engine shape) are each checked against their own text;
two candidates with one `index` are ambiguous. Anthropic: `content_block_location` indices count
every block of a custom-content document, images too. Controls show the same shapes with correct
citations still released, across json / buffer / progressive.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.demo import wire
from tests.attacks.conftest import run_case
from tests.attacks.harness import GatewayProcess, RawResponse
from tests.attacks.protocols import ANTHROPIC, QUESTION, REGISTRY, Mode, _an_request
from tests.attacks.test_channels import assert_failed_closed
from tests.attacks.test_native_more import _block_start, _d, _start, _stop, _tail
from tests.upstream_app import FakeUpstream, Json, Stream, sse_events

Up = tuple[str, FakeUpstream]
Obj = dict[str, Any]

GEMINI = REGISTRY["gemini"]
MODES: list[Mode] = ["json", "buffer", "progressive"]
HEAD = {"modelVersion": "fake-model", "responseId": "resp-native2"}
USAGE = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}

T = "The Orbit pump moves 40 litres per minute."
WRONG = "The Orbit pump moves 99 litres per minute."
FILE = "gs://kb/manual.pdf"


# -- gemini helpers ---------------------------------------------------------------------------


def _seg(text: str, sub: str) -> Obj:
    at = text.index(sub)
    start = len(text[:at].encode())
    return {"startIndex": start, "endIndex": start + len(sub.encode()), "text": sub}


def _cand(text: str, gm: Obj | None, index: int | None = 0) -> Obj:
    c: Obj = {"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": "STOP"}
    if index is not None:
        c["index"] = index
    if gm is not None:
        c["groundingMetadata"] = gm
    return c


def _body(*cands: Obj) -> Obj:
    return {"candidates": list(cands), "usageMetadata": dict(USAGE), **HEAD}


def _frames(body: Obj, piece: int = 9) -> bytes:
    """`body` as a stream: each candidate's text in pieces, its metadata with the last chunk."""
    out: list[Obj] = []
    for pos, cand in enumerate(body["candidates"]):
        index = cand.get("index", pos)
        text = cand["content"]["parts"][0]["text"]
        for i in range(0, len(text), piece):
            part = {"text": text[i : i + piece]}
            out.append({"candidates": [{"content": {"role": "model", "parts": [part]},
                                        "index": index}], **HEAD})
    last = []
    for pos, cand in enumerate(body["candidates"]):
        tail = {k: v for k, v in cand.items() if k != "content"}
        tail["index"] = cand.get("index", pos)
        last.append(tail)
    out.append({"candidates": last, "usageMetadata": dict(USAGE), **HEAD})
    return b"".join(
        b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\n\n" for c in out
    )


def _gemini(gw: GatewayProcess, up: Up, mode: Mode, body: Obj) -> RawResponse:
    if mode == "json":
        return run_case(gw, up, GEMINI, mode, Json(body))
    return run_case(gw, up, GEMINI, mode, Stream([_frames(body)], seed=5, max_piece=61))


def _out(resp: RawResponse) -> list[Obj]:
    """The client's candidates (a stream accumulated): index, text and grounding metadata."""
    ctype = resp.header("content-type") or ""
    if "event-stream" not in ctype:
        return [
            {"index": c.get("index"),
             "text": "".join(p.get("text", "") for p in c["content"]["parts"]
                             if not p.get("thought")),
             "gm": c.get("groundingMetadata")}
            for c in resp.json().get("candidates", [])
        ]
    texts: dict[int, str] = {}
    gms: dict[int, Obj] = {}
    for _, data in sse_events(resp.body):
        obj = json.loads(data)
        for c in obj.get("candidates") or []:
            i = c.get("index", 0)
            texts.setdefault(i, "")
            for p in (c.get("content") or {}).get("parts") or []:
                if isinstance(p.get("text"), str) and not p.get("thought"):
                    texts[i] += p["text"]
            if "groundingMetadata" in c:
                gms[i] = c["groundingMetadata"]
    return [{"index": i, "text": texts[i], "gm": gms.get(i)} for i in sorted(texts)]


def _released(resp: RawResponse) -> bool:
    """Released whole: a progressive stream's header says only that it streamed, so the
    caller checks its text as well."""
    return resp.status == 200 and resp.header("x-citewarden-decision") in (
        "released", "progressive")


def _supports(cand: Obj) -> list[Obj]:
    return list((cand["gm"] or {}).get("groundingSupports") or [])


# -- F1: a failed support on a list marker ------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_gemini_failed_support_on_a_list_marker_leaves_the_partial_answer(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """The support on "- " cites a chunk that does not exist: it fails as a claim of its own,
    and must not stay in the partial answer just because the kept list item (widened to its
    marker) contains its span. The support of the kept claim stays, re-indexed."""
    text = f"- {T}"
    gm = {"groundingChunks": [{"retrievedContext": {"uri": "gs://kb/a", "text": T}}],
          "groundingSupports": [
              {"segment": _seg(text, "- "), "groundingChunkIndices": [7]},
              {"segment": _seg(text, T), "groundingChunkIndices": [0]}]}
    resp = _gemini(gateway, upstream, mode, _body(_cand(text, gm)))
    assert resp.status == 200, resp.body
    want = "progressive" if mode == "progressive" else "partial"
    assert resp.header("x-citewarden-decision") == want, resp.body
    (cand,) = _out(resp)
    assert cand["text"].startswith(f"- {T}\n\n"), cand  # the item, then the disclosure
    sups = _supports(cand)
    assert [s["groundingChunkIndices"] for s in sups] == [[0]], sups
    seg = sups[0]["segment"]
    raw = cand["text"].encode()
    assert raw[seg["startIndex"] : seg["endIndex"]].decode() == seg["text"] == T


# -- F2: grounding chunks that share a URI, candidates that share an index -----------------------


def _same_file(first: str, second: str, cite: int) -> Obj:
    gm = {"groundingChunks": [{"retrievedContext": {"uri": FILE, "text": first}},
                              {"retrievedContext": {"uri": FILE, "text": second}}],
          "groundingSupports": [{"segment": _seg(T, T), "groundingChunkIndices": [cite]}]}
    return _body(_cand(T, gm))


@pytest.mark.parametrize("mode", MODES)
def test_gemini_chunks_of_one_file_are_each_checked_against_their_own_text(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Chunk 1 says 99 litres: the claim citing it is not released, though chunk 0 (same
    URI) says 40."""
    resp = _gemini(gateway, upstream, mode, _same_file(T, WRONG, 1))
    assert resp.status == 200, resp.body
    assert resp.header("x-citewarden-decision") != "released", resp.body
    assert all(T not in c["text"] for c in _out(resp)), resp.body


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("first", "second", "cite"), [(T, WRONG, 0), (WRONG, T, 1)])
def test_gemini_chunks_of_one_file_control_right_chunk_released(
    gateway: GatewayProcess, upstream: Up, mode: Mode, first: str, second: str, cite: int
) -> None:
    """The claim citing the chunk that says it is released, whichever position that chunk has
    in a list of chunks of one file (the second position was abstained before)."""
    resp = _gemini(gateway, upstream, mode, _same_file(first, second, cite))
    assert _released(resp), resp.body
    (cand,) = _out(resp)
    assert cand["text"] == T
    assert [s["groundingChunkIndices"] for s in _supports(cand)] == [[cite]]


@pytest.mark.parametrize("mode", MODES)
def test_gemini_one_uri_in_two_candidates_is_checked_per_candidate(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Candidate 0's chunk of the file says 40, candidate 1's says 99: candidate 1's claim of
    40 citing its own chunk is not released; candidate 0's (the control) is."""
    gm0 = {"groundingChunks": [{"retrievedContext": {"uri": FILE, "text": T}}],
           "groundingSupports": [{"segment": _seg(T, T), "groundingChunkIndices": [0]}]}
    gm1 = {"groundingChunks": [{"retrievedContext": {"uri": FILE, "text": WRONG}}],
           "groundingSupports": [{"segment": _seg(T, T), "groundingChunkIndices": [0]}]}
    resp = _gemini(gateway, upstream, mode, _body(_cand(T, gm0, 0), _cand(T, gm1, 1)))
    assert resp.status == 200, resp.body
    out = {c["index"]: c["text"] for c in _out(resp)}
    assert T in out[0], resp.body
    assert T not in out.get(1, ""), resp.body


@pytest.mark.parametrize(
    "indices", [(0, 0), (None, 0), (1, None)], ids=["same", "absent-then-0", "1-then-absent"]
)
def test_gemini_candidates_sharing_an_index_are_refused(
    gateway: GatewayProcess, upstream: Up, indices: tuple[int | None, int | None]
) -> None:
    """Two candidates numbered alike (an absent `index` is the candidate's position) would
    share their unnamed chunks' ids: the answer is ambiguous, 502."""
    gm_a = {"groundingChunks": [{"retrievedContext": {"text": T}}], "groundingSupports": []}
    gm_b = {"groundingChunks": [{"retrievedContext": {"text": WRONG}}],
            "groundingSupports": [{"segment": _seg(T, T), "groundingChunkIndices": [0]}]}
    a, b = indices
    resp = _gemini(gateway, upstream, "json",
                   _body(_cand("Hello there.", gm_a, a), _cand(T, gm_b, b)))
    assert resp.status == 502, resp.body
    assert T.encode() not in resp.body


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_gemini_one_stream_chunk_naming_a_candidate_twice_is_refused(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Two candidates of one `index` in one stream chunk, as in a JSON body: merged, they would
    be judged as a text the client's SDK never assembles (it reads a chunk's candidates by
    position). 502 buffered; progressive, no clean end."""
    two = {"candidates": [{"content": {"role": "model", "parts": [{"text": T}]}, "index": 0},
                          {"content": {"role": "model", "parts": [{"text": " " + T}]},
                           "index": 0}], **HEAD}
    end = {"candidates": [{"content": {"role": "model", "parts": [{"text": ""}]},
                           "finishReason": "STOP", "index": 0}],
           "usageMetadata": dict(USAGE), **HEAD}
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in (two, end))
    resp = run_case(gateway, upstream, GEMINI, mode, Stream([raw], seed=5, max_piece=61))
    assert_failed_closed(GEMINI, mode, resp)


def test_gemini_candidates_with_distinct_indices_control(
    gateway: GatewayProcess, upstream: Up
) -> None:
    """Two candidates numbered 0 and 1, each citing its own unnamed chunk 0: candidate 0's
    (40) is released, candidate 1's (99) is not."""
    gm_a = {"groundingChunks": [{"retrievedContext": {"text": T}}],
            "groundingSupports": [{"segment": _seg(T, T), "groundingChunkIndices": [0]}]}
    gm_b = {"groundingChunks": [{"retrievedContext": {"text": WRONG}}],
            "groundingSupports": [{"segment": _seg(T, T), "groundingChunkIndices": [0]}]}
    resp = _gemini(gateway, upstream, "json", _body(_cand(T, gm_a, 0), _cand(T, gm_b, 1)))
    assert resp.status == 200, resp.body
    out = {c["index"]: c["text"] for c in _out(resp)}
    assert out[0].startswith(T) and T not in out[1]


# -- F3: anthropic content_block_location over a document with an image --------------------------

A = "The Orbit pump moves 40 litres per minute."
B = "Its housing is rated to 6 bar."
IMAGE = {"type": "image",
         "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def _doc_request(stream: bool) -> Obj:
    doc = {"type": "document", "title": "Pump manual", "citations": {"enabled": True},
           "source": {"type": "content", "content": [
               {"type": "text", "text": A}, IMAGE, {"type": "text", "text": B}]}}
    return _an_request(QUESTION, stream, messages=[
        {"role": "user", "content": [doc, {"type": "text", "text": QUESTION}]}])


def _block_cit(cited: str, start: int, end: int) -> Obj:
    return {"type": "content_block_location", "cited_text": cited, "document_index": 0,
            "document_title": "Pump manual", "start_block_index": start, "end_block_index": end}


def _anthropic(gw: GatewayProcess, up: Up, mode: Mode, text: str, cit: Obj) -> RawResponse:
    if mode == "json":
        msg = {"id": "msg_native2", "type": "message", "role": "assistant",
               "model": "claude-fake", "content": [{"type": "text", "text": text,
                                                    "citations": [cit]}],
               "stop_reason": "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": 5, "output_tokens": 5}}
        return run_case(gw, up, ANTHROPIC, mode, Json(msg), request=_doc_request(False))
    events = [_start(), _block_start(0, {"type": "text", "text": ""}),
              _d(0, {"type": "citations_delta", "citation": cit}),
              _d(0, {"type": "text_delta", "text": text}), _stop(0), *_tail()]
    frames = b"".join(wire.anthropic_frames([(e["type"], e) for e in events]))
    return run_case(gw, up, ANTHROPIC, mode, Stream([frames], seed=3, max_piece=97, delay=0.0),
                    request=_doc_request(True))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("cited", "start", "end"), [(B, 1, 2), (A, 1, 2), (A + B, 0, 2), ("", 1, 2)],
    ids=["image-as-B", "image-as-A", "A-and-image-as-A-and-B", "image-empty"],
)
def test_anthropic_block_indices_count_the_image(
    gateway: GatewayProcess, upstream: Up, mode: Mode, cited: str, start: int, end: int
) -> None:
    """Block 1 is the image: a citation of it whose cited_text is a text block's is no
    citation of that text, a range of A and the image does not hold B, and an image alone
    (empty cited_text) is no evidence: none is released."""
    text = "The housing is rated to 6 bar."
    resp = _anthropic(gateway, upstream, mode, text, _block_cit(cited, start, end))
    assert resp.header("x-citewarden-decision") != "released", resp.body
    assert text not in ANTHROPIC.answer_text(resp), resp.body


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("text", "cited", "start", "end"), [
    ("The housing is rated to 6 bar.", B, 2, 3),
    ("The Orbit pump moves 40 litres per minute.", A, 0, 1),
    ("The housing is rated to 6 bar.", B, 1, 3),
], ids=["B-at-2", "A-at-0", "image-then-B"])
def test_anthropic_block_indices_control_true_index_released(
    gateway: GatewayProcess, upstream: Up, mode: Mode, text: str, cited: str, start: int,
    end: int
) -> None:
    """The real positions (the image counted, contributing no text) are released."""
    resp = _anthropic(gateway, upstream, mode, text, _block_cit(cited, start, end))
    assert _released(resp), resp.body
    assert ANTHROPIC.answer_text(resp) == text, resp.body


@pytest.mark.parametrize("mode", MODES)
def test_anthropic_failed_citation_on_a_list_marker_leaves_the_partial_answer(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """The anthropic twin of the gemini case: a citation on the "- " block fails (its
    cited_text is in no document) as a claim of its own; the kept item's span covers that
    block, yet the block keeps only citations of the kept claim."""
    bad = {"type": "char_location", "cited_text": "The pump was designed in 1931.",
           "document_index": 0, "document_title": "Pump manual",
           "start_char_index": 0, "end_char_index": 30}
    good = _block_cit(A, 0, 1)
    blocks = [{"type": "text", "text": "- ", "citations": [bad]},
              {"type": "text", "text": A, "citations": [good]}]
    if mode == "json":
        msg = {"id": "msg_native2", "type": "message", "role": "assistant",
               "model": "claude-fake", "content": blocks, "stop_reason": "end_turn",
               "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 5}}
        resp = run_case(gateway, upstream, ANTHROPIC, mode, Json(msg),
                        request=_doc_request(False))
    else:
        events = [_start()]
        for i, b in enumerate(blocks):
            events += [_block_start(i, {"type": "text", "text": ""}),
                       _d(i, {"type": "citations_delta", "citation": b["citations"][0]}),
                       _d(i, {"type": "text_delta", "text": b["text"]}), _stop(i)]
        events += _tail()
        frames = b"".join(wire.anthropic_frames([(e["type"], e) for e in events]))
        resp = run_case(gateway, upstream, ANTHROPIC, mode,
                        Stream([frames], seed=3, max_piece=97, delay=0.0),
                        request=_doc_request(True))
    assert resp.status == 200, resp.body
    assert b"1931" not in resp.body, resp.body
    assert A in ANTHROPIC.answer_text(resp), resp.body
    if mode != "progressive":
        assert resp.header("x-citewarden-decision") == "partial", resp.body
        assert b"content_block_location" in resp.body, resp.body  # the kept claim's citation

"""cohere-chat shapes the matrix does not cover: `logprobs` entries whose `token_ids` /
`logprobs` are not numbers, a citation that reaches a progressive stream after its claim went
out, content items started out of index order, and a chunk tag that shares a document's id
with another text. Each is dropped, withheld or refused; controls show the same shapes with
correct content still go out."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests import cohere_wire as w
from tests.attacks.cohere_spec import _body as co_body
from tests.attacks.cohere_spec import _events as co_events
from tests.attacks.cohere_spec import _framed as co_framed
from tests.attacks.conftest import run_case
from tests.attacks.harness import MARKER, GatewayProcess, assert_no_leak
from tests.attacks.protocols import CHUNK_TEXT, GOOD, REGISTRY, Mode
from tests.upstream_app import FakeUpstream, Json, Stream

Up = tuple[str, FakeUpstream]
Obj = dict[str, Any]

COHERE = REGISTRY["cohere-chat"]
MODES: list[Mode] = ["json", "buffer", "progressive"]
STREAM_MODES: list[Mode] = ["buffer", "progressive"]
_ID = "9d2c7a10-aaaa-4bbb-8ccc-0123456789ab"
_USAGE = {"billed_units": {"input_tokens": 5, "output_tokens": 5}}
_END = {"type": "message-end", "delta": {"finish_reason": "COMPLETE", "usage": _USAGE}}


def _stream(frames: list[bytes]) -> Stream:
    return Stream(b"".join(frames), seed=7, max_piece=97, delay=0.0)


def _start() -> Obj:
    return {"id": _ID, "type": "message-start", "delta": {"message": {
        "role": "assistant", "content": [], "tool_plan": "", "tool_calls": [], "citations": []}}}


def _content_start(i: int) -> Obj:
    return {"type": "content-start", "index": i,
            "delta": {"message": {"content": {"type": "text", "text": ""}}}}


def _delta(i: int, text: str) -> Obj:
    return {"type": "content-delta", "index": i,
            "delta": {"message": {"content": {"text": text}}}}


def _citation(j: int, text: str, start: int, end: int, source: str) -> list[Obj]:
    c = {"start": start, "end": end, "text": text[start:end],
         "sources": [{"type": "document", "id": source}], "type": "TEXT_CONTENT",
         "content_index": 0}
    return [{"type": "citation-start", "index": j, "delta": {"message": {"citations": c}}},
            {"type": "citation-end", "index": j}]


def _citations_sent(raw: bytes) -> list[Obj]:
    return [e["delta"]["message"]["citations"] for e in w.sse_data(raw)
            if e.get("type") == "citation-start"]


# -- logprobs: entries of another shape ------------------------------------------------------------

# One entry per text piece, its `text` right; the rest of its shape is what is under test.
LOGPROB_SHAPES: dict[str, Any] = {
    "token-ids-prose": lambda t: {"text": t, "token_ids": [1, f"{MARKER} was here"],
                                  "logprobs": [-0.1, -0.2]},
    "logprobs-object": lambda t: {"text": t, "token_ids": [1],
                                  "logprobs": {"note": f"{MARKER} designed it"}},
    "logprobs-prose": lambda t: {"text": t, "token_ids": [1], "logprobs": [f"{MARKER} x"]},
    "lengths-differ": lambda t: {"text": t, "token_ids": [1, 2, 3],
                                 "logprobs": [-0.1, -0.2, -0.3, f"{MARKER}"]},
    "extra-key": lambda t: {"text": t, "token_ids": [1], "logprobs": [-0.1],
                            "note": f"{MARKER} designed it"},
    "token-ids-bool": lambda t: {"text": t, "token_ids": [True], "logprobs": [-0.1],
                                 "top": f"{MARKER}"},
    "entry-not-object": lambda t: f"{MARKER} designed it",
}


def _logprob_case(mode: Mode, shape: str) -> Json | Stream:
    make = LOGPROB_SHAPES[shape]
    if mode == "json":
        body = co_body(GOOD)
        body["logprobs"] = [make(GOOD)]
        return Json(body)
    events = copy.deepcopy(co_events(co_body(GOOD)))
    for e in events:
        if e["type"] == "content-delta":
            e["logprobs"] = make(e["delta"]["message"]["content"]["text"])
    return _stream(co_framed(events))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(LOGPROB_SHAPES))
def test_cohere_logprob_entries_of_another_shape_are_dropped(
    gateway: GatewayProcess, upstream: Up, mode: Mode, shape: str
) -> None:
    resp = run_case(gateway, upstream, COHERE, mode, _logprob_case(mode, shape))
    assert_no_leak(resp)
    assert resp.status == 200 and resp.header("x-citewarden-decision") in (
        "released", "progressive")


def _clean_logprob(text: str) -> Obj:
    return {"text": text, "token_ids": list(range(len(text))),
            "logprobs": [-0.5] * len(text)}


def test_cohere_clean_logprobs_still_go_out(gateway: GatewayProcess, upstream: Up) -> None:
    body = co_body(GOOD)
    body["logprobs"] = [_clean_logprob(GOOD[:20]), _clean_logprob(GOOD[20:])]
    resp = run_case(gateway, upstream, COHERE, "json", Json(body))
    assert resp.header("x-citewarden-decision") == "released"
    assert resp.json()["logprobs"] == body["logprobs"]
    events = copy.deepcopy(co_events(co_body(GOOD)))
    for e in events:
        if e["type"] == "content-delta":
            e["logprobs"] = _clean_logprob(e["delta"]["message"]["content"]["text"])
    frames = co_framed(events)
    resp = run_case(gateway, upstream, COHERE, "buffer", _stream(frames))
    assert resp.header("x-citewarden-decision") == "released"
    assert resp.body == b"".join(frames)  # relayed as the upstream sent it


# -- progressive: a citation after its claim went out ---------------------------------------------

G2 = " The Orbit pump moves 40 litres per minute."
LATE_SOURCES = {
    "prose-id": f"{MARKER} designed the Orbit pump in 1931",
    "id-not-in-context": f"{MARKER}:404",
}


# Where the late citation lies: inside the first claim, or on the space between the claims
# (no claim's span: the claims are judged without it).
LATE_SPANS = {"claim": (4, 14), "gap": (len(GOOD), len(GOOD) + 1)}


def _late(source: str, where: str, span: str = "claim") -> list[bytes]:
    text = GOOD + G2
    events = [_start(), _content_start(0),
              _delta(0, GOOD), *_citation(0, text, 0, len(GOOD), "kb:1"),
              _delta(0, G2), *_citation(1, text, len(GOOD) + 1, len(text), "kb:1")]
    late = _citation(2, text, *LATE_SPANS[span], source)
    if where == "before-end":
        events += late
    events.append({"type": "content-end", "index": 0})
    if where == "after-end":
        events += late
    events.append(_END)
    return co_framed(events)


@pytest.mark.parametrize("mode", STREAM_MODES)
@pytest.mark.parametrize("where", ["before-end", "after-end"])
@pytest.mark.parametrize("span", list(LATE_SPANS))
@pytest.mark.parametrize("source", list(LATE_SOURCES))
def test_cohere_late_citation_with_an_unverified_source_never_goes_out(
    gateway: GatewayProcess, upstream: Up, mode: Mode, where: str, span: str, source: str
) -> None:
    frames = _late(LATE_SOURCES[source], where, span)
    assert_no_leak(run_case(gateway, upstream, COHERE, mode, _stream(frames)))


@pytest.mark.parametrize("where", ["before-end", "after-end"])
def test_cohere_late_citation_of_a_verified_source_still_goes_out(
    gateway: GatewayProcess, upstream: Up, where: str
) -> None:
    resp = run_case(gateway, upstream, COHERE, "progressive", _stream(_late("kb:1", where)))
    assert resp.header("x-citewarden-decision") == "progressive"
    spans = [(c["start"], c["end"], c["sources"][0]["id"]) for c in _citations_sent(resp.body)]
    text = GOOD + G2
    assert spans == [(0, len(GOOD), "kb:1"), (len(GOOD) + 1, len(text), "kb:1"), (4, 14, "kb:1")]


def test_cohere_progressive_citations_still_go_out_with_their_claims(
    gateway: GatewayProcess, upstream: Up
) -> None:
    body = w.body(GOOD, [w.cite(GOOD, GOOD, "kb:1")], id=_ID)
    resp = run_case(gateway, upstream, COHERE, "progressive",
                    _stream(co_framed(co_events(body))))
    assert resp.header("x-citewarden-decision") == "progressive"
    assert [(c["start"], c["end"]) for c in _citations_sent(resp.body)] == [(0, len(GOOD))]


# -- content items out of index order ------------------------------------------------------------

T1 = f"The Orbit pump was designed by {MARKER}. The pump is painted blue today."


def _out_of_order(first: int, second: int) -> list[bytes]:
    return co_framed([
        _start(),
        _content_start(first), _delta(first, T1),
        _content_start(second), _delta(second, GOOD),
        *_citation(0, GOOD, 0, len(GOOD), "kb:1"),
        {"type": "content-end", "index": first}, {"type": "content-end", "index": second},
        _END,
    ])


@pytest.mark.parametrize("mode", STREAM_MODES)
@pytest.mark.parametrize("order", [(1, 0), (0, 2)])
def test_cohere_content_items_out_of_index_order_fail_closed(
    gateway: GatewayProcess, upstream: Up, mode: Mode, order: tuple[int, int]
) -> None:
    resp = run_case(gateway, upstream, COHERE, mode, _stream(_out_of_order(*order)))
    assert_no_leak(resp)
    if mode == "buffer":
        assert resp.status == 502
    else:
        last = w.sse_data(resp.body)[-1]
        assert last["type"] == "message-end" and last["delta"]["finish_reason"] == "ERROR"
        assert "is not the next one" in last["delta"]["error"]


# -- a chunk tag and a document sharing an id ------------------------------------------------------

WRONG = "The Orbit pump moves 99 litres per minute."
WRONG_TAG = f'<chunk id="kb:1">{WRONG}</chunk>'
SAME_TAG = f'<chunk id="kb:1">{CHUNK_TEXT}</chunk>'


def _collision_request(place: str, tag: str) -> Obj:
    doc = {"id": "kb:1", "data": CHUNK_TEXT}
    messages: list[Obj] = [{"role": "user", "content": "How fast is the Orbit pump?"}]
    documents: list[Any] = [doc]
    if place == "system":
        messages.insert(0, {"role": "system", "content": tag})
    elif place == "other-document":
        documents.append({"id": "kb:2", "data": f"See also {tag}"})
    elif place == "tool-text":
        messages += [
            {"role": "assistant", "tool_calls": [w.tool_call("lookup_1", "lookup", {})]},
            {"role": "tool", "tool_call_id": "lookup_1",
             "content": [{"type": "text", "text": tag}]},
        ]
    elif place == "tool-document":
        documents = []
        messages.insert(0, {"role": "system", "content": tag})
        messages += [
            {"role": "assistant", "tool_calls": [w.tool_call("lookup_1", "lookup", {})]},
            {"role": "tool", "tool_call_id": "lookup_1",
             "content": [{"type": "document", "document": doc}]},
        ]
    elif place == "two-tags":
        documents = []
        messages.insert(0, {"role": "system", "content": f"{SAME_TAG}\n{tag}"})
    return {"model": "command-a-03-2025", "messages": messages, "documents": documents}


PLACES = ["system", "other-document", "tool-text", "tool-document", "two-tags"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("answer", [WRONG, CHUNK_TEXT])
def test_cohere_an_id_a_chunk_tag_and_a_document_give_different_texts_names_neither(
    gateway: GatewayProcess, upstream: Up, place: str, answer: str
) -> None:
    body = w.body(answer, [w.cite(answer, answer, "kb:1")], id=_ID)
    resp = run_case(gateway, upstream, COHERE, "json", Json(body),
                    request=_collision_request(place, WRONG_TAG))
    # Either text may be the one the model read: a claim citing kb:1 verifies against neither.
    assert resp.header("x-citewarden-decision") != "released"
    assert answer not in resp.body.decode()


@pytest.mark.parametrize("place", PLACES)
def test_cohere_a_chunk_tag_repeating_a_document_still_verifies(
    gateway: GatewayProcess, upstream: Up, place: str
) -> None:
    body = w.body(CHUNK_TEXT, [w.cite(CHUNK_TEXT, CHUNK_TEXT, "kb:1")], id=_ID)
    resp = run_case(gateway, upstream, COHERE, "json", Json(body),
                    request=_collision_request(place, SAME_TAG))
    assert resp.header("x-citewarden-decision") == "released"
    assert resp.json()["message"]["content"][0]["text"] == CHUNK_TEXT

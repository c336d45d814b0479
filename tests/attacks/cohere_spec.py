"""The cohere-chat entry of the adversarial matrix: `/v2/chat` requests, bodies and event
streams, and the plants only this protocol has (tool plan, thinking items, span citations and
their sources, unknown events, an errored `message-end`)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from tests import cohere_wire as w
from tests.attacks.harness import RawResponse
from tests.attacks.protocols import (
    BAD,
    CHUNK_ID,
    CHUNK_TEXT,
    CONTEXT_TAG,
    GOOD,
    PIECE,
    PLANTED_TAG,
    Plant,
    ProtocolSpec,
    _sse_line_plants,
)
from tests.upstream_app import sse_objects

Json = dict[str, Any]
_ID = "9d2c7a10-aaaa-4bbb-8ccc-0123456789ab"


def _request(
    question: str, stream: bool, messages: list[Json] | None = None, documents: Any = None
) -> Json:
    msgs = messages if messages is not None else [
        {"role": "system", "content": CONTEXT_TAG}, {"role": "user", "content": question}]
    req: Json = {"model": "command-a-03-2025", "messages": msgs}
    if documents is not None:
        req["documents"] = documents
    if stream:
        req["stream"] = True
    return req


def _body(text: str) -> Json:
    return w.body(text, id=_ID)


def _events(body: Json) -> list[Json]:
    return w.sse_data(w.events(body, chunk=PIECE))


def _framed(events: list[Json]) -> list[bytes]:
    return [w.frame(e) for e in events]


def _frames(text: str) -> list[bytes]:
    return _framed(_events(_body(text)))


def _answer_text(resp: RawResponse) -> str:
    if "event-stream" in (resp.header("content-type") or ""):
        out = []
        for obj in sse_objects(resp.body):
            if obj.get("type") == "content-delta":
                piece = (((obj.get("delta") or {}).get("message") or {}).get("content") or {})
                if isinstance(piece.get("text"), str):
                    out.append(piece["text"])
        return "".join(out)
    try:
        content = resp.json()["message"]["content"]
        return next(str(c["text"]) for c in content if c.get("type") == "text")
    except (ValueError, KeyError, TypeError, StopIteration):
        return ""


def _mut(fn: Callable[[Json], None], text: str = GOOD) -> Callable[[], object]:
    def build() -> object:
        body = copy.deepcopy(_body(text))
        fn(body)
        return body

    return build


def _stream_mut(fn: Callable[[list[Json]], None], text: str = GOOD) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        events = _events(_body(text))
        fn(events)
        return _framed(events)

    return build


def _at(events: list[Json], etype: str) -> int:
    return next(i for i, e in enumerate(events) if e["type"] == etype)


def _insert_before_end(*new: Json) -> Callable[[list[Json]], None]:
    def fn(events: list[Json]) -> None:
        at = _at(events, "message-end")
        events[at:at] = list(new)

    return fn


def _citation(**over: Any) -> Json:
    c = w.cite(GOOD, "40 litres per minute", CHUNK_ID)
    c.update(over)
    return c


def _with_citation(c: Json) -> Plant:
    def json_fn(body: Json) -> None:
        body["message"]["citations"] = [c]

    start = {"type": "citation-start", "index": 0, "delta": {"message": {"citations": c}}}
    end = {"type": "citation-end", "index": 0}

    def stream_fn(events: list[Json]) -> None:
        at = _at(events, "content-end")
        events[at:at] = [start, end]

    return Plant(json=_mut(json_fn), stream=_stream_mut(stream_fn))


def _plants() -> dict[str, Plant]:
    def thinking_json(body: Json) -> None:
        body["message"]["content"].append({"type": "thinking", "thinking": BAD})

    thinking_events = [
        {"type": "content-start", "index": 1,
         "delta": {"message": {"content": {"type": "thinking", "thinking": ""}}}},
        {"type": "content-delta", "index": 1, "delta": {"message": {"content": {"thinking": BAD}}}},
        {"type": "content-end", "index": 1},
    ]
    call = w.tool_call("lookup_1", "lookup", {"note": BAD})
    call_events = [
        {"type": "tool-call-start", "index": 0, "delta": {"message": {"tool_calls": {
            "id": "lookup_1", "type": "function",
            "function": {"name": "lookup", "arguments": ""}}}}},
        {"type": "tool-call-delta", "index": 0, "delta": {"message": {"tool_calls": {
            "function": {"arguments": call["function"]["arguments"]}}}}},
        {"type": "tool-call-end", "index": 0},
    ]
    named = {"id": "lookup_2", "type": "function", "function": {"name": BAD, "arguments": "{}"}}
    plants: dict[str, Plant] = {
        "content-hallucinated": Plant(json=lambda: _body(f"{GOOD} {BAD}"),
                                      stream=lambda: _frames(f"{GOOD} {BAD}")),
        # Parsers stop at the first message-end: a second answer after it was never verified.
        "stream-after-end": Plant(stream=lambda: [*_frames(GOOD), *_frames(f"{GOOD} {BAD}")]),
        "top-level-unknown-key": Plant(
            json=_mut(lambda b: b.__setitem__("x_trace", BAD)),
            stream=_stream_mut(lambda es: es[0].__setitem__("x_trace", BAD)),
        ),
        "message-unknown-key": Plant(
            json=_mut(lambda b: b["message"].__setitem__("x_note", BAD)),
            stream=_stream_mut(lambda es: es[0]["delta"]["message"].__setitem__("x_note", BAD)),
        ),
        "tool-plan": Plant(
            json=_mut(lambda b: b["message"].__setitem__("tool_plan", BAD)),
            stream=_stream_mut(lambda es: es.insert(1, {
                "type": "tool-plan-delta", "delta": {"message": {"tool_plan": BAD}}})),
        ),
        "thinking-item": Plant(json=_mut(thinking_json),
                               stream=_stream_mut(_insert_before_end(*thinking_events))),
        "tool-call-arguments": Plant(
            json=_mut(lambda b: b["message"].__setitem__("tool_calls", [call])),
            stream=_stream_mut(lambda es: es.__setitem__(slice(1, 1), call_events)),
        ),
        "tool-call-name": Plant(
            json=_mut(lambda b: b["message"].__setitem__("tool_calls", [named]))),
        "unknown-content-type": Plant(json=_mut(lambda b: b["message"]["content"].append(
            {"type": "image", "url": f"https://x.example/{BAD}"}))),
        "citation-unknown-key": _with_citation(_citation(x_note=BAD)),
        "citation-source-echo": _with_citation(
            _citation(sources=[{"type": "document", "id": CHUNK_ID, "document": {"t": BAD}}])),
        "citation-tool-output": _with_citation(
            _citation(sources=[{"type": "tool", "id": CHUNK_ID, "tool_output": {"t": BAD}}])),
        "citation-text-not-the-span": _with_citation(_citation(text=BAD)),
        "citation-source-id-prose": _with_citation(
            _citation(sources=[{"type": "document", "id": BAD}])),
        "citation-type-prose": _with_citation(_citation(type=BAD)),
        "usage-text": Plant(json=_mut(lambda b: b.__setitem__("usage", {"tokens": {"x": BAD}}))),
        "id-prose": Plant(json=_mut(lambda b: b.__setitem__("id", BAD))),
        "finish-reason-prose": Plant(json=_mut(lambda b: b.__setitem__("finish_reason", BAD))),
        "logprobs-of-another-text": Plant(json=_mut(lambda b: b.__setitem__(
            "logprobs", [{"text": BAD, "token_ids": [1, 2]}]))),
        "unknown-event": Plant(stream=_stream_mut(_insert_before_end(
            {"type": "debug", "prompt": BAD}))),
        "unknown-event-key": Plant(stream=_stream_mut(
            lambda es: es[2].__setitem__("x_note", BAD))),
        "message-end-error": Plant(
            stream=_stream_mut(lambda es: es.__setitem__(-1, {
                "type": "message-end", "delta": {"finish_reason": "ERROR", "error": BAD}})),
            fail_closed=True,
        ),
    }
    plants.update(_sse_line_plants(lambda: _frames(GOOD), lambda: w.frame(
        {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": ""}}}})))
    return plants


def _planted(where: str) -> Callable[[str, bool], Json]:
    def build(question: str, stream: bool) -> Json:
        if where == "user-string":
            msgs: list[Json] = [{"role": "user", "content": f"{PLANTED_TAG}\n{question}"}]
        elif where == "user-text-part":
            msgs = [{"role": "user", "content": [{"type": "text", "text": PLANTED_TAG},
                                                 {"type": "text", "text": question}]}]
        else:  # assistant-history
            msgs = [{"role": "user", "content": "Hi."},
                    {"role": "assistant", "content": PLANTED_TAG},
                    {"role": "user", "content": question}]
        return _request(question, stream, msgs)

    return build


def _trusted(where: str) -> Callable[[str, bool], Json]:
    def build(question: str, stream: bool) -> Json:
        if where == "system":
            return _request(question, stream)
        if where == "tool-result":
            msgs = [
                {"role": "user", "content": question},
                {"role": "assistant", "tool_calls": [w.tool_call("lookup_1", "lookup", {})]},
                {"role": "tool", "tool_call_id": "lookup_1", "content": CONTEXT_TAG},
            ]
            return _request(question, stream, msgs)
        msgs = [{"role": "user", "content": question}]
        return _request(question, stream, msgs,
                        documents=[{"id": CHUNK_ID, "data": {"text": CHUNK_TEXT}}])

    return build


COHERE = ProtocolSpec(
    name="cohere-chat",
    path="/v2/chat",
    streams=True,
    text_key="text",
    request=lambda q, s: _request(q, s),
    body=_body,
    frames=_frames,
    answer_text=_answer_text,
    error_envelope=lambda m: {"message": m},
    plants=_plants(),
    planted_requests={
        "user-string": _planted("user-string"),
        "user-text-part": _planted("user-text-part"),
        "assistant-history": _planted("assistant-history"),
    },
    trusted_requests={
        "system": _trusted("system"),
        "tool-result": _trusted("tool-result"),
        "document": _trusted("document"),
    },
)

"""The openai-responses entry of the adversarial matrix: `/v1/responses` requests, response
objects and typed event streams, and the plants only this protocol has (output items and their
parts, annotations, reasoning summaries, tool calls, file_search and web_search items, event
types and fields, `sequence_number`, and the repeated copies of the text that must equal the
deltas)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from gateway.demo import responses_wire as rw
from gateway.demo import wire
from tests.attacks.harness import MARKER, RawResponse
from tests.attacks.protocols import (
    BAD,
    CONTEXT_TAG,
    GOOD,
    PIECE,
    PLANTED_ANSWER,
    PLANTED_TAG,
    Plant,
    ProtocolSpec,
    _sse_line_plants,
)
from tests.upstream_app import sse_objects

Json = dict[str, Any]
PATH = "/v1/responses"
ID = "resp_attack"
MSG = "msg_attack"
ENCRYPTED = "gAAAAB-opaque-reasoning-state-0123456789"


def request(question: str, stream: bool, input: Any = None, **extra: Any) -> Json:
    req: Json = {"model": "gpt-test", "instructions": CONTEXT_TAG}
    req["input"] = input if input is not None else question
    if stream:
        req["stream"] = True
    req.update(extra)
    return {k: v for k, v in req.items() if v is not None}


def body(text: str, *items: Json, before: tuple[Json, ...] = (), **extra: Any) -> Json:
    output = [*before, rw.message_item(text, id=MSG), *items]
    return rw.response_body(output, id=ID, model="fake-model", extra=extra)


def events(b: Json) -> list[Json]:
    """The typed events the API streams for body `b` (text in PIECE-character deltas)."""
    out = []
    for frame in rw.response_events(b, chunk_size=PIECE):
        line = next(x for x in frame.decode().split("\n") if x.startswith("data: "))
        out.append(json.loads(line[len("data: "):]))
    return out


def framed(evs: list[Json]) -> list[bytes]:
    """Events as SSE frames, `sequence_number` counted again where it is a number (a plant
    may have inserted events, or put something else there on purpose)."""
    out = []
    for n, e in enumerate(evs):
        if isinstance(e.get("sequence_number"), int):
            e["sequence_number"] = n
        out.append(wire.sse(e, str(e.get("type"))))
    return out


def frames(text: str) -> list[bytes]:
    return framed(events(body(text)))


def answer_text(resp: RawResponse) -> str:
    """The first message's output_text (deltas, in a stream)."""
    if "event-stream" in (resp.header("content-type") or ""):
        return "".join(
            str(obj.get("delta", ""))
            for obj in sse_objects(resp.body)
            if obj.get("type") == "response.output_text.delta"
        )
    try:
        for item in resp.json()["output"]:
            if item.get("type") == "message":
                return "".join(
                    p["text"] for p in item["content"] if p.get("type") == "output_text"
                )
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return ""


# -- plants ----------------------------------------------------------------------------------


def _of_body(build: Callable[[], Json], fail_closed: bool = False) -> Plant:
    """The same response as a JSON body and as the stream that carries it."""
    return Plant(json=build, stream=lambda: framed(events(build())), fail_closed=fail_closed)


def _mut(fn: Callable[[Json], None], text: str = GOOD) -> Plant:
    def build() -> Json:
        b = copy.deepcopy(body(text))
        fn(b)
        return b

    return _of_body(build)


def _smut(
    fn: Callable[[list[Json]], None], text: str = GOOD, fail_closed: bool = False
) -> Plant:
    def build() -> list[bytes]:
        evs = events(body(text))
        fn(evs)
        return framed(evs)

    return Plant(stream=build, fail_closed=fail_closed)


def _items(*items: Json, before: bool = False) -> Plant:
    if before:
        return _of_body(lambda: body(GOOD, before=copy.deepcopy(items)))
    return _of_body(lambda: body(GOOD, *copy.deepcopy(items)))


def _msg(b: Json) -> Json:
    return next(i for i in b["output"] if i.get("type") == "message")  # type: ignore[no-any-return]


def _part(b: Json) -> Json:
    return _msg(b)["content"][0]  # type: ignore[no-any-return]


def _at(evs: list[Json], etype: str, last: bool = False) -> int:
    found = [i for i, e in enumerate(evs) if e["type"] == etype]
    return found[-1] if last else found[0]


def _insert_before(etype: str, *new: Json) -> Callable[[list[Json]], None]:
    def fn(evs: list[Json]) -> None:
        at = _at(evs, etype)
        evs[at:at] = [{"sequence_number": 0, **copy.deepcopy(e)} for e in new]

    return fn


def _url_citation(**over: Any) -> Json:
    return {"type": "url_citation", "url": "https://example.com/pump", "title": "Pump",
            "start_index": 0, "end_index": len(GOOD), **over}


def _file_citation(**over: Any) -> Json:
    return {"type": "file_citation", "file_id": "kb:1", "filename": "pump.txt",
            "index": len(GOOD), **over}


def _annotated(ann: Json) -> Plant:
    return _mut(lambda b: _part(b).__setitem__("annotations", [ann]))


def _reasoning(text: str | None = BAD, **over: Any) -> Json:
    return {**rw.reasoning_item(text, id="rs_attack", encrypted=ENCRYPTED), **over}


def _tokens(text: str) -> list[Json]:
    return [{"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []}
            for t in wire.split_fixed(text, PIECE)]


def _differs(etype: str, edit: Callable[[Json], None]) -> Plant:
    """A repeated copy of the text (in the first `etype` event) that is not what the deltas
    built: the stream is ambiguous and fails closed."""

    def fn(evs: list[Json]) -> None:
        edit(evs[_at(evs, etype)])

    return _smut(fn, fail_closed=True)


def _data_frame() -> bytes:
    head = {"id": ID, "object": "response", "status": "in_progress", "output": []}
    return wire.sse({"type": "response.in_progress", "sequence_number": 1, "response": head})


def _args_done_name() -> list[bytes]:
    call = rw.function_call_item("lookup", "{}", id="fc_attack", call_id="call_attack")
    evs = events(body(GOOD, call))
    evs[_at(evs, "response.function_call_arguments.done")]["name"] = BAD
    return framed(evs)


def plants() -> dict[str, Plant]:
    bad_text = f"{GOOD} {BAD}"
    delta = "response.output_text.delta"
    out: dict[str, Plant] = {
        "content-hallucinated": _of_body(lambda: body(bad_text)),
        "second-message-item": _items(rw.message_item(BAD, id="msg_2")),
        "second-text-part": _mut(lambda b: _msg(b)["content"].append(
            {"type": "output_text", "text": f" {BAD}", "annotations": [], "logprobs": []})),
        "error-4xx-nested-extra-field": Plant(
            json=lambda: {"error": {**rw.response_error("refused")["error"],
                                    "x_note": BAD, "param": BAD, "code": BAD}},
            stream=lambda: {"error": {**rw.response_error("refused")["error"], "x_note": BAD}},
            status=400),
        "refusal-part": _mut(lambda b: _msg(b)["content"].append(
            {"type": "refusal", "refusal": BAD})),
        "top-level-unknown-key": _mut(lambda b: b.__setitem__("x_trace", BAD)),
        "top-level-unknown-object": _mut(lambda b: b.__setitem__("x_debug", {"prompt": BAD})),
        "top-level-model-not-token": _mut(lambda b: b.__setitem__("model", BAD)),
        "top-level-id-not-token": _mut(lambda b: b.__setitem__("id", BAD)),
        "top-level-status-prose": _mut(lambda b: b.__setitem__("status", BAD)),
        "top-level-error-message": _mut(lambda b: b.__setitem__(
            "error", {"code": "server_error", "message": BAD})),
        "incomplete-details-prose": _mut(lambda b: b.update(
            status="incomplete", incomplete_details={"reason": BAD})),
        # Echoes of the request: the client's own values go out, nothing the upstream wrote.
        "instructions-echo-differs": _mut(lambda b: b.__setitem__("instructions", BAD)),
        "instructions-echo-planted-context": _mut(
            lambda b: b.__setitem__("instructions", PLANTED_TAG), PLANTED_ANSWER),
        "metadata-echo": _mut(lambda b: b.__setitem__("metadata", {"note": BAD})),
        "reasoning-config-text": _mut(lambda b: b["reasoning"].__setitem__("content", BAD)),
        "text-format-schema": _mut(lambda b: b.__setitem__("text", {"format": {
            "type": "json_schema", "name": "answer", "schema": {"description": BAD}}})),
        "tools-echo": _mut(lambda b: b.__setitem__("tools", [
            {"type": "function", "name": "lookup", "description": BAD, "parameters": {}}])),
        "tool-choice-prose": _mut(lambda b: b.__setitem__("tool_choice", BAD)),
        "prompt-echo": _mut(lambda b: b.__setitem__(
            "prompt", {"id": "pmpt_1", "variables": {"x": BAD}})),
        "conversation-echo": _mut(lambda b: b.__setitem__(
            "conversation", {"id": "conv_1", "note": BAD})),
        "usage-unknown-text": _mut(lambda b: b["usage"].__setitem__("x_note", BAD)),
        "usage-details-text": _mut(lambda b: b["usage"]["output_tokens_details"].__setitem__(
            "note", BAD)),
        "item-unknown-key": _mut(lambda b: _msg(b).__setitem__("x_note", BAD)),
        "item-id-not-token": _mut(lambda b: _msg(b).__setitem__("id", BAD)),
        "item-role-not-assistant": _mut(lambda b: _msg(b).__setitem__("role", BAD)),
        "item-status-prose": _mut(lambda b: _msg(b).__setitem__("status", BAD)),
        "item-phase-prose": _mut(lambda b: _msg(b).__setitem__("phase", BAD)),
        "unknown-item-type": _items({"id": "xd_1", "type": "x_debug", "text": BAD}),
        "part-unknown-key": _mut(lambda b: _part(b).__setitem__("x_note", BAD)),
        "unknown-part-type": _mut(lambda b: _msg(b)["content"].append(
            {"type": "x_debug", "text": BAD})),
        "annotation-title": _annotated(_url_citation(title=BAD)),
        "annotation-unknown-key": _annotated(_file_citation(x_note=BAD)),
        "annotation-url-prose": _annotated(_url_citation(url=BAD)),
        "annotation-file-id-prose": _annotated(_file_citation(file_id=BAD)),
        "annotation-unknown-type": _annotated({"type": "x_note", "text": BAD, "index": 0}),
        "annotation-container-filename": _annotated(
            {"type": "container_file_citation", "container_id": "cntr_1", "file_id": "kb:1",
             "filename": BAD, "start_index": 0, "end_index": len(GOOD)}),
        "logprobs-of-another-text": _mut(lambda b: _part(b).__setitem__("logprobs", _tokens(BAD))),
        "top-logprobs": _mut(lambda b: _part(b).__setitem__("logprobs", [
            {**t, "top_logprobs": [{"token": f" {MARKER}", "logprob": -2.0, "bytes": []}]}
            for t in _tokens(GOOD)])),
        "reasoning-summary": _items(_reasoning(), before=True),
        "reasoning-summary-after-message": _items(_reasoning()),
        "reasoning-content-text": _items(_reasoning(
            None, content=[{"type": "reasoning_text", "text": BAD}]), before=True),
        "reasoning-unknown-key": _items(_reasoning(None, x_note=BAD), before=True),
        "reasoning-summary-unknown-part": _items(_reasoning(
            None, summary=[{"type": "x_note", "text": BAD}]), before=True),
        "function-call-arguments": _items(rw.function_call_item(
            "lookup", json.dumps({"summary": BAD}), id="fc_attack", call_id="call_attack")),
        "function-call-name": _items(rw.function_call_item(
            BAD, "{}", id="fc_attack", call_id="call_attack")),
        "function-call-id-prose": _items(rw.function_call_item(
            "lookup", "{}", id="fc_attack", call_id=BAD)),
        "function-call-unknown-key": _items({**rw.function_call_item(
            "lookup", "{}", id="fc_attack", call_id="call_attack"), "x_note": BAD}),
        "custom-tool-call-input": _items({"id": "ctc_attack", "type": "custom_tool_call",
                                          "call_id": "call_c", "name": "shell", "input": BAD}),
        "file-search-results": _items(rw.file_search_item(
            [{"file_id": "file_9", "filename": "notes.txt", "score": 0.9, "text": BAD}],
            id="fs_attack"), before=True),
        "file-search-result-attributes": _items(rw.file_search_item(
            [{"file_id": "file_9", "filename": "notes.txt", "attributes": {"note": BAD},
              "text": "x"}], id="fs_attack"), before=True),
        "file-search-queries": _items(rw.file_search_item(None, queries=[BAD], id="fs_attack"),
                                      before=True),
        "web-search-action": _items({"id": "ws_attack", "type": "web_search_call",
                                     "status": "completed",
                                     "action": {"type": "search", "query": BAD}}, before=True),
        "web-search-unknown-key": _items({"id": "ws_attack", "type": "web_search_call",
                                          "status": "completed", "x_note": BAD}, before=True),
        # -- stream only ------------------------------------------------------------------
        "unknown-event-type": _smut(_insert_before(
            "response.output_item.done", {"type": "response.x_debug", "note": BAD})),
        "unknown-event-type-with-delta": _smut(_insert_before(
            "response.output_item.done",
            {"type": "response.audio_transcript.delta", "delta": BAD})),
        "event-unknown-key": _smut(lambda evs: evs[_at(evs, delta)].__setitem__("x_note", BAD)),
        "event-obfuscation-prose": _smut(
            lambda evs: [e.__setitem__("obfuscation", BAD) for e in evs if e["type"] == delta]
            and None),
        "event-sequence-number-prose": _smut(
            lambda evs: evs[_at(evs, delta)].__setitem__("sequence_number", BAD)),
        "event-sequence-number-object": _smut(
            lambda evs: evs[_at(evs, delta)].__setitem__("sequence_number", {"n": BAD})),
        "item-added-unknown-key": _smut(
            lambda evs: evs[_at(evs, "response.output_item.added")]["item"].__setitem__(
                "x_note", BAD)),
        "part-added-unknown-key": _smut(
            lambda evs: evs[_at(evs, "response.content_part.added")]["part"].__setitem__(
                "x_note", BAD)),
        "part-done-annotation-title": _smut(
            lambda evs: evs[_at(evs, "response.content_part.done")]["part"].__setitem__(
                "annotations", [_url_citation(title=BAD)])),
        "annotation-added-not-in-the-item": _smut(_insert_before(
            "response.output_text.done",
            {"type": "response.output_text.annotation.added", "item_id": MSG, "output_index": 0,
             "content_index": 0, "annotation_index": 0, "annotation": _url_citation(title=BAD)})),
        "delta-logprobs-of-another-text": _smut(
            lambda evs: evs[_at(evs, delta)].__setitem__("logprobs", _tokens(BAD))),
        "arguments-done-name": Plant(stream=_args_done_name),
        "created-response-unknown-key": _smut(
            lambda evs: evs[0]["response"].__setitem__("x_trace", BAD)),
        "created-response-output-text": _smut(
            lambda evs: evs[0]["response"]["output"].append(rw.message_item(BAD, id="msg_9"))),
        "item-added-with-text": _smut(
            lambda evs: evs[_at(evs, "response.output_item.added")]["item"].__setitem__(
                "content", [{"type": "output_text", "text": BAD, "annotations": []}]),
            fail_closed=True),
        "part-added-with-text": _smut(
            lambda evs: evs[_at(evs, "response.content_part.added")]["part"].__setitem__(
                "text", BAD), fail_closed=True),
        "output-text-done-differs": _differs(
            "response.output_text.done", lambda e: e.__setitem__("text", bad_text)),
        "content-part-done-differs": _differs(
            "response.content_part.done", lambda e: e["part"].__setitem__("text", bad_text)),
        "output-item-done-differs": _differs(
            "response.output_item.done",
            lambda e: e["item"]["content"][0].__setitem__("text", bad_text)),
        "completed-response-differs": _differs(
            "response.completed",
            lambda e: e["response"]["output"][0]["content"][0].__setitem__("text", bad_text)),
        "completed-response-extra-item": _differs(
            "response.completed",
            lambda e: e["response"]["output"].append(rw.message_item(BAD, id="msg_9"))),
        "event-after-completed": Plant(stream=lambda: [*frames(GOOD), wire.sse(
            {"type": delta, "sequence_number": 99, "item_id": MSG, "output_index": 0,
             "content_index": 0, "delta": BAD, "logprobs": []}, delta)]),
        "response-failed-mid-stream": _smut(
            lambda evs: evs.__setitem__(slice(_at(evs, "response.output_text.done"), None), [
                {"type": "response.failed", "sequence_number": 0, "response": {
                    **evs[0]["response"], "status": "failed",
                    "error": {"code": "server_error", "message": BAD}}}]),
            text=bad_text, fail_closed=True),
        "error-event-mid-stream": _smut(
            lambda evs: evs.__setitem__(slice(_at(evs, "response.output_text.done"), None), [
                {"type": "error", "sequence_number": 0, "code": "server_error",
                 "message": BAD, "param": None}]),
            text=bad_text, fail_closed=True),
        "truncated-stream": _smut(
            lambda evs: evs.__setitem__(slice(_at(evs, "response.output_text.done"), None), []),
            text=bad_text, fail_closed=True),
        "event-name-disagrees": Plant(stream=lambda: [
            f.replace(b"event: response.output_text.delta", b"event: response.x", 1)
            for f in frames(bad_text)], fail_closed=True),
        "done-sentinel-then-more": Plant(stream=lambda: [
            *frames(GOOD)[:-1], b"data: [DONE]\n\n", *frames(bad_text)[-1:]],
            fail_closed=True),
    }
    out.update(_sse_line_plants(lambda: frames(GOOD), _data_frame))
    return out


# -- requests --------------------------------------------------------------------------------


def _message(role: str, content: Any) -> Json:
    return {"type": "message", "role": role, "content": content}


def planted(where: str) -> Callable[[str, bool], Json]:
    def build(question: str, stream: bool) -> Json:
        if where == "input-string":
            return request(question, stream, f"{PLANTED_TAG}\n{question}")
        if where == "user-message":
            return request(question, stream, [_message("user", f"{PLANTED_TAG}\n{question}")])
        if where == "user-input-text-part":
            parts = [{"type": "input_text", "text": PLANTED_TAG},
                     {"type": "input_text", "text": question}]
            return request(question, stream, [_message("user", parts)])
        if where == "assistant-history":
            return request(question, stream, [
                _message("user", "Tell me about the pump."),
                _message("assistant", [{"type": "output_text", "text": PLANTED_TAG}]),
                _message("user", question)])
        # a function_call item the client sends back: the model's own words, not a result
        return request(question, stream, [
            {"type": "function_call", "call_id": "call_1", "name": "kb",
             "arguments": json.dumps({"q": PLANTED_TAG})},
            _message("user", question)])

    return build


def trusted(where: str) -> Callable[[str, bool], Json]:
    def build(question: str, stream: bool) -> Json:
        if where == "instructions":
            return request(question, stream)
        if where in ("developer", "system"):
            return request(question, stream, [_message(where, CONTEXT_TAG),
                                              _message("user", question)], instructions=None)
        return request(question, stream, [
            _message("user", question),
            {"type": "function_call", "call_id": "call_1", "name": "kb", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": CONTEXT_TAG}],
            instructions=None)

    return build


RESPONSES = ProtocolSpec(
    name="openai-responses",
    path=PATH,
    streams=True,
    text_key="text",
    stream_text_key="delta",
    request=lambda q, s: request(q, s),
    body=lambda text: body(text),
    frames=frames,
    answer_text=answer_text,
    error_envelope=lambda m: rw.response_error(m),
    plants=plants(),
    spot_modes=("json", "progressive"),
    planted_requests={w: planted(w) for w in (
        "input-string", "user-message", "user-input-text-part", "assistant-history",
        "function-call-arguments")},
    trusted_requests={w: trusted(w) for w in (
        "instructions", "developer", "system", "function-call-output")},
)

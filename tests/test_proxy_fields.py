"""Every field is decided (DESIGN §2): a marker planted anywhere the gateway does not verify
never reaches the client, in any decision, JSON or SSE, buffered or progressive.

The upstream is a real ASGI app on loopback whose answers carry the marker in one undecided
place each (metadata of the wrong shape, unknown keys at every level, tool-call ids and names,
annotation titles, logprobs that spell another text, SSE comment / id / event lines, frames
that change the head, duplicate JSON keys). The client is a raw socket: the whole response —
status line, headers, every body and stream byte — is scanned for the marker.
"""

from __future__ import annotations

import copy
import json
import re
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import httpx
import openai
import pytest

from gateway.demo import wire
from gateway.sse import SSEDecoder
from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.upstream_app import (
    SCENARIO_HEADER,
    FakeUpstream,
    Json,
    Stream,
    create_upstream,
    serve,
    sse_frame,
)

MARKER = "ZEBRAQUARTZ"
# A marker shaped like prose: no metadata shape admits it.
PLANT = f"The base has {MARKER} reactors"
CONTEXT = '<chunk id="kb:1" version="2">The Orbit pump moves 40 litres per minute.</chunk>'
GOOD = "The Orbit pump moves 40 litres per minute [kb:1]."
BAD = "The Orbit pump was designed on Mars [kb:404]."
TEXTS = {"released": GOOD, "partial": f"{GOOD} {BAD}", "abstained": BAD, "blocked": BAD}
# The policy's on_unverified per expected decision.
ON_UNVERIFIED = {
    "released": "block", "partial": "strip", "abstained": "abstain", "blocked": "block"
}

Body = dict[str, Any]
Plant = Callable[[Body], None]

# -- raw HTTP --------------------------------------------------------------------------------


def _dechunk(body: bytes) -> bytes:
    out: list[bytes] = []
    while body:
        line, _, rest = body.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        if size == 0:
            break
        out.append(rest[:size])
        body = rest[size + 2 :]
    return b"".join(out)


def raw_post(base: str, path: str, payload: Body, scenario: str) -> tuple[bytes, int, bytes]:
    """(every byte the gateway sent, status, the de-chunked body) of one POST."""
    url = urlsplit(base)
    data = json.dumps(payload).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(data)}\r\n{SCENARIO_HEADER}: {scenario}\r\n"
        "x-api-key: k\r\nanthropic-version: 2023-06-01\r\nconnection: close\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(head.encode() + data)
        parts: list[bytes] = []
        while chunk := sock.recv(65536):
            parts.append(chunk)
    raw = b"".join(parts)
    head_bytes, _, body = raw.partition(b"\r\n\r\n")
    status = int(head_bytes.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head_bytes.lower():
        body = _dechunk(body)
    return raw, status, body


def assert_clean(raw: bytes, body: bytes) -> None:
    for blob in (raw, body):
        assert MARKER.encode() not in blob, blob.decode(errors="replace")[-1500:]
        assert MARKER.lower().encode() not in blob.lower()


# -- OpenAI chat -----------------------------------------------------------------------------


def _msg(b: Body) -> Body:
    return b["choices"][0]["message"]  # type: ignore[no-any-return]


def _tool(**over: Any) -> Plant:
    def plant(b: Body) -> None:
        fn = {"name": "lookup", "arguments": "{}"}
        call: Body = {"id": "call_1", "type": "function", "function": fn}
        for k, v in over.items():
            if k == "name":
                fn["name"] = v
            elif k == "fn_extra":
                fn["note"] = v
            else:
                call[k] = v
        _msg(b)["tool_calls"] = [call]

    return plant


def _annotation(**over: Any) -> Plant:
    def plant(b: Body) -> None:
        span = {"start_index": 0, "end_index": 9, "url": "https://example.com/a", "title": "A"}
        span.update(over)
        _msg(b)["annotations"] = [{"type": "url_citation", "url_citation": span}]

    return plant


def _tokens(text: str) -> list[Body]:
    return [{"token": t, "logprob": -0.1, "bytes": None, "top_logprobs": []} for t in text]


def _logprobs(kind: str) -> Plant:
    def plant(b: Body) -> None:
        text = _msg(b)["content"]
        entries = _tokens(text)
        if kind == "mismatch":
            entries = _tokens(PLANT)
        elif kind == "top":
            entries[0]["top_logprobs"] = [{"token": PLANT, "logprob": -3.0, "bytes": None}]
        elif kind == "entry_key":
            entries[0]["note"] = PLANT
        elif kind == "bytes":
            entries[0]["bytes"] = list(PLANT.encode())
        b["choices"][0]["logprobs"] = {"content": entries, "refusal": None}

    return plant


def _set(getter: Callable[[Body], Body], key: str, value: object) -> Plant:
    def plant(b: Body) -> None:
        getter(b)[key] = value

    return plant


def _top(b: Body) -> Body:
    return b


def _choice(b: Body) -> Body:
    return b["choices"][0]  # type: ignore[no-any-return]


def _usage(b: Body) -> Body:
    return b["usage"]  # type: ignore[no-any-return]


OPENAI_JSON_PLANTS: dict[str, Plant] = {
    "top-unknown": _set(_top, "x_trace", PLANT),
    "id": _set(_top, "id", PLANT),
    "model": _set(_top, "model", PLANT),
    "created": _set(_top, "created", PLANT),
    "object": _set(_top, "object", PLANT),
    "system_fingerprint": _set(_top, "system_fingerprint", PLANT),
    "service_tier": _set(_top, "service_tier", PLANT),
    "perplexity-citations": _set(_top, "citations", [PLANT]),
    "usage-value": _set(_usage, "prompt_tokens", PLANT),
    "usage-key": _set(_usage, PLANT, 1),
    "usage-details": _set(_usage, "completion_tokens_details", {"note": PLANT}),
    "choice-unknown": _set(_choice, "x_note", PLANT),
    "finish_reason": _set(_choice, "finish_reason", PLANT),
    "message-unknown": _set(_msg, "x_note", PLANT),
    "role": _set(_msg, "role", PLANT),
    "reasoning_content": _set(_msg, "reasoning_content", PLANT),
    "reasoning": _set(_msg, "reasoning", PLANT),
    "reasoning_details": _set(_msg, "reasoning_details", [{"type": "text", "text": PLANT}]),
    "tool-id": _tool(id=PLANT),
    "tool-name": _tool(name=PLANT),
    "tool-unknown": _tool(note=PLANT),
    "tool-function-unknown": _tool(fn_extra=PLANT),
    "tool-type": _tool(type=PLANT),
    "function_call-name": _set(_msg, "function_call", {"name": PLANT, "arguments": "{}"}),
    "annotation-title": _annotation(title=PLANT),
    "annotation-url": _annotation(url=f"https://example.com/{PLANT}"),
    "annotation-unknown-key": _annotation(note=PLANT),
    "annotation-unknown-type": _set(_msg, "annotations", [{"type": "file_note", "text": PLANT}]),
    "audio-id": _set(_msg, "audio", {"id": PLANT, "data": "", "expires_at": 1, "transcript": ""}),
    "logprobs-mismatch": _logprobs("mismatch"),
    "logprobs-top": _logprobs("top"),
    "logprobs-entry-key": _logprobs("entry_key"),
    "logprobs-bytes": _logprobs("bytes"),
    "logprobs-unknown": _set(_choice, "logprobs", {"content": None, "note": PLANT}),
}


def _openai_request(stream: bool) -> Body:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": "q"}],
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }


def _openai_body(text: str) -> Body:
    return wire.openai_completion(
        text, id="chatcmpl-1", model="gpt-x", created=1, usage=wire.Usage(5, 7)
    )


def _openai_chunks(text: str) -> list[Body]:
    pieces = wire.split_fixed(text, 7)
    return wire.openai_chunks(
        pieces, id="chatcmpl-1", model="gpt-x", created=1, usage=wire.Usage(5, 7),
        include_usage=True,
    )


def _frames(chunks: list[Body]) -> list[bytes]:
    return [*(sse_frame(c) for c in chunks), b"data: [DONE]\n\n"]


def _delta(chunk: Body) -> Body:
    return chunk["choices"][0]["delta"]  # type: ignore[no-any-return]


def _chunk_plant(fn: Callable[[list[Body]], None]) -> Callable[[str], list[bytes]]:
    def build(text: str) -> list[bytes]:
        chunks = _openai_chunks(text)
        fn(chunks)
        return _frames(chunks)

    return build


def _raw_plant(line: bytes, at: int = 2) -> Callable[[str], list[bytes]]:
    def build(text: str) -> list[bytes]:
        frames = _frames(_openai_chunks(text))
        frames.insert(at, line)
        return frames

    return build


def _extra_chunk(delta: Body, **choice: Any) -> Callable[[list[Body]], None]:
    def fn(chunks: list[Body]) -> None:
        extra = copy.deepcopy(chunks[1])
        extra["choices"][0]["delta"] = delta
        extra["choices"][0].update(choice)
        chunks.insert(2, extra)

    return fn


def _dup_frame(text: str) -> list[bytes]:
    frames = _frames(_openai_chunks(text))
    good = json.dumps(_openai_chunks(text)[1])
    frames[1] = f'data: {{"model": "{PLANT}", {good[1:]}\n\n'.encode()
    return frames


OPENAI_STREAM_PLANTS: dict[str, Callable[[str], list[bytes]]] = {
    "sse-comment": _raw_plant(f": {PLANT}\n".encode()),
    "sse-comment-block": _raw_plant(f": {PLANT}\n\n".encode()),
    "sse-id": _raw_plant(f"id: {MARKER}\n".encode(), at=1),
    "sse-unknown-field": _raw_plant(f"note: {PLANT}\n".encode()),
    "sse-event-only": _raw_plant(f"event: {MARKER}\n\n".encode()),
    "sse-event-line": _raw_plant(f"event: {MARKER}\n".encode(), at=3),
    "frame-unknown": _chunk_plant(lambda c: c[2].update(x_note=PLANT)),
    "frame-model": _chunk_plant(lambda c: c[3].update(model=PLANT)),
    "frame-model-token": _chunk_plant(lambda c: c[3].update(model=MARKER)),
    "frame-id-token": _chunk_plant(lambda c: c[3].update(id=MARKER)),
    "frame-obfuscation": _chunk_plant(lambda c: c[2].update(obfuscation=PLANT)),
    "choice-unknown": _chunk_plant(lambda c: c[2]["choices"][0].update(x_note=PLANT)),
    "delta-unknown": _chunk_plant(lambda c: _delta(c[2]).update(x_note=PLANT)),
    "delta-role": _chunk_plant(lambda c: _delta(c[0]).update(role=PLANT)),
    "finish_reason": _chunk_plant(lambda c: c[-2]["choices"][0].update(finish_reason=PLANT)),
    "usage-key": _chunk_plant(lambda c: c[-1]["usage"].update({PLANT: 1})),
    "reasoning-delta": _chunk_plant(_extra_chunk({"reasoning_content": PLANT})),
    "reasoning-delta-vllm": _chunk_plant(_extra_chunk({"reasoning": PLANT})),
    "tool-delta-id": _chunk_plant(
        _extra_chunk(
            {"tool_calls": [{"index": 0, "id": PLANT, "type": "function",
                             "function": {"name": "lookup", "arguments": "{}"}}]}
        )
    ),
    "tool-delta-unknown": _chunk_plant(
        _extra_chunk(
            {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "note": PLANT,
                             "function": {"name": "lookup", "arguments": "{}"}}]}
        )
    ),
    "tool-delta-name": _chunk_plant(
        _extra_chunk(
            {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                             "function": {"name": PLANT, "arguments": "{}"}}]}
        )
    ),
    "logprobs-delta": _chunk_plant(
        _extra_chunk({"content": ""}, logprobs={"content": _tokens(PLANT), "refusal": None})
    ),
    "duplicate-key": _dup_frame,
}


# -- Anthropic messages ----------------------------------------------------------------------


DOCUMENT = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "The Orbit pump is blue."},
    "title": "Pump",
    "citations": {"enabled": True},
}


def _anthropic_request(stream: bool) -> Body:
    return {
        "model": "claude-x",
        "max_tokens": 100,
        "system": CONTEXT,
        "messages": [{"role": "user", "content": [DOCUMENT, {"type": "text", "text": "q"}]}],
        "stream": stream,
    }


def _anthropic_body(text: str) -> Body:
    return wire.anthropic_message(text, id="msg_1", model="claude-x", usage=wire.Usage(5, 7))


def _block(b: Body) -> Body:
    return b["content"][0]  # type: ignore[no-any-return]


def _append_block(block: Body) -> Plant:
    def plant(b: Body) -> None:
        b["content"].append(block)

    return plant


def _tool_use(**over: Any) -> Plant:
    block = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}
    block.update(over)
    return _append_block(block)


def _citation(**over: Any) -> Plant:
    def plant(b: Body) -> None:
        cit = {
            "type": "char_location",
            "cited_text": "The Orbit pump",
            "document_index": 0,
            "document_title": "Pump",
            "start_char_index": 0,
            "end_char_index": 14,
        }
        cit.update(over)
        _block(b)["citations"] = [cit]

    return plant


ANTHROPIC_JSON_PLANTS: dict[str, Plant] = {
    "top-unknown": _set(_top, "x_trace", PLANT),
    "id": _set(_top, "id", PLANT),
    "model": _set(_top, "model", PLANT),
    "role": _set(_top, "role", PLANT),
    "stop_reason": _set(_top, "stop_reason", PLANT),
    "stop_sequence": _set(_top, "stop_sequence", PLANT),
    "usage-value": _set(_usage, "input_tokens", PLANT),
    "usage-key": _set(_usage, PLANT, 1),
    "container": _set(_top, "container", {"id": "c", "note": PLANT}),
    "block-unknown": _set(_block, "x_note", PLANT),
    "block-unknown-type": _append_block({"type": "server_note", "text": PLANT}),
    "thinking": _append_block({"type": "thinking", "thinking": PLANT, "signature": "c2ln"}),
    "thinking-signature": _append_block({"type": "thinking", "thinking": "", "signature": PLANT}),
    "redacted_thinking": _append_block({"type": "redacted_thinking", "data": PLANT}),
    "tool-id": _tool_use(id=PLANT),
    "tool-name": _tool_use(name=PLANT),
    "tool-unknown": _tool_use(note=PLANT),
    "citation-title": _citation(document_title=PLANT),
    "citation-unknown-key": _citation(note=PLANT),
    "citation-unknown-type": _citation(type="web_search_result_location", title=PLANT, url="u"),
}


def _anthropic_events(text: str) -> list[tuple[str, Body]]:
    return wire.anthropic_events(
        wire.split_fixed(text, 7), id="msg_1", model="claude-x", usage=wire.Usage(5, 7)
    )


def _aframes(events: list[tuple[str | None, Body]]) -> list[bytes]:
    return [sse_frame(data, event=name) for name, data in events]


def _event_plant(
    fn: Callable[[list[tuple[str | None, Body]]], None],
) -> Callable[[str], list[bytes]]:
    def build(text: str) -> list[bytes]:
        events: list[tuple[str | None, Body]] = list(_anthropic_events(text))
        fn(events)
        return _aframes(events)

    return build


def _a_raw(line: bytes, at: int = 2) -> Callable[[str], list[bytes]]:
    def build(text: str) -> list[bytes]:
        frames = _aframes(list(_anthropic_events(text)))
        frames.insert(at, line)
        return frames

    return build


def _insert_event(at: int, name: str | None, data: Body) -> Callable[[list[Any]], None]:
    def fn(events: list[Any]) -> None:
        events.insert(at, (name, data))

    return fn


def _thinking_block(delta: Body) -> Callable[[list[Any]], None]:
    def fn(events: list[Any]) -> None:
        for e in events:
            if isinstance(e[1].get("index"), int):
                e[1]["index"] += 1
        events[1:1] = [
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "thinking", "thinking": "",
                                                       "signature": ""}}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]

    return fn


def _a_dup(text: str) -> list[bytes]:
    events = list(_anthropic_events(text))
    frames = _aframes(list(events))
    good = json.dumps(events[2][1])
    frames[2] = f'event: {events[2][0]}\ndata: {{"type": "{PLANT}", {good[1:]}\n\n'.encode()
    return frames


def _mutate(index: int, fn: Callable[[Body], None]) -> Callable[[list[Any]], None]:
    def apply(events: list[Any]) -> None:
        fn(events[index][1])

    return apply


ANTHROPIC_STREAM_PLANTS: dict[str, Callable[[str], list[bytes]]] = {
    "sse-comment": _a_raw(f": {PLANT}\n".encode()),
    "sse-comment-block": _a_raw(f": {PLANT}\n\n".encode()),
    "sse-id": _a_raw(f"id: {MARKER}\n".encode(), at=3),
    "sse-unknown-field": _a_raw(f"note: {PLANT}\n".encode()),
    "sse-event-only": _a_raw(f"event: {MARKER}\n\n".encode()),
    "sse-event-name": _event_plant(
        lambda e: e.insert(3, (MARKER, {"type": "ping"}))
    ),
    "sse-event-name-on-text": _event_plant(
        lambda e: e.__setitem__(-4, (MARKER, e[-4][1]))  # the last text_delta
    ),
    "unknown-event": _event_plant(_insert_event(3, "x_note", {"type": "x_note", "text": PLANT})),
    "unknown-delta": _event_plant(
        _insert_event(3, "content_block_delta",
                      {"type": "content_block_delta", "index": 0,
                       "delta": {"type": "note_delta", "text": PLANT}})
    ),
    "delta-unknown-key": _event_plant(
        _insert_event(3, "content_block_delta",
                      {"type": "content_block_delta", "index": 0,
                       "delta": {"type": "text_delta", "text": "", "note": PLANT}})
    ),
    "frame-unknown-key": _event_plant(_mutate(-1, lambda d: d.update(note=PLANT))),
    "ping-unknown-key": _event_plant(_mutate(2, lambda d: d.update(note=PLANT))),
    "message_start-unknown": _event_plant(_mutate(0, lambda d: d["message"].update(x=PLANT))),
    "message_start-id": _event_plant(_mutate(0, lambda d: d["message"].update(id=PLANT))),
    "message_start-model": _event_plant(_mutate(0, lambda d: d["message"].update(model=PLANT))),
    "message_delta-unknown": _event_plant(_mutate(-2, lambda d: d["delta"].update(x=PLANT))),
    "message_delta-stop": _event_plant(
        _mutate(-2, lambda d: d["delta"].update(stop_sequence=PLANT))
    ),
    "message_delta-top": _event_plant(_mutate(-2, lambda d: d.update(x=PLANT))),
    "block-start-unknown": _event_plant(
        _mutate(1, lambda d: d["content_block"].update(x=PLANT))
    ),
    "thinking-delta": _event_plant(_thinking_block({"type": "thinking_delta", "thinking": PLANT})),
    "signature-delta": _event_plant(
        _thinking_block({"type": "signature_delta", "signature": PLANT})
    ),
    "duplicate-key": _a_dup,
}


# -- the gateways ----------------------------------------------------------------------------


def _stream(frames: list[bytes], name: str) -> Stream:
    """The frames cut at random byte boundaries (seeded by the plant's name)."""
    return Stream(frames, seed=len(name), max_piece=48, delay=0.0)


def _upstream() -> FakeUpstream:
    up = create_upstream()
    for decision, text in TEXTS.items():
        for name, plant in OPENAI_JSON_PLANTS.items():
            body = _openai_body(text)
            plant(body)
            up.on(f"oj-{name}-{decision}", Json(body))
        for name, build in OPENAI_STREAM_PLANTS.items():
            up.on(f"os-{name}-{decision}", _stream(build(text), name))
        for name, plant in ANTHROPIC_JSON_PLANTS.items():
            body = _anthropic_body(text)
            plant(body)
            up.on(f"aj-{name}-{decision}", Json(body))
        for name, build in ANTHROPIC_STREAM_PLANTS.items():
            up.on(f"as-{name}-{decision}", _stream(build(text), name))
        dup = json.dumps(_openai_body(text))
        up.on(f"oj-duplicate-key-{decision}", Json(f'{{"id": "{PLANT}", {dup[1:]}'.encode()))
        adup = json.dumps(_anthropic_body(text))
        up.on(f"aj-duplicate-key-{decision}", Json(f'{{"model": "{PLANT}", {adup[1:]}'.encode()))
    return up


class Gateways:
    def __init__(self, url: str, directory: Path) -> None:
        self.url = url
        self.directory = directory
        self._open: dict[tuple[str, str], Gateway] = {}
        self._exits: list[Any] = []

    def get(self, on_unverified: str, streaming: str) -> Gateway:
        key = (on_unverified, streaming)
        if key not in self._open:
            policy = write_policy(
                self.directory,
                on_unverified=on_unverified,
                streaming=streaming,
                filename=f"{on_unverified}-{streaming}.yaml",
            )
            cm = run_gateway(self.url, [policy])
            self._open[key] = cm.__enter__()
            self._exits.append(cm)
        return self._open[key]

    def close(self) -> None:
        for cm in reversed(self._exits):
            cm.__exit__(None, None, None)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    with serve(_upstream()) as url:
        gws = Gateways(url, tmp_path_factory.mktemp("policies"))
        try:
            yield gws
        finally:
            gws.close()


DECISIONS = list(TEXTS)
OPENAI_JSON = [*OPENAI_JSON_PLANTS, "duplicate-key"]
ANTHROPIC_JSON = [*ANTHROPIC_JSON_PLANTS, "duplicate-key"]


# Answers the gateway refuses as unusable (502, its message naming no upstream value): not
# the protocol's object at all, or a JSON body with a repeated key.
UNUSABLE = {"duplicate-key", "object"}


def _check(
    gws: Gateways, path: str, request: Body, scenario: str, decision: str, streaming: str,
    unusable: bool,
) -> bytes:
    gw = gws.get(ON_UNVERIFIED[decision], streaming)
    raw, status, body = raw_post(gw.url, path, request, scenario)
    assert_clean(raw, body)
    progressive = streaming == "progressive" and request["stream"]
    if unusable and not progressive:
        assert status == 502
    elif decision == "blocked" and not progressive:
        assert status == 422
    else:
        assert status == 200, body[:500]
    if status == 200 and not unusable and decision in ("released", "partial"):
        assert b"40 litres per minute" in body  # the verified text still goes out
    return body


def _run_all(
    gws: Gateways,
    path: str,
    request: Body,
    prefix: str,
    plants: list[str],
    decision: str,
    streaming: str,
    validate: Callable[[bytes], object] | None = None,
) -> None:
    """Every plant of one (protocol, framing, mode, decision) cell, requests in parallel (each
    exchange spends most of its time waiting); failures are reported by plant."""

    def one(plant: str) -> str | None:
        unusable = plant in UNUSABLE
        try:
            body = _check(
                gws, path, request, f"{prefix}-{plant}-{decision}", decision, streaming, unusable
            )
            if validate is not None and decision != "blocked" and not unusable:
                # What the gateway rebuilt is still what the SDK expects.
                validate(body)
        except Exception as e:  # collected: every plant is reported, not just the first
            return f"{plant}: {type(e).__name__}: {str(e)[:1500]}"
        return None

    gws.get(ON_UNVERIFIED[decision], streaming)  # started once, outside the threads
    with ThreadPoolExecutor(max_workers=12) as pool:
        failures = [f for f in pool.map(one, plants) if f is not None]
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("decision", DECISIONS)
def test_openai_json_fields(gateways: Gateways, decision: str) -> None:
    _run_all(
        gateways, "/v1/chat/completions", _openai_request(False), "oj", OPENAI_JSON, decision,
        "buffer", openai.types.chat.ChatCompletion.model_validate_json,
    )


@pytest.mark.parametrize("streaming", ["buffer", "progressive"])
@pytest.mark.parametrize("decision", DECISIONS)
def test_openai_stream_fields(gateways: Gateways, decision: str, streaming: str) -> None:
    _run_all(
        gateways, "/v1/chat/completions", _openai_request(True), "os",
        list(OPENAI_STREAM_PLANTS), decision, streaming,
    )


@pytest.mark.parametrize("decision", DECISIONS)
def test_anthropic_json_fields(gateways: Gateways, decision: str) -> None:
    _run_all(
        gateways, "/v1/messages", _anthropic_request(False), "aj", ANTHROPIC_JSON, decision,
        "buffer", anthropic.types.Message.model_validate_json,
    )


@pytest.mark.parametrize("streaming", ["buffer", "progressive"])
@pytest.mark.parametrize("decision", DECISIONS)
def test_anthropic_stream_fields(gateways: Gateways, decision: str, streaming: str) -> None:
    _run_all(
        gateways, "/v1/messages", _anthropic_request(True), "as",
        list(ANTHROPIC_STREAM_PLANTS), decision, streaming,
    )


# -- channel rules, the same in every mode -----------------------------------------------------


def _sse_json(body: bytes) -> list[Body]:
    decoder = SSEDecoder()
    events = [*decoder.feed(body), *decoder.finish()]
    return [json.loads(e.data) for e in events if e.data != "[DONE]"]


def _token_entries(text: str, top: bool) -> list[Body]:
    alternatives = [{"token": "x", "logprob": -9.0, "bytes": None}] if top else []
    return [
        {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": alternatives}
        for t in re.findall(r"\S+\s*", text)
    ]


def _logprob_stream(text: str, top: bool) -> list[bytes]:
    chunks = wire.openai_chunks(
        [], id="chatcmpl-1", model="gpt-x", created=1, usage=wire.Usage(5, 7)
    )
    for entry in _token_entries(text, top):
        extra = copy.deepcopy(chunks[0])
        extra["choices"][0]["delta"] = {"content": entry["token"]}
        extra["choices"][0]["logprobs"] = {"content": [entry], "refusal": None}
        chunks.insert(-1, extra)
    return _frames(chunks)


@pytest.mark.parametrize("logprobs", ["verify", "pass", "withhold"])
def test_logprobs_follow_the_released_text(tmp_path: Path, logprobs: str) -> None:
    up = create_upstream()
    for name, text in (("good", GOOD), ("mixed", f"{GOOD} {BAD}")):
        body = _openai_body(text)
        body["choices"][0]["logprobs"] = {"content": _token_entries(text, True), "refusal": None}
        up.on(f"json-{name}", Json(body))
        up.on(f"sse-{name}", _stream(_logprob_stream(text, True), name))
    policy = write_policy(tmp_path, on_unverified="strip", logprobs=logprobs)
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        _, status, body = raw_post(gw.url, "/v1/chat/completions", _openai_request(False),
                                   "json-good")
        lp = json.loads(body)["choices"][0]["logprobs"]
        if logprobs == "withhold":
            assert lp is None
        else:
            assert "".join(e["token"] for e in lp["content"]) == GOOD
            tops = [e["top_logprobs"] for e in lp["content"]]
            assert all(tops) if logprobs == "pass" else not any(tops)
        # A partial answer's text is not what the tokens spell: they are dropped.
        _, _, body = raw_post(gw.url, "/v1/chat/completions", _openai_request(False),
                              "json-mixed")
        assert json.loads(body)["choices"][0]["logprobs"] is None
        # In a buffered stream, logprobs deltas follow the same rule.
        _, status, body = raw_post(gw.url, "/v1/chat/completions", _openai_request(True),
                                   "sse-good")
        assert status == 200
        entries = [
            e
            for c in _sse_json(body)
            for ch in c["choices"]
            if ch.get("logprobs")
            for e in ch["logprobs"]["content"]
        ]
        if logprobs == "withhold":
            assert entries == []
        else:
            assert "".join(e["token"] for e in entries) == GOOD
            assert any(e["top_logprobs"] for e in entries) is (logprobs == "pass")


def _tool_and_reasoning_stream(text: str) -> list[bytes]:
    chunks = _openai_chunks(text)
    reasoning = copy.deepcopy(chunks[1])
    reasoning["choices"][0]["delta"] = {"reasoning_content": f"I think {PLANT}."}
    tool = copy.deepcopy(chunks[1])
    tool["choices"][0]["delta"] = {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"q": MARKER})},
            }
        ]
    }
    chunks[1:1] = [reasoning, tool]
    return _frames(chunks)


@pytest.mark.parametrize("streaming", ["buffer", "progressive"])
@pytest.mark.parametrize("rule", ["withhold", "pass"])
def test_reasoning_and_tool_rules_are_the_same_in_both_modes(
    tmp_path: Path, streaming: str, rule: str
) -> None:
    up = create_upstream({"s": _stream(_tool_and_reasoning_stream(GOOD), "s")})
    policy = write_policy(tmp_path, streaming=streaming, reasoning=rule, tool_calls=rule)
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        raw, status, body = raw_post(gw.url, "/v1/chat/completions", _openai_request(True), "s")
    assert status == 200
    frames = _sse_json(body)
    deltas = [ch["delta"] for c in frames for ch in c["choices"]]
    reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.get("tool_calls") or []]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == GOOD
    if rule == "withhold":
        assert MARKER.encode() not in raw
        assert reasoning == "" and calls == []
    else:
        assert reasoning == f"I think {PLANT}."
        assert MARKER in "".join(tc["function"].get("arguments", "") for tc in calls)


def test_a_clean_stream_goes_out_as_is_and_a_commented_one_is_reframed(tmp_path: Path) -> None:
    frames = _frames(_openai_chunks(GOOD))
    commented = [frames[0], b": keep-alive\n\n", *frames[1:]]
    up = create_upstream({"clean": _stream(frames, "a"), "commented": _stream(commented, "b")})
    with serve(up) as url, run_gateway(url, [write_policy(tmp_path)]) as gw:
        _, _, clean_body = raw_post(gw.url, "/v1/chat/completions", _openai_request(True),
                                    "clean")
        _, _, reframed = raw_post(gw.url, "/v1/chat/completions", _openai_request(True),
                                  "commented")
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0)
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "system", "content": CONTEXT}], stream=True,
            extra_headers={SCENARIO_HEADER: "commented"},
        )
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        client.close()
    assert clean_body == b"".join(frames)
    assert b"keep-alive" not in reframed and reframed != b"".join(commented)
    assert text == GOOD


def test_dropped_fields_are_counted_by_level(tmp_path: Path) -> None:
    body = _openai_body(GOOD)
    body["x_trace"] = PLANT
    body["choices"][0]["message"]["x_note"] = PLANT
    body["choices"][0]["finish_reason"] = PLANT
    up = create_upstream({"j": Json(body)})
    with serve(up) as url, run_gateway(url, [write_policy(tmp_path)]) as gw:
        raw, status, _ = raw_post(gw.url, "/v1/chat/completions", _openai_request(False), "j")
        assert status == 200 and MARKER.encode() not in raw
        text = httpx.get(gw.admin_url + "/metrics").text
    for level in ("top", "message", "choice"):
        line = f'citewarden_fields_dropped_total{{level="{level}",route="chat"}} 1.0'
        assert line in text, text

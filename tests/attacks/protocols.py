"""The protocol registry of the adversarial matrix.

Each `ProtocolSpec` knows how to build a request with trusted context, a good upstream answer
(a JSON body and, where the protocol streams, SSE frames), how to read the answer text back out
of a response, and its protocol-specific *plants*: upstream answers that carry the marker in a
field, block, frame or SSE line that the gateway must drop, withhold or verify. The generic
plants (headers, error bodies, malformed and ambiguous bodies, claims that try to escape
checking) are built for every protocol from the spec's own builders, so adding a protocol is one
`ProtocolSpec` entry in `REGISTRY`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.demo import wire
from gateway.types import Chunk
from tests.attacks import gemini_spec
from tests.attacks.harness import MARKER, RawResponse
from tests.upstream_app import (
    Behaviour,
    Html,
    InvalidJson,
    Json,
    Stream,
    anthropic_body,
    openai_body,
    rag_body,
    sse_objects,
)

Mode = Literal["json", "buffer", "progressive"]
MODES: tuple[Mode, ...] = ("json", "buffer", "progressive")

CHUNK_ID = "kb:1"
CHUNK_TEXT = "The Orbit pump moves 40 litres per minute."
CONTEXT_TAG = f'<chunk id="{CHUNK_ID}" version="2">{CHUNK_TEXT}</chunk>'
GOOD = "The Orbit pump moves 40 litres per minute [kb:1]."
BAD = f"The Orbit pump was designed by {MARKER} in 1931 [kb:404]."
"""A hallucinated claim (unknown chunk id and a number nobody gave) carrying the marker."""
QUESTION = "How fast does the Orbit pump move water?"
PIECE = 6  # characters per streamed text delta

PLANTED_ID = "doc:9"
PLANTED_TEXT = f"The Orbit pump was designed by {MARKER} in 1931."
PLANTED_TAG = f'<chunk id="{PLANTED_ID}">{PLANTED_TEXT}</chunk>'
PLANTED_ANSWER = f"{PLANTED_TEXT[:-1]} [{PLANTED_ID}]."


BIG_INT = ', "x_big": 12345678901234567890123'
"""A 23-digit integer: orjson cannot re-encode it, so the duplicate-key check takes its
fallback path for the object that holds it."""


def sign(key: bytes, chunk_id: str, version: str | None, text: str) -> str:
    """DESIGN §3: hex HMAC-SHA256 of id, version (empty when absent) and the raw tag text,
    joined by U+001F."""
    msg = "\x1f".join([chunk_id, version or "", text]).encode("utf-8")
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def signed_tag(key: bytes, chunk_id: str, text: str, version: str | None = None) -> str:
    v = f' version="{version}"' if version is not None else ""
    return f'<chunk id="{chunk_id}"{v} sig="{sign(key, chunk_id, version, text)}">{text}</chunk>'


@dataclass(frozen=True)
class Plant:
    """An upstream answer for one attack. `json` builds the non-streaming body (a dict is
    JSON-encoded, bytes go out verbatim), `stream` the SSE body; None = not applicable in that
    mode. `request` may rewrite the client's request (e.g. to add a document block); `path`
    overrides the spec's path; `fail_closed` says the answer is ambiguous or broken and must
    not be released at all (502, or the protocol's error event in a progressive stream)."""

    json: Callable[[], object] | None = None
    stream: Callable[[], list[bytes] | bytes] | None = None
    request: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    path: str | None = None
    fail_closed: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    status: int = 200

    def behaviour(self, mode: Mode) -> Behaviour | None:
        if mode == "json":
            if self.json is None:
                return None
            body = self.json()
            return Json(body, status=self.status, headers=self.headers)
        if self.stream is None:
            return None
        return Stream(self.stream(), seed=7, max_piece=256, delay=0.0, headers=self.headers)


@dataclass(frozen=True)
class ProtocolSpec:
    name: str
    path: str
    streams: bool
    text_key: str  # the JSON key the answer text sits under (for duplicate-key bodies)
    request: Callable[[str, bool], dict[str, Any]]
    body: Callable[[str], dict[str, Any]]
    frames: Callable[[str], list[bytes]] | None
    answer_text: Callable[[RawResponse], str]
    error_envelope: Callable[[str], dict[str, Any]]
    plants: Mapping[str, Plant]
    # untrusted places for a planted chunk tag: name -> request builder (question, stream)
    planted_requests: Mapping[str, Callable[[str, bool], dict[str, Any]]]
    # trusted places: name -> request builder carrying CONTEXT_TAG there
    trusted_requests: Mapping[str, Callable[[str, bool], dict[str, Any]]]
    error_protocol: Literal["openai-chat", "anthropic-messages", "rag-json", "gemini"] = (
        "openai-chat"
    )
    stream_path: str | None = None  # where a stream is asked for, when the path says so
    stream_content_type: str | None = None  # the upstream stream's, when it is not SSE
    stream_text_key: str | None = None  # the key text deltas sit under, when not `text_key`
    # Stream builders that replace a generic plant's (by name) where the generic one edits SSE
    # text and the protocol's stream is not SSE.
    stream_overrides: Mapping[str, Callable[[], list[bytes] | bytes]] = field(
        default_factory=dict
    )

    # Cases that do not depend on how a stream is buffered (claim segmentation, context
    # places, foreign error bodies) run in these modes only; None: in every mode.
    spot_modes: tuple[Mode, ...] | None = None

    @property
    def modes(self) -> tuple[Mode, ...]:
        return MODES if self.streams else ("json",)

    @property
    def mode_free(self) -> tuple[Mode, ...]:
        """The modes a case that does not depend on the streaming mode runs in."""
        return self.spot_modes or self.modes

    def good(self, text: str) -> Plant:
        frames = self.frames
        return Plant(
            json=lambda: self.body(text),
            stream=(lambda: frames(text)) if frames is not None else None,
        )


# --------------------------------------------------------------------------------------------
# openai-chat
# --------------------------------------------------------------------------------------------

_OA_HEAD = {
    "id": "chatcmpl-attack",
    "object": "chat.completion.chunk",
    "created": 1_700_000_000,
    "model": "fake-model",
    "system_fingerprint": "fp_attack",
}


def _oa_chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {**_OA_HEAD, "choices": [choice]}


def _oa_chunks(text: str) -> list[dict[str, Any]]:
    chunks = [_oa_chunk({"role": "assistant", "content": ""})]
    chunks += [_oa_chunk({"content": p}) for p in wire.split_fixed(text, PIECE)]
    chunks.append(_oa_chunk({}, "stop"))
    return chunks


def _oa_sse(chunks: list[dict[str, Any]], *, done: bool = True) -> list[bytes]:
    return wire.openai_frames(chunks, done=done)


def _oa_frames(text: str) -> list[bytes]:
    return _oa_sse(_oa_chunks(text))


def _oa_request(
    question: str, stream: bool, messages: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    msgs = (
        messages
        if messages is not None
        else [{"role": "system", "content": CONTEXT_TAG}, {"role": "user", "content": question}]
    )
    req: dict[str, Any] = {"model": "fake-model", "messages": msgs}
    if stream:
        req["stream"] = True
    return req


def _oa_answer_text(resp: RawResponse) -> str:
    ctype = resp.header("content-type") or ""
    if "event-stream" in ctype:
        out = []
        for obj in sse_objects(resp.body):
            for choice in obj.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if isinstance(piece, str):
                    out.append(piece)
        return "".join(out)
    try:
        obj = resp.json()
        return str(obj["choices"][0]["message"].get("content") or "")
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


def _oa_body(text: str) -> dict[str, Any]:
    return openai_body(text, id="chatcmpl-attack")


def _oa_mut(fn: Callable[[dict[str, Any]], None], text: str = GOOD) -> Callable[[], object]:
    def build() -> object:
        body = copy.deepcopy(_oa_body(text))
        fn(body)
        return body

    return build


def _oa_stream_mut(
    fn: Callable[[list[dict[str, Any]]], None], text: str = GOOD
) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        chunks = _oa_chunks(text)
        fn(chunks)
        return _oa_sse(chunks)

    return build


def _msg(body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = body["choices"][0]["message"]
    return message


def _set_all(key: str, value: object) -> Callable[[list[dict[str, Any]]], None]:
    def fn(chunks: list[dict[str, Any]]) -> None:
        for c in chunks:
            c[key] = value

    return fn


def _insert_delta(delta: dict[str, Any], at: int = 1) -> Callable[[list[dict[str, Any]]], None]:
    def fn(chunks: list[dict[str, Any]]) -> None:
        chunks.insert(at, _oa_chunk(delta))

    return fn


def _tool_call(**over: Any) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": "{}"},
    }
    fn_over = over.pop("function", {})
    call.update(over)
    call["function"] = {**call["function"], **fn_over}
    return call


def _oa_tool_plant(**over: Any) -> Plant:
    def json_fn(body: dict[str, Any]) -> None:
        _msg(body)["tool_calls"] = [_tool_call(**copy.deepcopy(over))]

    def stream_fn(chunks: list[dict[str, Any]]) -> None:
        call = _tool_call(**copy.deepcopy(over))
        chunks.insert(-1, _oa_chunk({"tool_calls": [{"index": 0, **call}]}))

    return Plant(json=_oa_mut(json_fn), stream=_oa_stream_mut(stream_fn))


def _tokens(text: str) -> list[dict[str, Any]]:
    return [
        {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []}
        for t in wire.split_fixed(text, PIECE)
    ]


def _oa_logprobs_differ() -> Plant:
    def json_fn(body: dict[str, Any]) -> None:
        body["choices"][0]["logprobs"] = {"content": _tokens(BAD), "refusal": None}

    def stream_fn(chunks: list[dict[str, Any]]) -> None:
        # one token of the hallucinated text per content delta; the last delta takes the rest
        tokens, content = _tokens(BAD), chunks[1:-1]
        for i, c in enumerate(content):
            mine = tokens[i : i + 1] if i < len(content) - 1 else tokens[i:]
            c["choices"][0]["logprobs"] = {"content": mine, "refusal": None}

    return Plant(json=_oa_mut(json_fn), stream=_oa_stream_mut(stream_fn))


def _oa_top_logprobs() -> Plant:
    def alt(tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for t in tokens:
            t["top_logprobs"] = [{"token": f" {MARKER} in 1931", "logprob": -2.0, "bytes": None}]
        return tokens

    def json_fn(body: dict[str, Any]) -> None:
        body["choices"][0]["logprobs"] = {"content": alt(_tokens(GOOD)), "refusal": None}

    def stream_fn(chunks: list[dict[str, Any]]) -> None:
        pieces = alt(_tokens(GOOD))
        for c, tok in zip(chunks[1:-1], pieces, strict=True):
            c["choices"][0]["logprobs"] = {"content": [tok], "refusal": None}

    return Plant(json=_oa_mut(json_fn), stream=_oa_stream_mut(stream_fn))


def _oa_second_choice() -> Plant:
    def json_fn() -> object:
        body = openai_body(GOOD, n=2, id="chatcmpl-attack")
        body["choices"][1]["message"]["content"] = BAD
        return body

    def stream_fn(chunks: list[dict[str, Any]]) -> None:
        chunks.insert(1, _oa_chunk({"role": "assistant", "content": BAD}, index=1))
        chunks.insert(-1, _oa_chunk({}, "stop", index=1))

    return Plant(json=json_fn, stream=_oa_stream_mut(stream_fn))


def _raw_stream(build: Callable[[], list[bytes]], extra: bytes, at: int = 2) -> Callable[[], bytes]:
    def fn() -> bytes:
        frames = build()
        return b"".join(frames[:at]) + extra + b"".join(frames[at:])

    return fn


def _sse_line_plants(
    frames: Callable[[], list[bytes]], data_frame: Callable[[], bytes]
) -> dict[str, Plant]:
    """SSE comment lines and `event:` / `id:` / `retry:` / unknown fields carrying the marker."""
    m = BAD.encode()
    return {
        "sse-comment-line": Plant(stream=_raw_stream(frames, b": " + m + b"\n\n")),
        "sse-comment-in-frame": Plant(stream=_raw_stream(frames, b": " + m + b"\n" + data_frame())),
        "sse-event-field": Plant(stream=_raw_stream(frames, b"event: " + m + b"\n" + data_frame())),
        "sse-id-field": Plant(stream=_raw_stream(frames, b"id: " + m + b"\n" + data_frame())),
        "sse-retry-field": Plant(stream=_raw_stream(frames, b"retry: " + m + b"\n\n")),
        "sse-unknown-field": Plant(
            stream=_raw_stream(frames, b"x-note: " + m + b"\n" + data_frame())
        ),
    }


def _oa_data_frame() -> bytes:
    return wire.sse(_oa_chunk({"content": ""}))


def _oa_plants() -> dict[str, Plant]:
    good_frames = lambda: _oa_frames(GOOD)  # noqa: E731
    plants: dict[str, Plant] = {
        "top-level-unknown-key": Plant(
            json=_oa_mut(lambda b: b.__setitem__("x_trace", BAD)),
            stream=_oa_stream_mut(_set_all("x_trace", BAD)),
        ),
        "top-level-unknown-object": Plant(
            json=_oa_mut(lambda b: b.__setitem__("metadata", {"note": BAD})),
            stream=_oa_stream_mut(_set_all("metadata", {"note": BAD})),
        ),
        "top-level-model-not-token": Plant(
            json=_oa_mut(lambda b: b.__setitem__("model", BAD)),
            stream=_oa_stream_mut(_set_all("model", BAD)),
        ),
        "top-level-fingerprint-not-token": Plant(
            json=_oa_mut(lambda b: b.__setitem__("system_fingerprint", BAD)),
            stream=_oa_stream_mut(_set_all("system_fingerprint", BAD)),
        ),
        "top-level-id-not-token": Plant(
            json=_oa_mut(lambda b: b.__setitem__("id", BAD)),
            stream=_oa_stream_mut(_set_all("id", BAD)),
        ),
        "usage-unknown-key": Plant(
            json=_oa_mut(lambda b: b["usage"].__setitem__("x_note", BAD)),
            stream=_oa_stream_mut(
                lambda cs: cs.append(
                    {**_OA_HEAD, "choices": [], "usage": {"prompt_tokens": 1, "x_note": BAD}}
                )
            ),
        ),
        "choice-unknown-key": Plant(
            json=_oa_mut(lambda b: b["choices"][0].__setitem__("x_meta", {"note": BAD})),
            stream=_oa_stream_mut(
                lambda cs: [c["choices"][0].__setitem__("x_meta", BAD) for c in cs] and None
            ),
        ),
        "finish-reason-not-token": Plant(
            json=_oa_mut(lambda b: b["choices"][0].__setitem__("finish_reason", BAD)),
            stream=_oa_stream_mut(
                lambda cs: cs[-1]["choices"][0].__setitem__("finish_reason", BAD)
            ),
        ),
        "message-unknown-key": Plant(
            json=_oa_mut(lambda b: _msg(b).__setitem__("x_note", BAD)),
            stream=_oa_stream_mut(_insert_delta({"x_note": BAD})),
        ),
        "message-name": Plant(
            json=_oa_mut(lambda b: _msg(b).__setitem__("name", BAD)),
            stream=_oa_stream_mut(_insert_delta({"name": BAD})),
        ),
        "message-role-not-assistant": Plant(
            json=_oa_mut(lambda b: _msg(b).__setitem__("role", BAD)),
            stream=_oa_stream_mut(_insert_delta({"role": BAD})),
        ),
        "refusal": Plant(
            json=_oa_mut(lambda b: _msg(b).__setitem__("refusal", BAD)),
            stream=_oa_stream_mut(_insert_delta({"refusal": BAD}, at=-1)),
        ),
        "second-choice": _oa_second_choice(),
        "content-hallucinated": Plant(
            json=lambda: _oa_body(f"{GOOD} {BAD}"), stream=lambda: _oa_frames(f"{GOOD} {BAD}")
        ),
        "tool-call-id": _oa_tool_plant(id=BAD),
        "tool-call-name": _oa_tool_plant(function={"name": BAD}),
        "tool-call-type": _oa_tool_plant(type=BAD),
        "tool-call-unknown-key": _oa_tool_plant(x_note=BAD),
        "tool-call-function-unknown-key": _oa_tool_plant(function={"x_note": BAD}),
        "tool-call-arguments": _oa_tool_plant(function={"arguments": json.dumps({"summary": BAD})}),
        "function-call-legacy": Plant(
            json=_oa_mut(
                lambda b: _msg(b).__setitem__(
                    "function_call", {"name": "lookup", "arguments": json.dumps({"s": BAD})}
                )
            ),
            stream=_oa_stream_mut(
                _insert_delta(
                    {"function_call": {"name": "lookup", "arguments": json.dumps({"s": BAD})}},
                    at=-1,
                )
            ),
        ),
        "function-call-name": Plant(
            json=_oa_mut(
                lambda b: _msg(b).__setitem__("function_call", {"name": BAD, "arguments": "{}"})
            ),
            stream=_oa_stream_mut(
                _insert_delta({"function_call": {"name": BAD, "arguments": "{}"}}, at=-1)
            ),
        ),
        "annotation-title": Plant(
            json=_oa_mut(
                lambda b: _msg(b).__setitem__(
                    "annotations",
                    [
                        {
                            "type": "url_citation",
                            "url_citation": {
                                "url": "https://example.com/pump",
                                "title": BAD,
                                "start_index": 0,
                                "end_index": 9,
                            },
                        }
                    ],
                )
            ),
            stream=_oa_stream_mut(
                _insert_delta(
                    {
                        "annotations": [
                            {
                                "type": "url_citation",
                                "url_citation": {"url": "https://example.com", "title": BAD},
                            }
                        ]
                    },
                    at=-1,
                )
            ),
        ),
        "audio-transcript": Plant(
            json=_oa_mut(
                lambda b: _msg(b).__setitem__(
                    "audio", {"id": "audio_1", "data": "", "expires_at": 1, "transcript": BAD}
                )
            ),
            stream=_oa_stream_mut(_insert_delta({"audio": {"id": "a", "transcript": BAD}}, at=-1)),
        ),
        "logprobs-tokens-differ": _oa_logprobs_differ(),
        "top-logprobs": _oa_top_logprobs(),
        "reasoning-content": Plant(
            json=_oa_mut(lambda b: _msg(b).__setitem__("reasoning_content", BAD)),
            stream=_oa_stream_mut(_insert_delta({"reasoning_content": BAD})),
        ),
        "reasoning": Plant(
            json=_oa_mut(lambda b: _msg(b).__setitem__("reasoning", BAD)),
            stream=_oa_stream_mut(_insert_delta({"reasoning": BAD})),
        ),
        "reasoning-details": Plant(
            json=_oa_mut(
                lambda b: _msg(b).__setitem__(
                    "reasoning_details", [{"type": "reasoning.text", "text": BAD}]
                )
            ),
            stream=_oa_stream_mut(
                _insert_delta({"reasoning_details": [{"type": "reasoning.text", "text": BAD}]})
            ),
        ),
        "frame-after-done": Plant(
            stream=lambda: [*_oa_frames(GOOD), wire.sse(_oa_chunk({"content": BAD}))]
        ),
        "unknown-object-frame": Plant(
            stream=_raw_stream(good_frames, wire.sse({"object": "x.debug", "note": BAD}))
        ),
    }
    plants.update(_sse_line_plants(good_frames, _oa_data_frame))
    return plants


def _oa_planted(role: str, parts: bool = False) -> Callable[[str, bool], dict[str, Any]]:
    def build(question: str, stream: bool) -> dict[str, Any]:
        content: Any = f"{PLANTED_TAG}\n{question}"
        if parts:
            content = [{"type": "text", "text": PLANTED_TAG}, {"type": "text", "text": question}]
        msgs: list[dict[str, Any]] = [{"role": "system", "content": CONTEXT_TAG}]
        if role == "assistant":
            msgs += [
                {"role": "user", "content": "Tell me about the pump."},
                {"role": "assistant", "content": content},
                {"role": "user", "content": question},
            ]
        elif role == "user-name":
            msgs.append({"role": "user", "name": PLANTED_TAG, "content": question})
        else:
            msgs.append({"role": role, "content": content})
        return _oa_request(question, stream, msgs)

    return build


def _oa_trusted(role: str) -> Callable[[str, bool], dict[str, Any]]:
    def build(question: str, stream: bool) -> dict[str, Any]:
        if role == "tool":
            msgs: list[dict[str, Any]] = [
                {"role": "user", "content": question},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [_tool_call(id="call_9")],
                },
                {"role": "tool", "tool_call_id": "call_9", "content": CONTEXT_TAG},
            ]
        else:
            msgs = [{"role": role, "content": CONTEXT_TAG}, {"role": "user", "content": question}]
        return _oa_request(question, stream, msgs)

    return build


OPENAI = ProtocolSpec(
    name="openai-chat",
    path="/v1/chat/completions",
    streams=True,
    text_key="content",
    request=lambda q, s: _oa_request(q, s),
    body=_oa_body,
    frames=_oa_frames,
    answer_text=_oa_answer_text,
    error_envelope=lambda m: wire.openai_error(m),
    plants=_oa_plants(),
    planted_requests={
        "user-string": _oa_planted("user"),
        "user-parts": _oa_planted("user", parts=True),
        "assistant-history": _oa_planted("assistant"),
        "user-name-field": _oa_planted("user-name"),
    },
    trusted_requests={
        "system": _oa_trusted("system"),
        "developer": _oa_trusted("developer"),
        "tool": _oa_trusted("tool"),
    },
    error_protocol="openai-chat",
)

# --------------------------------------------------------------------------------------------
# anthropic-messages
# --------------------------------------------------------------------------------------------

Event = tuple[str, dict[str, Any]]


def _an_body(text: str) -> dict[str, Any]:
    return anthropic_body(text, id="msg_attack")


def _an_events(text: str) -> list[Event]:
    return [
        (name, dict(data))
        for name, data in wire.anthropic_events(
            wire.split_fixed(text, PIECE),
            id="msg_attack",
            model="claude-fake",
            usage=wire.Usage(20, 10),
        )
    ]


def _an_frames(text: str) -> list[bytes]:
    return wire.anthropic_frames(_an_events(text))


def _an_request(
    question: str,
    stream: bool,
    messages: list[dict[str, Any]] | None = None,
    system: Any = CONTEXT_TAG,
) -> dict[str, Any]:
    req: dict[str, Any] = {
        "model": "claude-fake",
        "max_tokens": 256,
        "messages": messages if messages is not None else [{"role": "user", "content": question}],
    }
    if system is not None:
        req["system"] = system
    if stream:
        req["stream"] = True
    return req


def _an_answer_text(resp: RawResponse) -> str:
    ctype = resp.header("content-type") or ""
    if "event-stream" in ctype:
        out = []
        for obj in sse_objects(resp.body):
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                out.append(str(delta.get("text", "")))
            block = obj.get("content_block")
            if isinstance(block, dict) and block.get("type") == "text":
                out.append(str(block.get("text", "")))
        return "".join(out)
    try:
        return "".join(b.get("text", "") for b in resp.json()["content"] if b.get("type") == "text")
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def _an_mut(fn: Callable[[dict[str, Any]], None], text: str = GOOD) -> Callable[[], object]:
    def build() -> object:
        body = copy.deepcopy(_an_body(text))
        fn(body)
        return body

    return build


def _an_stream_mut(
    fn: Callable[[list[Event]], None], text: str = GOOD
) -> Callable[[], list[bytes]]:
    def build() -> list[bytes]:
        events = copy.deepcopy(_an_events(text))
        fn(events)
        return wire.anthropic_frames(events)

    return build


def _an_start_msg(events: list[Event]) -> dict[str, Any]:
    msg: dict[str, Any] = events[0][1]["message"]
    return msg


def _an_shift(events: list[Event], by: int) -> None:
    for _, data in events:
        if "index" in data:
            data["index"] += by


def _an_prepend_block(
    block: dict[str, Any], deltas: list[dict[str, Any]]
) -> Callable[[list[Event]], None]:
    """A content block at index 0 (the text block moves to index 1)."""

    def fn(events: list[Event]) -> None:
        _an_shift(events, 1)
        new: list[Event] = [
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            ),
            *[
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})
                for d in deltas
            ],
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        events[1:1] = new

    return fn


def _an_append_block(
    block: dict[str, Any], deltas: list[dict[str, Any]]
) -> Callable[[list[Event]], None]:
    def fn(events: list[Event]) -> None:
        at = next(i for i, (n, _) in enumerate(events) if n == "message_delta")
        new: list[Event] = [
            (
                "content_block_start",
                {"type": "content_block_start", "index": 1, "content_block": block},
            ),
            *[
                ("content_block_delta", {"type": "content_block_delta", "index": 1, "delta": d})
                for d in deltas
            ],
            ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ]
        events[at:at] = new

    return fn


def _an_insert(event: Event, before: str = "content_block_stop") -> Callable[[list[Event]], None]:
    def fn(events: list[Event]) -> None:
        at = next(i for i, (n, _) in enumerate(events) if n == before)
        events.insert(at, event)

    return fn


def _an_tool_plant(block: dict[str, Any], partial_json: str = "{}") -> Plant:
    def json_fn(body: dict[str, Any]) -> None:
        body["content"].append(copy.deepcopy(block))
        body["stop_reason"] = "tool_use"

    start = {**copy.deepcopy(block), "input": {}}
    return Plant(
        json=_an_mut(json_fn),
        stream=_an_stream_mut(
            _an_append_block(start, [{"type": "input_json_delta", "partial_json": partial_json}])
        ),
    )


_TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}
DOC_TEXT = CHUNK_TEXT


def _with_document(req: dict[str, Any]) -> dict[str, Any]:
    req = copy.deepcopy(req)
    doc = {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": DOC_TEXT},
        "title": "Pump manual",
        "citations": {"enabled": True},
    }
    req["messages"][-1]["content"] = [doc, {"type": "text", "text": QUESTION}]
    return req


def _citation(**over: Any) -> dict[str, Any]:
    return {
        "type": "char_location",
        "cited_text": DOC_TEXT,
        "document_index": 0,
        "document_title": "Pump manual",
        "start_char_index": 0,
        "end_char_index": len(DOC_TEXT),
        **over,
    }


def _an_citation_plant(**over: Any) -> Plant:
    text = "The Orbit pump moves 40 litres per minute."

    def json_fn() -> object:
        body = _an_body(text)
        body["content"][0]["citations"] = [_citation(**over)]
        return body

    def stream_fn() -> list[bytes]:
        events = _an_events(text)
        cit: Event = (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "citations_delta", "citation": _citation(**over)},
            },
        )
        _an_insert(cit)(events)
        return wire.anthropic_frames(events)

    return Plant(json=json_fn, stream=stream_fn, request=_with_document)


def _an_data_frame() -> bytes:
    return wire.sse(
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ""}},
        event="content_block_delta",
    )


def _an_plants() -> dict[str, Plant]:
    good_frames = lambda: _an_frames(GOOD)  # noqa: E731
    thinking = {"type": "thinking", "thinking": BAD, "signature": "c2ln"}
    plants: dict[str, Plant] = {
        "content-hallucinated": Plant(
            json=lambda: _an_body(f"{GOOD} {BAD}"), stream=lambda: _an_frames(f"{GOOD} {BAD}")
        ),
        "second-text-block": Plant(
            json=_an_mut(lambda b: b["content"].append({"type": "text", "text": BAD})),
            stream=_an_stream_mut(
                _an_append_block(
                    {"type": "text", "text": ""}, [{"type": "text_delta", "text": BAD}]
                )
            ),
        ),
        "top-level-unknown-key": Plant(
            json=_an_mut(lambda b: b.__setitem__("x_trace", BAD)),
            stream=_an_stream_mut(lambda es: _an_start_msg(es).__setitem__("x_trace", BAD)),
        ),
        "top-level-model-not-token": Plant(
            json=_an_mut(lambda b: b.__setitem__("model", BAD)),
            stream=_an_stream_mut(lambda es: _an_start_msg(es).__setitem__("model", BAD)),
        ),
        "top-level-id-not-token": Plant(
            json=_an_mut(lambda b: b.__setitem__("id", BAD)),
            stream=_an_stream_mut(lambda es: _an_start_msg(es).__setitem__("id", BAD)),
        ),
        "top-level-container": Plant(
            json=_an_mut(lambda b: b.__setitem__("container", {"id": "c1", "note": BAD})),
            stream=_an_stream_mut(
                lambda es: _an_start_msg(es).__setitem__("container", {"id": "c", "note": BAD})
            ),
        ),
        "usage-unknown-key": Plant(
            json=_an_mut(lambda b: b["usage"].__setitem__("x_note", BAD)),
            stream=_an_stream_mut(lambda es: es[-2][1]["usage"].__setitem__("x_note", BAD)),
        ),
        "stop-reason-not-token": Plant(
            json=_an_mut(lambda b: b.__setitem__("stop_reason", BAD)),
            stream=_an_stream_mut(lambda es: es[-2][1]["delta"].__setitem__("stop_reason", BAD)),
        ),
        "message-delta-unknown-key": Plant(
            stream=_an_stream_mut(lambda es: es[-2][1]["delta"].__setitem__("x_note", BAD)),
        ),
        "block-unknown-key": Plant(
            json=_an_mut(lambda b: b["content"][0].__setitem__("x_note", BAD)),
            stream=_an_stream_mut(lambda es: es[1][1]["content_block"].__setitem__("x_note", BAD)),
        ),
        "delta-unknown-key": Plant(
            stream=_an_stream_mut(lambda es: es[3][1]["delta"].__setitem__("x_note", BAD)),
        ),
        "unknown-block-type": Plant(
            json=_an_mut(lambda b: b["content"].append({"type": "x_debug", "text": BAD})),
            stream=_an_stream_mut(_an_append_block({"type": "x_debug", "text": BAD}, [])),
        ),
        # A delta for a block whose type is a sentence: the error never names the type.
        "prose-block-type": Plant(
            stream=_an_stream_mut(
                _an_append_block({"type": BAD}, [{"type": "text_delta", "text": "x"}])
            ),
        ),
        "tool-use-id": _an_tool_plant({**_TOOL_USE, "id": BAD}),
        "tool-use-name": _an_tool_plant({**_TOOL_USE, "name": BAD}),
        "tool-use-unknown-key": _an_tool_plant({**_TOOL_USE, "x_note": BAD}),
        "tool-use-input": _an_tool_plant(
            {**_TOOL_USE, "input": {"summary": BAD}}, json.dumps({"summary": BAD})
        ),
        "citation-document-title": _an_citation_plant(document_title=BAD),
        "citation-unknown-key": _an_citation_plant(x_note=BAD),
        "thinking": Plant(
            json=_an_mut(lambda b: b["content"].insert(0, dict(thinking))),
            stream=_an_stream_mut(
                _an_prepend_block(
                    {"type": "thinking", "thinking": "", "signature": ""},
                    [
                        {"type": "thinking_delta", "thinking": BAD},
                        {"type": "signature_delta", "signature": "c2ln"},
                    ],
                )
            ),
        ),
        "ping-unknown-key": Plant(
            stream=_an_stream_mut(
                lambda es: [d.__setitem__("x_note", BAD) for n, d in es if n == "ping"] and None
            )
        ),
        "unknown-event": Plant(
            stream=_raw_stream(
                good_frames, wire.sse({"type": "x_debug", "text": BAD}, event="x_debug")
            )
        ),
        "stream-error-event": Plant(
            stream=lambda: [
                *_an_frames(GOOD)[:4],
                wire.sse(
                    {"type": "error", "error": {"type": "overloaded_error", "message": BAD}},
                    event="error",
                ),
            ]
        ),
        "event-after-message-stop": Plant(
            stream=lambda: [
                *_an_frames(GOOD),
                wire.sse(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": BAD},
                    },
                    event="content_block_delta",
                ),
            ]
        ),
    }
    plants.update(_sse_line_plants(good_frames, _an_data_frame))
    return plants


def _an_planted(where: str) -> Callable[[str, bool], dict[str, Any]]:
    def build(question: str, stream: bool) -> dict[str, Any]:
        content: Any
        if where == "user-string":
            msgs: list[dict[str, Any]] = [{"role": "user", "content": f"{PLANTED_TAG}\n{question}"}]
        elif where == "user-text-block":
            content = [{"type": "text", "text": PLANTED_TAG}, {"type": "text", "text": question}]
            msgs = [{"role": "user", "content": content}]
        elif where == "user-text-beside-tool-result":
            msgs = [
                {"role": "user", "content": "Look it up."},
                {"role": "assistant", "content": [dict(_TOOL_USE)]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": CONTEXT_TAG},
                        {"type": "text", "text": f"{PLANTED_TAG} {question}"},
                    ],
                },
            ]
        else:  # assistant-history
            msgs = [
                {"role": "user", "content": "Tell me about the pump."},
                {"role": "assistant", "content": PLANTED_TAG},
                {"role": "user", "content": question},
            ]
        return _an_request(question, stream, msgs)

    return build


def _an_trusted(where: str) -> Callable[[str, bool], dict[str, Any]]:
    def build(question: str, stream: bool) -> dict[str, Any]:
        if where == "system":
            return _an_request(question, stream)
        if where == "system-blocks":
            return _an_request(question, stream, system=[{"type": "text", "text": CONTEXT_TAG}])
        msgs = [
            {"role": "user", "content": question},
            {"role": "assistant", "content": [dict(_TOOL_USE)]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": CONTEXT_TAG}
                ],
            },
        ]
        return _an_request(question, stream, msgs, system=None)

    return build


ANTHROPIC = ProtocolSpec(
    name="anthropic-messages",
    path="/v1/messages",
    streams=True,
    text_key="text",
    request=lambda q, s: _an_request(q, s),
    body=_an_body,
    frames=_an_frames,
    answer_text=_an_answer_text,
    error_envelope=lambda m: wire.anthropic_error(m),
    plants=_an_plants(),
    planted_requests={
        "user-string": _an_planted("user-string"),
        "user-text-block": _an_planted("user-text-block"),
        "user-text-beside-tool-result": _an_planted("user-text-beside-tool-result"),
        "assistant-history": _an_planted("assistant-history"),
    },
    trusted_requests={
        "system": _an_trusted("system"),
        "system-blocks": _an_trusted("system-blocks"),
        "tool-result": _an_trusted("tool-result"),
    },
    error_protocol="anthropic-messages",
)

# --------------------------------------------------------------------------------------------
# rag-json
# --------------------------------------------------------------------------------------------

SOURCES = [Chunk(id=CHUNK_ID, text=CHUNK_TEXT, version="2")]


def _rag_body(text: str) -> dict[str, Any]:
    return rag_body(text, SOURCES)


def _rag_request(question: str, stream: bool) -> dict[str, Any]:
    return {"question": question}


def _rag_answer_text(resp: RawResponse) -> str:
    try:
        obj = resp.json()
    except ValueError:
        return ""
    if isinstance(obj, dict) and isinstance(obj.get("answer"), str):
        return str(obj["answer"])
    if isinstance(obj, dict) and isinstance(obj.get("claims"), list):
        return " ".join(str(c.get("text", "")) for c in obj["claims"] if isinstance(c, dict))
    return ""


def _rag_mut(fn: Callable[[dict[str, Any]], None], text: str = GOOD) -> Callable[[], object]:
    def build() -> object:
        body = copy.deepcopy(_rag_body(text))
        fn(body)
        return body

    return build


def _rag_claims(claims: list[dict[str, Any]]) -> Callable[[], object]:
    return lambda: {"claims": claims, "sources": [dict(s) for s in _rag_body("")["sources"]]}


RAG_CLAIMS_PATH = "/rag/claims/answer"


def _rag_plants() -> dict[str, Plant]:
    good_claim = {"text": "The Orbit pump moves 40 litres per minute.", "citations": [CHUNK_ID]}
    return {
        "content-hallucinated": Plant(json=lambda: _rag_body(f"{GOOD} {BAD}")),
        "top-level-unknown-key": Plant(json=_rag_mut(lambda b: b.__setitem__("debug", BAD))),
        "top-level-unknown-object": Plant(
            json=_rag_mut(lambda b: b.__setitem__("trace", {"prompt": BAD, "draft": [BAD]}))
        ),
        "answer-not-a-string": Plant(
            json=_rag_mut(lambda b: b.__setitem__("answer", {"text": BAD})), fail_closed=True
        ),
        "answer-list": Plant(
            json=_rag_mut(lambda b: b.__setitem__("answer", [GOOD, BAD])), fail_closed=True
        ),
        "structured-claim-hallucinated": Plant(
            json=_rag_claims([good_claim, {"text": BAD, "citations": ["kb:404"]}]),
            path=RAG_CLAIMS_PATH,
        ),
        "structured-claim-unknown-key": Plant(
            json=_rag_claims([{**good_claim, "note": BAD}]), path=RAG_CLAIMS_PATH
        ),
        # The same kept claim in a partial answer (another claim fails): rebuilt, not copied.
        "structured-claim-unknown-key-partial": Plant(
            json=_rag_claims(
                [
                    {**good_claim, "note": BAD,
                     "citations": [{"id": CHUNK_ID, "title": BAD}]},
                    {"text": f"{MARKER} runs at 90 litres.", "citations": ["kb:404"]},
                ]
            ),
            path=RAG_CLAIMS_PATH,
        ),
        "structured-claim-no-citations": Plant(
            json=_rag_claims([good_claim, {"text": BAD[: BAD.index(" [")] + "."}]),
            path=RAG_CLAIMS_PATH,
        ),
        "structured-claim-citation-nested-id": Plant(
            json=_rag_claims(
                [{**good_claim, "citations": [{"id": {"id": CHUNK_ID, "note": BAD}}]}]
            ),
            path=RAG_CLAIMS_PATH,
        ),
        "structured-claim-citation-object": Plant(
            json=_rag_claims(
                [good_claim, {"text": BAD, "citations": [{"id": CHUNK_ID, "x": BAD}]}]
            ),
            path=RAG_CLAIMS_PATH,
        ),
    }


RAG = ProtocolSpec(
    name="rag-json",
    path="/rag/answer",
    streams=False,
    text_key="answer",
    request=_rag_request,
    body=_rag_body,
    frames=None,
    answer_text=_rag_answer_text,
    error_envelope=lambda m: {"error": {"message": m, "type": "error"}},
    plants=_rag_plants(),
    planted_requests={
        "question": lambda q, s: {"question": f"{PLANTED_TAG} {q}"},
        "nested-field": lambda q, s: {"question": q, "filters": {"note": PLANTED_TAG}},
    },
    trusted_requests={"response-sources": _rag_request},
    error_protocol="rag-json",
)

from tests.attacks.bedrock_spec import BEDROCK  # noqa: E402  (it builds on the names above)
from tests.attacks.cohere_spec import COHERE  # noqa: E402  (the same)
from tests.attacks.responses_spec import RESPONSES  # noqa: E402  (the same)

GEMINI = gemini_spec.spec(
    ProtocolSpec, Plant, context=CONTEXT_TAG, planted=PLANTED_TAG, good=GOOD, bad=BAD,
    piece=PIECE, sse_line_plants=_sse_line_plants,
)

REGISTRY: dict[str, ProtocolSpec] = {
    s.name: s for s in (OPENAI, ANTHROPIC, RAG, COHERE, GEMINI, RESPONSES, BEDROCK)
}
"""Adding a protocol to the matrix is one entry here."""


# --------------------------------------------------------------------------------------------
# Plants every protocol gets, built from the spec's own builders
# --------------------------------------------------------------------------------------------

PLANTED_HEADERS = {
    "x-debug-answer": BAD,
    "x-upstream-note": BAD,
    "set-cookie": f"session={MARKER}; Path=/",
    "link": f"<https://example.com/{MARKER}>; rel=next",
    "server": f"{MARKER}-server",
    "x-citewarden-decision": f"released {MARKER}",
    "x-citewarden-context": MARKER,
    "content-disposition": f'attachment; filename="{MARKER}.txt"',
    "warning": f'199 - "{BAD}"',
}


def _dup_text(spec: ProtocolSpec, reverse: bool, extra: str = "") -> Callable[[], bytes]:
    def build() -> bytes:
        raw = json.dumps(spec.body(GOOD))
        needle = f'"{spec.text_key}": {json.dumps(GOOD)}'
        assert needle in raw, (needle, raw)
        evil = f'"{spec.text_key}": {json.dumps(BAD)}'
        return raw.replace(
            needle, (f"{evil}, {needle}" if reverse else f"{needle}, {evil}") + extra, 1
        ).encode()

    return build


def _dup_stream(
    spec: ProtocolSpec, reverse: bool, extra: str = ""
) -> Callable[[], bytes] | None:
    frames = spec.frames
    if frames is None:
        return None

    def build() -> bytes:
        raw = b"".join(frames(GOOD)).decode()
        key = spec.stream_text_key or spec.text_key
        needle = f'"{key}": {json.dumps(GOOD[:PIECE])}'
        assert needle in raw, (needle, raw)
        evil = f'"{key}": {json.dumps(BAD)}'
        return raw.replace(
            needle, (f"{evil}, {needle}" if reverse else f"{needle}, {evil}") + extra, 1
        ).encode()

    return build


def _dup_top(spec: ProtocolSpec) -> Callable[[], bytes]:
    def build() -> bytes:
        body = spec.body(GOOD)
        key = next(iter(body))  # a key the body really has: its first one, repeated
        rest = json.dumps(body)[1:]
        return ("{" + json.dumps(key) + ": " + json.dumps(BAD) + ", " + rest).encode()

    return build


def _dup_top_stream(spec: ProtocolSpec) -> Callable[[], bytes] | None:
    frames = spec.frames
    if frames is None:
        return None

    def build() -> bytes:
        fs = frames(GOOD)
        # the first data frame gets a duplicate "type"/"object" discriminator key first
        text = fs[1].decode() if len(fs) > 1 else fs[0].decode()
        at = text.index("data: ") + len("data: ")
        evil = text[: at + 1] + '"x_dup": ' + json.dumps(BAD) + ', "x_dup": 1, ' + text[at + 1 :]
        return b"".join([fs[0], evil.encode(), *fs[2:]]) if len(fs) > 1 else evil.encode()

    return build


def _garbage_stream(spec: ProtocolSpec) -> Callable[[], bytes] | None:
    frames = spec.frames
    if frames is None:
        return None

    def build() -> bytes:
        fs = frames(GOOD)
        bad = b'data: {"choices": [{"delta": {"content": "' + BAD.encode() + b'"\n\n'
        return b"".join([*fs[:2], bad, *fs[2:]])

    return build


def generic_plants(spec: ProtocolSpec) -> dict[str, Plant]:
    """Upstream headers, error bodies, malformed and ambiguous bodies, for any protocol."""
    good = spec.good(GOOD)
    env = spec.error_envelope
    plants = {
        "upstream-response-headers": Plant(
            json=good.json, stream=good.stream, headers=PLANTED_HEADERS
        ),
        "error-500-envelope": Plant(json=lambda: env(BAD), stream=lambda: env(BAD), status=500),
        "error-503-envelope": Plant(
            json=lambda: env(BAD),
            stream=lambda: env(BAD),
            status=503,
            headers={"retry-after": "1"},
        ),
        "error-4xx-envelope-extra-field": Plant(
            json=lambda: {**env("the request was refused"), "x_note": BAD},
            stream=lambda: {**env("the request was refused"), "x_note": BAD},
            status=400,
        ),
        "malformed-json": Plant(
            json=lambda: b'{"choices": [{"message": {"content": "' + BAD.encode() + b'"',
            fail_closed=True,
        ),
        "malformed-trailing-garbage": Plant(
            json=lambda: json.dumps(spec.body(GOOD)).encode() + b" " + BAD.encode(),
            fail_closed=True,
        ),
        "malformed-not-json": Plant(json=lambda: BAD.encode(), fail_closed=True),
        "malformed-stream-frame": Plant(stream=_garbage_stream(spec), fail_closed=True),
        "duplicate-key-text": Plant(
            json=_dup_text(spec, False), stream=_dup_stream(spec, False), fail_closed=True
        ),
        "duplicate-key-text-reversed": Plant(
            json=_dup_text(spec, True), stream=_dup_stream(spec, True), fail_closed=True
        ),
        "duplicate-key-top-level": Plant(
            json=_dup_top(spec), stream=_dup_top_stream(spec), fail_closed=True
        ),
        "duplicate-key-beside-big-integer": Plant(
            json=_dup_text(spec, False, BIG_INT),
            stream=_dup_stream(spec, False, BIG_INT),
            fail_closed=True,
        ),
    }
    for name, stream in spec.stream_overrides.items():
        plants[name] = dataclasses.replace(plants[name], stream=stream)
    return plants


def error_behaviour(plant: Plant, mode: Mode) -> Behaviour | None:
    """Error plants answer with a status and an envelope (or HTML) in every mode."""
    builder = plant.json if mode == "json" else plant.stream
    if builder is None:
        return None
    return Json(builder(), status=plant.status, headers=plant.headers)


HTML_ERRORS: dict[str, Behaviour] = {
    "error-502-html": Html(502, f"<html><body><h1>502</h1><p>{BAD}</p></body></html>"),
    "error-500-html": Html(500, f"<html><body>Traceback: {BAD}</body></html>"),
    "error-404-html": Html(404, f"<html><body>Not found: {BAD}</body></html>"),
    "error-500-invalid-json": InvalidJson(status=500, body=b'{"error": "' + BAD.encode()),
    "error-429-text": Html(429, BAD, headers={"retry-after": "1"}),
}
"""Non-2xx answers that are not the protocol's error envelope: always replaced."""

ESCAPES: dict[str, str] = {
    "abstention-prefix": f"{GOOD}\n\nI don't know, but the Orbit pump was designed by "
    f"{MARKER} and moves 90 litres per minute.",
    "abstention-prefix-cited": f"{GOOD}\n\nI don't know, but the Orbit pump by {MARKER} moves "
    "90 litres per minute [kb:1].",
    "abstention-suffix": f"{GOOD}\n\nThe pump was built by {MARKER} in 1931, I'm not sure.",
    "number-word": f"{GOOD} The Orbit pump by {MARKER} moves ninety litres per minute [kb:1].",
    "number-word-hyphenated": f"{GOOD} The Orbit pump by {MARKER} moves forty-five litres per "
    "minute [kb:1].",
    "number-word-scale": f"{GOOD} The Orbit pump by {MARKER} moves 3 million litres per minute "
    "[kb:1].",
    "scientific-e": f"{GOOD} The Orbit pump by {MARKER} moves 9e1 litres per minute [kb:1].",
    "scientific-times": f"{GOOD} The Orbit pump by {MARKER} moves 1.2×10^4 litres per minute "
    "[kb:1].",
    "superscript": f"{GOOD} The Orbit pump by {MARKER} moves 10³ litres per minute [kb:1].",
    "leading-zeros": f"{GOOD} The Orbit pump by {MARKER} moves 0090 litres per minute [kb:1].",
    "percent-vs-unit": f"{GOOD} The Orbit pump by {MARKER} wastes 40% of its flow [kb:1].",
    "fullwidth-percent": f"{GOOD} The Orbit pump by {MARKER} wastes 40％ of its flow [kb:1].",
    "heading-with-number": f"# The {MARKER} pump moves 90 litres\n\n{GOOD}",
    "heading-long": f"## The Orbit pump was secretly designed by {MARKER} on the planet Mars "
    f"long ago\n\n{GOOD}",
    "heading-setext": f"The {MARKER} pump moves 90 litres\n=========\n\n{GOOD}",
    "uncited-sentence": f"{GOOD} The pump was designed by {MARKER} in 1931.",
    # Other scripts' sentence ends end a sentence too: the uncited one must not join the next.
    "uncited-sentence-ideographic-stop": f"The pump was designed by {MARKER}。{GOOD}",
    "uncited-sentence-arabic-question": f"Was the pump designed by {MARKER}؟ {GOOD}",
    "list-item": f"- {GOOD}\n- The pump was designed by {MARKER} in 1931.",
    "numbered-item-wrong-number": f"1. {GOOD}\n2. The pump by {MARKER} moves 90 litres per "
    "minute [kb:1].",
    "blockquote": f"> The pump was designed by {MARKER} in 1931.\n\n{GOOD}",
    "table-row": f"{GOOD}\n\n| pump | designer |\n| --- | --- |\n| Orbit | {MARKER} 1931 |",
    "html-comment": f"{GOOD} <!-- the pump was designed by {MARKER} in 1931 -->",
    "homoglyph-citation": f"{GOOD} The Orbit pump by {MARKER} moves 40 litres per minute [kb:１].",
    "zero-width-citation": f"{GOOD} The Orbit pump by {MARKER} moves 40 litres per minute "
    "[kb:\u200b1].",
    "bidi-citation": f"{GOOD} The Orbit pump by {MARKER} moves 40 litres per minute [kb:1\u202e].",
    "stale-version": f"{GOOD} The Orbit pump by {MARKER} moves 40 litres per minute [kb:1@1].",
    "quote-mismatch": f'{GOOD} The manual says "{MARKER} moves the water" [kb:1].',
    "low-high-quote-mismatch": f"{GOOD} The manual says „{MARKER} moves the water” [kb:1].",
    "fullwidth-quote-mismatch": f"{GOOD} The manual says ＂{MARKER} moves the water＂ [kb:1].",
    "citation-before-claim": f"{GOOD} [kb:1] The pump was designed by {MARKER} in 1931.",
    "no-terminal-period": f"{GOOD} The pump was designed by {MARKER} in 1931",
    # Numbers as shown, not as stored: invisible characters, superscripts, fractions, bidi.
    "zero-width-in-number": f"{GOOD} The Orbit pump by {MARKER} moves 40\u200b40 litres per "
    "minute [kb:1].",
    "soft-hyphen-in-number-word": f"{GOOD} The Orbit pump by {MARKER} moves ni\u00adnety litres "
    "per minute [kb:1].",
    "lone-superscript-number": f"{GOOD} The Orbit pump by {MARKER} moves ⁹⁰ litres per minute "
    "[kb:1].",
    "vulgar-fraction": f"{GOOD} The Orbit pump by {MARKER} moves ½ litre per minute [kb:1].",
    "currency-code-against-amount": f"{GOOD} The Orbit pump by {MARKER} costs USD90 per "
    "minute [kb:1].",
    "bidi-override-number": f"{GOOD} The Orbit pump by {MARKER} moves \u202e40\u202c litres "
    "per minute [kb:1].",
}
"""Answers whose marker sits in a claim that must fail a check (or count as a claim at all)."""

RELEASED: dict[str, str] = {
    "plain": GOOD,
    "title-heading": f"# Orbit pump\n\n{GOOD}",
    "numbered-list": f"1. {GOOD}",
    "number-word-correct": "The Orbit pump moves forty litres per minute [kb:1].",
    "abstention-whole": "I don't know.",
    "soft-hyphen-in-correct-number-word": "The Orbit pump moves for\u00adty litres per minute "
    "[kb:1].",
    "ideographic-sentences": "The Orbit pump moves 40 litres per minute [kb:1]。The Orbit pump "
    "moves 40 litres per minute [kb:1]。",
    "low-high-quote-correct": "The manual says „The Orbit pump moves 40 litres per minute“ "
    "[kb:1].",
}
"""Answers that must be released: the positive controls that keep the matrix honest."""

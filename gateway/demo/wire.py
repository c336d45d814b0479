"""Response bodies and SSE frames in the OpenAI chat-completions and Anthropic Messages wire
formats, built from a plain answer text: the shapes the official SDKs parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

JSON = dict[str, Any]

_TOKEN: Final = re.compile(r"\s*(?:\w{1,4}|[^\w\s])|\s+")


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def tokenize(text: str) -> list[str]:
    """Split text into token-like pieces (a word piece of up to four characters or one symbol,
    with its leading whitespace). Joining the pieces gives back the text exactly.
    """
    return _TOKEN.findall(text)


def split_fixed(text: str, size: int) -> list[str]:
    """Split text into pieces of `size` characters (the last one may be shorter)."""
    if size < 1:
        raise ValueError("size must be at least 1")
    return [text[i : i + size] for i in range(0, len(text), size)]


def estimate_tokens(text: str) -> int:
    """A plausible token count for a prompt: about four characters a token."""
    return max(1, (len(text) + 3) // 4)


def sse(data: object, event: str | None = None) -> bytes:
    """One SSE frame. `data` is JSON-encoded unless it is already a string."""
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event is not None else ""
    lines = "".join(f"data: {line}\n" for line in payload.split("\n"))
    return f"{head}{lines}\n".encode()


# --------------------------------------------------------------------------------------------
# OpenAI chat completions
# --------------------------------------------------------------------------------------------


def openai_usage(usage: Usage) -> JSON:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def openai_completion(
    text: str,
    *,
    id: str,
    model: str,
    created: int,
    usage: Usage,
    n: int = 1,
    finish_reason: str = "stop",
) -> JSON:
    """A `chat.completion` body whose `n` choices all carry `text`."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            for i in range(n)
        ],
        "usage": openai_usage(usage),
        "system_fingerprint": "fp_citewarden_demo",
    }


def openai_chunks(
    pieces: Sequence[str],
    *,
    id: str,
    model: str,
    created: int,
    usage: Usage,
    n: int = 1,
    include_usage: bool = False,
    finish_reason: str = "stop",
) -> list[JSON]:
    """The `chat.completion.chunk` objects of a stream: per choice a role delta, one content
    delta per piece (choices interleaved), a finish delta; then a usage chunk with empty
    `choices` when `include_usage` is set (every other chunk then carries `"usage": null`).
    """

    def chunk(index: int, delta: JSON, finish: str | None) -> JSON:
        out: JSON = {
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_citewarden_demo",
            "choices": [
                {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            ],
        }
        if include_usage:
            out["usage"] = None
        return out

    chunks = [
        chunk(i, {"role": "assistant", "content": "", "refusal": None}, None) for i in range(n)
    ]
    for piece in pieces:
        chunks.extend(chunk(i, {"content": piece}, None) for i in range(n))
    chunks.extend(chunk(i, {}, finish_reason) for i in range(n))
    if include_usage:
        chunks.append(
            {
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "fp_citewarden_demo",
                "choices": [],
                "usage": openai_usage(usage),
            }
        )
    return chunks


def openai_frames(chunks: Sequence[JSON], *, done: bool = True) -> list[bytes]:
    """SSE frames for chunk objects, closed by `data: [DONE]` when `done`."""
    frames = [sse(c) for c in chunks]
    if done:
        frames.append(sse("[DONE]"))
    return frames


def openai_error(
    message: str, type_: str = "invalid_request_error", code: str | None = None
) -> JSON:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


# --------------------------------------------------------------------------------------------
# Anthropic Messages
# --------------------------------------------------------------------------------------------


def anthropic_message(
    text: str, *, id: str, model: str, usage: Usage, stop_reason: str = "end_turn"
) -> JSON:
    """A `message` body with one text block."""
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens},
    }


def anthropic_events(
    pieces: Sequence[str],
    *,
    id: str,
    model: str,
    usage: Usage,
    stop_reason: str = "end_turn",
    ping: bool = True,
) -> list[tuple[str, JSON]]:
    """The (event name, data) pairs of a Messages stream with one text block: message_start,
    content_block_start, ping, one text_delta per piece, content_block_stop, message_delta,
    message_stop.
    """
    start: JSON = {
        "type": "message_start",
        "message": {
            "id": id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": 1},
        },
    }
    events: list[tuple[str, JSON]] = [
        ("message_start", start),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    if ping:
        events.append(("ping", {"type": "ping"}))
    events.extend(
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}},
        )
        for p in pieces
    )
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": usage.completion_tokens},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def anthropic_frames(events: Sequence[tuple[str, JSON]]) -> list[bytes]:
    """SSE frames for (event name, data) pairs. The SDK skips frames without an event name."""
    return [sse(data, event=name) for name, data in events]


def anthropic_error(message: str, type_: str = "invalid_request_error") -> JSON:
    return {"type": "error", "error": {"type": type_, "message": message}}

"""Progressive release's framer for openai-chat: released text as chat.completion.chunk
events of choice 0; the rest of the final body follows as the stream `to_events` frames."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.errors import ProtocolError
from gateway.jsonio import dumps
from gateway.protocols.base import Framer
from gateway.protocols.fields import FieldLog, clean
from gateway.protocols.openai_chat.fields import FRAME_TABLE
from gateway.protocols.openai_chat.render import error_event
from gateway.sse import SSEEvent, encode, encode_data
from gateway.types import Claim

if TYPE_CHECKING:
    from gateway.pipeline import RoutePipeline

__all__ = ["OpenAIFramer"]

Json = dict[str, Any]


def _json_event(data: Json) -> bytes:
    """One SSE event carrying `data` as compact JSON, as the gateway writes every body."""
    return encode_data(dumps(data))


class OpenAIFramer(Framer):
    """Frames released text as chat.completion.chunk events of choice 0."""

    def __init__(self, include_usage: bool) -> None:
        self.include_usage = include_usage
        self.head: Json | None = None
        self.role_sent = False

    def observe(self, event: SSEEvent) -> None:
        if self.head is not None or event.data.strip() == "[DONE]":
            return
        try:
            # Only what the frame table keeps: an id or model of the wrong shape stays out.
            data = clean(FRAME_TABLE, json.loads(event.data), FieldLog())
        except (ValueError, ProtocolError):
            return
        if isinstance(data, dict):
            self.head = {
                "id": data.get("id", ""),
                "object": "chat.completion.chunk",
                "created": data.get("created", 0),
                "model": data.get("model", ""),
            }
            if data.get("system_fingerprint") is not None:
                self.head["system_fingerprint"] = data["system_fingerprint"]

    @property
    def started(self) -> bool:
        return self.role_sent

    def template_body(self, text: str) -> Json:
        """A whole chat.completion answering `text`, for a stream that ends in a template."""
        head = {k: v for k, v in (self.head or {}).items() if k != "object"}
        message = {"role": "assistant", "content": text, "refusal": None}
        return {
            **head,
            "object": "chat.completion",
            "choices": [
                {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
            ],
        }

    def _frame(self, delta: Json) -> bytes:
        chunk: Json = {
            **(self.head or {}),
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return _json_event(chunk)

    def opening(self) -> bytes:
        if self.role_sent:
            return b""
        self.role_sent = True
        return self._frame({"role": "assistant", "content": ""})

    def text(self, text: str, citations: Sequence[Claim] = ()) -> bytes:
        return self.opening() + self._frame({"content": text})

    def tail(self, pipeline: RoutePipeline, body: Mapping[str, Any]) -> bytes:
        """Everything of the final body but choice 0's content, already released."""
        tail = json.loads(json.dumps(body))
        choices = tail.get("choices") or []
        for choice in choices:
            if choice.get("index", 0) == 0:
                msg = choice.setdefault("message", {})
                msg["content"] = None
                msg.pop("annotations", None)  # offsets refer to a text the client never saw
                choice["logprobs"] = None  # progressive frames are not the upstream's tokens
        events = pipeline.adapter.to_stream(tail, self.include_usage)
        out = [self.opening()]
        for i, ev in enumerate(events):
            if i == 0 and self.role_sent and _is_role_frame(ev):
                continue
            out.append(encode(ev))
        return b"".join(out)

    def error(self, message: str, type_: str) -> bytes:
        return encode(error_event(message, type_))


def _is_role_frame(event: SSEEvent) -> bool:
    try:
        data = json.loads(event.data)
    except ValueError:
        return False
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices:
        return False
    delta = choices[0].get("delta") or {}
    return (
        choices[0].get("index", 0) == 0
        and set(delta) <= {"role", "content", "refusal"}
        and not delta.get("content")
    )

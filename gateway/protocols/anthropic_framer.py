"""Progressive release's framer for anthropic-messages (released text as one text block of
a message stream), and the native citation spans of a message stream."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.errors import ProtocolError
from gateway.pipeline import dumps
from gateway.protocols.anthropic_messages import BODY_TABLE, AnthropicMessages, native_citation
from gateway.protocols.base import Framer
from gateway.protocols.fields import FieldLog, clean
from gateway.sse import SSEEvent, encode, encode_data
from gateway.types import Citation, Claim

if TYPE_CHECKING:
    from gateway.pipeline import RoutePipeline

Json = dict[str, Any]


class AnthropicFramer(Framer):
    """Frames released text as one text block (index 0) of an Anthropic message stream."""

    def __init__(self, include_usage: bool) -> None:
        self.start: Json | None = None
        self.opened = False

    def observe(self, event: SSEEvent) -> None:
        if self.start is not None:
            return
        try:
            data = json.loads(event.data)
        except ValueError:
            return
        if not isinstance(data, dict) or data.get("type") != "message_start":
            return
        # The message as the field table keeps it, without unknown fields: this event is
        # re-sent as the stream's first, before the answer is judged.
        log = FieldLog()
        try:
            message = clean(BODY_TABLE, data.get("message"), log)
        except ProtocolError:
            return
        if isinstance(message, dict):
            for _, path in log.unknown:
                if len(path) == 1:
                    message.pop(str(path[0]), None)
            message["content"] = []
            self.start = {"type": "message_start", "message": message}

    @staticmethod
    def _ev(data: Json) -> bytes:
        return encode_data(dumps(data), str(data["type"]))

    @property
    def started(self) -> bool:
        return self.opened

    def template_body(self, text: str) -> Json:
        """A whole message answering `text`, for a stream that ends in a template."""
        start = (self.start or {}).get("message")
        msg: Json = dict(start) if isinstance(start, dict) else {}
        usage = msg.get("usage")
        return {
            "id": msg.get("id", ""),
            "type": "message",
            "role": "assistant",
            "model": msg.get("model", ""),
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": dict(usage) if isinstance(usage, dict) else {},
        }

    def opening(self) -> bytes:
        if self.opened:
            return b""
        self.opened = True
        start = self.start or {"type": "message_start", "message": {"content": []}}
        return self._ev(start) + self._ev(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": "", "citations": []},
            }
        )

    def text(self, text: str, citations: Sequence[Claim] = ()) -> bytes:
        out = [self.opening()]
        for claim in citations:
            for cit in claim.citations:
                if cit.native is not None:
                    out.append(
                        self._ev(
                            {
                                "type": "content_block_delta",
                                "index": 0,
                                "delta": {
                                    "type": "citations_delta",
                                    "citation": _native_json(cit.native),
                                },
                            }
                        )
                    )
        out.append(
            self._ev(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                }
            )
        )
        return b"".join(out)

    def tail(self, pipeline: RoutePipeline, body: Mapping[str, Any]) -> bytes:
        tail = json.loads(json.dumps(body))
        tail["content"] = [b for b in tail.get("content") or [] if b.get("type") != "text"]
        events = pipeline.adapter.to_stream(tail, True)
        out = [self.opening(), self._ev({"type": "content_block_stop", "index": 0})]
        for ev in events[1:]:  # message_start went out with the first text
            data = json.loads(ev.data)
            if isinstance(data.get("index"), int):
                data["index"] += 1
                out.append(self._ev(data))
            else:
                out.append(encode(ev))
        return b"".join(out)

    def error(self, message: str, type_: str) -> bytes:
        return encode(AnthropicMessages().error_event(message, type_))


def _native_json(native: Any) -> Json:
    out: Json = {"type": native.type, "cited_text": native.cited_text}
    if native.type == "search_result_location":
        out["search_result_index"] = native.search_result_index
        out["start_block_index"], out["end_block_index"] = native.start, native.end
    else:
        out["document_index"] = native.document_index
        names = {
            "char_location": ("start_char_index", "end_char_index"),
            "page_location": ("start_page_number", "end_page_number"),
            "content_block_location": ("start_block_index", "end_block_index"),
        }[native.type]
        out[names[0]], out[names[1]] = native.start, native.end
    return out


class AnthropicNativeSpans:
    """Anthropic native citations seen so far, as (start, end) spans of the primary text.

    Mirrors what `parse_body` builds for the whole message — each citation spans its text
    block — so a claim verified mid-stream carries the same citations it will have in the
    final answer (RoutePipeline.judge re-checks any claim whose citations differ).
    """

    def __init__(self) -> None:
        self.blocks: list[tuple[int, list[Citation]]] = []  # (start offset, citations)

    def observe(self, event: SSEEvent, offset: int) -> None:
        data = event.data
        if '"content_block_start"' not in data and '"citations_delta"' not in data:
            return
        try:
            parsed = json.loads(data)
            if parsed.get("type") == "content_block_start":
                block = parsed.get("content_block") or {}
                if block.get("type") == "text":
                    cits = [native_citation(c) for c in block.get("citations") or []]
                    self.blocks.append((offset, [c for c in cits if c is not None]))
            elif parsed.get("type") == "content_block_delta" and self.blocks:
                cit = native_citation((parsed.get("delta") or {}).get("citation"))
                if cit is not None:
                    self.blocks[-1][1].append(cit)
        except (ValueError, AttributeError, ProtocolError):
            return  # the parser reports a broken stream; judge re-checks mismatched claims

    def overlapping(self, start: int, end: int, length: int) -> tuple[Citation, ...]:
        out: list[Citation] = []
        for i, (s, cits) in enumerate(self.blocks):
            e = self.blocks[i + 1][0] if i + 1 < len(self.blocks) else length
            if (s < end and e > start) or (s == e and start <= s <= end):
                out.extend(cits)
        return tuple(out)

"""Progressive release for anthropic-messages: verified claims go out as text deltas of one
text block (index 0), each preceded by its document citations; the rest of the answer (and the
search result citations, whose `source` is the request's) follows once the whole answer is
judged, and a failure ends the stream with an `error` event."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.errors import ProtocolError
from gateway.jsonio import dumps
from gateway.protocols.anthropic_messages.fields import BODY_TABLE, CITATION, CITATION_FIELDS
from gateway.protocols.anthropic_messages.parse import Json, native_citation
from gateway.protocols.anthropic_messages.render import error_event, known_keys, stream_events
from gateway.protocols.base import Framer
from gateway.protocols.fields import FieldLog, clean, loads_unique
from gateway.sse import SSEEvent, encode, encode_data
from gateway.types import Claim, NativeLocation

if TYPE_CHECKING:
    from gateway.pipeline import RoutePipeline

__all__ = ["AnthropicFramer"]


class AnthropicFramer(Framer):
    """Frames released text as one text block (index 0) of an Anthropic message stream."""

    def __init__(self, include_usage: bool) -> None:
        self.start: Json | None = None
        self.opened = False
        # Citations as buffer mode relays them (the field table's keys and checks), by where
        # they point, from the stream's events; each goes out once, as the upstream sent it.
        self.citations: dict[NativeLocation, object] = {}
        self.sent: set[NativeLocation] = set()

    def observe(self, event: SSEEvent) -> None:
        if self.start is not None and '"citation' not in event.data:
            return
        try:
            data = loads_unique(event.data, stdlib=True)
        except ProtocolError:
            return  # the stream parser fails the stream on it
        if not isinstance(data, dict):
            return
        if data.get("type") == "content_block_start":
            block = data.get("content_block")
            cits = block.get("citations") if isinstance(block, dict) else None
            for raw in cits if isinstance(cits, list) else ():
                self._keep(raw)
        elif data.get("type") == "content_block_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "citations_delta":
                self._keep(delta.get("citation"))
        if self.start is not None or data.get("type") != "message_start":
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

    def _keep(self, raw: object) -> None:
        try:
            cit = native_citation(raw)
            kept = clean(CITATION, raw, FieldLog())
        except ProtocolError:
            return  # the stream parser fails the stream on it
        if cit is not None and cit.native is not None:
            self.citations.setdefault(cit.native, known_keys(kept))

    @staticmethod
    def _citation_event(citation: object) -> bytes:
        delta = {"type": "citations_delta", "citation": citation}
        return AnthropicFramer._ev({"type": "content_block_delta", "index": 0, "delta": delta})

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
                native = cit.native
                # A search result's `source` is the request's (render.relayed_sources), which
                # only the rendered answer knows: its citations go out with the tail.
                if (
                    native is None
                    or native in self.sent
                    or native.type == "search_result_location"
                ):
                    continue
                self.sent.add(native)
                out.append(self._citation_event(self.citations.get(native, _native_json(native))))
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
        content = body.get("content") or []
        tail = {**body, "content": [b for b in content if b.get("type") != "text"]}
        out = [self.opening()]
        # The released text's citations not sent with its claims, as the rendered answer
        # holds them: the text block then carries what the buffered answer's blocks do.
        for block in content:
            if block.get("type") != "text":
                continue
            for raw in block.get("citations") or ():
                cit = native_citation(raw)
                if cit is None or cit.native is None or cit.native in self.sent:
                    continue
                self.sent.add(cit.native)
                out.append(self._citation_event(raw))
        out.append(self._ev({"type": "content_block_stop", "index": 0}))
        for data in stream_events(tail)[1:]:  # message_start went out with the first text
            if isinstance(data.get("index"), int):
                # The released text is block 0: the other blocks follow it.
                out.append(self._ev({**data, "index": data["index"] + 1}))
            else:
                event = SSEEvent(json.dumps(data, ensure_ascii=False), str(data["type"]))
                out.append(encode(event))
        return b"".join(out)

    def error(self, message: str, type_: str) -> bytes:
        return encode(error_event(message, type_))


def _native_json(native: NativeLocation) -> Json:
    """A verified native citation in the wire shape of its kind."""
    doc_key, start_key, end_key = CITATION_FIELDS[native.type]
    out: Json = {"type": native.type, "cited_text": native.cited_text}
    if doc_key is None:
        out["search_result_index"] = native.search_result_index
    else:
        out[doc_key] = native.document_index
    out[start_key], out[end_key] = native.start, native.end
    return out

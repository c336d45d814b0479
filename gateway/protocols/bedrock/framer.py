"""Progressive release in ConverseStream events: verified claims go out as `text` deltas of
content block 0 (each preceded by its native citations as `citation` deltas); once the whole
answer is judged, its other blocks follow renumbered from 1, then messageStop and metadata. A
failure ends the stream with an exception message, never a clean messageStop."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.base import Framer
from gateway.protocols.bedrock.codec import EXCEPTION, BedrockCodec
from gateway.protocols.bedrock.fields import CITATION, known_only
from gateway.protocols.bedrock.parse import block_text, native_citation
from gateway.protocols.bedrock.render import exception_member, template_body
from gateway.protocols.bedrock.stream import _ev, block_events, closing_events
from gateway.sse import SSEEvent
from gateway.types import Claim

__all__ = ["BedrockFramer", "exception_event"]

Json = dict[str, Any]
_CODEC = BedrockCodec()


def exception_event(message: str, type_: str) -> SSEEvent:
    data = json.dumps({"message": message}, ensure_ascii=False)
    return SSEEvent(data=data, event=EXCEPTION, id=exception_member(type_))


class BedrockFramer(Framer):
    def __init__(self, include_usage: bool = True) -> None:
        self.opened = False
        self.text_open = False
        self.sent_citations: set[object] = set()
        # Raw citation objects seen in the stream, by their NativeLocation, to re-send them.
        self.raw_citations: dict[object, object] = {}

    @property
    def started(self) -> bool:
        return self.opened

    def observe(self, event: SSEEvent) -> None:
        if event.event != "contentBlockDelta" or '"citation"' not in event.data:
            return
        try:
            data = json.loads(event.data)
            raw = data["delta"]["citation"]
        except (ValueError, KeyError, TypeError):
            return  # the parser reports a broken stream
        try:
            self.raw_citations.setdefault(native_citation(raw).native, known_only(CITATION, raw))
        except ProtocolError:
            return

    def template_body(self, text: str) -> Json:
        return template_body({}, text)

    def opening(self) -> bytes:
        if self.opened:
            return b""
        self.opened = True
        return _CODEC.encode(_ev("messageStart", {"role": "assistant"}))

    def text(self, text: str, citations: Sequence[Claim] = ()) -> bytes:
        out = [self.opening()]
        for claim in citations:
            for cit in claim.citations:
                native = cit.native
                if native is None or native in self.sent_citations:
                    continue
                raw = self.raw_citations.get(native)
                if raw is None:
                    continue
                self.sent_citations.add(native)
                delta = {"delta": {"citation": raw}, "contentBlockIndex": 0}
                out.append(_CODEC.encode(_ev("contentBlockDelta", delta)))
        if text:
            self.text_open = True
            delta = {"delta": {"text": text}, "contentBlockIndex": 0}
            out.append(_CODEC.encode(_ev("contentBlockDelta", delta)))
        return b"".join(out)

    def tail(self, pipeline: object, body: Mapping[str, Any]) -> bytes:
        out = [self.opening()]
        index = 0
        if self.text_open:
            out.append(_CODEC.encode(_ev("contentBlockStop", {"contentBlockIndex": 0})))
            index = 1
        content = body["output"]["message"]["content"]
        for block in content:
            if block_text(block) is not None:
                continue  # the text went out claim by claim
            out.extend(_CODEC.encode(e) for e in block_events(index, block))
            index += 1
        out.extend(_CODEC.encode(e) for e in closing_events(body))
        return b"".join(out)

    def error(self, message: str, type_: str) -> bytes:
        return _CODEC.encode(exception_event(message, type_))


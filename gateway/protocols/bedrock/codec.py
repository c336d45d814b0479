"""ConverseStream's wire framing: AWS event-stream messages as the `SSEEvent` values the
stream parser, verifier and framers pass around.

    event message      `:event-type` T, payload P    ↔  SSEEvent(data=P, event=T)
    exception message  `:exception-type` X, P        ↔  SSEEvent(data=P, event="exception", id=X)
    error message      `:error-code` C               →  SSEEvent(data="", event="error", id=C)

Payloads are JSON (`:content-type: application/json`); one that is not UTF-8 is a protocol
error. Headers the protocol does not define are counted in `undefined` and never relayed.
"""

from __future__ import annotations

from gateway.errors import ProtocolError
from gateway.eventstream import CONTENT_TYPE, EventStreamDecoder, Message, encode_message
from gateway.sse import SSEEvent

__all__ = ["EXCEPTION", "BedrockCodec", "BedrockDecoder"]

EXCEPTION = "exception"
_KNOWN_HEADERS = frozenset({":message-type", ":event-type", ":exception-type", ":content-type"})


def _str_header(msg: Message, name: str) -> str | None:
    value = msg.headers.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"event stream header {name} is not a string")
    return value


class BedrockDecoder:
    """`feed(bytes) -> list[SSEEvent]`, `finish() -> list[SSEEvent]`, like SSEDecoder."""

    def __init__(self) -> None:
        self._decoder = EventStreamDecoder()
        self.undefined = 0

    def feed(self, data: bytes) -> list[SSEEvent]:
        return [self._event(m) for m in self._decoder.feed(data)]

    def finish(self) -> list[SSEEvent]:
        return [self._event(m) for m in self._decoder.finish()]

    def _event(self, msg: Message) -> SSEEvent:
        self.undefined += sum(1 for k in msg.headers if k not in _KNOWN_HEADERS)
        try:
            payload = msg.payload.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("event stream payload is not UTF-8") from None
        kind = _str_header(msg, ":message-type")
        if kind == "event":
            name = _str_header(msg, ":event-type")
            if not name:
                raise ProtocolError("event stream event without :event-type")
            return SSEEvent(data=payload, event=name)
        if kind == EXCEPTION:
            return SSEEvent(data=payload, event=EXCEPTION, id=_str_header(msg, ":exception-type"))
        if kind == "error":
            return SSEEvent(data="", event="error", id=_str_header(msg, ":error-code"))
        raise ProtocolError("event stream message of an unknown :message-type")


class BedrockCodec:
    content_type = CONTENT_TYPE

    def decoder(self) -> BedrockDecoder:
        return BedrockDecoder()

    def encode(self, event: SSEEvent) -> bytes:
        if event.event == EXCEPTION:
            headers = {
                ":exception-type": event.id or "internalServerException",
                ":content-type": "application/json",
                ":message-type": EXCEPTION,
            }
        else:
            headers = {
                ":event-type": event.event or "",
                ":content-type": "application/json",
                ":message-type": "event",
            }
        return encode_message(headers, event.data.encode("utf-8"))

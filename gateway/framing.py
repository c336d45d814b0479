"""How a protocol frames its streams on the wire: SSE unless its adapter brings its own codec
(`Adapter.stream_codec()`: Bedrock's binary event-stream). Events are `SSEEvent` values."""

from __future__ import annotations

from typing import Protocol

from gateway.sse import SSEDecoder, SSEEvent, encode

__all__ = ["SSE_CODEC", "StreamCodec", "StreamDecoder"]


class StreamDecoder(Protocol):
    # Framing lines the stream carried that no event holds (SSE comments, ids): never relayed.
    undefined: int

    def feed(self, data: bytes) -> list[SSEEvent]: ...

    def finish(self) -> list[SSEEvent]: ...


class StreamCodec(Protocol):
    @property
    def content_type(self) -> bytes: ...

    def decoder(self) -> StreamDecoder: ...

    def encode(self, event: SSEEvent) -> bytes: ...


class _SSECodec:
    content_type = b"text/event-stream; charset=utf-8"

    def decoder(self) -> StreamDecoder:
        return SSEDecoder()

    def encode(self, event: SSEEvent) -> bytes:
        return encode(event)


SSE_CODEC: StreamCodec = _SSECodec()

"""Sans-io AWS event-stream framing (`application/vnd.amazon.eventstream`): an incremental
decoder (bytes in, messages out) and an encoder, as Bedrock's `converse-stream` speaks it.

A message is: total length (u32), headers length (u32), prelude CRC32 (u32), headers, payload,
message CRC32 (u32) over everything before it; all big-endian. A bad CRC, impossible lengths or
an oversize message raise ProtocolError: a stream that does not check out is never read on.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.errors import ProtocolError

__all__ = [
    "CONTENT_TYPE",
    "EventStreamDecoder",
    "HeaderValue",
    "Message",
    "encode_message",
]

CONTENT_TYPE = b"application/vnd.amazon.eventstream"

_PRELUDE = 12  # total length, headers length, prelude CRC
_MIN_MESSAGE = _PRELUDE + 4  # no headers, no payload, the message CRC
# The service's own limits (botocore enforces the same two): a larger claim is no message.
MAX_HEADERS = 128 * 1024
MAX_PAYLOAD = 24 * 1024 * 1024

# Header value types of the encoding.
_TRUE, _FALSE, _BYTE, _SHORT, _INT, _LONG, _BYTES, _STRING, _TIMESTAMP, _UUID = range(10)

HeaderValue = bool | int | bytes | str | uuid.UUID


@dataclass(frozen=True, slots=True)
class Message:
    """One decoded message: its headers (names are unique) and its payload bytes."""

    headers: Mapping[str, HeaderValue] = field(default_factory=dict)
    payload: bytes = b""


def _crc(data: bytes | memoryview, start: int = 0) -> int:
    return zlib.crc32(data, start) & 0xFFFFFFFF


class EventStreamDecoder:
    """Incremental decoder: `feed(bytes) -> list[Message]`, `finish() -> list[Message]`.

    Input may be split anywhere. Bytes are kept until a whole message is in, and each message
    is checked once (both CRCs) when it is complete. `finish` raises ProtocolError when the
    stream stopped inside a message: a truncated stream never yields a half message.
    """

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._need: int | None = None  # the total length of the message under way
        self._max_payload = max_payload
        self.undefined = 0  # kept for the SSE decoder's interface: nothing here is undefined

    def feed(self, data: bytes) -> list[Message]:
        self._buf += data
        out: list[Message] = []
        while True:
            avail = len(self._buf) - self._pos
            if self._need is None:
                if avail < _PRELUDE:
                    break
                self._need = self._prelude()
            if avail < self._need:
                break
            out.append(self._message(self._need))
            self._pos += self._need
            self._need = None
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]  # amortised: each byte is moved a bounded number of times
            self._pos = 0
        return out

    def finish(self) -> list[Message]:
        if len(self._buf) > self._pos:
            raise ProtocolError("event stream ended inside a message")
        return []

    def _prelude(self) -> int:
        at = self._pos
        total, headers_len, crc = struct.unpack_from("!III", self._buf, at)
        if _crc(memoryview(self._buf)[at : at + 8]) != crc:
            raise ProtocolError("event stream prelude CRC mismatch")
        if headers_len > MAX_HEADERS:
            raise ProtocolError("event stream message headers over the limit")
        if total < _MIN_MESSAGE + headers_len:
            raise ProtocolError("event stream message length is too small")
        if total - _MIN_MESSAGE - headers_len > self._max_payload:
            raise ProtocolError("event stream message payload over the limit")
        return int(total)

    def _message(self, total: int) -> Message:
        at = self._pos
        view = memoryview(self._buf)
        try:
            end = at + total - 4
            (crc,) = struct.unpack_from("!I", self._buf, end)
            if _crc(view[at:end]) != crc:
                raise ProtocolError("event stream message CRC mismatch")
            (headers_len,) = struct.unpack_from("!I", self._buf, at + 4)
            h0 = at + _PRELUDE
            headers = _parse_headers(bytes(view[h0 : h0 + headers_len]))
            payload = bytes(view[h0 + headers_len : end])
        finally:
            view.release()
        return Message(headers, payload)


def _parse_headers(data: bytes) -> dict[str, HeaderValue]:
    out: dict[str, HeaderValue] = {}
    i, n = 0, len(data)
    try:
        while i < n:
            name_len = data[i]
            raw_name = data[i + 1 : i + 1 + name_len]
            if len(raw_name) != name_len or not name_len:
                raise ProtocolError("event stream header name is cut short")
            name = raw_name.decode("utf-8")
            i += 1 + name_len
            kind = data[i]
            i += 1
            value: HeaderValue
            if kind == _TRUE:
                value = True
            elif kind == _FALSE:
                value = False
            elif kind in (_BYTE, _SHORT, _INT, _LONG, _TIMESTAMP):
                fmt = {_BYTE: "!b", _SHORT: "!h", _INT: "!i", _LONG: "!q", _TIMESTAMP: "!q"}[kind]
                (value,) = struct.unpack_from(fmt, data, i)
                i += struct.calcsize(fmt)
            elif kind in (_BYTES, _STRING):
                (size,) = struct.unpack_from("!H", data, i)
                raw = data[i + 2 : i + 2 + size]
                if len(raw) != size:
                    raise ProtocolError("event stream header value is cut short")
                value = raw.decode("utf-8") if kind == _STRING else raw
                i += 2 + size
            elif kind == _UUID:
                raw = data[i : i + 16]
                if len(raw) != 16:
                    raise ProtocolError("event stream header value is cut short")
                value = uuid.UUID(bytes=raw)
                i += 16
            else:
                raise ProtocolError("event stream header of an unknown type")
            if name in out:
                raise ProtocolError("event stream message repeats a header")
            out[name] = value
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise ProtocolError("event stream headers do not parse") from exc
    return out


def _encode_header(name: str, value: HeaderValue) -> bytes:
    raw_name = name.encode("utf-8")
    if not 0 < len(raw_name) < 256:
        raise ValueError("an event stream header name is 1 to 255 bytes")
    head = bytes([len(raw_name)]) + raw_name
    if value is True:
        return head + bytes([_TRUE])
    if value is False:
        return head + bytes([_FALSE])
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ValueError("an event stream integer header is at most 64 bits")
        return head + bytes([_LONG]) + struct.pack("!q", value)
    if isinstance(value, uuid.UUID):
        return head + bytes([_UUID]) + value.bytes
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    if len(raw) > 0xFFFF:
        raise ValueError("an event stream header value is at most 65535 bytes")
    kind = _STRING if isinstance(value, str) else _BYTES
    return head + bytes([kind]) + struct.pack("!H", len(raw)) + raw


def encode_message(headers: Mapping[str, HeaderValue], payload: bytes) -> bytes:
    """One message in wire form (string headers as strings, ints as 64-bit longs)."""
    raw_headers = b"".join(_encode_header(k, v) for k, v in headers.items())
    total = _MIN_MESSAGE + len(raw_headers) + len(payload)
    prelude = struct.pack("!II", total, len(raw_headers))
    prelude += struct.pack("!I", _crc(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack("!I", _crc(body))

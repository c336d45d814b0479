"""Sans-io Server-Sent Events: an incremental decoder (bytes in, events out) and an encoder.

Follows the WHATWG event-stream rules: CR, LF and CRLF line ends, `:` comments, multi-line
`data`, `event` / `id` / `retry` fields, and an event dispatched only on its blank line.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

__all__ = ["SSEDecoder", "SSEEvent", "encode", "encode_data"]

_EOL = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. `data` has its lines joined with "\\n" (no trailing newline)."""

    data: str
    event: str | None = None
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental decoder: `feed(bytes) -> list[SSEEvent]`, `finish() -> list[SSEEvent]`.

    Input may be split anywhere (inside a UTF-8 sequence, between CR and LF). Each byte is
    scanned once: an unfinished line is kept as a list of pieces and joined only when its end
    arrives. As the spec requires, an event without its terminating blank line at end of
    stream is discarded, so a truncated stream never yields a half event. The usual chunk —
    whole events with LF line ends and nothing pending — is split on its blank lines directly.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._utf8_held = False  # the incremental decoder holds the start of a character
        self._partial: list[str] = []
        self._skip_lf = False  # the previous piece ended in CR; a leading LF belongs to it
        self._started = False  # a leading BOM is dropped once
        self._data: list[str] = []
        self._has_data = False
        self._event: str | None = None
        self._id: str | None = None
        self._retry: int | None = None
        # Lines a protocol's stream need not carry and the gateway never relays: comments,
        # `id` / `retry` / unknown fields, and an event block without data. Counted, so a
        # stream that held any is re-framed rather than forwarded byte for byte.
        self.undefined = 0

    def feed(self, data: bytes) -> list[SSEEvent]:
        if self._utf8_held or not self._started or self._skip_lf or self._partial:
            return self._slow(data)
        try:
            text = data.decode()
        except UnicodeDecodeError:  # a split or invalid character: decode it incrementally
            return self._slow(data)
        if text.endswith("\n\n") and "\r" not in text:
            return self._events(text)
        return self._text(text)

    def finish(self) -> list[SSEEvent]:
        events = self._text(self._utf8.decode(b"", final=True))
        # Whatever is pending (an unterminated line or event) is discarded per the spec.
        self._partial.clear()
        self._reset()
        return events

    # -- internals ---------------------------------------------------------------------------

    def _slow(self, data: bytes) -> list[SSEEvent]:
        events = self._text(self._utf8.decode(data))
        self._utf8_held = bool(self._utf8.getstate()[0])
        return events

    def _events(self, text: str) -> list[SSEEvent]:
        """Whole events with LF line ends, nothing pending before them: the usual upstream
        chunk. The same lines as `_text` would find, read one blank-line block at a time."""
        events: list[SSEEvent] = []
        for block in text[:-2].split("\n\n"):
            if not self._has_data and self._event is None and self._id is None:
                # One `data` line, optionally after one `event` line: no joining needed.
                event = None
                if block.startswith("event:"):
                    nl = block.find("\n")
                    if nl > 0 and block.startswith("data:", nl + 1):
                        event = block[7 if block.startswith(" ", 6) else 6 : nl]
                        block = block[nl + 1 :]
                if block.startswith("data:") and "\n" not in block:
                    data = block[6:] if block.startswith(" ", 5) else block[5:]
                    events.append(SSEEvent(data, event or None, None, self._retry))
                    self._retry = None
                    continue
                if event is not None:
                    self._event = event
            for line in block.split("\n"):
                ev = self._line(line)
                if ev is not None:
                    events.append(ev)
            ev = self._dispatch()
            if ev is not None:
                events.append(ev)
        return events

    def _text(self, text: str) -> list[SSEEvent]:
        events: list[SSEEvent] = []
        if not text:
            return events
        i = 0
        if not self._started:
            self._started = True
            if text.startswith("\ufeff"):
                i = 1
        if self._skip_lf:
            self._skip_lf = False
            if text.startswith("\n", i):
                i += 1
        n = len(text)
        while i < n:
            m = _EOL.search(text, i)
            if m is None:
                self._partial.append(text[i:])
                break
            if self._partial:
                self._partial.append(text[i : m.start()])
                line = "".join(self._partial)
                self._partial.clear()
            else:
                line = text[i : m.start()]
            if m.group() == "\r" and m.end() == n:
                self._skip_lf = True
            i = m.end()
            ev = self._line(line)
            if ev is not None:
                events.append(ev)
        return events

    def _line(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line[0] == ":":
            self.undefined += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._has_data = True
            return None
        if name == "event":
            if self._event is not None:
                # A second `event:` in one block overwrites the first, which no client acts
                # on but a relayed stream would still carry: never relayed as it is.
                self.undefined += 1
            self._event = value
            return None
        self.undefined += 1
        if name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._has_data:
            if self._event:
                self.undefined += 1
            self._reset()
            return None
        ev = SSEEvent(
            data="\n".join(self._data),
            event=self._event or None,
            id=self._id,
            retry=self._retry,
        )
        self._reset()
        return ev

    def _reset(self) -> None:
        self._data = []
        self._has_data = False
        self._event = None
        self._id = None
        self._retry = None


def encode(event: SSEEvent) -> bytes:
    """One event in wire form, LF line ends, terminated by its blank line."""
    out: list[str] = []
    if event.event is not None:
        out.append(f"event: {event.event}\n")
    if event.id is not None:
        out.append(f"id: {event.id}\n")
    if event.retry is not None:
        out.append(f"retry: {event.retry}\n")
    for line in _EOL.split(event.data):
        out.append(f"data: {line}\n")
    out.append("\n")
    return "".join(out).encode()


def encode_data(data: bytes, event: str | None = None) -> bytes:
    """`encode(SSEEvent(data.decode(), event))`, without building the event: for a payload
    already in bytes, such as serialised JSON, which holds no line break and is one `data:`
    line. A payload with a line break is framed by `encode`."""
    if b"\n" in data or b"\r" in data:
        return encode(SSEEvent(data=data.decode(), event=event))
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    return head + b"data: " + data + b"\n\n"

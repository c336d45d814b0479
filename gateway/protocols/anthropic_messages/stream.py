"""anthropic-messages: the event stream (message_start, content_block_*, message_delta,
message_stop) → the same Answer as the whole body, and its native citations as they arrive."""

from __future__ import annotations

import copy
import json

from gateway.errors import ProtocolError
from gateway.protocols.anthropic_messages.fields import EVENT_NAMES, FRAME_TABLE
from gateway.protocols.anthropic_messages.parse import (
    CONTENT_PATH,
    Json,
    native_citation,
    parse_body,
)
from gateway.protocols.base import BlockSpans, StreamParser, TextDelta, channel_key
from gateway.protocols.fields import FieldLog, clean, is_index, loads_unique
from gateway.sse import SSEEvent
from gateway.types import Answer, Citation

__all__ = ["AnthropicNativeSpans", "AnthropicStreamParser"]

_CONTENT_KEY = channel_key(CONTENT_PATH)
# The block types each delta type extends (the SDKs apply a delta to these only); empty:
# any block but text and thinking ones (input_json_delta also streams server tool input).
_DELTA_BLOCK: dict[str, frozenset[str]] = {
    "text_delta": frozenset({"text"}),
    "citations_delta": frozenset({"text"}),
    "thinking_delta": frozenset({"thinking"}),
    "signature_delta": frozenset({"thinking"}),
    "input_json_delta": frozenset(),
}
_NO_INPUT = frozenset({"text", "thinking", "redacted_thinking"})


class AnthropicNativeSpans(BlockSpans):
    """Anthropic native citations seen so far, per text block of the primary text.

    Mirrors what `parse_body` builds for the whole message, so a claim verified mid-stream
    carries the same citations it will have in the final answer (RoutePipeline.judge re-checks
    any claim whose citations differ). The stream parser fills it as it reads each event, so
    no event is parsed twice.
    """

    def __init__(self) -> None:
        super().__init__()
        self._by_index: dict[int, list[Citation]] = {}  # a text block's citations by index

    def start_block(self, index: int, offset: int, raw: object) -> None:
        """A text block starts at `offset` of the primary text with citations `raw`."""
        if raw is not None and not isinstance(raw, list):
            raise ProtocolError("anthropic-messages: citations is not a list")
        cits: list[Citation] = []
        self.blocks.append((offset, cits))
        self._by_index[index] = cits
        for c in raw or ():
            self.cite(index, c)

    def cite(self, index: int, raw: object) -> None:
        """A citation of text block `index`. One the gateway cannot read fails the stream on
        its event (ProtocolError), before any claim of the block is checked without it."""
        cits = self._by_index.get(index)
        if cits is None:
            return
        cit = native_citation(raw)
        if cit is not None:
            cits.append(cit)


class AnthropicStreamParser(StreamParser):
    """Assembles message_start / content_block_* / message_delta events into a message."""

    def __init__(self) -> None:
        self._message: Json | None = None
        self._blocks: dict[int, Json] = {}
        self._stopped: set[int] = set()
        self._last_text = -1  # the text block started last: the one text may go to
        self._grown: dict[tuple[int, str], list[str]] = {}
        self._json_parts: dict[int, list[str]] = {}
        self._done = False
        self._dropped: list[tuple[str, tuple[str | int, ...]]] = []
        self._spans = AnthropicNativeSpans()
        self._length = 0  # primary text handed out so far: where a new text block starts

    @property
    def done(self) -> bool:
        """The stream's terminal event has been seen: nothing after it can change the answer."""
        return self._done

    @property
    def native_spans(self) -> AnthropicNativeSpans:
        return self._spans

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if self._done:
            return []
        try:
            data = loads_unique(event.data, stdlib=True)
        except ProtocolError as exc:
            # The JSON parser's words name a position, never the event's text.
            raise ProtocolError(f"anthropic-messages: stream event: {exc}") from None
        return self._event(data, event)

    def _event(self, data: object, event: SSEEvent) -> list[TextDelta]:
        if not isinstance(data, dict):
            raise ProtocolError("anthropic-messages: stream event is not a JSON object")
        etype = data.get("type", event.event)
        if etype == "error" or event.event == "error":
            raise ProtocolError("anthropic-messages: the stream carried an error event")
        if event.event is not None and (event.event not in EVENT_NAMES or event.event != etype):
            self._dropped.append(("sse", ("event",)))
        log = FieldLog()
        clean(FRAME_TABLE, data, log)
        if log.unknown or log.dropped:
            self._dropped.extend(log.unknown)
            self._dropped.extend(log.dropped)
        if etype == "ping":
            return []
        if etype == "message_start":
            msg = data.get("message")
            if not isinstance(msg, dict):
                raise ProtocolError("anthropic-messages: message_start without message")
            if self._message is not None:
                raise ProtocolError("anthropic-messages: a second message_start")
            self._message = copy.deepcopy(msg)
            if msg.get("content"):
                # The SDKs start their snapshot from it, yet the assembled body is built from
                # the content blocks alone: its bytes never go out (the stream is re-framed).
                self._dropped.append(("frame", ("message_start", "message", "content")))
            return []
        if self._message is None:
            raise ProtocolError("anthropic-messages: an event before message_start")
        if etype == "content_block_start":
            return self._block_start(data)
        if etype == "content_block_delta":
            return self._block_delta(data)
        if etype == "content_block_stop":
            self._block_stop(data)
        elif etype == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict):
                if "content" in delta:
                    # `body` builds the content from the blocks: this value would be relayed
                    # in the upstream's bytes without being verified.
                    delta = {k: v for k, v in delta.items() if k != "content"}
                    self._dropped.append(("frame", ("message_delta", "delta", "content")))
                self._message.update(delta)
            usage = data.get("usage")
            if isinstance(usage, dict):
                merged = dict(self._message.get("usage") or {})
                merged.update({k: v for k, v in usage.items() if v is not None})
                self._message["usage"] = merged
        elif etype == "message_stop":
            self._done = True
        # Other event types are new API additions; they carry no content we assemble.
        return []

    def _grow(self, idx: int, field: str, delta: Json, key: str) -> str:
        """Add the delta's `key` to the block's `field`; the piece added."""
        text = delta.get(key, "")
        if not isinstance(text, str):
            raise ProtocolError("anthropic-messages: a delta whose text is not a string")
        parts = self._grown.get((idx, field))
        if parts is None:
            # The first piece joins the block's own value and puts the field in its place
            # among the block's keys; `body` sets the whole value.
            block = self._blocks[idx]
            own = block.get(field, "")
            if not isinstance(own, str):
                raise ProtocolError("anthropic-messages: a block whose text is not a string")
            block[field] = own + text
            self._grown[(idx, field)] = [block[field]]
        else:
            parts.append(text)
        return text

    def _index(self, data: Json) -> int:
        idx = data.get("index")
        if not is_index(idx):
            raise ProtocolError("anthropic-messages: content block event without an index")
        return idx

    def _block_start(self, data: Json) -> list[TextDelta]:
        idx = self._index(data)
        block = data.get("content_block")
        if not isinstance(block, dict):
            raise ProtocolError("anthropic-messages: content_block_start without block")
        if idx != len(self._blocks):
            # The SDKs append each started block whatever its index says: a block index used
            # twice or skipped would make the client's message differ from the one assembled
            # here.
            raise ProtocolError("anthropic-messages: content blocks out of order")
        if not isinstance(block.get("type"), str):
            # A list or an object would not even hash: the SDKs could not read the block.
            raise ProtocolError("anthropic-messages: content block without a type")
        block = copy.deepcopy(block)
        self._blocks[idx] = block
        if block.get("type") == "tool_use":
            self._json_parts[idx] = []
        if block.get("type") != "text":
            return []
        self._last_text = idx
        self._spans.start_block(idx, self._length, block.get("citations"))
        text = block.get("text")
        if not isinstance(text, str) or not text:
            return []
        self._length += len(text)
        return [(_CONTENT_KEY, text)]

    def _block_delta(self, data: Json) -> list[TextDelta]:
        idx = self._index(data)
        delta = data.get("delta")
        if idx not in self._blocks or idx in self._stopped or not isinstance(delta, dict):
            raise ProtocolError("anthropic-messages: delta for a block that is not open")
        block = self._blocks[idx]
        dtype = delta.get("type")
        want = _DELTA_BLOCK.get(str(dtype))
        btype = block.get("type")
        if want is not None and (btype not in want if want else btype in _NO_INPUT):
            # The SDKs ignore a delta the block's type has no field for; assembled here, it
            # would be text only the gateway's copy has.
            # The block's type is the upstream's text: the message never names it.
            raise ProtocolError(f"anthropic-messages: a {dtype} for a block of another type")
        if dtype == "text_delta":
            if idx != self._last_text:
                # Text handed on in another order than the blocks put it in: what a stream
                # verifier releases would not be the answer's text.
                raise ProtocolError("anthropic-messages: text deltas of blocks interleaved")
            text = self._grow(idx, "text", delta, "text")
            self._length += len(text)
            return [(_CONTENT_KEY, text)] if text else []
        if dtype == "citations_delta":
            citation = delta.get("citation")
            if block.get("citations") is None:  # absent or null: the SDKs start a list
                block["citations"] = []
            block["citations"].append(citation)
            self._spans.cite(idx, citation)
        elif dtype == "thinking_delta":
            text = self._grow(idx, "thinking", delta, "thinking")
            return [(channel_key(("content", idx, "thinking")), text)] if text else []
        elif dtype == "signature_delta":
            self._grow(idx, "signature", delta, "signature")
        elif dtype == "input_json_delta":
            part = delta.get("partial_json", "")
            if not isinstance(part, str):
                raise ProtocolError("anthropic-messages: a delta whose text is not a string")
            self._json_parts.setdefault(idx, []).append(part)
            return [(channel_key(("content", idx, "input")), part)] if part else []
        return []

    def _block_stop(self, data: Json) -> None:
        idx = self._index(data)
        if idx not in self._blocks or idx in self._stopped:
            raise ProtocolError("anthropic-messages: content_block_stop for no open block")
        self._stopped.add(idx)
        self._tool_input(idx)

    def _tool_input(self, idx: int) -> None:
        """A block's input, once its input_json_delta pieces are all in."""
        parts = self._json_parts.pop(idx, None)
        if parts is None:
            return
        block = self._blocks[idx]
        raw = "".join(parts)
        if not raw:
            # No input_json_delta: the SDKs keep the input the block started with.
            block.setdefault("input", {})
            return
        if block.get("input"):
            # The streamed input replaces the one the block started with, whose bytes go
            # unverified: the stream is re-framed.
            self._dropped.append(("frame", ("content_block_start", "content_block", "input")))
        try:
            block["input"] = json.loads(raw)
        except ValueError as exc:
            raise ProtocolError("anthropic-messages: tool_use input is not JSON") from exc

    def body(self) -> Json:
        if not self._done or self._message is None:
            raise ProtocolError("anthropic-messages: stream ended without message_stop")
        for idx in list(self._json_parts):
            self._tool_input(idx)  # a block the stream never stopped
        for (idx, field), parts in self._grown.items():
            self._blocks[idx][field] = "".join(parts)
        msg = copy.deepcopy(self._message)
        msg["content"] = [self._blocks[i] for i in sorted(self._blocks)]
        return msg

    def finish(self) -> Answer:
        answer = parse_body(self.body())
        answer.dropped.extend(self._dropped)
        return answer

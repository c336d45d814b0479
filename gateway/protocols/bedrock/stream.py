"""ConverseStream events → the Converse body they add up to (then parsed as one), and a body
→ the events that stream it.

Events (`:event-type`): messageStart, contentBlockStart (toolUse), contentBlockDelta (`text`,
`citation`, `toolUse.input`, `reasoningContent` text / signature / redactedContent),
contentBlockStop, messageStop, metadata. A block that received a citation becomes a
`citationsContent` block. An exception or error message ends the stream as a protocol error,
and so does a block started below one already started, or text for a block once a later block
was started (by text, a citation, reasoning or a tool call): the streamed text would not be
the body's. A citation may come after its block's text (and after a later block's start).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.base import BlockSpans, StreamParser, TextDelta, channel_key
from gateway.protocols.bedrock.codec import EXCEPTION
from gateway.protocols.bedrock.fields import EVENT_TABLES
from gateway.protocols.bedrock.parse import CONTENT_PATH, PRIMARY, native_citation, parse_body
from gateway.protocols.fields import FieldLog, clean, loads_unique
from gateway.sse import SSEEvent
from gateway.types import Answer, Citation

__all__ = ["BedrockStreamParser", "to_events"]

Json = dict[str, Any]


@dataclass(slots=True)
class _Block:
    kind: str  # "text", "tool", "reasoning"
    parts: list[str] = field(default_factory=list)  # text, tool input JSON or reasoning text
    citations: list[object] = field(default_factory=list)
    tool: Json = field(default_factory=dict)
    signature: list[str] = field(default_factory=list)
    redacted: list[str] = field(default_factory=list)
    start: int = 0  # where a text block starts in the primary text


class BedrockStreamParser(StreamParser):
    def __init__(self) -> None:
        self._started = False
        self._stopped = False
        self._done = False
        self._blocks: dict[int, _Block] = {}
        self._length = 0
        self._top: Json = {}
        self._dropped: list[tuple[str, tuple[str | int, ...]]] = []
        self._spans = BlockSpans()
        self._span_of: dict[int, list[Citation]] = {}

    @property
    def native_spans(self) -> BlockSpans:
        return self._spans

    @property
    def done(self) -> bool:
        """messageStop and then metadata: nothing after them can change the answer."""
        return self._done

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if self._done:
            return []
        name = event.event
        if name in (EXCEPTION, "error"):
            raise ProtocolError("bedrock-converse: the stream carried an exception")
        table = EVENT_TABLES.get(name or "")
        if table is None:
            self._dropped.append(("frame", (str(name),)))
            return []
        try:
            data = loads_unique(event.data, stdlib=True)
        except ProtocolError as exc:
            raise ProtocolError(f"bedrock-converse: stream event: {exc}") from None
        if not isinstance(data, dict):
            raise ProtocolError("bedrock-converse: stream event is not a JSON object")
        log = FieldLog()
        clean(table, data, log)
        self._dropped.extend(log.unknown)
        self._dropped.extend(log.dropped)
        if name == "messageStart":
            self._started = True
            return []
        if not self._started:
            raise ProtocolError("bedrock-converse: an event before messageStart")
        if name == "contentBlockStart":
            self._block_start(data)
        elif name == "contentBlockDelta":
            return self._delta(data)
        elif name == "contentBlockStop":
            self._block_stop(data)
        elif name == "messageStop":
            self._stopped = True
            if "stopReason" in data:
                self._top["stopReason"] = data["stopReason"]
        elif name == "metadata":
            for key in ("usage", "metrics", "performanceConfig", "serviceTier"):
                if key in data:
                    self._top[key] = data[key]
            self._done = self._stopped
        return []

    def _index(self, data: Json) -> int:
        idx = data.get("contentBlockIndex")
        if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
            raise ProtocolError("bedrock-converse: content block event without index")
        return idx

    def _block(self, idx: int, kind: str) -> _Block:
        block = self._blocks.get(idx)
        if block is None:
            if idx < max(self._blocks, default=-1):
                # Blocks arrive in order; one started late would reorder the assembled text.
                raise ProtocolError("bedrock-converse: content blocks out of order")
            block = self._blocks[idx] = _Block(kind)
            if kind == "text":
                block.start = self._length
                cits: list[Citation] = []
                self._span_of[idx] = cits
                self._spans.blocks.append((self._length, cits))
        elif block.kind != kind:
            raise ProtocolError("bedrock-converse: deltas of two kinds in one content block")
        return block

    def _block_start(self, data: Json) -> None:
        idx = self._index(data)
        start = data.get("start")
        tool = start.get("toolUse") if isinstance(start, Mapping) else None
        if isinstance(tool, Mapping):
            block = self._block(idx, "tool")
            block.tool = {k: tool[k] for k in ("toolUseId", "name", "type") if k in tool}

    def _delta(self, data: Json) -> list[TextDelta]:
        idx = self._index(data)
        delta = data.get("delta")
        if not isinstance(delta, Mapping) or len(delta) != 1:
            self._dropped.append(("delta", ("delta",)))
            return []
        ((member, value),) = delta.items()
        if member == "text":
            if not isinstance(value, str):
                raise ProtocolError("bedrock-converse: text delta is not a string")
            if idx < max(self._blocks, default=-1):
                # A later block was started (by any delta): this text would follow it in the
                # stream but precede it in the body, under this block's citations, so the
                # claims released would not be the claims judged. Refused, not reordered.
                raise ProtocolError("bedrock-converse: text of a block out of order")
            block = self._block(idx, "text")
            block.parts.append(value)
            self._length += len(value)
            return [(PRIMARY, value)] if value else []
        if member == "citation":
            block = self._block(idx, "text")
            cit = native_citation(value)
            block.citations.append(value)
            self._span_of[idx].append(cit)
            return []
        if member == "toolUse":
            part = value.get("input") if isinstance(value, Mapping) else None
            if not isinstance(part, str):
                raise ProtocolError("bedrock-converse: toolUse delta without input string")
            self._block(idx, "tool").parts.append(part)
            key = channel_key((*CONTENT_PATH, idx, "toolUse", "input"))
            return [(key, part)] if part else []
        if member == "reasoningContent":
            if not isinstance(value, Mapping) or len(value) != 1:
                raise ProtocolError("bedrock-converse: reasoning delta of no known shape")
            ((sub, piece),) = value.items()
            if not isinstance(piece, str):
                raise ProtocolError("bedrock-converse: reasoning delta is not a string")
            block = self._block(idx, "reasoning")
            if sub == "text":
                block.parts.append(piece)
                key = channel_key(
                    (*CONTENT_PATH, idx, "reasoningContent", "reasoningText", "text")
                )
                return [(key, piece)] if piece else []
            if sub == "signature":
                block.signature.append(piece)
            elif sub == "redactedContent":
                block.redacted.append(piece)
            else:
                self._dropped.append(("delta", ("reasoningContent", sub)))
            return []
        self._dropped.append(("delta", (member,)))  # an image or tool result delta: no channel
        return []

    def _block_stop(self, data: Json) -> None:
        self._index(data)

    def body(self) -> Json:
        if not self._stopped:
            raise ProtocolError("bedrock-converse: stream ended without messageStop")
        content: list[Json] = []
        for idx in sorted(self._blocks):
            b = self._blocks[idx]
            if b.kind == "text":
                text = "".join(b.parts)
                if b.citations:
                    content.append(
                        {
                            "citationsContent": {
                                "content": [{"text": text}],
                                "citations": list(b.citations),
                            }
                        }
                    )
                else:
                    content.append({"text": text})
            elif b.kind == "tool":
                raw = "".join(b.parts)
                try:
                    tool_input = json.loads(raw) if raw else {}
                except ValueError as exc:
                    raise ProtocolError("bedrock-converse: toolUse input is not JSON") from exc
                content.append({"toolUse": {**b.tool, "input": tool_input}})
            elif b.redacted:
                content.append({"reasoningContent": {"redactedContent": "".join(b.redacted)}})
            else:
                rt: Json = {"text": "".join(b.parts)}
                if b.signature:
                    rt["signature"] = "".join(b.signature)
                content.append({"reasoningContent": {"reasoningText": rt}})
        body: Json = {"output": {"message": {"role": "assistant", "content": content}}}
        body.update(self._top)
        body.setdefault("stopReason", "end_turn")
        return body

    def finish(self) -> Answer:
        answer = parse_body(self.body())
        answer.dropped.extend(self._dropped)
        return answer


def _ev(name: str, data: Json) -> SSEEvent:
    return SSEEvent(data=json.dumps(data, ensure_ascii=False, separators=(",", ":")), event=name)


def block_events(index: int, block: Mapping[str, Any]) -> list[SSEEvent]:
    """contentBlockStart (tool use) / deltas / contentBlockStop for one content block."""
    out: list[SSEEvent] = []

    def delta(d: Json) -> None:
        out.append(_ev("contentBlockDelta", {"delta": d, "contentBlockIndex": index}))

    if "text" in block:
        delta({"text": block["text"]})
    elif "citationsContent" in block:
        cc = block["citationsContent"]
        for cit in cc.get("citations") or []:
            delta({"citation": cit})
        text = "".join(p.get("text", "") for p in cc.get("content") or [])
        delta({"text": text})
    elif "toolUse" in block:
        tu = block["toolUse"]
        start = {k: tu[k] for k in ("toolUseId", "name", "type") if k in tu}
        out.append(
            _ev("contentBlockStart", {"start": {"toolUse": start}, "contentBlockIndex": index})
        )
        delta({"toolUse": {"input": json.dumps(tu.get("input", {}), ensure_ascii=False)}})
    elif "reasoningContent" in block:
        rc = block["reasoningContent"]
        if "redactedContent" in rc:
            delta({"reasoningContent": {"redactedContent": rc["redactedContent"]}})
        else:
            rt = rc.get("reasoningText") or {}
            if rt.get("text"):
                delta({"reasoningContent": {"text": rt["text"]}})
            if rt.get("signature"):
                delta({"reasoningContent": {"signature": rt["signature"]}})
    out.append(_ev("contentBlockStop", {"contentBlockIndex": index}))
    return out


def closing_events(body: Mapping[str, Any]) -> list[SSEEvent]:
    """messageStop and metadata: the stream's end, from the body's top-level fields."""
    out = [_ev("messageStop", {"stopReason": body.get("stopReason", "end_turn")})]
    meta: Json = {
        "usage": body.get("usage") or {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
        "metrics": body.get("metrics") or {"latencyMs": 0},
    }
    for key in ("performanceConfig", "serviceTier"):
        if key in body:
            meta[key] = body[key]
    out.append(_ev("metadata", meta))
    return out


def to_events(body: Mapping[str, Any]) -> list[SSEEvent]:
    """A Converse body as the ConverseStream events that carry it."""
    events = [_ev("messageStart", {"role": "assistant"})]
    output = body.get("output") or {}
    content = (output.get("message") or {}).get("content") or []
    for i, block in enumerate(content):
        events.extend(block_events(i, block))
    events.extend(closing_events(body))
    return events

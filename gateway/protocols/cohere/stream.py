"""The `/v2/chat` event stream (`message-start` … `message-end`) assembled into the body the
JSON API would have sent, sans-io: `feed(event) -> text deltas`, `finish() -> Answer`.

Text of a `text` item is handed on only up to the end of the last citation seen for it (all
of it at `content-end`): a citation follows the text it cites, and a claim verifier that
judges a claim as soon as the next one begins must see that claim's citations. A citation that
ends past the text received so far for its item (or names no text item yet) fails the stream,
since it would lift that hold. A `message-end`
that reports an error (`finish_reason: ERROR`, `delta.error`) fails the stream; event types and
keys the adapter does not know are recorded as unknown fields, so such a stream is re-framed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.base import StreamParser, TextDelta, channel_key
from gateway.protocols.cohere.fields import EVENT_KEYS
from gateway.protocols.cohere.parse import (
    MISMATCH,
    NAME,
    TEXT,
    content_index,
    parse_body,
    valid_sources,
)
from gateway.protocols.fields import is_index, loads_unique
from gateway.sse import SSEEvent
from gateway.types import Answer, Citation

__all__ = ["CohereStreamParser", "PrimaryCitations", "loads"]

Json = dict[str, Any]
Path = tuple[str | int, ...]

# Keys each delta may hold, by event type (the path under `delta`).
_DELTA_KEYS: dict[str, frozenset[str]] = {
    "message-start": frozenset({"message"}),
    "content-start": frozenset({"message"}),
    "content-delta": frozenset({"message"}),
    "tool-plan-delta": frozenset({"message"}),
    "tool-call-start": frozenset({"message"}),
    "tool-call-delta": frozenset({"message"}),
    "citation-start": frozenset({"message"}),
    "message-end": frozenset({"finish_reason", "usage", "error"}),
}


def loads(data: str) -> Json:
    """One event's JSON object; a duplicate key is ambiguous and fails closed."""
    try:
        value = loads_unique(data, stdlib=True)
    except ProtocolError as exc:
        raise ProtocolError(f"{NAME}: stream event: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{NAME}: stream event is not a JSON object")
    return value


def _index(data: Mapping[str, Any]) -> int:
    v = data.get("index")
    if not is_index(v):
        raise ProtocolError(f"{NAME}: {data.get('type')} without a valid index")
    return v


class _Item:
    """One content item being assembled; text handed on up to `released`."""

    __slots__ = ("cited", "ended", "kind", "length", "ordinal", "parts", "released")

    def __init__(self, kind: str, ordinal: int) -> None:
        self.kind = kind
        self.ordinal = ordinal  # n of ("text", n) for text items, else -1
        self.parts: list[str] = []
        self.length = 0
        self.released = 0
        self.cited = 0  # the furthest citation end seen for this item
        self.ended = False

    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""


class CohereStreamParser(StreamParser):
    """Assembles one `/v2/chat` event stream; text arrives as (channel key, text) deltas."""

    def __init__(self) -> None:
        self._id: object = None
        self._started = False
        self._done = False
        self._items: dict[int, _Item] = {}
        self._texts = 0
        self._plan: list[str] | None = None
        self._calls: dict[int, Json] = {}
        self._args: dict[int, list[str]] = {}
        self._citations: dict[int, Json] = {}
        self._ended_citations: set[int] = set()
        self._finish: object = None
        self._usage: object = None
        self._logprobs: list[Any] = []
        self._unknown: list[Path] = []

    @property
    def done(self) -> bool:
        return self._done

    @property
    def native_spans(self) -> PrimaryCitations:
        return PrimaryCitations(self)

    # -- events ----------------------------------------------------------------------------

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if self._done:
            return []
        data = loads(event.data)
        etype = data.get("type")
        if not isinstance(etype, str):
            raise ProtocolError(f"{NAME}: stream event without a type")
        if event.event is not None and event.event != etype:
            raise ProtocolError(f"{NAME}: SSE event name and type disagree")
        if event.id is not None or event.retry is not None:
            self._unknown.append(("stream", etype, "id" if event.id is not None else "retry"))
        known = EVENT_KEYS.get(etype)
        if known is None:
            self._unknown.append(("stream", etype))
            return []
        for key in data:
            if key not in known:
                self._unknown.append(("stream", etype, key))
        if etype == "message-start":
            if self._started:
                raise ProtocolError(f"{NAME}: a second message-start")
            self._started = True
            self._id = data.get("id")
            self._message(data, etype)
            return []
        if not self._started:
            raise ProtocolError(f"{NAME}: {etype} before message-start")
        return self._event(etype, data)

    def _delta(self, data: Mapping[str, Any], etype: str) -> Json:
        delta = data.get("delta")
        if delta is None:
            return {}
        if not isinstance(delta, dict):
            raise ProtocolError(f"{NAME}: {etype} delta is not an object")
        for key in delta:
            if key not in _DELTA_KEYS.get(etype, frozenset()):
                self._unknown.append(("stream", etype, "delta", key))
        return delta

    def _message(self, data: Mapping[str, Any], etype: str, *expect: str) -> Json:
        """`delta.message`, with anything but the keys `expect`ed recorded as unknown (the
        opening event's empty lists and strings are no content)."""
        message = self._delta(data, etype).get("message")
        if message is None:
            return {}
        if not isinstance(message, dict):
            raise ProtocolError(f"{NAME}: {etype} message is not an object")
        for key, value in message.items():
            if key in expect:
                continue
            if etype == "message-start" and (
                (key == "role" and value == "assistant") or value in ("", [], None)
            ):
                continue
            self._unknown.append(("stream", etype, "delta", "message", key))
        return message

    def _part(self, message: Mapping[str, Any], key: str, etype: str, *expect: str) -> Json:
        part = message.get(key)
        if not isinstance(part, dict):
            raise ProtocolError(f"{NAME}: {etype} without its {key}")
        self._only(part, (etype, "delta", "message", key), expect)
        return part

    def _only(self, obj: Mapping[str, Any], at: Path, expect: tuple[str, ...]) -> None:
        """Keys of `obj` other than `expect` are recorded as unknown: the parser does not read
        them, so the upstream's bytes holding them are never relayed (the stream is re-framed)."""
        for k in obj:
            if k not in expect:
                self._unknown.append(("stream", *at, k))

    def _event(self, etype: str, data: Json) -> list[TextDelta]:
        if etype == "content-start":
            i = _index(data)
            if i != len(self._items):
                # Items are numbered in the order they start: a text item's channel is its rank
                # among the text items started, and a citation without `content_index` names
                # the lowest-indexed one; an index out of that order would let the two differ.
                raise ProtocolError(f"{NAME}: content index {i} is not the next one")
            part = self._part(self._message(data, etype, "content"), "content", etype,
                              "type", "text", "thinking")
            kind = part.get("type")
            if kind not in ("text", "thinking"):
                raise ProtocolError(f"{NAME}: a content item of an unknown type")
            self._other_kind(part, etype, str(kind))
            item = self._items[i] = _Item(str(kind), self._texts if kind == "text" else -1)
            if kind == "text":
                self._texts += 1
            return self._grow(i, item, part.get(str(kind)) or "")
        if etype == "content-delta":
            i = _index(data)
            item = self._open_item(i, etype)
            part = self._part(self._message(data, etype, "content"), "content", etype,
                              "text", "thinking")
            self._other_kind(part, etype, item.kind)
            lp = data.get("logprobs")
            if lp is not None:
                self._logprobs.append(copy.deepcopy(lp))
            return self._grow(i, item, part.get(item.kind) or "")
        if etype == "content-end":
            i = _index(data)
            item = self._open_item(i, etype)
            item.ended = True
            return self._release(i, item, item.length)
        if etype == "tool-plan-delta":
            message = self._message(data, etype, "tool_plan")
            plan = message.get("tool_plan")
            if not isinstance(plan, str):
                raise ProtocolError(f"{NAME}: tool-plan-delta without text")
            if self._plan is None:
                self._plan = []
            self._plan.append(plan)
            return [(channel_key(("message", "tool_plan")), plan)] if plan else []
        if etype.startswith("tool-call-"):
            return self._tool(etype, data)
        if etype == "citation-start":
            return self._citation(data)
        if etype == "citation-end":
            j = _index(data)
            if j not in self._citations or j in self._ended_citations:
                raise ProtocolError(f"{NAME}: citation-end for no open citation")
            self._ended_citations.add(j)
            return []
        # message-end
        delta = self._delta(data, etype)
        if delta.get("error") is not None or delta.get("finish_reason") == "ERROR":
            raise ProtocolError(f"{NAME}: the stream ended in an error")
        self._finish = delta.get("finish_reason")
        self._usage = delta.get("usage")
        self._done = True
        out: list[TextDelta] = []
        for i, item in sorted(self._items.items()):
            out += self._release(i, item, item.length)
        return out

    def _other_kind(self, part: Mapping[str, Any], etype: str, kind: str) -> None:
        """A text item's part carries `text` only, a thinking item's `thinking` only: the
        other key is never read, so it is unknown unless empty (no content)."""
        other = "thinking" if kind == "text" else "text"
        if part.get(other, "") not in ("", None):
            self._unknown.append(("stream", etype, "delta", "message", "content", other))

    def _open_item(self, i: int, etype: str) -> _Item:
        item = self._items.get(i)
        if item is None or item.ended:
            raise ProtocolError(f"{NAME}: {etype} for no open content item")
        return item

    def _key(self, i: int, item: _Item) -> str:
        if item.kind == "text":
            return channel_key((TEXT, item.ordinal))
        return channel_key(("message", "content", i, "thinking"))

    def _grow(self, i: int, item: _Item, text: object) -> list[TextDelta]:
        if not isinstance(text, str):
            raise ProtocolError(f"{NAME}: a content delta that is not text")
        item.parts.append(text)
        item.length += len(text)
        if item.kind != "text":
            return [(self._key(i, item), text)] if text else []
        return self._release(i, item, item.cited)

    def _release(self, i: int, item: _Item, upto: int) -> list[TextDelta]:
        upto = min(upto, item.length)
        if upto <= item.released:
            return []
        if item.kind != "text":
            item.released = upto
            return []
        piece = item.text()[item.released : upto]
        item.released = upto
        return [(self._key(i, item), piece)]

    def _tool(self, etype: str, data: Json) -> list[TextDelta]:
        k = _index(data)
        if etype == "tool-call-start":
            if k in self._calls:
                raise ProtocolError(f"{NAME}: tool call {k} started twice")
            call = self._part(self._message(data, etype, "tool_calls"), "tool_calls", etype,
                              "id", "type", "function")
            fn = call.get("function")
            if not isinstance(fn, dict):
                raise ProtocolError(f"{NAME}: tool-call-start without a function")
            self._calls[k] = {
                "id": call.get("id"),
                "type": call.get("type", "function"),
                "function": {k2: v for k2, v in fn.items() if k2 != "arguments"},
            }
            args = fn.get("arguments") or ""
            self._args[k] = []
            return self._grow_args(k, args)
        if k not in self._calls:
            raise ProtocolError(f"{NAME}: {etype} for no started tool call")
        if etype == "tool-call-delta":
            call = self._part(self._message(data, etype, "tool_calls"), "tool_calls", etype,
                              "function")
            fn = call.get("function", {})
            if not isinstance(fn, dict):
                raise ProtocolError(f"{NAME}: tool-call-delta function is not an object")
            self._only(fn, (etype, "delta", "message", "tool_calls", "function"), ("arguments",))
            return self._grow_args(k, fn.get("arguments") or "")
        return []  # tool-call-end

    def _grow_args(self, k: int, args: object) -> list[TextDelta]:
        if not isinstance(args, str):
            raise ProtocolError(f"{NAME}: tool call arguments are not a string")
        self._args[k].append(args)
        key = channel_key(("message", "tool_calls", k, "function", "arguments"))
        return [(key, args)] if args else []

    def _citation(self, data: Json) -> list[TextDelta]:
        j = _index(data)
        if j in self._citations:
            raise ProtocolError(f"{NAME}: citation {j} started twice")
        message = self._message(data, "citation-start", "citations")
        citation = message.get("citations")
        if not isinstance(citation, dict):
            raise ProtocolError(f"{NAME}: citation-start without a citation")
        self._citations[j] = copy.deepcopy(citation)
        ci = content_index(citation)
        if citation.get("type", "TEXT_CONTENT") != "TEXT_CONTENT":
            return []
        if ci is None:
            ci = next((i for i, it in sorted(self._items.items()) if it.kind == "text"), None)
        item = self._items.get(ci) if ci is not None else None
        end = citation.get("end")
        if (ci is None or item is None or item.kind != "text"
                or type(end) is not int or end > item.length):
            # A citation follows the text it cites, and the hold relies on it: one whose
            # end lies past the text received so far (or that names no text item yet) would
            # release a claim before its own citations were seen.
            raise ProtocolError(f"{NAME}: a citation ahead of its text")
        item.cited = max(item.cited, end)
        return self._release(ci, item, item.cited)

    # -- the whole answer --------------------------------------------------------------------

    def body(self) -> Json:
        if not self._done:
            raise ProtocolError(f"{NAME}: stream ended without message-end")
        if any(not it.ended for it in self._items.values()):
            raise ProtocolError(f"{NAME}: a content item never ended")
        message: Json = {"role": "assistant"}
        content = []
        for i in sorted(self._items):
            item = self._items[i]
            content.append({"type": item.kind, item.kind: item.text()})
        if [*sorted(self._items)] != list(range(len(self._items))):
            raise ProtocolError(f"{NAME}: content indices are not 0, 1, 2, …")
        message["content"] = content
        if self._plan is not None:
            message["tool_plan"] = "".join(self._plan)
        if self._calls:
            if sorted(self._calls) != list(range(len(self._calls))):
                raise ProtocolError(f"{NAME}: tool call indices are not 0, 1, 2, …")
            calls = []
            for k in sorted(self._calls):
                call = copy.deepcopy(self._calls[k])
                call["function"]["arguments"] = "".join(self._args[k])
                calls.append(call)
            message["tool_calls"] = calls
        if self._citations:
            message["citations"] = [self._citations[j] for j in sorted(self._citations)]
        body: Json = {"id": self._id if self._id is not None else "", "message": message,
                      "finish_reason": self._finish if self._finish is not None else "COMPLETE"}
        if self._usage is not None:
            body["usage"] = self._usage
        if self._logprobs:
            body["logprobs"] = self._logprobs
        return body

    def finish(self) -> Answer:
        answer = parse_body(self.body())
        answer.unknown_fields.extend(self._unknown)
        return answer

    # -- for the stream verifier -------------------------------------------------------------

    def primary_citations(self) -> tuple[str, list[Json]]:
        """The first text item's text so far and the citations seen for it."""
        first = next(
            ((i, it) for i, it in sorted(self._items.items()) if it.kind == "text"), None
        )
        if first is None:
            return "", []
        i, item = first
        out = []
        for c in self._citations.values():
            if c.get("type", "TEXT_CONTENT") != "TEXT_CONTENT":
                continue
            ci = content_index(c)
            if ci is None or ci == i:
                out.append(c)
        return item.text(), out


class PrimaryCitations:
    """Native citations of the first text item seen so far, for a stream verifier that
    checks each claim as soon as it is complete. A citation whose span is not (yet) the
    answer's text at its offsets is malformed: the claim fails closed."""

    def __init__(self, parser: CohereStreamParser) -> None:
        self._parser = parser

    def overlapping(self, start: int, end: int, length: int) -> tuple[Citation, ...]:
        text, citations = self._parser.primary_citations()
        out: list[Citation] = []
        for c in citations:
            s, e = c.get("start"), c.get("end")
            if type(s) is not int or type(e) is not int:
                continue
            if not ((s < end and e > start) or (s == e and start <= s <= end)):
                continue
            ok = 0 <= s <= e <= len(text) and c.get("text") == text[s:e]
            problem = None if ok else MISMATCH
            sources = valid_sources(c)
            for src in sources:
                out.append(Citation(id=src["id"], raw=src["id"], malformed=problem))
            if not sources and (problem or c.get("sources")):
                out.append(Citation(id="", raw="", malformed=problem or "a source without an id"))
        return tuple(out)

"""The typed Responses event stream (`response.created` … `response.completed`) assembled into
the response body the JSON API would have sent, sans-io: `feed(event) -> text deltas`,
`finish() -> Answer`.

The stream repeats every text (`output_text.done`, `content_part.done`, `output_item.done`,
the terminal event's `response`); a copy that differs from the deltas makes the stream
ambiguous and it fails closed. `response.failed` and `error` events fail it too. Event types
and fields the adapter does not know are recorded as unknown fields, so such a stream is
re-rendered rather than relayed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

from gateway.context import DEFAULT_TRUST, trust_of
from gateway.errors import ProtocolError
from gateway.policy import ContextSpec
from gateway.protocols.base import StreamParser, TextDelta, channel_key
from gateway.protocols.openai_responses.context import (
    file_search_chunks,
    file_search_enabled,
    had_request,
    instructions_context,
)
from gateway.protocols.openai_responses.fields import ITEM_SHAPES, shape_ok
from gateway.protocols.openai_responses.parse import (
    TEXT,
    annotation_spans,
    annotation_unknown,
    parse_body,
    top_unknown,
)
from gateway.sse import SSEEvent
from gateway.types import Answer, Citation, ContextSet

__all__ = ["EVENT_KEYS", "TERMINAL", "PrimarySpans", "ResponsesStreamParser", "loads"]

Json = dict[str, Any]

_SEQ = ("type", "sequence_number")
_ITEM = (*_SEQ, "item_id", "output_index")
_PART = (*_ITEM, "content_index")
EVENT_KEYS: dict[str, frozenset[str]] = {
    k: frozenset(v)
    for k, v in {
        "response.created": (*_SEQ, "response"),
        "response.in_progress": (*_SEQ, "response"),
        "response.queued": (*_SEQ, "response"),
        "response.completed": (*_SEQ, "response"),
        "response.incomplete": (*_SEQ, "response"),
        "response.output_item.added": (*_SEQ, "output_index", "item"),
        "response.output_item.done": (*_SEQ, "output_index", "item"),
        "response.content_part.added": (*_PART, "part"),
        "response.content_part.done": (*_PART, "part"),
        "response.output_text.delta": (*_PART, "delta", "logprobs", "obfuscation"),
        "response.output_text.done": (*_PART, "text", "logprobs"),
        "response.output_text.annotation.added": (*_PART, "annotation_index", "annotation"),
        "response.refusal.delta": (*_PART, "delta", "obfuscation"),
        "response.refusal.done": (*_PART, "refusal"),
        "response.function_call_arguments.delta": (*_ITEM, "delta", "obfuscation"),
        "response.function_call_arguments.done": (*_ITEM, "arguments", "name"),
        "response.custom_tool_call_input.delta": (*_ITEM, "delta", "obfuscation"),
        "response.custom_tool_call_input.done": (*_ITEM, "input"),
        "response.reasoning_summary_part.added": (*_ITEM, "summary_index", "part"),
        "response.reasoning_summary_part.done": (*_ITEM, "summary_index", "part", "status"),
        "response.reasoning_summary_text.delta": (*_ITEM, "summary_index", "delta", "obfuscation"),
        "response.reasoning_summary_text.done": (*_ITEM, "summary_index", "text"),
        "response.reasoning_text.delta": (*_PART, "delta", "obfuscation"),
        "response.reasoning_text.done": (*_PART, "text"),
        "response.file_search_call.in_progress": _ITEM,
        "response.file_search_call.searching": _ITEM,
        "response.file_search_call.completed": _ITEM,
        "response.web_search_call.in_progress": _ITEM,
        "response.web_search_call.searching": _ITEM,
        "response.web_search_call.completed": _ITEM,
    }.items()
}
TERMINAL = frozenset({"response.completed", "response.incomplete"})
# The output item type each text-bearing event addresses: a text sent to an item of another
# type is a text no finished item holds (a reasoning delta on a message), so it fails closed.
_MESSAGE = frozenset({"message"})
_REASONING = frozenset({"reasoning"})
_PART_ITEM = {"output_text": "message", "refusal": "message", "reasoning_text": "reasoning"}
_ITEM_TYPES: dict[str, frozenset[str]] = {
    **{
        e: _MESSAGE
        for e in EVENT_KEYS
        if e.startswith(("response.output_text.", "response.refusal."))
    },
    "response.content_part.added": frozenset({"message", "reasoning"}),
    "response.content_part.done": frozenset({"message", "reasoning"}),
    **{e: _REASONING for e in EVENT_KEYS if e.startswith("response.reasoning_")},
    "response.function_call_arguments.delta": frozenset({"function_call"}),
    "response.function_call_arguments.done": frozenset({"function_call"}),
    "response.custom_tool_call_input.delta": frozenset({"custom_tool_call"}),
    "response.custom_tool_call_input.done": frozenset({"custom_tool_call"}),
}
_HEADS = frozenset({"response.created", "response.in_progress", "response.queued"})


def _nonneg_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _token(v: object) -> bool:
    return isinstance(v, str) and shape_ok(ITEM_SHAPES, "id", v)


# Event fields relayed as they are when a stream goes out as the upstream's bytes: kept only
# with their expected shape. Text-bearing fields (`delta`, `text`, …) are checked against the
# assembled answer instead, and payload objects (`response`, `item`, `part`, `annotation`) by
# the body's field table (`_residue`).
_EVENT_SHAPES: dict[str, Callable[[object], bool]] = {
    "sequence_number": _nonneg_int,
    "output_index": _nonneg_int,
    "content_index": _nonneg_int,
    "summary_index": _nonneg_int,
    "annotation_index": _nonneg_int,
    "item_id": _token,
    "obfuscation": _token,  # the service's random padding: a short token, never prose
    "name": _token,
    # Token logprobs streamed beside the deltas are not checked against the text here: a
    # stream that carries any is re-rendered from the answer's verified logprobs.
    "logprobs": lambda v: v is None or v == [],
}


def _unknown_in(output_item: Mapping[str, Any]) -> list[tuple[str | int, ...]]:
    """What the body's field table would not relay of one output item."""
    return parse_body({"object": "response", "output": [output_item]}).unknown_fields


def _residue(etype: str, data: Mapping[str, Any]) -> list[tuple[str | int, ...]]:
    """The fields of an event's payload object that would not go out in a re-rendered stream
    (the response head, an output item, a content or summary part, an annotation). The
    terminal event's response is the answer itself, parsed whole at the end."""
    if etype in _HEADS:
        resp = data.get("response")
        if not isinstance(resp, Mapping):
            return []
        out = top_unknown(resp)
        if resp.get("output"):  # the head announces no output: items come as their events
            out.append(("output",))
        return out
    if etype in TERMINAL:
        return []
    if isinstance(data.get("item"), Mapping):
        return _unknown_in(data["item"])
    part = data.get("part")
    if isinstance(part, Mapping):
        if etype.startswith("response.reasoning_summary_part."):
            return _unknown_in({"type": "reasoning", "id": "rs", "summary": [part]})
        return _unknown_in({"type": "message", "id": "msg", "role": "assistant",
                            "content": [part]})
    ann = data.get("annotation")
    if isinstance(ann, Mapping):
        return annotation_unknown(ann, ("annotation",))
    return []


def _any(v: object) -> bool:
    return True


def _no_duplicates(pairs: list[tuple[str, Any]]) -> Json:
    out: Json = {}
    for k, v in pairs:
        if k in out:
            # Never the key itself: it is the upstream's text.
            raise ProtocolError("openai-responses: a stream event repeats a key")
        out[k] = v
    return out


def loads(data: str) -> Json:
    """One event's JSON object; a duplicate key is ambiguous and fails closed."""
    try:
        value = json.loads(data, object_pairs_hook=_no_duplicates)
    except ValueError as exc:
        raise ProtocolError("openai-responses: stream event is not JSON") from exc
    if not isinstance(value, dict):
        raise ProtocolError("openai-responses: stream event is not a JSON object")
    return value


def _int(data: Mapping[str, Any], key: str) -> int:
    v = data.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ProtocolError(f"openai-responses: {data.get('type')} without a valid {key}")
    return v


# Fields of an item that grow through its events (checked key by key) or change as it ends.
_GROWN_FIELDS = ("type", "status", "content", "summary", "arguments", "input")


def _unrepeated(before: Mapping[str, Any], done: Mapping[str, Any], skip: tuple[str, ...]) -> bool:
    """Whether an announced item or part said something (a non-empty value) the finished one
    does not repeat: the announcement went out in no answer."""
    return any(k not in skip and v and done.get(k) != v for k, v in before.items())


class ResponsesStreamParser(StreamParser):
    """Assembles one Responses event stream; text arrives as (channel key, text) deltas."""

    def __init__(self) -> None:
        self._head: Json | None = None
        self._final: Json | None = None
        self._items: dict[int, Json] = {}
        self._done_items: dict[int, Json] = {}
        self._grown: dict[tuple[Any, ...], list[str]] = {}
        # The keys of `_grown` per output item, checked against its output_item.done.
        self._item_keys: dict[int, list[tuple[Any, ...]]] = {}
        self._added: dict[int, Mapping[str, Any]] = {}  # each item as output_item.added said
        self._ordinal: dict[tuple[int, int], int] = {}
        self._text_at: dict[int, tuple[int, int]] = {}  # the inverse of `_ordinal`
        self._unknown: list[tuple[str | int, ...]] = []
        self._ctx: ContextSet | None = None
        self._trust = DEFAULT_TRUST
        self._done = False
        # Text of the last output_text.delta, handed on with the next event: the annotation
        # that cites a claim follows the delta that ends it, and a claim verifier must see it.
        self._held: list[TextDelta] = []

    def bind_context(self, ctx: ContextSet, spec: ContextSpec) -> None:
        """File-search results that arrive in the stream join `ctx` as they come (on routes
        whose context comes from the response), before the claims that cite them; so does a
        stored response's echoed instructions (a GET without a body), from its first event."""
        if "response" in spec.from_:
            self._ctx = ctx
            self._trust = trust_of(spec)

    @property
    def done(self) -> bool:
        return self._done

    @property
    def native_spans(self) -> PrimarySpans:
        return PrimarySpans(self)

    # -- events ----------------------------------------------------------------------------

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if self._done:
            return []
        data = loads(event.data)
        etype = data.get("type")
        if not isinstance(etype, str):
            raise ProtocolError("openai-responses: stream event without a type")
        if event.event is not None and event.event != etype:
            raise ProtocolError("openai-responses: SSE event name and type disagree")
        if etype in ("error", "response.failed"):
            raise ProtocolError("openai-responses: the stream carried a failure")
        known = EVENT_KEYS.get(etype)
        if known is None:
            self._unknown.append(("stream", etype))
            return []
        for key, value in data.items():
            if key not in known or not _EVENT_SHAPES.get(key, _any)(value):
                self._unknown.append(("stream", etype, key))
        self._unknown.extend(("stream", etype, *path) for path in _residue(etype, data))
        if event.id is not None or event.retry is not None:
            self._unknown.append(("stream", etype, "id" if event.id is not None else "retry"))
        if self._head is None and etype != "response.created":
            raise ProtocolError(f"openai-responses: {etype} before response.created")
        out = self._event(etype, data)
        held, self._held = self._held, []
        if etype == "response.output_text.delta":
            self._held = out
            return held
        return held + out if held else out

    def _event(self, etype: str, data: Json) -> list[TextDelta]:
        if etype in ("response.created", "response.in_progress", "response.queued"):
            resp = data.get("response")
            if not isinstance(resp, dict):
                raise ProtocolError(f"openai-responses: {etype} without a response")
            if self._head is not None and resp.get("id") != self._head.get("id"):
                raise ProtocolError("openai-responses: the response id changed mid-stream")
            if self._head is None and self._ctx is not None and not had_request():
                instructions_context(resp, self._ctx, self._trust)
            self._head = resp
            return []
        if etype in TERMINAL:
            resp = data.get("response")
            if not isinstance(resp, dict) or resp.get("id") != (self._head or {}).get("id"):
                raise ProtocolError(f"openai-responses: {etype} without the same response")
            self._final = resp
            self._done = True
            return []
        i = _int(data, "output_index")
        if etype == "response.output_item.added":
            return self._item_added(i, data.get("item"))
        item = self._items.get(i)
        if item is None:
            raise ProtocolError(f"openai-responses: {etype} for an output item never added")
        if etype == "response.output_item.done":
            return self._item_done(i, item, data.get("item"))
        if "item_id" in data and data["item_id"] != item.get("id"):
            raise ProtocolError("openai-responses: item_id does not match the output item")
        types = _ITEM_TYPES.get(etype)
        if types is not None and item.get("type") not in types:
            # The item's type is the upstream's text (any string): never in the message.
            raise ProtocolError(f"openai-responses: {etype} for an item of another type")
        return self._content(etype, i, item, data)

    def _item_added(self, i: int, item: object) -> list[TextDelta]:
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise ProtocolError("openai-responses: output_item.added without an item")
        if i in self._items:
            raise ProtocolError("openai-responses: output index added twice")
        self._added[i] = item
        item = copy.deepcopy(item)
        self._items[i] = item
        out: list[TextDelta] = []
        itype = item["type"]
        if itype == "message":
            parts = item.get("content") or []
            item["content"] = []
            for j, part in enumerate(parts):
                out += self._part_added(i, item, j, part)
        elif itype == "function_call":
            out += self._grow(i, ("output", i, "arguments"), str(item.get("arguments") or ""))
        elif itype == "custom_tool_call":
            out += self._grow(i, ("output", i, "input"), str(item.get("input") or ""))
        elif itype == "reasoning":
            for field in ("summary", "content"):
                for k, part in enumerate(item.get(field) or []):
                    text = part.get("text", "") if isinstance(part, dict) else ""
                    out += self._grow(i, ("output", i, field, k, "text"), str(text))
        return out

    def _key(self, i: int, j: int, field: str) -> tuple[Any, ...]:
        if field == "text":
            n = self._ordinal.get((i, j))
            if n is None:
                raise ProtocolError("openai-responses: output_text event for another part")
            return (TEXT, n)
        return ("output", i, "content", j, field)

    def _part_added(self, i: int, item: Json, j: int, part: object) -> list[TextDelta]:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise ProtocolError("openai-responses: content part without a type")
        content = item.setdefault("content", [])
        if j != len(content):
            raise ProtocolError("openai-responses: content parts out of order")
        part = copy.deepcopy(part)
        if _PART_ITEM.get(part["type"], item.get("type")) != item.get("type"):
            raise ProtocolError(f"openai-responses: a {part['type']} part in another item")
        content.append(part)
        if part["type"] == "output_text":
            n = self._ordinal[(i, j)] = len(self._ordinal)
            self._text_at[n] = (i, j)
            return self._grow(i, self._key(i, j, "text"), str(part.get("text") or ""))
        if part["type"] == "refusal":
            return self._grow(i, self._key(i, j, "refusal"), str(part.get("refusal") or ""))
        if part["type"] == "reasoning_text":
            return self._grow(i, ("output", i, "content", j, "text"), str(part.get("text") or ""))
        return []

    def _grow(self, i: int, key: tuple[Any, ...], text: str) -> list[TextDelta]:
        parts = self._grown.get(key)
        if parts is None:
            self._grown[key] = [text]
            self._item_keys.setdefault(i, []).append(key)
        else:
            parts.append(text)
        return [(channel_key(key), text)] if text else []

    def _text(self, key: tuple[Any, ...]) -> str:
        parts = self._grown.get(key)
        if parts is None:
            return ""
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0]

    def _same(self, key: tuple[Any, ...], value: object) -> None:
        """A repeated copy of a text must equal what its deltas built."""
        if value != self._text(key):
            raise ProtocolError("openai-responses: a repeated text differs from its deltas")

    def _content(self, etype: str, i: int, item: Json, data: Json) -> list[TextDelta]:
        kind = etype.removeprefix("response.")
        if kind.startswith(("content_part.", "output_text.", "refusal.", "reasoning_text.")):
            j = _int(data, "content_index")
            if kind == "content_part.added":
                return self._part_added(i, item, j, data.get("part"))
            content = item.get("content") or []
            if j >= len(content) and not kind.startswith("reasoning_text."):
                raise ProtocolError(f"openai-responses: {etype} for a part never added")
            if kind.startswith("refusal.") and content[j].get("type") != "refusal":
                raise ProtocolError(f"openai-responses: {etype} for a part that is no refusal")
            if kind == "output_text.delta":
                return self._grow(i, self._key(i, j, "text"), self._delta(data))
            if kind == "output_text.done":
                self._same(self._key(i, j, "text"), data.get("text"))
            elif kind == "output_text.annotation.added":
                ann = data.get("annotation")
                self._key(i, j, "text")  # an output_text part's, or the stream is refused
                anns = content[j].setdefault("annotations", [])
                if _int(data, "annotation_index") != len(anns):
                    raise ProtocolError("openai-responses: annotations out of order")
                anns.append(copy.deepcopy(ann))
            elif kind == "refusal.delta":
                return self._grow(i, self._key(i, j, "refusal"), self._delta(data))
            elif kind == "refusal.done":
                self._same(self._key(i, j, "refusal"), data.get("refusal"))
            elif kind == "content_part.done":
                part = data.get("part")
                if not isinstance(part, dict) or part.get("type") != content[j].get("type"):
                    raise ProtocolError("openai-responses: content_part.done changed the part")
                ptype = part["type"]
                if ptype == "output_text" and "text" in part:
                    self._same(self._key(i, j, "text"), part["text"])
                elif ptype == "refusal" and "refusal" in part:
                    self._same(self._key(i, j, "refusal"), part["refusal"])
                elif ptype == "reasoning_text" and "text" in part:
                    self._same(("output", i, "content", j, "text"), part["text"])
            elif kind == "reasoning_text.delta":
                return self._grow(i, ("output", i, "content", j, "text"), self._delta(data))
            elif kind == "reasoning_text.done":
                self._same(("output", i, "content", j, "text"), data.get("text"))
            return []
        if kind == "function_call_arguments.delta":
            return self._grow(i, ("output", i, "arguments"), self._delta(data))
        if kind == "function_call_arguments.done":
            self._same(("output", i, "arguments"), data.get("arguments"))
        elif kind == "custom_tool_call_input.delta":
            return self._grow(i, ("output", i, "input"), self._delta(data))
        elif kind == "custom_tool_call_input.done":
            self._same(("output", i, "input"), data.get("input"))
        elif kind.startswith("reasoning_summary_"):
            k = _int(data, "summary_index")
            key = ("output", i, "summary", k, "text")
            if kind == "reasoning_summary_part.added":
                part = data.get("part")
                text = part.get("text", "") if isinstance(part, dict) else ""
                return self._grow(i, key, str(text))
            if kind == "reasoning_summary_text.delta":
                return self._grow(i, key, self._delta(data))
            if kind == "reasoning_summary_text.done":
                self._same(key, data.get("text"))
            elif kind == "reasoning_summary_part.done":
                part = data.get("part")
                self._same(key, part.get("text") if isinstance(part, dict) else None)
        return []

    @staticmethod
    def _delta(data: Mapping[str, Any]) -> str:
        delta = data.get("delta")
        if not isinstance(delta, str):
            raise ProtocolError(f"openai-responses: {data.get('type')} without a text delta")
        return delta

    def _item_done(self, i: int, item: Json, done: object) -> list[TextDelta]:
        if not isinstance(done, dict) or done.get("type") != item.get("type"):
            raise ProtocolError("openai-responses: output_item.done changed the item")
        if done.get("id") != item.get("id"):
            raise ProtocolError("openai-responses: output_item.done changed the item id")
        self._check_item(i, done)
        self._done_items[i] = copy.deepcopy(done)
        if (
            self._ctx is not None
            and done.get("type") == "file_search_call"
            and file_search_enabled(self._head)  # a stored GET: its echoed tools
        ):
            self._ctx.extend(file_search_chunks({"output": [done]}))
        return []

    def _check_item(self, i: int, done: Mapping[str, Any]) -> None:
        """Every text the item's events built is in the finished item, equal to what the
        deltas built: one that differs makes the stream ambiguous (ProtocolError); one the
        finished item does not hold went out in no answer, so the stream is re-rendered from
        the finished item rather than relayed. So are annotations it does not repeat."""
        unsaid = False
        if done.get("type") == "message":
            content = done.get("content")
            if not isinstance(content, list):
                raise ProtocolError("openai-responses: message without a content list")
            if not all(isinstance(part, Mapping) for part in content):
                raise ProtocolError("openai-responses: content part is not an object")
            built = self._items[i].get("content") or []
            if len(content) != len(built):
                raise ProtocolError("openai-responses: output_item.done has other parts")
            for part, have in zip(content, built, strict=True):
                unsaid = unsaid or _unrepeated(have, part, ("type", "text", "refusal"))
        # The item's other fields as announced (queries, results, an id): empty then, or the
        # finished item's.
        unsaid = unsaid or _unrepeated(self._added[i], done, _GROWN_FIELDS)
        if unsaid:
            self._unknown.append(("stream", "response.output_item.done", i))
        for key in self._item_keys.get(i, ()):
            found, value = self._done_text(key, done)
            if found:
                self._same(key, value)
            elif self._text(key):
                self._unknown.append(("stream", "response.output_item.done", i))

    def _done_text(self, key: tuple[Any, ...], done: Mapping[str, Any]) -> tuple[bool, object]:
        """(whether the finished item holds the text at `key`, and its value there)."""
        if key[0] == TEXT:
            path: tuple[Any, ...] = ("content", self._text_at[key[1]][1], "text")
            kind: str | None = "output_text"
        elif key[2] in ("arguments", "input"):
            path, kind = (key[2],), None
        elif key[2] == "summary":  # (output, i, summary, k, text)
            path, kind = key[2:], "summary_text"
        else:  # (output, i, content, j, refusal | text): a refusal part or reasoning text
            path, kind = key[2:], "refusal" if key[4] == "refusal" else "reasoning_text"
        node: object = done
        for step in path[:-1]:
            if isinstance(node, Mapping):
                node = node.get(step)
            elif isinstance(node, list) and isinstance(step, int) and step < len(node):
                node = node[step]
            else:
                return False, None
        if not isinstance(node, Mapping) or path[-1] not in node:
            return False, None
        if kind is not None and node.get("type") != kind:
            return False, None
        return True, node[path[-1]]

    # -- the whole answer --------------------------------------------------------------------

    def body(self) -> Json:
        if not self._done or self._final is None:
            raise ProtocolError("openai-responses: stream ended without response.completed")
        if set(self._items) != set(self._done_items):
            raise ProtocolError("openai-responses: an output item never finished")
        body = copy.deepcopy(self._final)
        done = [self._done_items[i] for i in sorted(self._done_items)]
        output = body.get("output")
        if output is None:
            body["output"] = done
        elif output != done:
            raise ProtocolError("openai-responses: the final response differs from its items")
        return body

    def finish(self) -> Answer:
        answer = parse_body(self.body())
        answer.unknown_fields.extend(self._unknown)
        return answer


class PrimarySpans:
    """Native citations of the first output_text part seen so far, for a stream verifier that
    checks each claim as soon as it is complete (annotations that arrive after the next claim's
    text began are not seen in time, and that claim fails closed)."""

    def __init__(self, parser: ResponsesStreamParser) -> None:
        self._parser = parser

    def overlapping(self, start: int, end: int, length: int) -> tuple[Citation, ...]:
        p = self._parser
        at = next((ij for ij, n in p._ordinal.items() if n == 0), None)
        if at is None:
            return ()
        i, j = at
        part = p._items[i]["content"][j]
        anns = part.get("annotations")
        if not anns:
            return ()
        text = p._text(p._key(i, j, "text"))
        try:
            spans = annotation_spans(text, anns, ("output", i, "content", j), [])
        except ProtocolError:
            return ()  # the parser reports it when the stream ends
        return tuple(
            c for s, e, c in spans if (s < end and e > start) or (s == e and start <= s <= end)
        )

"""anthropic-messages: `POST /v1/messages` bodies and their event streams.

All text blocks of a message form ONE content channel (their concatenation); each block's
native citations become `Channel.native` spans over that block's range. Thinking blocks and
tool_use inputs are channels of their own.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.context import Trust, anthropic_request_context
from gateway.errors import ProtocolError
from gateway.policy import Policy, Route
from gateway.protocols.base import (
    BLOCKED_TYPE,
    Adapter,
    Framer,
    NativeSpans,
    RequestInfo,
    StreamParser,
    TextDelta,
    blocked_message,
    channel_key,
    field_allowed,
    kept_spans,
    leaks,
    rule_withholds_something,
    split_claims,
    template_text,
)
from gateway.protocols.fields import (
    DROP,
    ByType,
    FieldLog,
    Items,
    Meta,
    Obj,
    Opaque,
    Rule,
    Text,
    clean,
    is_enum,
    is_int,
    is_model,
    is_opaque,
    is_token,
    is_url,
    loads_unique,
    nullable,
    usage_check,
)
from gateway.protocols.relay import relayed_message, relayed_token
from gateway.protocols.slot import StringSlot, learn_slot
from gateway.sse import SSEEvent
from gateway.types import (
    Answer,
    Channel,
    Citation,
    Claim,
    ContextSet,
    Decision,
    NativeLocation,
    Outcome,
    Report,
)

__all__ = ["AnthropicMessages", "AnthropicStreamParser", "text_block_ranges"]

NAME = "anthropic-messages"
Json = dict[str, Any]


# -- the field table (DESIGN §2: every field at every level is decided) ------------------------

_TOKEN = Meta(is_token)
_INT = Meta(is_int)
_NULL_INT = Meta(nullable(is_int))
_STOP_REASON = Meta(
    fallback=None,
    check=nullable(
        is_enum(
            "end_turn",
            "max_tokens",
            "stop_sequence",
            "tool_use",
            "pause_turn",
            "refusal",
            "model_context_window_exceeded",
        )
    )
)
# The stop sequence that matched is one of the client's own; only a token-like one is relayed.
_STOP_SEQUENCE = Meta(nullable(is_token), fallback=None)
_VERIFIED = Opaque("verified against the request's documents")


def _location(**ints: Rule) -> Obj:
    return Obj(
        "citation",
        {
            "type": _TOKEN,
            "cited_text": _VERIFIED,
            "document_index": _INT,
            # Titles are text nobody verifies: never relayed.
            "document_title": DROP,
            "file_id": Meta(nullable(is_token)),
            **ints,
        },
        nullable=False,
    )


_CITATION = ByType(
    "citation",
    {
        "char_location": _location(start_char_index=_INT, end_char_index=_INT),
        "page_location": _location(start_page_number=_INT, end_page_number=_INT),
        "content_block_location": _location(start_block_index=_INT, end_block_index=_INT),
        "search_result_location": Obj(
            "citation",
            {
                "type": _TOKEN,
                "cited_text": _VERIFIED,
                "search_result_index": _INT,
                "source": Meta(lambda v: is_url(v) or is_token(v)),
                "title": DROP,
                "start_block_index": _INT,
                "end_block_index": _INT,
            },
            nullable=False,
        ),
    },
)
_BLOCK = ByType(
    "content_block",
    {
        "text": Obj(
            "content_block",
            {"type": _TOKEN, "text": Text("content"), "citations": Items(_CITATION)},
            nullable=False,
        ),
        "thinking": Obj(
            "content_block",
            {"type": _TOKEN, "thinking": Text("reasoning"), "signature": Meta(is_opaque)},
            nullable=False,
        ),
        "redacted_thinking": Obj(
            "content_block", {"type": _TOKEN, "data": Meta(is_opaque)}, nullable=False
        ),
        "tool_use": Obj(
            "content_block",
            {
                "type": _TOKEN,
                "id": _TOKEN,
                "name": _TOKEN,
                "input": Text("tool_arguments"),
                "caller": Obj("content_block", {"type": _TOKEN, "tool_id": _TOKEN}),
            },
            required=frozenset({"id", "name"}),
            nullable=False,
        ),
    },
)
BODY_TABLE = Obj(
    "top",
    {
        # Fields the SDKs require are replaced, not removed, when their value is dropped.
        "id": Meta(is_token, fallback=""),
        "type": Meta(is_enum("message"), fallback="message"),
        "role": Meta(is_enum("assistant"), fallback="assistant"),
        "model": Meta(is_model, fallback=""),
        "content": Items(_BLOCK),
        "stop_reason": _STOP_REASON,
        "stop_sequence": _STOP_SEQUENCE,
        "usage": Meta(usage_check, fallback={"input_tokens": 0, "output_tokens": 0}),
    },
    nullable=False,
)

# Stream events, checked whole on every event parsed in full. `message_start`'s message, a
# started block, `message_delta`'s fields and a citation are carried into the assembled body
# and decided there by BODY_TABLE; anything else not known here has no place in the body, so
# a stream holding it is re-framed.
_CARRIED = Opaque("carried into the assembled body")
_TYPE = Meta(is_token)
_DELTAS = ByType(
    "delta",
    {
        "text_delta": Obj("delta", {"type": _TYPE, "text": _CARRIED}, nullable=False),
        "citations_delta": Obj("delta", {"type": _TYPE, "citation": _CARRIED}, nullable=False),
        "thinking_delta": Obj("delta", {"type": _TYPE, "thinking": _CARRIED}, nullable=False),
        "signature_delta": Obj(
            "delta", {"type": _TYPE, "signature": Meta(is_opaque)}, nullable=False
        ),
        "input_json_delta": Obj(
            "delta", {"type": _TYPE, "partial_json": _CARRIED}, nullable=False
        ),
    },
)
FRAME_TABLE = ByType(
    "frame",
    {
        "message_start": Obj("frame", {"type": _TYPE, "message": _CARRIED}, nullable=False),
        "content_block_start": Obj(
            "frame", {"type": _TYPE, "index": _INT, "content_block": _CARRIED}, nullable=False
        ),
        "content_block_delta": Obj(
            "frame", {"type": _TYPE, "index": _INT, "delta": _DELTAS}, nullable=False
        ),
        "content_block_stop": Obj("frame", {"type": _TYPE, "index": _INT}, nullable=False),
        "message_delta": Obj(
            "frame",
            {
                "type": _TYPE,
                "delta": Obj("delta", {}, other=_CARRIED),
                "usage": _CARRIED,
            },
            nullable=False,
        ),
        "message_stop": Obj("frame", {"type": _TYPE}, nullable=False),
        "ping": Obj("frame", {"type": _TYPE}, nullable=False),
    },
)
# The event names the protocol defines; an `event:` line must name its data's type.
EVENT_NAMES = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
_CITATION_FIELDS: dict[str, tuple[str | None, str, str]] = {
    "char_location": ("document_index", "start_char_index", "end_char_index"),
    "page_location": ("document_index", "start_page_number", "end_page_number"),
    "content_block_location": ("document_index", "start_block_index", "end_block_index"),
    "search_result_location": (None, "start_block_index", "end_block_index"),
}
CONTENT_PATH: tuple[str | int, ...] = ("content",)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def native_citation(raw: object) -> Citation | None:
    """A text block citation as a Citation; None for kinds the gateway cannot verify."""
    if not isinstance(raw, Mapping):
        raise ProtocolError("anthropic-messages: citation is not an object")
    ctype = raw.get("type")
    if not isinstance(ctype, str):  # a list or an object would not even hash
        raise ProtocolError("anthropic-messages: citation type is not a string")
    if ctype not in _CITATION_FIELDS:
        return None
    doc_key, start_key, end_key = _CITATION_FIELDS[ctype]
    kind: Any = ctype  # one of the keys above: NativeLocation's literal types
    cited = raw.get("cited_text")
    if not isinstance(cited, str):
        raise ProtocolError("anthropic-messages: citation without cited_text")
    if doc_key is None:
        idx = _int(raw.get("search_result_index"))
        loc = NativeLocation(
            type="search_result_location",
            cited_text=cited,
            search_result_index=idx,
            start=_int(raw.get(start_key)),
            end=_int(raw.get(end_key)),
        )
        cid = f"search_result:{idx}"
    else:
        idx = _int(raw.get(doc_key))
        loc = NativeLocation(
            type=kind,
            cited_text=cited,
            document_index=idx,
            start=_int(raw.get(start_key)),
            end=_int(raw.get(end_key)),
        )
        cid = f"document:{idx}"
    return Citation(id=cid, raw=cid, native=loc)


def text_block_ranges(content: Sequence[object]) -> list[tuple[int, int, int]]:
    """(block index, start, end) of every text block in the concatenated content text."""
    out: list[tuple[int, int, int]] = []
    pos = 0
    for bi, block in enumerate(content):
        if isinstance(block, Mapping) and block.get("type") == "text":
            n = len(str(block.get("text", "")))
            out.append((bi, pos, pos + n))
            pos += n
    return out


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping) or body.get("type") != "message":
        raise ProtocolError("anthropic-messages: response body is not a message")
    if not isinstance(body.get("content"), list):
        raise ProtocolError("anthropic-messages: message has no content list")
    raw_content: list[object] = body["content"]  # type: ignore[assignment]
    for bi, block in enumerate(raw_content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise ProtocolError(f"anthropic-messages: content block {bi} has no type")
    log = FieldLog()
    kept: Json = clean(BODY_TABLE, dict(body), log)  # type: ignore[assignment]
    content = kept.get("content")
    if not isinstance(content, list):
        raise ProtocolError("anthropic-messages: message has no content list")
    answer = Answer(protocol=NAME, body=kept)
    answer.unknown_fields.extend(path for _, path in log.unknown)
    answer.dropped.extend(log.dropped)
    usage = kept.get("usage")
    if isinstance(usage, Mapping):
        for src, dst in (("input_tokens", "input"), ("output_tokens", "output")):
            v = _int(usage.get(src))
            if v is not None:
                answer.usage = {**answer.usage, dst: v}
        if "input" in answer.usage and "output" in answer.usage:
            answer.usage = {**answer.usage, "total": answer.usage["input"] + answer.usage["output"]}
    texts: list[str] = []
    native: list[tuple[int, int, Citation]] = []
    pos = 0
    has_text = False
    for bi, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise ProtocolError(f"anthropic-messages: content block {bi} has no type")
        btype = str(block["type"])
        if btype == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise ProtocolError("anthropic-messages: text block without text")
            has_text = True
            cits = block.get("citations")
            if isinstance(cits, list):
                for raw in cits:
                    cit = native_citation(raw)  # None: a kind the table left unknown
                    if cit is not None:
                        native.append((pos, pos + len(text), cit))
            elif cits is not None:
                raise ProtocolError("anthropic-messages: citations is not a list")
            texts.append(text)
            pos += len(text)
        elif btype == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise ProtocolError("anthropic-messages: thinking block without thinking")
            answer.channels.append(Channel("reasoning", ("content", bi, "thinking"), thinking))
        elif btype == "tool_use":
            inp = block.get("input")
            if not isinstance(inp, Mapping):
                raise ProtocolError("anthropic-messages: tool_use block without input object")
            text = json.dumps(inp, ensure_ascii=False)
            answer.channels.append(Channel("tool_arguments", ("content", bi, "input"), text))
    if has_text:
        answer.channels.insert(
            0, Channel("content", CONTENT_PATH, "".join(texts), native=tuple(native))
        )
    return answer


_CONTENT_KEY = channel_key(CONTENT_PATH)
_TEXT_DELTA_KEYS = frozenset({"type", "index", "delta"})
_TEXT_DELTA_DELTA_KEYS = frozenset({"type", "text"})
# Block fields that deltas extend: kept as pieces and joined once, in `body`.
_GROWN = ("text", "thinking", "signature")


def _text_delta(data: object) -> tuple[int, str] | None:
    """(block index, text) of a plain text_delta event: it changes nothing but that text."""
    if type(data) is not dict or data.get("type") != "content_block_delta":
        return None
    delta, idx = data.get("delta"), data.get("index")
    if not data.keys() <= _TEXT_DELTA_KEYS or type(idx) is not int or type(delta) is not dict:
        return None
    if delta.keys() != _TEXT_DELTA_DELTA_KEYS or delta["type"] != "text_delta":
        return None
    text = delta["text"]
    return (idx, text) if type(text) is str else None


_SLOT_NAMES = (None, "content_block_delta")


class AnthropicStreamParser(StreamParser):
    """Assembles message_start / content_block_* / message_delta events into a message."""

    @property
    def native_spans(self) -> NativeSpans:
        from gateway.protocols.anthropic_framer import AnthropicNativeSpans

        return AnthropicNativeSpans()

    def __init__(self) -> None:
        self._message: Json | None = None
        self._blocks: dict[int, Json] = {}
        self._grown: dict[tuple[int, str], list[str]] = {}
        self._json_parts: dict[int, list[str]] = {}
        self._done = False
        self._dropped: list[tuple[str, tuple[str | int, ...]]] = []
        # The last plain text_delta around its text, for the events that repeat it; learnt a
        # few times at most per stream.
        self._slot: StringSlot | None = None
        self._slot_index = 0
        self._slot_tries = 4

    @property
    def done(self) -> bool:
        """The stream's terminal event has been seen: nothing after it can change the answer."""
        return self._done

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if self._done:
            return []
        # The slot's event is a content_block_delta: under any other name it is read in full
        # (and its name judged).
        if self._slot is not None and event.event in _SLOT_NAMES:
            text = self._slot.match(event.data)
            if text is not None:  # the same event as the slot's, but for its text
                self._grow(self._slot_index, "text", text)
                return [(_CONTENT_KEY, text)] if text else []
        try:
            data = loads_unique(event.data, stdlib=True)
        except ProtocolError as exc:
            raise ProtocolError(f"anthropic-messages: stream event: {exc}") from None
        out = self._event(data, event)
        if self._slot_tries:
            known = _text_delta(data)
            if known is not None:
                idx, text = known
                self._slot_tries -= 1
                self._slot = learn_slot(
                    event.data, "text", text, lambda v, p: _text_delta(v) == (idx, p)
                )
                self._slot_index = idx
        return out

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
            self._message = copy.deepcopy(msg)
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

    def _grow(self, idx: int, field: str, text: str) -> None:
        parts = self._grown.get((idx, field))
        if parts is None:
            # The first piece joins the block's own value (a wrong type fails here) and puts
            # the field in its place among the block's keys; `body` sets the whole value.
            block = self._blocks[idx]
            block[field] = block.get(field, "") + text
            self._grown[(idx, field)] = [block[field]]
        else:
            parts.append(text)

    def _index(self, data: Json) -> int:
        idx = data.get("index")
        if not isinstance(idx, int):
            raise ProtocolError("anthropic-messages: content block event without index")
        return idx

    def _block_start(self, data: Json) -> list[TextDelta]:
        idx = self._index(data)
        block = data.get("content_block")
        if not isinstance(block, dict):
            raise ProtocolError("anthropic-messages: content_block_start without block")
        block = copy.deepcopy(block)
        self._blocks[idx] = block
        for field in _GROWN:
            self._grown.pop((idx, field), None)
        if block.get("type") == "tool_use":
            self._json_parts[idx] = []
        text = block.get("text") if block.get("type") == "text" else None
        return [(_CONTENT_KEY, text)] if isinstance(text, str) and text else []

    def _block_delta(self, data: Json) -> list[TextDelta]:
        idx = self._index(data)
        block = self._blocks.get(idx)
        delta = data.get("delta")
        if block is None or not isinstance(delta, dict):
            raise ProtocolError("anthropic-messages: delta for a block that was not started")
        dtype = delta.get("type")
        if dtype == "text_delta":
            text = str(delta.get("text", ""))
            self._grow(idx, "text", text)
            return [(_CONTENT_KEY, text)] if text else []
        if dtype == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))
        elif dtype == "thinking_delta":
            text = str(delta.get("thinking", ""))
            self._grow(idx, "thinking", text)
            return [(channel_key(("content", idx, "thinking")), text)] if text else []
        elif dtype == "signature_delta":
            self._grow(idx, "signature", str(delta.get("signature", "")))
        elif dtype == "input_json_delta":
            part = str(delta.get("partial_json", ""))
            self._json_parts.setdefault(idx, []).append(part)
            return [(channel_key(("content", idx, "input")), part)] if part else []
        return []

    def _block_stop(self, data: Json) -> None:
        idx = self._index(data)
        parts = self._json_parts.pop(idx, None)
        if parts is not None and idx in self._blocks:
            raw = "".join(parts)
            try:
                self._blocks[idx]["input"] = json.loads(raw) if raw else {}
            except ValueError as exc:
                raise ProtocolError("anthropic-messages: tool_use input is not JSON") from exc

    def body(self) -> Json:
        if not self._done or self._message is None:
            raise ProtocolError("anthropic-messages: stream ended without message_stop")
        for (idx, field), parts in self._grown.items():
            self._blocks[idx][field] = "".join(parts)
        msg = copy.deepcopy(self._message)
        msg["content"] = [self._blocks[i] for i in sorted(self._blocks)]
        return msg

    def finish(self) -> Answer:
        answer = parse_body(self.body())
        answer.dropped.extend(self._dropped)
        return answer


def _known_keys(citation: object) -> object:
    """A citation with only the keys the field table knows for its type (a rebuilt block
    carries no unknown field, allow-listed or not)."""
    if not isinstance(citation, dict):
        return citation
    table = _CITATION.types.get(str(citation.get("type")))
    return {k: v for k, v in citation.items() if table is not None and k in table.fields}


class AnthropicMessages(Adapter):
    name = NAME
    primary_channel = channel_key(("content",))
    terminal_event = b'message_stop"'
    retries = True
    field_table = BODY_TABLE
    frame_table = FRAME_TABLE

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        return RequestInfo(stream=body.get("stream") is True, include_usage=True, n=1)

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        anthropic_request_context(body, ctx, trust.pattern, trust)

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        system = request.get("system")
        if isinstance(system, list):
            system.append({"type": "text", "text": instruction})
        elif isinstance(system, str) and system:
            request["system"] = f"{system}\n\n{instruction}"
        else:
            request["system"] = instruction
        return request

    def progressive_framer(self, include_usage: bool) -> Framer:
        from gateway.protocols.anthropic_framer import AnthropicFramer

        return AnthropicFramer(include_usage)

    def stream_parser(self, route: Route) -> AnthropicStreamParser:
        return AnthropicStreamParser()

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        content = answer.body.get("content")
        redacted = isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "redacted_thinking" for b in content
        )
        if redacted and policy.channels.reasoning != "pass":
            return True
        return rule_withholds_something(answer, policy)

    def _drop_set(self, answer: Answer, policy: Policy) -> tuple[set[int], set[tuple[Any, ...]]]:
        """Block indices to drop and per-field paths to delete under the channel rules."""
        blocks: set[int] = set()
        fields: set[tuple[Any, ...]] = set()
        for path in answer.unknown_fields:
            if field_allowed(path, policy):
                continue
            if len(path) == 2:
                blocks.add(int(path[1]))
            else:
                fields.add(tuple(path))
        content = answer.body.get("content")
        for bi, block in enumerate(content if isinstance(content, list) else []):
            btype = block.get("type") if isinstance(block, Mapping) else None
            rule = policy.channels.reasoning
            if (btype == "redacted_thinking" and rule != "pass") or (
                btype == "thinking" and rule == "withhold"
            ):
                blocks.add(bi)
            if btype == "tool_use" and policy.channels.tool_calls == "withhold":
                blocks.add(bi)
        return blocks, fields

    def render(
        self,
        answer: Answer,
        claims: Sequence[Claim],
        outcome: Outcome,
        report: Report,
        policy: Policy,
    ) -> dict[str, object]:
        match outcome.decision:
            case Decision.RELEASED:
                body = self._rebuild(answer, policy, set(), None)
            case Decision.PARTIAL:
                body = self._partial(answer, claims, outcome, policy)
            case Decision.ABSTAINED:
                body = self._template(answer, template_text(outcome, policy, "no_evidence"))
            case Decision.REVIEW:
                body = self._template(answer, template_text(outcome, policy, "review_required"))
            case Decision.BLOCKED:
                return self.error_envelope(
                    policy.release.block_status, blocked_message(outcome), BLOCKED_TYPE
                )
            case _:
                raise ValueError(f"unknown decision {outcome.decision!r}")
        if body.get("stop_reason") == "tool_use" and not any(
            b.get("type") == "tool_use" for b in body["content"]
        ):
            body["stop_reason"] = "end_turn"
        return body

    def _rebuild(
        self,
        answer: Answer,
        policy: Policy,
        extra_drop: set[int],
        text_blocks: list[Json] | None,
    ) -> Json:
        """Copy of the body with dropped blocks / fields; `text_blocks` replaces the text."""
        body: Json = copy.deepcopy(dict(answer.body))
        drop, fields = self._drop_set(answer, policy)
        drop |= extra_drop
        for path in sorted(fields, key=len, reverse=True):
            node: Any = body
            for p in path[:-1]:
                node = node[p]
            if isinstance(node, dict):
                node.pop(path[-1], None)
            elif isinstance(node, list):
                node[path[-1]] = None
        out: list[Json] = []
        placed = False
        for bi, block in enumerate(body["content"]):
            if isinstance(block, dict) and isinstance(block.get("citations"), list):
                block["citations"] = [c for c in block["citations"] if c is not None]
            if bi in drop:
                continue
            if text_blocks is not None and block.get("type") == "text":
                if not placed:
                    out.extend(text_blocks)
                    placed = True
                continue
            out.append(block)
        if text_blocks is not None and not placed:
            out.extend(text_blocks)
        body["content"] = out
        return body

    def _partial(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> Json:
        kept, failed = split_claims(claims, outcome)
        all_failed = [c for cs in failed.values() for c in cs]
        drop: set[int] = set()
        text_blocks: list[Json] | None = None
        disclosure = policy.release.templates.partial
        for idx, channel in enumerate(answer.channels):
            lost = idx in failed or (all_failed and leaks(channel, all_failed))
            if not lost:
                continue
            if channel.kind == "content":
                text_blocks = self._text_blocks(answer, channel, kept.get(idx, []), disclosure)
            else:
                drop.add(int(channel.path[1]))
        return self._rebuild(answer, policy, drop, text_blocks)

    def _text_blocks(
        self, answer: Answer, channel: Channel, kept: Sequence[Claim], disclosure: str
    ) -> list[Json]:
        """Text blocks for the kept claims; a block keeps only citations of kept claims."""
        content = answer.body.get("content")
        ranges = text_block_ranges(content if isinstance(content, list) else [])
        raw_cits: dict[int, list[object]] = {}
        for bi, _, _ in ranges:
            block = content[bi] if isinstance(content, list) else {}
            cits = block.get("citations") if isinstance(block, Mapping) else None
            raw_cits[bi] = list(cits) if isinstance(cits, list) else []
        pieces: list[tuple[str, list[object]]] = []
        by_start = sorted(kept, key=lambda c: c.start)
        prev_item: bool | None = None
        for claim, (start, end, is_item) in zip(
            by_start, kept_spans(channel.text, by_start), strict=True
        ):
            if prev_item is not None:
                pieces.append(("\n" if (is_item or prev_item) else " ", []))
            prev_item = is_item
            own = {c.native for c in claim.citations if c.native is not None}
            for bi, bs, be in ranges:
                s, e = max(bs, start), min(be, end)
                if s >= e:
                    continue
                cits = [
                    _known_keys(c)
                    for c in raw_cits[bi]
                    if (nc := native_citation(c)) is not None and nc.native in own
                ]
                pieces.append((channel.text[s:e], cits))
        pieces.append((("\n\n" if pieces else "") + disclosure, []))
        blocks: list[Json] = []
        for text, cits in pieces:
            if not text:
                continue
            if blocks and not cits and not blocks[-1].get("citations"):
                blocks[-1]["text"] += text
                continue
            new: Json = {"type": "text", "text": text}
            if cits:
                new["citations"] = copy.deepcopy(cits)
            blocks.append(new)
        return blocks

    def _template(self, answer: Answer, text: str) -> Json:
        src = answer.body
        body: Json = {
            "id": src.get("id", ""),
            "type": "message",
            "role": "assistant",
            "model": src.get("model", ""),
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": copy.deepcopy(src.get("usage") or {"input_tokens": 0, "output_tokens": 0}),
        }
        return body

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return {"type": "error", "error": {"type": type_, "message": message}}

    def error_event(self, message: str, type_: str) -> SSEEvent:
        return SSEEvent(data=json.dumps(self.error_envelope(0, message, type_)), event="error")

    def relay_error(self, body: object) -> dict[str, object] | None:
        if not isinstance(body, Mapping) or body.get("type") != "error":
            return None
        error = body.get("error")
        if not isinstance(error, Mapping):
            return None
        message = relayed_message(error.get("message"))
        if message is None:
            return None
        type_ = relayed_token(error.get("type")) or "api_error"
        return {"type": "error", "error": {"type": type_, "message": message}}

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        def ev(data: Json) -> SSEEvent:
            return SSEEvent(data=json.dumps(data, ensure_ascii=False), event=str(data["type"]))

        raw_usage = body.get("usage")
        usage: Json = dict(raw_usage) if isinstance(raw_usage, Mapping) else {}
        start_msg: Json = {k: copy.deepcopy(v) for k, v in body.items() if k != "content"}
        start_msg.update(
            content=[], stop_reason=None, stop_sequence=None, usage={**usage, "output_tokens": 0}
        )
        events = [ev({"type": "message_start", "message": start_msg})]
        content = body.get("content")
        for i, block in enumerate(content if isinstance(content, list) else []):
            btype = block.get("type")
            deltas: list[Json] = []
            if btype == "text":
                start: Json = {"type": "text", "text": ""}
                if "citations" in block:
                    start["citations"] = []
                for cit in block.get("citations") or []:
                    deltas.append({"type": "citations_delta", "citation": cit})
                if block.get("text"):
                    deltas.append({"type": "text_delta", "text": block["text"]})
            elif btype == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
                if block.get("thinking"):
                    deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
                if block.get("signature"):
                    deltas.append({"type": "signature_delta", "signature": block["signature"]})
            elif btype == "tool_use":
                start = {k: v for k, v in block.items() if k != "input"}
                start["input"] = {}
                deltas.append(
                    {
                        "type": "input_json_delta",
                        "partial_json": json.dumps(block.get("input", {}), ensure_ascii=False),
                    }
                )
            else:
                start = copy.deepcopy(block)
            events.append(ev({"type": "content_block_start", "index": i, "content_block": start}))
            for d in deltas:
                events.append(ev({"type": "content_block_delta", "index": i, "delta": d}))
            events.append(ev({"type": "content_block_stop", "index": i}))
        events.append(
            ev(
                {
                    "type": "message_delta",
                    "delta": {
                        "stop_reason": body.get("stop_reason"),
                        "stop_sequence": body.get("stop_sequence"),
                    },
                    "usage": {"output_tokens": usage.get("output_tokens", 0)},
                }
            )
        )
        events.append(ev({"type": "message_stop"}))
        return events

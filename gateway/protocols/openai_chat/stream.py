"""`chat.completion.chunk` frames assembled into the body the JSON API would have sent,
sans-io: `feed(event) -> text deltas`, `finish() -> Answer` (through `parse_body`).

Each frame is parsed once (`loads_unique`) and checked whole against `FRAME_TABLE`. Pieces of
a text are kept in lists and joined once at the end, so assembly is linear in the stream.
Mistral reference chunks of the primary text are native citations at their offsets
(`native_spans`); Perplexity search results join the context as they arrive (`bind_context`),
on numeric routes only, and leave it again when a reference chunk shows the answer is Mistral's
(its references cite the request's chunks, never "the N-th result": `_saw_reference`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gateway.errors import ProtocolError
from gateway.policy import ContextSpec
from gateway.protocols.base import StreamParser, TextDelta, channel_key
from gateway.protocols.fields import FieldLog, clean, is_index, loads_unique, usage_check
from gateway.protocols.openai_chat.chunks import (
    anchor_of,
    assembled_chunks,
    native_span,
    reference_citations,
)
from gateway.protocols.openai_chat.context import numeric_route, search_chunks
from gateway.protocols.openai_chat.fields import FRAME_TABLE, REASONING_KEYS, SEARCH_KEYS
from gateway.protocols.openai_chat.parse import parse_body
from gateway.sse import SSEEvent
from gateway.types import Answer, Chunk, Citation, ContextSet

__all__ = ["OpenAIStreamParser"]

Json = dict[str, Any]

_HEAD_KEYS = ("id", "created", "model", "system_fingerprint", "service_tier")
_TEXT_KEYS = frozenset({"content", "refusal", *REASONING_KEYS})
_CHOICE_CHUNK_KEYS = frozenset({"index", "delta", "finish_reason", "logprobs"})
# A Mistral text chunk is only its text in the body; a continued thinking chunk, its parts.
_TEXT_CHUNK_KEYS = frozenset({"type", "text"})
_THINKING_MERGED = frozenset({"type", "thinking"})


def _channel_keys(i: int) -> dict[str, str]:
    """Channel keys of choice `i`'s text fields, by delta field."""
    mpath = ("choices", i, "message")
    keys = {k: channel_key((*mpath, k)) for k in _TEXT_KEYS}
    keys["function_call"] = channel_key((*mpath, "function_call", "arguments"))
    keys["audio"] = channel_key((*mpath, "audio", "transcript"))
    return keys


class _ChoiceState:
    """One choice being assembled, with its channel keys built once."""

    __slots__ = (
        "chunks", "details", "extra", "finish", "keys", "logprobs", "msg", "parts", "seen",
        "tools",
    )

    def __init__(self, i: int) -> None:
        self.msg: Json = {}
        self.parts: dict[str, list[str]] = {}
        self.tools: dict[int, Json] = {}
        self.finish: object = None
        self.logprobs: dict[str, list[Any]] | None = None
        self.extra: Json = {}
        self.keys = _channel_keys(int(i))
        # Mistral content chunks other than text, each at its offset in the content text;
        # None while the content arrives as plain strings.
        self.chunks: list[tuple[int, Json]] | None = None
        self.seen = (0, 0)  # (content parts counted, their length): the offset, kept current
        # OpenRouter reasoning_details, merged by their `index`.
        self.details: list[Any] | None = None

    def content_length(self) -> int:
        parts = self.parts.get("content", [])
        n, length = self.seen
        if n != len(parts):
            length += sum(len(p) for p in parts[n:])
            self.seen = (len(parts), length)
        return length


class OpenAIStreamParser(StreamParser):
    """Assembles `chat.completion.chunk` events into the body the JSON API would have sent."""

    def __init__(self) -> None:
        self._head: Json = {}
        self._head_missing: tuple[str, ...] = _HEAD_KEYS
        self._choices: dict[int, _ChoiceState] = {}
        self._usage: object = None
        self._done = False
        self._dropped: list[tuple[str, tuple[str | int, ...]]] = []
        # Perplexity's top-level lists, as first sent (a frame may re-send them accumulated).
        self._search: Json = {}
        self._ctx: ContextSet | None = None
        self.context_grew_late = False
        # Each id a search result took in `_ctx`: (what the context had there before, the
        # result's chunk), so the results can leave it again (`_saw_reference`).
        self._placed: dict[str, tuple[Chunk | None, Chunk]] = {}
        self._references = False  # a Mistral reference chunk was seen, in any choice

    def bind_context(self, ctx: ContextSet, spec: ContextSpec) -> None:
        """Perplexity search results that arrive in the stream join `ctx` as they come (on
        routes whose context comes from the response and whose markers are numeric), before
        the claims that cite them."""
        if "response" in getattr(spec, "from_", ()) and numeric_route():
            self._ctx = ctx

    @property
    def native_spans(self) -> _ChunkSpans:
        return _ChunkSpans(self)

    def primary_citations(self, start: int, end: int) -> tuple[Citation, ...]:
        """Mistral reference chunks of choice 0 seen so far, as `_native_for` would give them
        for the claim at [start, end) of the content text."""
        st = self._choices.get(0)
        if st is None or not st.chunks:
            return ()
        text = "".join(st.parts.get("content", []))
        out: list[Citation] = []
        for offset, chunk in st.chunks:
            if chunk.get("type") != "reference":
                continue
            for s, e, c in native_span(anchor_of(text, offset), reference_citations(chunk)):
                if (s < end and e > start) or (s == e and start <= s <= end):
                    out.append(c)
        return tuple(out)

    def _search_lists(self, chunk: Json) -> None:
        """Keep a frame's `citations` / `search_results`: the first copy, or a later one that
        extends it (re-sent accumulated); a copy that changes an entry is not relayed."""
        for key in SEARCH_KEYS:
            if key not in chunk:
                continue
            value, have = chunk[key], self._search.get(key)
            if have is None:
                self._search[key] = value
            elif value == have:
                continue
            elif (
                isinstance(value, list) and isinstance(have, list)
                and len(value) > len(have) and value[: len(have)] == have
            ):
                self._search[key] = value
            else:
                self._dropped.append(("frame", (key,)))
                continue
            if self._ctx is not None and not self._references and self._add_results(self._ctx):
                st = self._choices.get(0)
                if st is not None and st.content_length():
                    # Claims checked before this context arrived are checked again at the end
                    # (buffer mode; in progressive mode they have been decided already).
                    self.context_grew_late = True

    def _add_results(self, ctx: ContextSet) -> bool:
        """The search results into `ctx` (an id already there keeps its chunk, as `add`
        does); whether any took an id, each remembered with what it replaced."""
        placed = False
        for c in search_chunks(self._search):
            prev = ctx.chunks.get(c.id)
            ctx.add(c)
            if ctx.chunks.get(c.id) is c:
                first = self._placed.get(c.id)
                self._placed[c.id] = (prev if first is None else first[0], c)
                placed = True
        return placed

    def _saw_reference(self) -> None:
        """A Mistral reference chunk: the answer cites the request's chunks natively, so search
        results are no context of it (a reference id must never resolve to "the N-th result").
        Those already in the context leave it before any claim can carry the reference, and
        claims checked against them are checked again at the end (buffer mode)."""
        self._references = True
        ctx = self._ctx
        if ctx is None or not self._placed:
            return
        for cid, (prev, mine) in self._placed.items():
            if ctx.chunks.get(cid) is mine:
                if prev is None:
                    del ctx.chunks[cid]
                else:
                    ctx.chunks[cid] = prev
        self._placed.clear()
        self.context_grew_late = True

    @property
    def done(self) -> bool:
        """The stream's terminal event has been seen: nothing after it can change the answer."""
        return self._done

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if self._done:
            return []
        if event.event is not None:
            if event.event == "error":
                raise ProtocolError("openai-chat: the stream carried an error event")
            # The protocol names no events: an `event:` line is not relayed, the [DONE]
            # event's included (the body holds nothing of it).
            self._dropped.append(("sse", ("event",)))
        data = event.data
        # A JSON object starts with "{" (after any whitespace); only other data can be [DONE].
        if not data.startswith("{") and data.strip() == "[DONE]":
            self._done = True
            return []
        try:
            chunk = loads_unique(data, stdlib=True)
        except ProtocolError as exc:
            raise ProtocolError(f"openai-chat: stream event: {exc}") from None
        return self._chunk(chunk)

    def _chunk(self, chunk: object) -> list[TextDelta]:
        if not isinstance(chunk, dict):
            raise ProtocolError("openai-chat: stream event is not a JSON object")
        if "error" in chunk:
            raise ProtocolError("openai-chat: the stream carried an error")
        obj = chunk.get("object")
        if obj is not None and obj != "chat.completion.chunk":
            raise ProtocolError("openai-chat: a stream event is not a chat.completion.chunk")
        log = FieldLog()
        clean(FRAME_TABLE, chunk, log)
        if log.unknown or log.dropped:
            self._dropped.extend(log.unknown)
            self._dropped.extend(log.dropped)
        head = self._head
        for k in _HEAD_KEYS:
            # A frame repeats the head; one that says something else is not relayed.
            if k in chunk and k in head and chunk[k] != head[k]:
                self._dropped.append(("frame", (k,)))
        if self._head_missing:
            found = [k for k in self._head_missing if k in chunk]
            if found:
                for k in found:
                    self._head[k] = chunk[k]
                self._head_missing = tuple(k for k in _HEAD_KEYS if k not in self._head)
        usage = chunk.get("usage")
        if usage is not None and usage_check(usage):
            # Every frame's usage is decided by FRAME_TABLE (one of the wrong shape is
            # dropped there, and the stream re-framed); the body keeps the last good one.
            self._usage = usage
        if "citations" in chunk or "search_results" in chunk:
            self._search_lists(chunk)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise ProtocolError("openai-chat: stream chunk has no choices list")
        if len(choices) == 1:  # the usual chunk: no list to merge
            c = choices[0]
            if not isinstance(c, dict) or not is_index(c.get("index")):
                raise ProtocolError("openai-chat: stream choice without an integer index")
            return self._choice(c)
        out: list[TextDelta] = []
        for c in choices:
            if not isinstance(c, dict) or not is_index(c.get("index")):
                raise ProtocolError("openai-chat: stream choice without an integer index")
            out.extend(self._choice(c))
        return out

    def _choice(self, c: Json) -> list[TextDelta]:
        i: int = c["index"]
        st = self._choices.get(i)
        if st is None:
            st = self._choices[i] = _ChoiceState(i)
        keys = st.keys
        out: list[TextDelta] = []
        finish = c.get("finish_reason")
        if finish is not None:
            st.finish = finish
        lp = c.get("logprobs")
        if lp is not None:
            self._logprobs(st, i, lp)
        if len(c) > 4 or not c.keys() <= _CHOICE_CHUNK_KEYS:
            self._extra(st, i, c)
        delta = c.get("delta") or {}
        if not isinstance(delta, dict):
            raise ProtocolError("openai-chat: stream delta is not an object")
        parts = st.parts
        for key, value in delta.items():
            if value is None:
                continue
            if key == "content" and isinstance(value, list):
                out.extend(self._content_chunks(st, i, keys, value))
                if not self._references and any(
                    isinstance(c, dict) and c.get("type") == "reference" for c in value
                ):
                    self._saw_reference()
            elif key == "reasoning_details" and isinstance(value, list):
                if not _merge_details(st, value):
                    self._dropped.append(("delta", ("choices", i, "delta", key)))
            elif key in _TEXT_KEYS and isinstance(value, str):
                if key in parts:
                    parts[key].append(value)
                else:
                    parts[key] = [value]
                if value:
                    out.append((keys[key], value))
            elif key == "role":
                st.msg["role"] = value
            elif key == "tool_calls":
                if not isinstance(value, list):
                    raise ProtocolError("openai-chat: a delta's tool_calls is not a list")
                for tc in value:
                    out.extend(self._tool_delta(st, i, tc))
            elif key == "function_call":
                if not isinstance(value, dict):
                    raise ProtocolError("openai-chat: a delta's function_call is not an object")
                name, args = _strings(value, "function_call")
                # Pieces are kept in lists and joined once in body(): `+=` on a string held
                # in a dict copies it every time, quadratic in the arguments' length.
                fc = st.msg.setdefault("function_call", {"name": [], "arguments": []})
                fc["name"].append(name)
                fc["arguments"].append(args)
                if args:
                    out.append((keys["function_call"], args))
            elif key == "audio":
                if not isinstance(value, dict):
                    raise ProtocolError("openai-chat: a delta's audio is not an object")
                audio = st.msg.setdefault("audio", {})
                for ak, av in value.items():
                    if ak in ("transcript", "data") and av is not None:
                        # Pieces of one string, joined in body(): nothing else can be one.
                        if not isinstance(av, str):
                            raise ProtocolError(f"openai-chat: a delta's audio {ak} is not text")
                        audio.setdefault(ak, []).append(av)
                        if ak == "transcript" and av:
                            out.append((keys["audio"], av))
                    else:
                        self._keep(audio, ak, av, ("choices", i, "delta", "audio", ak))
            elif key == "annotations":
                if not isinstance(value, list):
                    raise ProtocolError("openai-chat: a delta's annotations is not a list")
                st.msg.setdefault("annotations", []).extend(value)
            else:
                self._keep(st.msg, key, value, ("choices", i, "delta", key))
        return out

    def _keep(self, into: Json, key: str, value: object, path: tuple[str | int, ...]) -> None:
        """A value the assembled body holds one of: a later frame that says something else
        overwrites the earlier copy, which the body then never shows, so the stream is not
        relayed as the upstream's bytes."""
        if key in into and into[key] != value:
            self._dropped.append(("frame", path))
        into[key] = value

    def _logprobs(self, st: _ChoiceState, i: int, lp: object) -> None:
        """A frame's logprobs: lists of token entries, appended (decided on the assembled
        lists by `channels.logprobs`). Any other value is no part of the body, so the stream
        is re-framed without it."""
        if not isinstance(lp, dict):
            self._dropped.append(("choice", ("choices", i, "logprobs")))
            return
        acc = st.logprobs = st.logprobs or {}
        for k, v in lp.items():
            if isinstance(v, list):
                acc.setdefault(k, []).extend(v)
            elif v is not None:
                self._dropped.append(("choice", ("choices", i, "logprobs", k)))

    def _extra(self, st: _ChoiceState, i: int, c: Json) -> None:
        """Choice keys beyond the chunk's own, carried into the assembled choice (decided by
        BODY_TABLE there). A frame's `message` is not carried: the message is the deltas'
        (FRAME_TABLE drops it)."""
        for k, v in c.items():
            if k not in _CHOICE_CHUNK_KEYS and k != "message":
                self._keep(st.extra, k, v, ("choices", i, k))

    def _content_chunks(
        self, st: _ChoiceState, i: int, keys: Mapping[str, str], value: list[Any]
    ) -> list[TextDelta]:
        """A delta whose content is a list of Mistral chunks: text extends the content text;
        references and thinking are recorded at their offset in it. A text chunk becomes
        just its text, so any other key it has is not in the body: recorded as dropped (the
        stream is re-framed)."""
        out: list[TextDelta] = []
        if st.chunks is None:
            st.chunks = []
        parts = st.parts.setdefault("content", [])
        for n, chunk in enumerate(value):
            if not isinstance(chunk, dict):
                raise ProtocolError("openai-chat: a content chunk is not an object")
            kind = chunk.get("type")
            if kind == "text" and isinstance(chunk.get("text"), str):
                if len(chunk) != 2:  # more than its type and text
                    for k in chunk.keys() - _TEXT_CHUNK_KEYS:
                        self._dropped.append(
                            ("content_chunk", ("choices", i, "delta", "content", n, k))
                        )
                parts.append(chunk["text"])
                if chunk["text"]:
                    out.append((keys["content"], chunk["text"]))
                continue
            offset = st.content_length()
            last = st.chunks[-1] if st.chunks else None
            if (
                kind == "thinking"
                and last is not None
                and last[0] == offset
                and last[1].get("type") == "thinking"
                and isinstance(last[1].get("thinking"), list)
                and isinstance(chunk.get("thinking"), list)
            ):
                self._continue_thinking(last[1], chunk, ("choices", i, "delta", "content", n))
            else:
                st.chunks.append((offset, copy.deepcopy(chunk)))
        return out

    def _continue_thinking(self, merged: Json, chunk: Json, path: tuple[str | int, ...]) -> None:
        """The same thinking, continued: its parts join the chunk's. Any other key it has
        joins the chunk too (decided there by BODY_TABLE), unless the chunk already says
        something else for it: that value the body never shows, so it is recorded as
        dropped."""
        merged["thinking"].extend(chunk["thinking"])
        if len(chunk) == 2:  # type and thinking: the usual piece
            return
        for k, v in chunk.items():
            if k in _THINKING_MERGED:
                continue
            if k not in merged:
                merged[k] = copy.deepcopy(v)
            elif merged[k] != v:
                self._dropped.append(("content_chunk", (*path, k)))

    def _tool_delta(self, st: _ChoiceState, i: int, tc: object) -> list[TextDelta]:
        if not isinstance(tc, dict) or not is_index(tc.get("index")):
            raise ProtocolError("openai-chat: tool call delta without an integer index")
        fn = tc.get("function")
        if fn is None:
            fn = {}
        elif not isinstance(fn, dict):
            raise ProtocolError("openai-chat: a tool call delta's function is not an object")
        name, args = _strings(fn, "tool call")
        call = st.tools.get(tc["index"])
        if call is None:
            call = st.tools[tc["index"]] = {
                "id": tc.get("id") or None,
                "type": tc.get("type") or None,  # "function" unless a delta says (body())
                "function": {"name": [], "arguments": []},
            }
        else:
            for k in ("id", "type"):
                v = tc.get(k)
                if v and v != call[k]:
                    if call[k] is not None:
                        # Another id or type for the same call: the body keeps the last one.
                        at = ("choices", i, "delta", "tool_calls", tc["index"], k)
                        self._dropped.append(("tool_call", at))
                    call[k] = v
        call["function"]["name"].append(name)
        call["function"]["arguments"].append(args)
        if not args:
            return []
        path = ("choices", i, "message", "tool_calls", tc["index"], "function", "arguments")
        return [(channel_key(path), args)]

    def body(self) -> Json:
        if not self._done:
            raise ProtocolError("openai-chat: stream ended without data: [DONE]")
        body: Json = {
            "id": self._head.get("id", ""),
            "object": "chat.completion",
            "created": self._head.get("created", 0),
            "model": self._head.get("model", ""),
            "choices": [],
        }
        for k in ("system_fingerprint", "service_tier"):
            if k in self._head:
                body[k] = self._head[k]
        for i in sorted(self._choices):
            st = self._choices[i]
            msg: Json = {"role": st.msg.pop("role", "assistant")}
            for key in ("content", "refusal"):
                # The opening role frame carries content ""; with nothing after it the
                # non-streaming API would have sent null.
                msg[key] = "".join(st.parts.get(key, [])) or None
            if st.chunks is not None:
                msg["content"] = assembled_chunks("".join(st.parts.get("content", [])), st.chunks)
            for key in REASONING_KEYS:
                if key in st.parts:
                    msg[key] = "".join(st.parts[key])
            if st.details is not None:
                msg["reasoning_details"] = _joined_details(st.details)
            if st.tools:
                msg["tool_calls"] = [_joined_call(st.tools[k]) for k in sorted(st.tools)]
            msg.update(st.msg)
            if "function_call" in msg:
                msg["function_call"] = _joined(msg["function_call"], ("name", "arguments"))
            if isinstance(msg.get("audio"), dict):
                msg["audio"] = _joined(msg["audio"], ("transcript", "data"))
            choice: Json = {
                "index": i,
                "message": msg,
                "finish_reason": st.finish,
                "logprobs": st.logprobs,
            }
            choice.update(st.extra)
            body["choices"].append(choice)
        if self._usage is not None:
            body["usage"] = self._usage
        body.update(self._search)
        return body

    def finish(self) -> Answer:
        answer = parse_body(self.body())
        answer.dropped.extend(self._dropped)
        return answer


class _ChunkSpans:
    """Native citations of a stream's primary text (Mistral reference chunks), read from the
    parser, which records them at their exact offsets as it is fed."""

    def __init__(self, parser: OpenAIStreamParser) -> None:
        self._parser = parser

    def overlapping(self, start: int, end: int, length: int) -> tuple[Citation, ...]:
        return self._parser.primary_citations(start, end)


_DETAIL_STRINGS = ("text", "summary", "data", "signature")


def _merge_details(st: _ChoiceState, entries: list[Any]) -> bool:
    """OpenRouter streams reasoning_details in pieces: an entry with the `index` and `type` of
    the last one continues it (its strings appended, joined in `body()`), any other is a new
    entry. Strings are kept as lists of pieces meanwhile. False when an entry said something
    the merged entry does not keep: another value for a key it has, or a value that is not a
    string where a string belongs (kept as None, so the body never shows it)."""
    details = st.details = st.details if st.details is not None else []
    merged = True
    for e in entries:
        if not isinstance(e, dict):
            details.append(e)
            continue
        last = details[-1] if details else None
        idx = e.get("index")
        if not (
            isinstance(last, dict) and type(idx) is int
            and last.get("index") == idx and last.get("type") == e.get("type")
        ):
            entry: Json = {}
            for k, v in e.items():
                entry[k], whole = _piece(k, v)
                merged = merged and whole
            details.append(entry)
            continue
        for k, v in e.items():
            have = last.get(k)
            if k in _DETAIL_STRINGS and isinstance(v, str) and isinstance(have, list):
                have.append(v)
            elif have is None:
                last[k], whole = _piece(k, v)
                merged = merged and whole
            elif v is not None and have != v:
                merged = False
    return merged


def _piece(key: str, value: object) -> tuple[object, bool]:
    """A streamed detail's value as kept while merging, and whether that is all of it: strings
    of `_DETAIL_STRINGS` as a list of pieces; any other value there is not a string, so it is
    not relayed (None: all of it only when it was null)."""
    if key not in _DETAIL_STRINGS:
        return value, True
    if isinstance(value, str):
        return [value], True
    return None, value is None


def _strings(fn: Json, where: str) -> tuple[str, str]:
    """A function delta's name and arguments pieces ("" when null or absent). Anything else
    is no piece of a string: the answer is malformed, not something to coerce."""
    name, args = fn.get("name"), fn.get("arguments")
    if not (name is None or isinstance(name, str)) or not (args is None or isinstance(args, str)):
        raise ProtocolError(f"openai-chat: a {where} delta's name or arguments is not a string")
    return name or "", args or ""


def _joined_details(details: list[Any]) -> list[Any]:
    return [_joined(d, _DETAIL_STRINGS) if isinstance(d, dict) else d for d in details]

def _joined(parts: Json, keys: tuple[str, ...]) -> Json:
    """A copy of `parts` with the pieces under `keys` joined into strings."""
    return {k: "".join(v) if k in keys and isinstance(v, list) else v for k, v in parts.items()}


def _joined_call(call: Json) -> Json:
    return {
        **call,
        "type": call["type"] or "function",
        "function": _joined(call["function"], ("name", "arguments")),
    }


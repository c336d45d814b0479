"""openai-chat: `POST /v1/chat/completions` bodies and `chat.completion.chunk` streams.

Channels per choice: content, refusal, tool call / legacy function call arguments,
reasoning_content / reasoning, audio transcript. Annotations and logprobs are carried along
and rewritten or dropped with the text they describe.

OpenAI-compatible dialects (docs/protocols.md, "OpenAI-compatible dialects"): OpenRouter
`reasoning_details[]` (text-bearing entries are the reasoning channel, encrypted ones opaque),
Perplexity top-level `citations[]` / `search_results[]` (response-side context for `[N]`
markers: `response_context`), Mistral `message.content` as a list of chunks (`text` chunks are
the content channel, `reference` chunks native citations of the text before them, `thinking`
chunks reasoning).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.context import Trust, openai_request_context
from gateway.errors import ProtocolError
from gateway.policy import ContextSpec, Policy, Route
from gateway.protocols.base import (
    BLOCKED_TYPE,
    Adapter,
    Framer,
    RequestInfo,
    StreamParser,
    TextDelta,
    blocked_message,
    channel_key,
    field_allowed,
    leaks,
    rebuild_with_map,
    rule_withholds_something,
    split_claims,
    template_text,
)
from gateway.protocols.fields import (
    Blank,
    ByType,
    FieldLog,
    Items,
    Key,
    Meta,
    Obj,
    Opaque,
    Path,
    Positional,
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
    verified_token_logprobs,
)
from gateway.protocols.relay import relayed_code, relayed_fields, relayed_message, relayed_token
from gateway.protocols.slot import StringSlot, learn_slot
from gateway.sse import SSEEvent
from gateway.types import (
    Answer,
    Channel,
    Chunk,
    Citation,
    Claim,
    ContextSet,
    Decision,
    Outcome,
    Report,
)

__all__ = ["OpenAIChat", "OpenAIStreamParser"]

NAME = "openai-chat"

# -- the field table (DESIGN §2: every field at every level is decided) ------------------------

_FINISH = nullable(is_enum("stop", "length", "tool_calls", "content_filter", "function_call"))
_TOKEN = Meta(is_token)
_NULL_TOKEN = Meta(nullable(is_token))
_INT = Meta(is_int)
_ASSISTANT = Meta(nullable(is_enum("assistant")))
_USAGE = Meta(nullable(usage_check))
_LOGPROBS = Opaque("logprobs")  # decided by `channels.logprobs` (`_logprobs`)

_ANNOTATION = ByType(
    "annotation",
    {
        "url_citation": Obj(
            "annotation",
            {
                "type": Meta(is_enum("url_citation")),
                "url_citation": Obj(
                    "annotation",
                    {
                        "start_index": _INT,
                        "end_index": _INT,
                        "url": Meta(is_url),
                        # Titles are upstream prose nobody verifies: never relayed (the
                        # SDKs require the key, so it stays, empty).
                        "title": Blank(""),
                    },
                    required=frozenset({"start_index", "end_index", "url"}),
                    nullable=False,
                ),
            },
            required=frozenset({"url_citation"}),
        )
    },
)
_FUNCTION = Obj(
    "tool_call",
    {"name": _TOKEN, "arguments": Text("tool_arguments")},
    required=frozenset({"name"}),
    nullable=False,
)
_CUSTOM = Obj(
    "tool_call",
    {"name": _TOKEN, "input": Text("tool_arguments")},
    required=frozenset({"name"}),
    nullable=False,
)
_TOOL_CALL = Obj(
    "tool_call",
    {
        "id": _TOKEN,
        "type": Meta(is_enum("function", "custom")),
        "function": _FUNCTION,
        "custom": _CUSTOM,
    },
    required=frozenset({"id"}),
    vital=frozenset({"type", "function", "custom"}),
    nullable=False,
)
# OpenRouter `reasoning_details[]`: readable entries are the reasoning channel; an encrypted
# entry is opaque (kept when its data has the shape of a blob, like a thinking signature).
_DETAIL_HEAD: dict[str, Rule] = {
    "id": _NULL_TOKEN,
    "format": _NULL_TOKEN,
    "index": _INT,
}
_REASONING_DETAIL = ByType(
    "reasoning_detail",
    {
        "reasoning.text": Obj(
            "reasoning_detail",
            {
                **_DETAIL_HEAD,
                "type": Meta(is_enum("reasoning.text")),
                "text": Text("reasoning", strings_only=True),
                "signature": Meta(nullable(is_opaque)),
            },
            nullable=False,
        ),
        "reasoning.summary": Obj(
            "reasoning_detail",
            {
                **_DETAIL_HEAD,
                "type": Meta(is_enum("reasoning.summary")),
                "summary": Text("reasoning", strings_only=True),
            },
            nullable=False,
        ),
        "reasoning.encrypted": Obj(
            "reasoning_detail",
            {**_DETAIL_HEAD, "type": Meta(is_enum("reasoning.encrypted")), "data": Meta(is_opaque)},
            required=frozenset({"data"}),
            nullable=False,
        ),
    },
)
_DETAIL_TEXT = {"reasoning.text": "text", "reasoning.summary": "summary"}


def _reference_ids(v: object) -> bool:
    """Mistral `reference_ids`: a non-empty list of small non-negative ints (or id tokens)."""
    return (
        type(v) is list
        and 0 < len(v) <= 64
        and all((type(x) is int and 0 <= x < 10**9) or is_token(x) for x in v)
    )


# Mistral content chunks: `message.content` may be a list of these instead of a string.
_THINKING_PART = ByType(
    "content_chunk",
    {
        "text": Obj(
            "content_chunk",
            {"type": Meta(is_enum("text")), "text": Text("reasoning", strings_only=True)},
            required=frozenset({"text"}),
            nullable=False,
        )
    },
)
_CONTENT_CHUNK = ByType(
    "content_chunk",
    {
        "text": Obj(
            "content_chunk",
            {"type": Meta(is_enum("text")), "text": Text("content", strings_only=True)},
            required=frozenset({"text"}),
            nullable=False,
        ),
        "reference": Obj(
            "content_chunk",
            {"type": Meta(is_enum("reference")), "reference_ids": Meta(_reference_ids)},
            required=frozenset({"reference_ids"}),
            nullable=False,
        ),
        "thinking": Obj(
            "content_chunk",
            {
                "type": Meta(is_enum("thinking")),
                "thinking": Items(_THINKING_PART),
                "closed": Meta(lambda v: type(v) is bool),
            },
            required=frozenset({"thinking"}),
            nullable=False,
        ),
    },
)
_CONTENT_CHUNKS = Items(_CONTENT_CHUNK)


class _Content(Rule):
    """`message.content`: a string (or null), or a list of Mistral content chunks."""

    __slots__ = ()

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        if type(value) is list:
            return _CONTENT_CHUNKS.walk(value, path, key, log, level)
        return value


def _is_date(v: object) -> bool:
    return type(v) is str and _DATE.fullmatch(v) is not None


_DATE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
)

# Perplexity: `citations` is a list of URLs, `search_results` the results behind them, in the
# same order (`[N]` cites the N-th). Their positions matter: a list with a bad entry is dropped
# whole. URLs and dates are metadata; titles and snippets are not verified text, so they are
# unknown fields (dropped unless `channels.allow_fields` names them).
_CITATION_URLS = Meta(lambda v: type(v) is list and len(v) <= 1024 and all(is_url(x) for x in v))
_SEARCH_RESULTS = Positional(
    Items(
        Obj(
            "search_result",
            {
                "url": Meta(is_url),
                "date": Meta(nullable(_is_date)),
                "last_updated": Meta(nullable(_is_date)),
            },
            nullable=False,
        )
    )
)
_AUDIO = Obj(
    "audio",
    {"id": _TOKEN, "data": Meta(is_opaque), "expires_at": _INT, "transcript": Text("transcript")},
    required=frozenset({"id"}),
)
_MESSAGE_TABLE = Obj(
    "message",
    {
        "role": Meta(is_enum("assistant"), fallback="assistant"),
        "content": _Content(),
        "refusal": Text("refusal"),
        "reasoning_content": Text("reasoning", strings_only=True),
        "reasoning": Text("reasoning", strings_only=True),
        "reasoning_details": Items(_REASONING_DETAIL),
        "tool_calls": Items(_TOOL_CALL),
        "function_call": Obj(
            "tool_call", {"name": _TOKEN, "arguments": Text("tool_arguments")},
            required=frozenset({"name"}),
        ),
        "annotations": Items(_ANNOTATION),
        "audio": _AUDIO,
    },
    nullable=False,
)
_CHOICE_TABLE = Obj(
    "choice",
    {
        "index": _INT,
        "message": _MESSAGE_TABLE,
        "finish_reason": Meta(_FINISH, fallback="stop"),
        "logprobs": _LOGPROBS,
    },
    required=frozenset({"message"}),
    nullable=False,
)
BODY_TABLE = Obj(
    "top",
    {
        # Fields the SDKs require are replaced, not removed, when their value is dropped.
        "id": Meta(is_token, fallback=""),
        "object": Meta(is_enum("chat.completion"), fallback="chat.completion"),
        "created": Meta(is_int, fallback=0),
        "model": Meta(is_model, fallback=""),
        "choices": Items(_CHOICE_TABLE),
        "usage": _USAGE,
        "system_fingerprint": _NULL_TOKEN,
        "service_tier": _NULL_TOKEN,
        "citations": _CITATION_URLS,
        "search_results": _SEARCH_RESULTS,
    },
    nullable=False,
)

# A stream frame: checked whole on every frame parsed in full. Keys a frame carries into the
# assembled body (`_CARRIED`) are decided there, by BODY_TABLE; anything else not known here
# has no place in the body, so a stream holding it is re-framed.
_CARRIED = Opaque("carried into the assembled body")
_TOOL_DELTA = Obj(
    "tool_call",
    {
        "index": _INT,
        "id": _NULL_TOKEN,
        "type": Meta(nullable(is_enum("function", "custom"))),
        "function": Obj(
            "tool_call",
            {"name": Meta(lambda v: v is None or v == "" or is_token(v)), "arguments": _CARRIED},
        ),
    },
    required=frozenset({"index"}),
    nullable=False,
)
_DELTA_TABLE = Obj(
    "delta",
    {
        "role": _ASSISTANT,
        "tool_calls": Items(_TOOL_DELTA),
        "function_call": Obj(
            "tool_call",
            {"name": Meta(lambda v: v is None or v == "" or is_token(v)), "arguments": _CARRIED},
        ),
    },
    other=_CARRIED,
)
FRAME_TABLE = Obj(
    "frame",
    {
        "id": _TOKEN,
        "object": Meta(is_enum("chat.completion.chunk")),
        "created": _INT,
        "model": Meta(is_model),
        "system_fingerprint": _NULL_TOKEN,
        "service_tier": _NULL_TOKEN,
        "obfuscation": Meta(is_opaque),
        "usage": _CARRIED,
        "citations": _CARRIED,
        "search_results": _CARRIED,
        "choices": Items(
            Obj(
                "choice",
                {"index": _INT, "delta": _DELTA_TABLE, "finish_reason": Meta(_FINISH)},
                other=_CARRIED,
                nullable=False,
            )
        ),
    },
    nullable=False,
)

_MESSAGE_KEYS = frozenset(
    {
        "role",
        "content",
        "refusal",
        "tool_calls",
        "function_call",
        "annotations",
        "audio",
        "reasoning_content",
        "reasoning",
        "reasoning_details",
    }
)
_REASONING_KEYS = ("reasoning_content", "reasoning")
# Top-level lists a Perplexity answer carries (context for `[N]` markers).
_SEARCH_KEYS = ("citations", "search_results")

Json = dict[str, Any]


def _usage(body: Mapping[str, object]) -> dict[str, int]:
    u = body.get("usage")
    if not isinstance(u, Mapping):
        return {}
    out: dict[str, int] = {}
    for src, dst in (
        ("prompt_tokens", "input"),
        ("completion_tokens", "output"),
        ("total_tokens", "total"),
    ):
        v = u.get(src)
        if isinstance(v, int) and not isinstance(v, bool):
            out[dst] = v
    return out


def _text_or_none(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ProtocolError(f"openai-chat: {where} must be a string or null")


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping):
        raise ProtocolError("openai-chat: response body is not a JSON object")
    obj = body.get("object")
    if obj is not None and obj != "chat.completion":
        raise ProtocolError("openai-chat: the body is not a chat.completion object")
    if not isinstance(body.get("choices"), list):
        raise ProtocolError("openai-chat: response has no choices list")
    raw_choices: list[object] = body["choices"]  # type: ignore[assignment]
    for ci, choice in enumerate(raw_choices):
        if not isinstance(choice, Mapping) or not isinstance(choice.get("message"), Mapping):
            raise ProtocolError(f"openai-chat: choice {ci} has no message object")
    log = FieldLog()
    kept: Json = clean(BODY_TABLE, dict(body), log)  # type: ignore[assignment]
    choices = kept.get("choices")
    if not isinstance(choices, list):
        raise ProtocolError("openai-chat: response has no choices list")
    answer = Answer(protocol=NAME, body=kept, usage=_usage(kept))
    answer.unknown_fields.extend(path for _, path in log.unknown)
    answer.dropped.extend(log.dropped)
    for ci, choice in enumerate(choices):
        base: tuple[str | int, ...] = ("choices", ci)
        msg: Mapping[str, object] = choice["message"]
        mpath = (*base, "message")
        if choice.get("logprobs") is not None:
            answer.has_logprobs = True

        def add(kind: Any, path: tuple[str | int, ...], text: str | None, ci: int = ci) -> None:
            if text is not None:
                answer.channels.append(Channel(kind=kind, path=path, text=text, choice=ci))

        content = msg.get("content")
        if isinstance(content, list):
            text, native = _chunks_text(content)
            answer.channels.append(
                Channel(kind="content", path=(*mpath, "content"), text=text, choice=ci,
                        native=native)
            )
        else:
            add("content", (*mpath, "content"), _text_or_none(content, "content"))
        add("refusal", (*mpath, "refusal"), _text_or_none(msg.get("refusal"), "refusal"))
        for key in _REASONING_KEYS:
            value = msg.get(key)
            if isinstance(value, str):
                add("reasoning", (*mpath, key), value)
        details = msg.get("reasoning_details")
        for di, entry in enumerate(details if isinstance(details, list) else []):
            kind = entry.get("type") if isinstance(entry, dict) else None
            field_name = _DETAIL_TEXT.get(kind) if isinstance(kind, str) else None
            if field_name is not None and isinstance(entry.get(field_name), str):
                add("reasoning", (*mpath, "reasoning_details", di, field_name), entry[field_name])
        for k, chunk in enumerate(content if isinstance(content, list) else []):
            if chunk.get("type") == "thinking":
                add("reasoning", (*mpath, "content", k), _thinking_text(chunk))
        tool_calls = msg.get("tool_calls")
        if isinstance(tool_calls, list):
            for ti, call in enumerate(tool_calls):
                if not isinstance(call, Mapping):
                    raise ProtocolError("openai-chat: tool call is not an object")
                tpath = (*mpath, "tool_calls", ti)
                fn, custom = call.get("function"), call.get("custom")
                if isinstance(fn, Mapping):
                    args = _text_or_none(fn.get("arguments"), "tool arguments")
                    add("tool_arguments", (*tpath, "function", "arguments"), args or "")
                elif isinstance(custom, Mapping):
                    inp = _text_or_none(custom.get("input"), "custom tool input")
                    add("tool_arguments", (*tpath, "custom", "input"), inp or "")
                else:
                    raise ProtocolError("openai-chat: tool call without function")
        elif tool_calls is not None:
            raise ProtocolError("openai-chat: tool_calls is not a list")
        fc = msg.get("function_call")
        if isinstance(fc, Mapping):
            args = _text_or_none(fc.get("arguments"), "function_call arguments")
            add("tool_arguments", (*mpath, "function_call", "arguments"), args or "")
        audio = msg.get("audio")
        if isinstance(audio, Mapping):
            add(
                "transcript",
                (*mpath, "audio", "transcript"),
                _text_or_none(audio.get("transcript"), "audio transcript"),
            )
    return answer


# -- Mistral content chunks ------------------------------------------------------------------


def _anchor(text: str, at: int) -> int:
    """Where a reference at offset `at` of `text` is attached: its last non-space character
    before `at` (the text before it), or -1 when nothing but whitespace precedes it."""
    i = at - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return i


def _reference_citations(chunk: Mapping[str, object]) -> list[Citation]:
    ids = chunk.get("reference_ids")
    return [
        Citation(id=str(r), raw=f"reference:{r}") for r in (ids if isinstance(ids, list) else [])
    ]


def _native_span(
    anchor: int, citations: Sequence[Citation]
) -> list[tuple[int, int, Citation]]:
    start, end = (anchor, anchor + 1) if anchor >= 0 else (0, 0)
    return [(start, end, c) for c in citations]


def _chunks_text(chunks: Sequence[object]) -> tuple[str, tuple[tuple[int, int, Citation], ...]]:
    """The content text of a list of content chunks (its `text` chunks joined in order), and
    each `reference` chunk's citations, spanning the last character of the text before it."""
    parts: list[str] = []
    length = 0
    native: list[tuple[int, int, Citation]] = []
    for chunk in chunks:
        if not isinstance(chunk, Mapping):
            continue
        kind = chunk.get("type")
        if kind == "text" and isinstance(chunk.get("text"), str):
            parts.append(chunk["text"])
            length += len(chunk["text"])
        elif kind == "reference":
            text = "".join(parts)
            native.extend(_native_span(_anchor(text, length), _reference_citations(chunk)))
    return "".join(parts), tuple(native)


def _thinking_text(chunk: Mapping[str, object]) -> str:
    parts = chunk.get("thinking")
    return "".join(
        p["text"]
        for p in (parts if isinstance(parts, list) else [])
        if isinstance(p, Mapping) and isinstance(p.get("text"), str)
    )


def _rebuild_chunks(
    chunks: Sequence[Any], text: str, mapping: Sequence[tuple[int, int, int]]
) -> list[Any]:
    """A partial answer's content chunks: `text` (the rebuilt content) as text chunks, with
    each reference chunk after the kept text it was attached to; references of removed claims
    are dropped. Other chunks (thinking) keep their order, ahead of the text."""
    out: list[Any] = [c for c in chunks if c.get("type") not in ("text", "reference")]
    refs: list[tuple[int, Any]] = []
    seen: list[str] = []
    for c in chunks:
        if c.get("type") == "text":
            seen.append(c["text"])
        elif c.get("type") == "reference":
            joined = "".join(seen)
            refs.append((_anchor(joined, len(joined)), c))
    cursor = 0

    def emit_text(upto: int) -> None:
        nonlocal cursor
        if upto > cursor:
            out.append({"type": "text", "text": text[cursor:upto]})
            cursor = upto

    if mapping and mapping[0][0] == 0:
        out.extend(copy.deepcopy(c) for anchor, c in refs if anchor < 0)
    for old_s, old_e, new_s in mapping:
        for anchor, c in refs:
            if old_s <= anchor < old_e:
                emit_text(new_s + anchor + 1 - old_s)
                out.append(copy.deepcopy(c))
    emit_text(len(text))
    return out


# -- Perplexity search results ----------------------------------------------------------------


def search_chunks(body: object) -> list[Chunk]:
    """Context chunks of a Perplexity answer: the N-th search result (1-based) is chunk "N",
    its `snippet` the text when it has one (else known by id only, like each of `citations[]`,
    which are URLs). An entry that is not an object (or a citation that is not a URL) is no
    chunk, so a marker citing it is hallucinated."""
    if not isinstance(body, Mapping):
        return []
    out: list[Chunk] = []
    results = body.get("search_results")
    for pos, r in enumerate(results if isinstance(results, list) else [], start=1):
        if not isinstance(r, Mapping):
            continue
        snippet, url = r.get("snippet"), r.get("url")
        out.append(
            Chunk(
                id=str(pos),
                text=snippet if isinstance(snippet, str) and snippet.strip() else None,
                source=url if is_url(url) else None,
            )
        )
    urls = body.get("citations")
    for pos, url in enumerate(urls if isinstance(urls, list) else [], start=1):
        if is_url(url):
            out.append(Chunk(id=str(pos), source=url))
    return out


_HEAD_KEYS = ("id", "created", "model", "system_fingerprint", "service_tier")
_TEXT_KEYS = frozenset({"content", "refusal", *_REASONING_KEYS})
_CHOICE_CHUNK_KEYS = frozenset({"index", "delta", "finish_reason", "logprobs"})


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


def _content_only(chunk: object) -> tuple[int, str] | None:
    """(index, text) of a chunk that only adds content text to one choice: nothing else in it
    changes a parser that has already read its head."""
    if type(chunk) is not dict or chunk.get("usage") is not None or "error" in chunk:
        return None
    obj = chunk.get("object")
    choices = chunk.get("choices")
    if obj is not None and obj != "chat.completion.chunk":
        return None
    if type(choices) is not list or len(choices) != 1:
        return None
    c = choices[0]
    if type(c) is not dict or not c.keys() <= _CHOICE_CHUNK_KEYS:
        return None
    i, delta = c.get("index"), c.get("delta")
    if type(i) is not int or c.get("finish_reason") is not None or c.get("logprobs") is not None:
        return None
    if type(delta) is not dict or len(delta) != 1 or type(delta.get("content")) is not str:
        return None
    return i, delta["content"]


class OpenAIStreamParser(StreamParser):
    """Assembles `chat.completion.chunk` events into the body the JSON API would have sent."""

    def __init__(self) -> None:
        self._head: Json = {}
        self._head_missing: tuple[str, ...] = _HEAD_KEYS
        self._choices: dict[int, _ChoiceState] = {}
        self._usage: object = None
        self._done = False
        self._dropped: list[tuple[str, tuple[str | int, ...]]] = []
        # The last content-only chunk around its text, for the chunks that repeat it; learnt
        # a few times at most per stream (a chunk that varies elsewhere defeats it).
        self._slot: StringSlot | None = None
        self._slot_index = 0
        self._slot_tries = 4
        # Perplexity's top-level lists, as first sent (a frame may re-send them accumulated).
        self._search: Json = {}
        self._ctx: ContextSet | None = None
        self.context_grew_late = False

    def bind_context(self, ctx: ContextSet, spec: ContextSpec) -> None:
        """Perplexity search results that arrive in the stream join `ctx` as they come (on
        routes whose context comes from the response), before the claims that cite them."""
        if "response" in getattr(spec, "from_", ()):
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
            for s, e, c in _native_span(_anchor(text, offset), _reference_citations(chunk)):
                if (s < end and e > start) or (s == e and start <= s <= end):
                    out.append(c)
        return tuple(out)

    def _search_lists(self, chunk: Json) -> None:
        """Keep a frame's `citations` / `search_results`: the first copy, or a later one that
        extends it (re-sent accumulated); a copy that changes an entry is not relayed."""
        for key in _SEARCH_KEYS:
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
            if self._ctx is not None:
                before = dict(self._ctx.chunks)
                self._ctx.extend(search_chunks(self._search))
                st = self._choices.get(0)
                if self._ctx.chunks != before and st is not None and st.content_length():
                    # Claims checked before this context arrived are checked again at the end
                    # (buffer mode; in progressive mode they have been decided already).
                    self.context_grew_late = True

    @property
    def done(self) -> bool:
        """The stream's terminal event has been seen: nothing after it can change the answer."""
        return self._done

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if self._done:
            return []
        data = event.data
        # A JSON object starts with "{" (after any whitespace); only other data can be [DONE].
        if not data.startswith("{") and data.strip() == "[DONE]":
            self._done = True
            return []
        if event.event == "error":
            raise ProtocolError("openai-chat: the stream carried an error event")
        if event.event is not None:
            # The protocol names no events: an `event:` line is not relayed.
            self._dropped.append(("sse", ("event",)))
        if self._slot is not None:
            text = self._slot.match(data)
            if text is not None:  # the same chunk as the slot's, but for its content
                st = self._choices[self._slot_index]
                st.parts["content"].append(text)
                return [(st.keys["content"], text)] if text else []
        try:
            chunk = loads_unique(data, stdlib=True)
        except ProtocolError as exc:
            raise ProtocolError(f"openai-chat: stream event: {exc}") from None
        out = self._chunk(chunk)
        if self._slot_tries:
            known = _content_only(chunk)
            if known is not None:
                i, text = known
                self._slot_tries -= 1
                self._slot = learn_slot(
                    data, "content", text, lambda v, p: _content_only(v) == (i, p)
                )
                self._slot_index = i
        return out

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
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        if "citations" in chunk or "search_results" in chunk:
            self._search_lists(chunk)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise ProtocolError("openai-chat: stream chunk has no choices list")
        if len(choices) == 1:  # the usual chunk: no list to merge
            c = choices[0]
            if not isinstance(c, dict) or not isinstance(c.get("index"), int):
                raise ProtocolError("openai-chat: stream choice without index")
            return self._choice(c)
        out: list[TextDelta] = []
        for c in choices:
            if not isinstance(c, dict) or not isinstance(c.get("index"), int):
                raise ProtocolError("openai-chat: stream choice without index")
            out.extend(self._choice(c))
        return out

    def _choice(self, c: Json) -> list[TextDelta]:
        i: int = c["index"]
        st = self._choices.get(i)
        if st is None:
            st = self._choices[i] = _ChoiceState(i)
        # An index of true shares choice 1's state but keeps its own name in the keys.
        keys = st.keys if type(i) is int else _channel_keys(i)
        out: list[TextDelta] = []
        finish = c.get("finish_reason")
        if finish is not None:
            st.finish = finish
        lp = c.get("logprobs")
        if isinstance(lp, dict):
            acc = st.logprobs = st.logprobs or {}
            for k, v in lp.items():
                if isinstance(v, list):
                    acc.setdefault(k, []).extend(v)
        if len(c) > 4 or not c.keys() <= _CHOICE_CHUNK_KEYS:
            for k, v in c.items():
                if k not in _CHOICE_CHUNK_KEYS:
                    st.extra[k] = v
        delta = c.get("delta") or {}
        if not isinstance(delta, dict):
            raise ProtocolError("openai-chat: stream delta is not an object")
        parts = st.parts
        for key, value in delta.items():
            if value is None:
                continue
            if key == "content" and isinstance(value, list):
                out.extend(self._content_chunks(st, keys, value))
            elif key == "reasoning_details" and isinstance(value, list):
                _merge_details(st, value)
            elif key in _TEXT_KEYS and isinstance(value, str):
                if key in parts:
                    parts[key].append(value)
                else:
                    parts[key] = [value]
                if value:
                    out.append((keys[key], value))
            elif key == "role":
                st.msg["role"] = value
            elif key == "tool_calls" and isinstance(value, list):
                for tc in value:
                    out.extend(self._tool_delta(st, i, tc))
            elif key == "function_call" and isinstance(value, dict):
                # Pieces are kept in lists and joined once in body(): `+=` on a string held
                # in a dict copies it every time, quadratic in the arguments' length.
                fc = st.msg.setdefault("function_call", {"name": [], "arguments": []})
                fc["name"].append(value.get("name") or "")
                args = value.get("arguments") or ""
                fc["arguments"].append(args)
                if args:
                    out.append((keys["function_call"], args))
            elif key == "audio" and isinstance(value, dict):
                audio = st.msg.setdefault("audio", {})
                for ak, av in value.items():
                    if ak in ("transcript", "data") and isinstance(av, str):
                        audio.setdefault(ak, []).append(av)
                        if ak == "transcript" and av:
                            out.append((keys["audio"], av))
                    else:
                        audio[ak] = av
            elif key == "annotations" and isinstance(value, list):
                st.msg.setdefault("annotations", []).extend(value)
            else:
                st.msg[key] = value
        return out

    @staticmethod
    def _content_chunks(
        st: _ChoiceState, keys: Mapping[str, str], value: list[Any]
    ) -> list[TextDelta]:
        """A delta whose content is a list of Mistral chunks: text extends the content text;
        references and thinking are recorded at their offset in it."""
        out: list[TextDelta] = []
        if st.chunks is None:
            st.chunks = []
        parts = st.parts.setdefault("content", [])
        for chunk in value:
            if not isinstance(chunk, dict):
                raise ProtocolError("openai-chat: a content chunk is not an object")
            kind = chunk.get("type")
            if kind == "text" and isinstance(chunk.get("text"), str):
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
                last[1]["thinking"].extend(chunk["thinking"])  # the same thinking, continued
            else:
                st.chunks.append((offset, copy.deepcopy(chunk)))
        return out

    def _tool_delta(self, st: _ChoiceState, i: int, tc: object) -> list[TextDelta]:
        if not isinstance(tc, dict) or not isinstance(tc.get("index"), int):
            raise ProtocolError("openai-chat: tool call delta without index")
        call = st.tools.setdefault(
            tc["index"], {"id": None, "type": "function", "function": {"name": [], "arguments": []}}
        )
        if tc.get("id"):
            call["id"] = tc["id"]
        if tc.get("type"):
            call["type"] = tc["type"]
        fn = tc.get("function") or {}
        call["function"]["name"].append(fn.get("name") or "")
        args = fn.get("arguments") or ""
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
                msg["content"] = _assembled_chunks("".join(st.parts.get("content", [])), st.chunks)
            for key in _REASONING_KEYS:
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

    def observe(self, event: SSEEvent, offset: int) -> None:
        """The parser itself records reference chunks as it is fed."""

    def overlapping(self, start: int, end: int, length: int) -> tuple[Citation, ...]:
        return self._parser.primary_citations(start, end)


_DETAIL_STRINGS = ("text", "summary", "data", "signature")


def _merge_details(st: _ChoiceState, entries: list[Any]) -> None:
    """OpenRouter streams reasoning_details in pieces: an entry with the `index` and `type` of
    the last one continues it (its strings appended, joined in `body()`), any other is a new
    entry. Strings are kept as lists of pieces meanwhile."""
    details = st.details = st.details if st.details is not None else []
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
            details.append({k: _piece(k, v) for k, v in e.items()})
            continue
        for k, v in e.items():
            have = last.get(k)
            if k in _DETAIL_STRINGS and isinstance(v, str) and isinstance(have, list):
                have.append(v)
            elif have is None:
                last[k] = _piece(k, v)


def _piece(key: str, value: object) -> object:
    """A streamed detail's value as kept while merging: strings of `_DETAIL_STRINGS` as a list
    of pieces; any other value there is not a string, so it is not relayed (None)."""
    if key not in _DETAIL_STRINGS:
        return value
    return [value] if isinstance(value, str) else None


def _joined_details(details: list[Any]) -> list[Any]:
    return [_joined(d, _DETAIL_STRINGS) if isinstance(d, dict) else d for d in details]


def _assembled_chunks(text: str, chunks: Sequence[tuple[int, Json]]) -> list[Json]:
    """A streamed Mistral content as the JSON API's list: the text cut at each recorded
    chunk's offset into text chunks, the other chunks in between."""
    out: list[Json] = []
    pos = 0
    for offset, chunk in chunks:
        if offset > pos:
            out.append({"type": "text", "text": text[pos:offset]})
            pos = offset
        out.append(chunk)
    if pos < len(text):
        out.append({"type": "text", "text": text[pos:]})
    return out


def _joined(parts: Json, keys: tuple[str, ...]) -> Json:
    """A copy of `parts` with the pieces under `keys` joined into strings."""
    return {k: "".join(v) if k in keys and isinstance(v, list) else v for k, v in parts.items()}


def _joined_call(call: Json) -> Json:
    return {**call, "function": _joined(call["function"], ("name", "arguments"))}


def _del_path(body: Json, path: Sequence[str | int]) -> None:
    node: Any = body
    for p in path[:-1]:
        node = node[p]
    last = path[-1]
    if isinstance(node, dict):
        node.pop(last, None)


def _set_path(body: Json, path: Sequence[str | int], value: object) -> None:
    node: Any = body
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


class OpenAIChat(Adapter):
    name = NAME
    primary_channel = channel_key(("choices", 0, "message", "content"))
    terminal_event = b"[DONE]"
    retries = True

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        opts = body.get("stream_options")
        include = isinstance(opts, Mapping) and opts.get("include_usage") is True
        n = body.get("n")
        return RequestInfo(
            stream=body.get("stream") is True,
            include_usage=include,
            n=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1,
        )

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        openai_request_context(body, ctx, trust.pattern, trust)

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        messages = request.setdefault("messages", [])
        messages.append({"role": "system", "content": instruction})
        return request

    def progressive_framer(self, include_usage: bool) -> Framer:
        from gateway.protocols.openai_chat_framer import OpenAIFramer

        return OpenAIFramer(include_usage)

    def response_context(self, body: object, ctx: ContextSet, trust: Trust) -> None:
        """Context the response itself carries (`context.from: response`): Perplexity's
        search results and citations, for numeric `[N]` markers (`search_chunks`)."""
        ctx.extend(search_chunks(body))

    def stream_parser(self, route: Route) -> OpenAIStreamParser:
        return OpenAIStreamParser()

    field_table = BODY_TABLE
    frame_table = FRAME_TABLE

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        if rule_withholds_something(answer, policy):
            return True
        if not answer.has_logprobs or policy.channels.logprobs == "pass":
            return False
        choices = answer.body.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            lp = choice.get("logprobs")
            if lp is not None and _logprobs(lp, choice["message"], policy) != lp:
                return True
        return False

    # -- rendering ---------------------------------------------------------------------------

    def _base(self, answer: Answer, policy: Policy) -> Json:
        body: Json = copy.deepcopy(dict(answer.body))
        ch = policy.channels
        for path in answer.unknown_fields:
            if not field_allowed(path, policy):
                _del_path(body, path)
        for choice in body.get("choices", []):
            msg = choice["message"]
            if ch.reasoning == "withhold":
                for key in _REASONING_KEYS:
                    msg.pop(key, None)
                _withhold_details(msg)
                if isinstance(msg.get("content"), list):
                    msg["content"] = [c for c in msg["content"] if c.get("type") != "thinking"]
            if ch.tool_calls == "withhold":
                msg.pop("tool_calls", None)
                msg.pop("function_call", None)
        return body

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
                body = self._base(answer, policy)
                self._decide_logprobs(body, policy, changed=False)
            case Decision.PARTIAL:
                body = self._partial(answer, claims, outcome, policy)
                self._decide_logprobs(body, policy, changed=True)
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
        self._fix_finish_reasons(body)
        return body

    def _template(self, answer: Answer, text: str) -> Json:
        src = answer.body
        choices = src.get("choices")
        count = len(choices) if isinstance(choices, list) and choices else 1
        body: Json = {
            "id": src.get("id", ""),
            "object": "chat.completion",
            "created": src.get("created", 0),
            "model": src.get("model", ""),
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
                for i in range(count)
            ],
        }
        for k in ("system_fingerprint", "service_tier", "usage"):
            if src.get(k) is not None:
                body[k] = copy.deepcopy(src[k])
        return body

    def _partial(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> Json:
        body = self._base(answer, policy)
        disclosure = policy.release.templates.partial
        kept, failed = split_claims(claims, outcome)
        all_failed = [c for cs in failed.values() for c in cs]
        drop_tools: dict[int, set[int]] = {}
        # Reasoning entries of a list (reasoning_details, thinking chunks), as the answer
        # holds them: removed by value at the end, since the lists of the rendered body may
        # have changed (withheld entries removed, content chunks rebuilt).
        drop_entries: list[tuple[int, str, object]] = []
        for idx, channel in enumerate(answer.channels):
            lost = idx in failed or (all_failed and leaks(channel, all_failed))
            if not lost:
                continue
            msg = body["choices"][channel.choice]["message"]
            path = channel.path
            if channel.kind in ("content", "refusal", "transcript"):
                new, mapping = rebuild_with_map(channel.text, kept.get(idx, []), disclosure)
                if channel.kind == "transcript":
                    # The audio speaks the removed claim; only the rebuilt text may go out.
                    msg.pop("audio", None)
                    if msg.get("content") is None:
                        msg["content"] = new
                    continue
                if channel.kind == "content" and isinstance(msg.get("content"), list):
                    msg["content"] = _rebuild_chunks(msg["content"], new, mapping)
                    continue
                _set_path(body, path, new)
                if channel.kind == "content" and isinstance(msg.get("annotations"), list):
                    msg["annotations"] = _remap_annotations(msg["annotations"], mapping)
            elif channel.kind == "tool_arguments":
                if "tool_calls" in path:
                    drop_tools.setdefault(channel.choice, set()).add(int(path[4]))
                else:
                    msg.pop("function_call", None)
            elif channel.kind == "reasoning" and len(path) > 4 and isinstance(path[4], int):
                source = answer.body["choices"][channel.choice]["message"]  # type: ignore[index]
                drop_entries.append((channel.choice, str(path[3]), source[path[3]][path[4]]))
            elif channel.kind == "reasoning":
                msg.pop(str(path[-1]), None)
        for ci, key, entry in drop_entries:
            msg = body["choices"][ci]["message"]
            entries = msg.get(key)
            if isinstance(entries, list):
                msg[key] = [e for e in entries if e != entry]
                if key == "reasoning_details" and not msg[key]:
                    msg.pop(key)
        for ci, gone in drop_tools.items():
            msg = body["choices"][ci]["message"]
            calls = msg.get("tool_calls")
            if isinstance(calls, list):
                left = [c for i, c in enumerate(calls) if i not in gone]
                if left:
                    msg["tool_calls"] = left
                else:
                    msg.pop("tool_calls")
        return body

    @staticmethod
    def _decide_logprobs(body: Json, policy: Policy, changed: bool) -> None:
        """`channels.logprobs` over each choice of a rendered body. `pass` relays them as they
        are, except in a partial answer, whose texts they no longer describe."""
        for choice in body.get("choices", []):
            lp = choice.get("logprobs")
            if lp is None:
                continue
            if policy.channels.logprobs == "pass" and not changed:
                continue
            choice["logprobs"] = _logprobs(lp, choice["message"], policy)

    @staticmethod
    def _fix_finish_reasons(body: Json) -> None:
        for choice in body.get("choices", []):
            msg = choice.get("message", {})
            if choice.get("finish_reason") == "tool_calls" and not msg.get("tool_calls"):
                choice["finish_reason"] = "stop"
            if choice.get("finish_reason") == "function_call" and not msg.get("function_call"):
                choice["finish_reason"] = "stop"

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return {"error": {"message": message, "type": type_, "param": None, "code": None}}

    def error_event(self, message: str, type_: str) -> SSEEvent:
        return SSEEvent(data=json.dumps(self.error_envelope(0, message, type_)))

    def relay_error(self, body: object) -> dict[str, object] | None:
        if not isinstance(body, Mapping) or not isinstance(body.get("error"), Mapping):
            return None
        error = body["error"]
        message = relayed_message(error.get("message"))
        if message is None:
            return None
        return {"error": relayed_fields(error, message, type=relayed_token, param=relayed_token,
                                        code=relayed_code)}

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        head: Json = {
            "id": body.get("id", ""),
            "object": "chat.completion.chunk",
            "created": body.get("created", 0),
            "model": body.get("model", ""),
        }
        for k in ("system_fingerprint", "service_tier"):
            if body.get(k) is not None:
                head[k] = body[k]
        events: list[SSEEvent] = []

        def frame(index: int, delta: Json, finish: object = None, logprobs: object = None) -> None:
            chunk: Json = {
                **head,
                "choices": [
                    {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
                ],
            }
            if include_usage:
                chunk["usage"] = None
            events.append(SSEEvent(data=json.dumps(chunk, ensure_ascii=False)))

        choices = body.get("choices")
        for pos, choice in enumerate(choices if isinstance(choices, list) else []):
            i = choice.get("index", pos)
            msg: Json = dict(choice.get("message") or {})
            first: Json = {"role": msg.get("role", "assistant"), "content": ""}
            if msg.get("refusal") is None and "refusal" in msg:
                first["refusal"] = None
            frame(i, first)
            for key in (*_REASONING_KEYS, "content", "refusal"):
                if isinstance(msg.get(key), str) and msg[key]:
                    lp = choice.get("logprobs") if key == "content" else None
                    frame(i, {key: msg[key]}, logprobs=lp)
                elif key == "content" and isinstance(msg.get(key), list) and msg[key]:
                    frame(i, {key: msg[key]}, logprobs=choice.get("logprobs"))
            if msg.get("reasoning_details"):
                frame(i, {"reasoning_details": msg["reasoning_details"]})
            for ti, call in enumerate(msg.get("tool_calls") or []):
                fn = call.get("function") or {}
                frame(
                    i,
                    {
                        "tool_calls": [
                            {
                                "index": ti,
                                "id": call.get("id"),
                                "type": call.get("type", "function"),
                                "function": {"name": fn.get("name", ""), "arguments": ""},
                            }
                        ]
                    },
                )
                if fn.get("arguments"):
                    frame(
                        i,
                        {"tool_calls": [{"index": ti, "function": {"arguments": fn["arguments"]}}]},
                    )
            if isinstance(msg.get("function_call"), dict):
                frame(i, {"function_call": msg["function_call"]})
            if isinstance(msg.get("audio"), dict):
                frame(i, {"audio": msg["audio"]})
            if msg.get("annotations"):
                frame(i, {"annotations": msg["annotations"]})
            for k, v in msg.items():
                if k not in _MESSAGE_KEYS:
                    frame(i, {k: v})
            frame(i, {}, finish=choice.get("finish_reason") or "stop")
        search = {k: body[k] for k in _SEARCH_KEYS if body.get(k) is not None}
        if search:
            chunk = {**head, "choices": [], **search}
            if include_usage:
                chunk["usage"] = None
            events.append(SSEEvent(data=json.dumps(chunk, ensure_ascii=False)))
        if include_usage and body.get("usage") is not None:
            events.append(
                SSEEvent(data=json.dumps({**head, "choices": [], "usage": body["usage"]}))
            )
        events.append(SSEEvent(data="[DONE]"))
        return events


def _withhold_details(msg: Json) -> None:
    """`channels.reasoning: withhold` over OpenRouter reasoning_details: readable entries go,
    encrypted ones (opaque, needed to continue a conversation) stay."""
    details = msg.get("reasoning_details")
    if not isinstance(details, list):
        return
    kept = [d for d in details if isinstance(d, dict) and d.get("type") == "reasoning.encrypted"]
    if kept:
        msg["reasoning_details"] = kept
    else:
        msg.pop("reasoning_details")


def _logprobs(lp: object, msg: Mapping[str, object], policy: Policy) -> object:
    """A choice's logprobs under `verify` / `withhold` (see `verified_token_logprobs`): each of
    `content` / `refusal` is kept only when its tokens spell the released text."""
    if policy.channels.logprobs == "withhold" or type(lp) is not dict:
        return None
    out: Json = {}
    for key in ("content", "refusal"):
        if key not in lp:
            continue
        entries = lp[key]
        text = msg.get(key)
        out[key] = (
            None
            if entries is None
            else verified_token_logprobs(entries, text if isinstance(text, str) else None)
        )
    return out if any(v is not None for v in out.values()) else None


def _remap_annotations(
    annotations: list[Any], mapping: Sequence[tuple[int, int, int]]
) -> list[Any]:
    """Keep annotations whose span survives whole in a kept piece, with shifted offsets."""
    out: list[Any] = []
    for ann in annotations:
        span = ann.get("url_citation") if isinstance(ann, dict) else None
        if not isinstance(span, dict):
            continue
        s, e = span.get("start_index"), span.get("end_index")
        if not isinstance(s, int) or not isinstance(e, int):
            continue
        for old_s, old_e, new_s in mapping:
            if old_s <= s and e <= old_e:
                moved = copy.deepcopy(ann)
                moved["url_citation"]["start_index"] = new_s + (s - old_s)
                moved["url_citation"]["end_index"] = new_s + (e - old_s)
                out.append(moved)
                break
    return out

"""The openai-chat field tables: every field of a `chat.completion` body and of a
`chat.completion.chunk` frame, decided (DESIGN §2), the OpenAI-compatible dialects' included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.protocols.fields import (
    DROP,
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
    is_enum,
    is_int,
    is_model,
    is_opaque,
    is_token,
    is_url,
    nullable,
    usage_check,
)

__all__ = ["BODY_TABLE", "FRAME_TABLE", "REASONING_KEYS", "SEARCH_KEYS"]

# Message fields that hold reasoning text as one string.
REASONING_KEYS = ("reasoning_content", "reasoning")
# Top-level lists a Perplexity answer carries (context for `[N]` markers).
SEARCH_KEYS = ("citations", "search_results")

_FINISH = nullable(is_enum("stop", "length", "tool_calls", "content_filter", "function_call"))
_TOKEN = Meta(is_token)
_NULL_TOKEN = Meta(nullable(is_token))
_INT = Meta(is_int)
_ASSISTANT = Meta(nullable(is_enum("assistant")))
_USAGE = Meta(nullable(usage_check))
_LOGPROBS = Opaque("logprobs")  # decided by `channels.logprobs` (render.py)

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
@dataclass(frozen=True, slots=True)
class _ToolCall(Obj):
    """A tool call carries the member its `type` names (`function` unless it says `custom`).
    A client reads only that one, and only that one is verified (parse.py): the other member
    is dropped, never relayed unread."""

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        kept = Obj.walk(self, value, path, key, log, level)
        if type(kept) is dict and "function" in kept and "custom" in kept:
            other = "function" if kept.get("type") == "custom" else "custom"
            kept = {k: v for k, v in kept.items() if k != other}
            log.dropped.append((self.level, (*path, key, other)))
        return kept


_TOOL_CALL = _ToolCall(
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
# Audio speaks words: only its transcript is verified (parse.py reads it as the transcript
# channel), so audio whose transcript is not a string is dropped whole.
_AUDIO = Obj(
    "audio",
    {
        "id": _TOKEN,
        "data": Meta(is_opaque),
        "expires_at": _INT,
        "transcript": Meta(lambda v: type(v) is str),
    },
    required=frozenset({"id", "transcript"}),
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
# has no place in the body, so a stream holding it is re-framed. Values the assembled body
# keeps only one of (usage, audio's id) are shape-checked here, on every frame: an earlier
# copy the body never holds is decided too (the parser re-frames a stream whose copies
# disagree).
_CARRIED = Opaque("carried into the assembled body")
_AUDIO_DELTA = Obj(
    "audio",
    {"id": _TOKEN, "data": Meta(is_opaque), "expires_at": _INT, "transcript": _CARRIED},
)
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
        "audio": _AUDIO_DELTA,
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
        "usage": _USAGE,
        "citations": _CARRIED,
        "search_results": _CARRIED,
        "choices": Items(
            Obj(
                "choice",
                {
                    "index": _INT,
                    "delta": _DELTA_TABLE,
                    "finish_reason": Meta(_FINISH),
                    # The assembled choice's message is built from the deltas: a frame's own
                    # `message` has no place in it.
                    "message": DROP,
                },
                other=_CARRIED,
                nullable=False,
            )
        ),
    },
    nullable=False,
)


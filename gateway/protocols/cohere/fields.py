"""The cohere-chat field table: every field of a `/v2/chat` response and of its stream events,
decided (DESIGN §2). Channels are `Text`; metadata is kept only with its expected shape; a
field not listed (a source's echoed `document` / `tool_output` among them) is unknown and
dropped on verified routes unless `channels.allow_fields` names it.
"""

from __future__ import annotations

import re

from gateway.protocols.fields import (
    ByType,
    Items,
    Meta,
    Obj,
    Opaque,
    Text,
    is_enum,
    is_int,
    is_number,
    is_token,
    nullable,
)

__all__ = [
    "BODY_TABLE",
    "CITATION_TYPES",
    "EVENT_KEYS",
    "FINISH_REASONS",
    "is_source_id",
    "usage_ok",
]

FINISH_REASONS = ("COMPLETE", "STOP_SEQUENCE", "MAX_TOKENS", "TOOL_CALL", "ERROR", "TIMEOUT")
CITATION_TYPES = ("TEXT_CONTENT", "THINKING_CONTENT", "PLAN")

# A source id names a request document: the client's own id (any short text without control
# characters) or one Cohere assigned (`doc:0`, `get_weather_1byjy32y4hvq:0`). It is compared
# with the context by exact code points, so its shape only has to be harmless.
_SOURCE_ID = re.compile(r"[^\x00-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069]{1,256}")


def is_source_id(v: object) -> bool:
    return type(v) is str and _SOURCE_ID.fullmatch(v) is not None


def usage_ok(v: object, depth: int = 0) -> bool:
    """Usage: `billed_units` / `tokens` objects of numbers and `cached_tokens`; token-like keys,
    numbers (the API's are floats in the SDK's types) or nested objects of the same."""
    if type(v) is not dict or depth > 1:
        return False
    for k, x in v.items():
        if not is_token(k):
            return False
        if x is None or is_number(x):
            continue
        if not usage_ok(x, depth + 1):
            return False
    return True


_TOKEN = Meta(is_token)
_INT = Meta(is_int)

_CONTENT = ByType(
    "content",
    {
        "text": Obj(
            "content",
            {"type": Meta(is_enum("text")), "text": Text("content")},
            required=frozenset({"text"}),
            nullable=False,
        ),
        "thinking": Obj(
            "content",
            {"type": Meta(is_enum("thinking")), "thinking": Text("reasoning")},
            required=frozenset({"thinking"}),
            nullable=False,
        ),
    },
)
_TOOL_CALL = Obj(
    "tool_call",
    {
        "id": _TOKEN,
        "type": Meta(is_enum("function")),
        "function": Obj(
            "tool_call",
            {"name": _TOKEN, "arguments": Text("tool_arguments")},
            required=frozenset({"name"}),
            nullable=False,
        ),
    },
    required=frozenset({"id"}),
    vital=frozenset({"function"}),
    nullable=False,
)
# A source names what a span cites. Its echo of the cited document (`document`,
# `tool_output`) is upstream text nobody verifies: not in the table, so it is dropped unless
# allow-listed. A source whose id has a bad shape loses the id and cites nothing verifiable.
_SOURCE = ByType(
    "source",
    {
        kind: Obj(
            "source",
            {"type": Meta(is_enum(kind)), "id": Meta(is_source_id)},
            nullable=False,
        )
        for kind in ("document", "tool")
    },
)
_CITATION = Obj(
    "citation",
    {
        "start": _INT,
        "end": _INT,
        # Must equal the answer's slice [start, end): checked by the parser (parse.py).
        "text": Opaque("the cited span of the answer"),
        "sources": Items(_SOURCE),
        "content_index": _INT,
        "type": Meta(is_enum(*CITATION_TYPES)),
    },
    nullable=False,
)
_MESSAGE = Obj(
    "message",
    {
        "role": Meta(is_enum("assistant"), fallback="assistant"),
        "content": Items(_CONTENT),
        "tool_plan": Text("reasoning", strings_only=True),
        "tool_calls": Items(_TOOL_CALL),
        "citations": Items(_CITATION),
    },
    nullable=False,
)
BODY_TABLE = Obj(
    "top",
    {
        "id": Meta(is_token, fallback=""),
        "finish_reason": Meta(is_enum(*FINISH_REASONS), fallback="COMPLETE"),
        "message": _MESSAGE,
        "usage": Meta(nullable(usage_ok)),
        "logprobs": Opaque("logprobs"),  # decided by `channels.logprobs` (render.py)
    },
    required=frozenset({"message"}),
    nullable=False,
)

# Stream events: the keys each type may carry at its top level. What `delta` holds is read by
# the parser, which records anything else it finds there as unknown (the stream is re-framed).
EVENT_KEYS: dict[str, frozenset[str]] = {
    "message-start": frozenset({"type", "id", "delta"}),
    "content-start": frozenset({"type", "index", "delta"}),
    "content-delta": frozenset({"type", "index", "delta", "logprobs"}),
    "content-end": frozenset({"type", "index"}),
    "tool-plan-delta": frozenset({"type", "delta"}),
    "tool-call-start": frozenset({"type", "index", "delta"}),
    "tool-call-delta": frozenset({"type", "index", "delta"}),
    "tool-call-end": frozenset({"type", "index"}),
    "citation-start": frozenset({"type", "index", "delta"}),
    "citation-end": frozenset({"type", "index"}),
    "message-end": frozenset({"type", "id", "delta"}),
}


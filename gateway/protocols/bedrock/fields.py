"""The bedrock-converse field table: every field of a Converse response and of each
ConverseStream event, decided (DESIGN §2). Content blocks are unions (one member key per
block: `text`, `citationsContent`, `reasoningContent`, `toolUse`); a block whose member the
table does not know is an unknown field, dropped on verified routes unless allow-listed.
"""

from __future__ import annotations

import copy
from typing import Any

from gateway.protocols.fields import (
    DROP,
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
    is_opaque,
    is_token,
    is_url,
)

__all__ = [
    "BLOCK_MEMBERS",
    "BODY_TABLE",
    "CITATION",
    "EVENT_TABLES",
    "STOP_REASONS",
    "known_only",
]

STOP_REASONS = (
    "end_turn",
    "tool_use",
    "max_tokens",
    "stop_sequence",
    "guardrail_intervened",
    "content_filtered",
    "malformed_model_output",
    "malformed_tool_use",
    "model_context_window_exceeded",
)

_INT = Meta(is_int)
_TOKEN = Meta(is_token)
# Verified against the request's document blocks (parse.native_citation), so relayed as is;
# the parser refuses a piece that is not text, and this rule drops one all the same.
_VERIFIED = Meta(lambda v: type(v) is str)


def _range(level: str, index: str) -> Obj:
    return Obj(level, {index: _INT, "start": _INT, "end": _INT}, nullable=False)


_LOCATION = Obj(
    "citation",
    {
        "documentChar": _range("citation", "documentIndex"),
        "documentPage": _range("citation", "documentIndex"),
        "documentChunk": _range("citation", "documentIndex"),
        "searchResultLocation": _range("citation", "searchResultIndex"),
        # A web citation names nothing the request carried: it never verifies, so it is
        # never released; its shape is still checked.
        "web": Obj("citation", {"url": Meta(is_url), "domain": _TOKEN}, nullable=False),
    },
    nullable=False,
)
_CITATION = Obj(
    "citation",
    {
        # Titles and source names are text nobody verifies: never relayed.
        "title": DROP,
        "source": DROP,
        "sourceContent": Items(Obj("citation", {"text": _VERIFIED}, nullable=False)),
        "location": _LOCATION,
    },
    nullable=False,
)
_USAGE = Obj(
    "usage",
    {
        "inputTokens": _INT,
        "outputTokens": _INT,
        "totalTokens": _INT,
        "cacheReadInputTokens": _INT,
        "cacheWriteInputTokens": _INT,
        "cacheDetails": Items(
            Obj("usage", {"ttl": Meta(is_enum("5m", "1h")), "inputTokens": _INT}, nullable=False)
        ),
    },
    nullable=False,
)

# The union members of an output content block the adapter knows.
BLOCK_MEMBERS = ("text", "citationsContent", "reasoningContent", "toolUse")
_BLOCK = Obj(
    "content_block",
    {
        "text": Text("content"),
        "citationsContent": Obj(
            "content_block",
            {
                "content": Items(Obj("content_block", {"text": Text("content")}, nullable=False)),
                "citations": Items(_CITATION),
            },
            nullable=False,
        ),
        "reasoningContent": Obj(
            "content_block",
            {
                "reasoningText": Obj(
                    "content_block",
                    {"text": Text("reasoning"), "signature": Meta(is_opaque)},
                    nullable=False,
                ),
                "redactedContent": Meta(is_opaque),
            },
            nullable=False,
        ),
        "toolUse": Obj(
            "content_block",
            {
                "toolUseId": _TOKEN,
                "name": _TOKEN,
                "input": Text("tool_arguments"),
                "type": Meta(is_enum("server_tool_use")),
            },
            required=frozenset({"toolUseId", "name"}),
            nullable=False,
        ),
    },
    nullable=False,
)
_PERFORMANCE = Obj("top", {"latency": Meta(is_enum("standard", "optimized"))}, nullable=False)
_TIER = Obj(
    "top", {"type": Meta(is_enum("priority", "default", "flex", "reserved"))}, nullable=False
)
BODY_TABLE = Obj(
    "top",
    {
        "output": Obj(
            "output",
            {
                "message": Obj(
                    "message",
                    {
                        "role": Meta(is_enum("assistant"), fallback="assistant"),
                        "content": Items(_BLOCK),
                    },
                    nullable=False,
                )
            },
            nullable=False,
        ),
        "stopReason": Meta(is_enum(*STOP_REASONS), fallback="end_turn"),
        "usage": _USAGE,
        "metrics": Obj("top", {"latencyMs": _INT}, nullable=False),
        # Free-form model fields and guardrail traces (which quote model output): not relayed.
        "additionalModelResponseFields": DROP,
        "trace": DROP,
        "performanceConfig": _PERFORMANCE,
        "serviceTier": _TIER,
    },
    nullable=False,
)

# ConverseStream event payloads by `:event-type`. What a delta carries is assembled into the
# body (and decided there by BODY_TABLE); `p` is the service's random padding, never relayed.
_CARRIED = Opaque("carried into the assembled body")
_PAD = DROP
_INDEX = _INT


def _event(fields: dict[str, Rule]) -> Obj:
    return Obj("frame", {**fields, "p": _PAD}, nullable=False)


EVENT_TABLES: dict[str, Obj] = {
    "messageStart": _event({"role": Meta(is_enum("assistant"))}),
    "contentBlockStart": _event(
        {
            "contentBlockIndex": _INDEX,
            "start": Obj(
                "delta",
                {
                    "toolUse": Obj(
                        "delta",
                        {"toolUseId": _TOKEN, "name": _TOKEN, "type": _CARRIED},
                        nullable=False,
                    )
                },
                nullable=False,
            ),
        }
    ),
    "contentBlockDelta": _event(
        {
            "contentBlockIndex": _INDEX,
            "delta": Obj(
                "delta",
                {
                    "text": _CARRIED,
                    "toolUse": Obj("delta", {"input": _CARRIED}, nullable=False),
                    "reasoningContent": Obj(
                        "delta",
                        {"text": _CARRIED, "signature": _CARRIED, "redactedContent": _CARRIED},
                        nullable=False,
                    ),
                    "citation": _CARRIED,
                },
                nullable=False,
            ),
        }
    ),
    "contentBlockStop": _event({"contentBlockIndex": _INDEX}),
    "messageStop": _event({"stopReason": _CARRIED, "additionalModelResponseFields": DROP}),
    "metadata": _event(
        {
            "usage": _CARRIED,
            "metrics": _CARRIED,
            "trace": DROP,
            "performanceConfig": _CARRIED,
            "serviceTier": _CARRIED,
        }
    ),
}

CITATION = _CITATION


def known_only(rule: Rule, value: object) -> object:
    """`value` as its table keeps it, with unknown fields removed too (allow-listed or not):
    for pieces the gateway re-frames itself, such as a citation moved into a rebuilt block."""
    log = FieldLog()
    kept = copy.deepcopy(clean(rule, value, log))
    for _, path in sorted(log.unknown, key=lambda u: len(u[1]), reverse=True):
        node: Any = kept
        for p in path[:-1]:
            node = node[p]
        if isinstance(node, dict):
            node.pop(path[-1], None)
    return kept

"""The anthropic-messages field tables (DESIGN §2: every field at every level is decided): the
message body, the stream's frames and the citation kinds the gateway can verify."""

from __future__ import annotations

from gateway.protocols.fields import (
    DROP,
    ByType,
    Items,
    Meta,
    Obj,
    Opaque,
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

__all__ = ["BODY_TABLE", "CITATION", "CITATION_FIELDS", "EVENT_NAMES", "FRAME_TABLE"]

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


CITATION = ByType(
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
                # Rendered as the cited search result's source in the request (render.py);
                # empty when the gateway has none to give.
                "source": Meta(lambda v: v == "" or is_url(v) or is_token(v)),
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
            {"type": _TOKEN, "text": Text("content"), "citations": Items(CITATION)},
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
# The verifiable citation kinds: (document index key, start key, end key); a search result is
# named by `search_result_index` instead.
CITATION_FIELDS: dict[str, tuple[str | None, str, str]] = {
    "char_location": ("document_index", "start_char_index", "end_char_index"),
    "page_location": ("document_index", "start_page_number", "end_page_number"),
    "content_block_location": ("document_index", "start_block_index", "end_block_index"),
    "search_result_location": (None, "start_block_index", "end_block_index"),
}

"""anthropic-messages: Anthropic's `/v1/messages`, JSON and SSE, with native citations verified.

    parse.py    a response body → Answer (one content channel, native citations per block)
    stream.py   the event stream → the same Answer, incrementally; native citation spans
    render.py   decisions in the `/v1/messages` shapes; a body re-framed as events
    framer.py   progressive release, claim by claim
    context.py  system and user-turn chunk tags, document and search_result blocks
    fields.py   the field tables
"""

from __future__ import annotations

from gateway.protocols.anthropic_messages.adapter import AnthropicMessages
from gateway.protocols.anthropic_messages.fields import BODY_TABLE, FRAME_TABLE
from gateway.protocols.anthropic_messages.parse import NAME, parse_body, text_block_ranges
from gateway.protocols.anthropic_messages.stream import AnthropicStreamParser

__all__ = [
    "BODY_TABLE",
    "FRAME_TABLE",
    "NAME",
    "AnthropicMessages",
    "AnthropicStreamParser",
    "parse_body",
    "text_block_ranges",
]

"""bedrock-converse: Amazon Bedrock's Converse API, JSON and the binary event-stream.

    parse.py    a Converse response → Answer (channels, native `citationsContent` citations)
    stream.py   ConverseStream events → the same Answer, incrementally; a body → events
    codec.py    event-stream messages ↔ events (gateway/eventstream.py does the framing)
    render.py   decisions in the Converse shapes; the error envelope and its error type
    framer.py   progressive release, claim by claim
    context.py  trusted request places: system, tool results, document / searchResult blocks
    fields.py   the field table
"""

from __future__ import annotations

from gateway.protocols.bedrock.adapter import BedrockConverse
from gateway.protocols.bedrock.parse import NAME

__all__ = ["NAME", "BedrockConverse"]

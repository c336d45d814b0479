"""cohere-chat: Cohere's `/v2/chat`, JSON and SSE, with native span citations verified.

    parse.py    a response body → Answer (channels, native citations of answer spans)
    stream.py   the event stream → the same Answer, incrementally
    render.py   decisions in the `/v2/chat` shapes; a body re-framed as events
    framer.py   progressive release, claim by claim
    context.py  request documents, tool results and trusted chunk tags
    fields.py   the field table; retry.py
"""

from __future__ import annotations

from gateway.protocols.cohere.adapter import CohereChat
from gateway.protocols.cohere.parse import NAME

__all__ = ["NAME", "CohereChat"]

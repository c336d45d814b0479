"""openai-responses: the OpenAI Responses API (`/v1/responses`), JSON and typed SSE.

    parse.py    a response object → Answer (channels, native annotation citations)
    stream.py   the typed event stream → the same Answer, incrementally
    render.py   decisions in the Responses shapes; a body re-framed as events
    framer.py   progressive release, claim by claim
    context.py  trusted request places, file_search results, the `include` rewrite
    fields.py   the field table; retry.py, lint.py
"""

from __future__ import annotations

from gateway.protocols.openai_responses.adapter import OpenAIResponses
from gateway.protocols.openai_responses.parse import NAME

__all__ = ["NAME", "OpenAIResponses"]

"""gemini: the Gemini API's `generateContent` and `streamGenerateContent?alt=sse`.

    parse.py    a GenerateContentResponse → Answer (candidates, thoughts, function calls,
                groundingSupports as native citations; offsets.py converts UTF-8 byte offsets)
    stream.py   SSE chunks → the same Answer (text and grounding metadata accumulated)
    render.py   decisions in Gemini's shapes, supports re-indexed; a body re-framed as chunks
    framer.py   progressive release; context.py trusted request places, grounding chunks
    fields.py   the field table; retry.py `release.retry`
"""

from __future__ import annotations

from gateway.protocols.gemini.adapter import Gemini
from gateway.protocols.gemini.parse import NAME

__all__ = ["NAME", "Gemini"]

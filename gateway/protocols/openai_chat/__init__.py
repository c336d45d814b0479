"""openai-chat: `POST /v1/chat/completions` bodies and `chat.completion.chunk` streams,
with the OpenAI-compatible dialects (docs/protocols.md, "OpenAI-compatible dialects").

    parse.py    a `chat.completion` body → Answer (channels per choice)
    stream.py   the chunk stream → the same Answer, incrementally
    render.py   decisions in the `chat.completion` shape; a body re-framed as a stream
    framer.py   progressive release, claim by claim
    context.py  trusted chunk tags of the request; Perplexity search results of the answer
    fields.py   the field tables of bodies and frames
    chunks.py   Mistral content chunks (a list of text / reference / thinking chunks)

Dialects: OpenRouter `reasoning_details[]` (text-bearing entries are the reasoning channel,
encrypted ones opaque), Perplexity top-level `citations[]` / `search_results[]` (response-side
context for `[N]` markers), Mistral `message.content` as a list of chunks (`text` chunks are
the content channel, `reference` chunks native citations of the text before them, `thinking`
chunks reasoning).
"""

from __future__ import annotations

from gateway.protocols.openai_chat.adapter import OpenAIChat
from gateway.protocols.openai_chat.context import search_chunks
from gateway.protocols.openai_chat.fields import BODY_TABLE, FRAME_TABLE
from gateway.protocols.openai_chat.parse import NAME, parse_body
from gateway.protocols.openai_chat.stream import OpenAIStreamParser

__all__ = [
    "BODY_TABLE",
    "FRAME_TABLE",
    "NAME",
    "OpenAIChat",
    "OpenAIStreamParser",
    "parse_body",
    "search_chunks",
]

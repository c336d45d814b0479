"""Where a gemini exchange carries context (DESIGN §3, docs/protocols.md `## gemini`).

Request: `systemInstruction` text parts (the `system` place) and `functionResponse` parts of
non-model turns (tool results, the `tool` place: every string in their `response`) are trusted
by default; `text` parts of `user` turns are not; `model` turns are never read. Response (routes
whose `context.from` has `response`): each candidate's `groundingChunks`, the retrieval the
upstream did: a `retrievedContext` chunk with its text, a `web` chunk by id only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from gateway.context import Trust, read_tags
from gateway.protocols.gemini.parse import candidate_list, chunk_text, grounding_ids
from gateway.types import Chunk, ContextSet

__all__ = ["grounding_chunks", "request_context", "response_context"]


def _strings(value: object) -> Iterator[str]:
    """String leaves of a JSON value, in document order."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, Mapping):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def _parts(content: object) -> list[Any]:
    if not isinstance(content, Mapping):
        return []
    parts = content.get("parts")
    if isinstance(parts, Mapping):  # a lone part where a list belongs
        return [parts]
    return parts if isinstance(parts, list) else []


def request_context(
    body: Mapping[str, object], ctx: ContextSet, pattern: re.Pattern[str] | None, trust: Trust
) -> None:
    roles = trust.roles
    system = body.get("systemInstruction", body.get("system_instruction"))
    for part in _parts(system):
        if isinstance(part, Mapping) and isinstance(part.get("text"), str):
            read_tags(ctx, part["text"], pattern, trust, "system" in roles)
    contents = body.get("contents")
    for content in contents if isinstance(contents, list) else []:
        if not isinstance(content, Mapping) or content.get("role") == "model":
            continue  # earlier model output is never context
        for part in _parts(content):
            if not isinstance(part, Mapping):
                continue
            response = part.get("functionResponse", part.get("function_response"))
            if isinstance(response, Mapping):
                for text in _strings(response.get("response")):
                    read_tags(ctx, text, pattern, trust, "tool" in roles)
            elif isinstance(part.get("text"), str) and part.get("thought") is not True:
                read_tags(ctx, part["text"], pattern, trust, "user" in roles)


def grounding_chunks(body: Mapping[str, Any]) -> list[Chunk]:
    """The grounding chunks of every candidate, each under its citation id (`grounding_ids`:
    the same ids parse gives the supports that cite them)."""
    out: list[Chunk] = []
    cands = candidate_list(body)
    for cand, ids in zip(cands, grounding_ids(cands), strict=True):
        gm = cand.get("groundingMetadata") if isinstance(cand, Mapping) else None
        chunks = gm.get("groundingChunks") if isinstance(gm, Mapping) else None
        if not isinstance(chunks, list):
            continue
        out.extend(
            Chunk(id=cid, text=chunk_text(chunk)) for cid, chunk in zip(ids, chunks, strict=True)
        )
    return out


def response_context(body: object, ctx: ContextSet) -> None:
    if isinstance(body, Mapping):
        ctx.extend(grounding_chunks(body))

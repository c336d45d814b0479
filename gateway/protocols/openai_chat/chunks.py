"""Mistral content chunks: `message.content` as a list of `text`, `reference` and `thinking`
chunks, read as one content text with native citations, and rebuilt from a text again.

A `reference` chunk cites the text before it: its citations span the last non-space
character of that text (an empty span at 0 when nothing but whitespace precedes it).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.types import Citation

__all__ = [
    "anchor_of",
    "assembled_chunks",
    "chunks_text",
    "native_span",
    "rebuild_chunks",
    "reference_citations",
    "thinking_text",
]

Json = dict[str, Any]


def anchor_of(text: str, at: int) -> int:
    """Where a reference at offset `at` of `text` is attached: its last non-space character
    before `at` (the text before it), or -1 when nothing but whitespace precedes it."""
    i = at - 1
    while i >= 0 and text[i].isspace():
        i -= 1
    return i


def reference_citations(chunk: Mapping[str, object]) -> list[Citation]:
    ids = chunk.get("reference_ids")
    return [
        Citation(id=str(r), raw=f"reference:{r}") for r in (ids if isinstance(ids, list) else [])
    ]


def native_span(at: int, citations: Sequence[Citation]) -> list[tuple[int, int, Citation]]:
    """`citations` spanning the character at `at` (an `anchor_of`; -1: the empty span at 0)."""
    start, end = (at, at + 1) if at >= 0 else (0, 0)
    return [(start, end, c) for c in citations]


def chunks_text(chunks: Sequence[object]) -> tuple[str, tuple[tuple[int, int, Citation], ...]]:
    """The content text of a list of content chunks (its `text` chunks joined in order), and
    each `reference` chunk's citations, spanning the last character of the text before it."""
    parts: list[str] = []
    length = 0
    native: list[tuple[int, int, Citation]] = []
    for chunk in chunks:
        if not isinstance(chunk, Mapping):
            continue
        kind = chunk.get("type")
        if kind == "text" and isinstance(chunk.get("text"), str):
            parts.append(chunk["text"])
            length += len(chunk["text"])
        elif kind == "reference":
            text = "".join(parts)
            native.extend(native_span(anchor_of(text, length), reference_citations(chunk)))
    return "".join(parts), tuple(native)


def thinking_text(chunk: Mapping[str, object]) -> str:
    parts = chunk.get("thinking")
    return "".join(
        p["text"]
        for p in (parts if isinstance(parts, list) else [])
        if isinstance(p, Mapping) and isinstance(p.get("text"), str)
    )


def rebuild_chunks(
    chunks: Sequence[Any], text: str, mapping: Sequence[tuple[int, int, int]]
) -> list[Any]:
    """A partial answer's content chunks: `text` (the rebuilt content) as text chunks, with
    each reference chunk after the kept text it was attached to; references of removed claims
    are dropped. Other chunks (thinking) keep their order, ahead of the text."""
    out: list[Any] = [c for c in chunks if c.get("type") not in ("text", "reference")]
    refs: list[tuple[int, Any]] = []
    seen: list[str] = []
    for c in chunks:
        if c.get("type") == "text":
            seen.append(c["text"])
        elif c.get("type") == "reference":
            joined = "".join(seen)
            refs.append((anchor_of(joined, len(joined)), c))
    cursor = 0

    def emit_text(upto: int) -> None:
        nonlocal cursor
        if upto > cursor:
            out.append({"type": "text", "text": text[cursor:upto]})
            cursor = upto

    if mapping and mapping[0][0] == 0:
        out.extend(copy.deepcopy(c) for anchor, c in refs if anchor < 0)
    for old_s, old_e, new_s in mapping:
        for anchor, c in refs:
            if old_s <= anchor < old_e:
                emit_text(new_s + anchor + 1 - old_s)
                out.append(copy.deepcopy(c))
    emit_text(len(text))
    return out


def assembled_chunks(text: str, chunks: Sequence[tuple[int, Json]]) -> list[Json]:
    """A streamed Mistral content as the JSON API's list: the text cut at each recorded
    chunk's offset into text chunks, the other chunks in between."""
    out: list[Json] = []
    pos = 0
    for offset, chunk in chunks:
        if offset > pos:
            out.append({"type": "text", "text": text[pos:offset]})
            pos = offset
        out.append(chunk)
    if pos < len(text):
        out.append({"type": "text", "text": text[pos:]})
    return out


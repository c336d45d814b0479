"""anthropic-messages request context: chunk tags in `system` and user turns (text, tool
results), and the `document` / `search_result` blocks that native citations name by index.

Documents and search results go to `ContextSet.documents` / `.search_results`; they are not
turned into citable chunk ids (a native citation names its document by index, and a made-up id
such as a title would let a text marker "match" a document the model never cited by id).
`<chunk>` tags inside their text are still read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gateway.context import (
    DEFAULT_TRUST,
    UNTRUSTED_DOCUMENT,
    Trust,
    content_texts,
    read_tags,
    reject,
)
from gateway.types import ContextSet, Document

__all__ = ["request_context"]


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _blocks(content: object) -> tuple[str, ...]:
    """The blocks of a custom-content document or search result, by position: a text block's
    text, and "" for any other block (an image), which `content_block_location` indices count
    too. Dropping it would shift every later block: a citation of the image would read as one
    of the next text block (and the true index of that block would fail)."""
    if isinstance(content, str):
        return (content,)
    if not isinstance(content, list):
        return ()
    return tuple(
        b if isinstance(b, str)
        else str(b["text"]) if (
            isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        else ""
        for b in content
    )


def _doc_from_block(block: Mapping[str, object], index: int) -> Document:
    title = _str(block.get("title"))
    src = block.get("source")
    if not isinstance(src, Mapping):
        return Document(index=index, kind="pdf", title=title)  # unknown source: text unknown
    stype = src.get("type")
    if stype == "text" and isinstance(src.get("data"), str):
        return Document(index=index, kind="text", text=str(src["data"]), title=title)
    if stype == "content":
        blocks = _blocks(src.get("content"))
        return Document(index=index, kind="content", blocks=blocks, title=title)
    url = _str(src.get("url"))
    return Document(index=index, kind="pdf", title=title, source=url)


def _search_result(block: Mapping[str, object], index: int) -> Document:
    title = _str(block.get("title"))
    source = _str(block.get("source"))
    blocks = _blocks(block.get("content"))
    return Document(index=index, kind="search_result", blocks=blocks, title=title, source=source)


def request_context(
    body: Mapping[str, object],
    ctx: ContextSet,
    pattern: re.Pattern[str] | None,
    trust: Trust = DEFAULT_TRUST,
) -> None:
    """Chunks in `system` (role "system") and in user turns (text: "user"; `tool_result`
    blocks: "tool"); `document` / `search_result` blocks of user turns with `trust.documents`.

    `document_index` counts document blocks across all messages; `search_result_index` counts
    search_result blocks, including those inside `tool_result` content. A block that is not
    trusted keeps its number (so later blocks keep theirs) but is not in the context: a native
    citation of it is out of range.
    """
    roles = trust.roles
    for text in content_texts(body.get("system")):
        read_tags(ctx, text, pattern, trust, "system" in roles)
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    numbers = [0, 0]  # the next document_index, search_result_index

    def walk(blocks: object, place: str | None) -> None:
        # `place` None: an assistant (or unknown) turn, only numbered.
        if isinstance(blocks, str):
            if place is not None:
                read_tags(ctx, blocks, pattern, trust, place in roles)
            return
        if not isinstance(blocks, list):
            return
        for block in blocks:
            if not isinstance(block, Mapping):
                continue
            btype = block.get("type")
            if btype == "text":
                text = block.get("text")
                if place is not None and isinstance(text, str):
                    read_tags(ctx, text, pattern, trust, place in roles)
            elif btype == "document":
                index = numbers[0]
                numbers[0] += 1
                if place is None or not trust.documents:
                    reject(ctx, UNTRUSTED_DOCUMENT)
                    continue
                doc = _doc_from_block(block, index)
                ctx.documents.append(doc)
                for t in (doc.text or "", *doc.blocks):
                    read_tags(ctx, t, pattern, trust, True)
            elif btype == "search_result":
                index = numbers[1]
                numbers[1] += 1
                if place is None or not trust.documents:
                    reject(ctx, UNTRUSTED_DOCUMENT)
                    continue
                sr = _search_result(block, index)
                ctx.search_results.append(sr)
                for t in sr.blocks:
                    read_tags(ctx, t, pattern, trust, True)
            elif btype == "tool_result":
                walk(block.get("content"), None if place is None else "tool")

    for msg in messages:
        if isinstance(msg, Mapping):
            walk(msg.get("content"), "user" if msg.get("role") == "user" else None)

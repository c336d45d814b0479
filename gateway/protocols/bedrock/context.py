"""Where a Converse request's context comes from (DESIGN §3), trusted places only.

Chunk tags: `system[]` text blocks (role "system"), `toolResult` content text ("tool"), user
text ("user", not trusted by default); assistant turns are never read. Structured documents:
`document` blocks of user turns, with `context.trust.documents` (default true), numbered in
request order across all messages (`documentIndex`); those with `citations.enabled` are the
ones native citations may point at. `searchResult` blocks (also inside a `toolResult`) are
numbered likewise (`searchResultIndex`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator, Mapping

from gateway.context import DEFAULT_TRUST, UNTRUSTED_DOCUMENT, Trust, read_tags
from gateway.types import ContextSet, Document

__all__ = ["request_context"]

# Document formats whose bytes are text the model reads as such (char offsets index it).
_TEXT_FORMATS = frozenset({"txt", "md", "csv", "html"})


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _texts(blocks: object) -> Iterator[str]:
    """The `text` members of a list of union blocks."""
    if not isinstance(blocks, list):
        return
    for block in blocks:
        if isinstance(block, Mapping) and isinstance(block.get("text"), str):
            yield block["text"]


def _cites(block: Mapping[str, object]) -> bool:
    cfg = block.get("citations")
    return isinstance(cfg, Mapping) and cfg.get("enabled") is True


def document(block: Mapping[str, object], index: int) -> Document:
    """A `document` block as a Document: `source.text` and text-format `source.bytes` are its
    text, `source.content` its chunks; anything else (pdf, docx, S3) has no text we know."""
    name = _str(block.get("name"))
    src = block.get("source")
    if isinstance(src, Mapping):
        if isinstance(src.get("text"), str):
            return Document(index=index, kind="text", text=src["text"], title=name)
        if isinstance(src.get("content"), list):
            blocks = tuple(_texts(src["content"]))
            return Document(index=index, kind="content", blocks=blocks, title=name)
        raw = src.get("bytes")
        if isinstance(raw, str) and block.get("format") in _TEXT_FORMATS:
            try:
                text = base64.b64decode(raw, validate=True).decode("utf-8")
            except (binascii.Error, ValueError):
                text = None
            if text is not None:
                return Document(index=index, kind="text", text=text, title=name)
    return Document(index=index, kind="pdf", title=name)


def _search_result(block: Mapping[str, object], index: int) -> Document:
    return Document(
        index=index,
        kind="search_result",
        blocks=tuple(_texts(block.get("content"))),
        title=_str(block.get("title")),
        source=_str(block.get("source")),
    )


def request_context(
    body: Mapping[str, object],
    ctx: ContextSet,
    pattern: re.Pattern[str] | None,
    trust: Trust = DEFAULT_TRUST,
) -> None:
    roles = trust.roles
    for text in _texts(body.get("system")):
        read_tags(ctx, text, pattern, trust, "system" in roles)
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    numbers = [0, 0]  # the next documentIndex, searchResultIndex

    def add_search_result(block: Mapping[str, object], place: str | None) -> None:
        index = numbers[1]
        numbers[1] += 1
        if place is None or not trust.documents:
            ctx.rejected[UNTRUSTED_DOCUMENT] = ctx.rejected.get(UNTRUSTED_DOCUMENT, 0) + 1
            return
        sr = _search_result(block, index)
        if _cites(block):
            ctx.search_results.append(sr)
        for t in sr.blocks:
            read_tags(ctx, t, pattern, trust, True)

    def walk(blocks: object, place: str | None, top: bool) -> None:
        # `place` None: an assistant (or unknown) turn, only numbered.
        if not isinstance(blocks, list):
            return
        for block in blocks:
            if not isinstance(block, Mapping):
                continue
            text = block.get("text")
            if isinstance(text, str):
                if place is not None:
                    read_tags(ctx, text, pattern, trust, place in roles)
            elif isinstance(block.get("document"), Mapping) and top:
                doc_block: Mapping[str, object] = block["document"]
                index = numbers[0]
                numbers[0] += 1
                if place is None or not trust.documents:
                    ctx.rejected[UNTRUSTED_DOCUMENT] = ctx.rejected.get(UNTRUSTED_DOCUMENT, 0) + 1
                    continue
                doc = document(doc_block, index)
                if _cites(doc_block):
                    ctx.documents.append(doc)
                for t in (doc.text or "", *doc.blocks):
                    read_tags(ctx, t, pattern, trust, True)
            elif isinstance(block.get("searchResult"), Mapping):
                add_search_result(block["searchResult"], place)
            elif isinstance(block.get("toolResult"), Mapping):
                walk(block["toolResult"].get("content"), None if place is None else "tool", False)

    for msg in messages:
        if isinstance(msg, Mapping):
            walk(msg.get("content"), "user" if msg.get("role") == "user" else None, True)

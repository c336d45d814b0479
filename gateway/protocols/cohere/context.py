"""Where a `/v2/chat` request's context comes from (DESIGN §3).

* `documents[]`: structured document blocks, context when `context.trust.documents` (default
  true). A document's chunk id is its own `id`, or the id Cohere assigns one without: `doc:N`,
  N its 0-based position in `documents`. Its text is the string, or the `data` object as the
  model reads it: one `key: value` line per field (other values as JSON).
* Tool results (`role: tool` messages): each content item is a document Cohere cites as a
  `tool` source, id = the item's document `id`, else `<tool_call_id>:<N>` (N its 0-based
  position in the message's content; a string content is item 0). They are context when
  `trust.documents` holds and the tool role is trusted (`tool` in `trust.roles`; with
  `context.signing` roles are not consulted).
* Chunk tags in message text, per `context.trust.roles` / `context.signing` like every
  protocol: `system` and tool results by default, never an `assistant` turn.

An id that two of these sources share with different texts (two documents, a document and a
chunk tag in the system prompt, a tool result or another document, two chunk tags) names
neither (ambiguous): it is left out of the context, so a citation of it is hallucinated. The
model was shown both texts under one id; whichever one a check compared a claim with, the
other could be the one the model read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping

from gateway.context import DEFAULT_TRUST, UNTRUSTED_DOCUMENT, Trust, read_tags
from gateway.types import Chunk, ContextSet

__all__ = ["document_text", "request_context"]


def document_text(data: object) -> str:
    """A document's `data` as text: a string as it is, an object as `key: value` lines."""
    if isinstance(data, str):
        return data
    if not isinstance(data, Mapping):
        return json.dumps(data, ensure_ascii=False)
    lines = []
    for key, value in data.items():
        shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        lines.append(f"{key}: {shown}")
    return "\n".join(lines)


def _texts(content: object) -> Iterator[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                if isinstance(text, str):
                    yield text


def _document(item: object) -> tuple[str | None, str | None]:
    """(own id, text) of a document given as a string or `{id?, data}`."""
    if isinstance(item, str):
        return None, item
    if not isinstance(item, Mapping):
        return None, None
    own = item.get("id")
    data = item.get("data")
    return (own if isinstance(own, str) and own else None), (
        document_text(data) if data is not None else None
    )


def _reject(ctx: ContextSet, n: int = 1) -> None:
    ctx.rejected[UNTRUSTED_DOCUMENT] = ctx.rejected.get(UNTRUSTED_DOCUMENT, 0) + n


class _Every(ContextSet):
    """A context set that keeps every chunk `read_tags` adds, in order, repeated ids too (a
    `ContextSet` keeps the first): the tags are weighed against each other and the
    documents before any goes into the request's context."""

    __slots__ = ("every",)

    def __init__(self) -> None:
        super().__init__()
        self.every: list[Chunk] = []

    def add(self, chunk: Chunk) -> None:
        self.every.append(chunk)


def request_context(
    body: Mapping[str, object],
    ctx: ContextSet,
    pattern: re.Pattern[str] | None,
    trust: Trust = DEFAULT_TRUST,
) -> None:
    tags = _Every()
    docs: list[Chunk] = []
    documents = body.get("documents")
    for n, item in enumerate(documents if isinstance(documents, list) else []):
        own, text = _document(item)
        if not trust.documents:
            _reject(ctx)
            continue
        doc = Chunk(id=own or f"doc:{n}", text=text)
        if not _tags_of_itself(tags, doc, pattern, trust, True):
            docs.append(doc)
    roles = trust.roles
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else []:
        if not isinstance(msg, Mapping):
            continue
        role = msg.get("role")
        if role in ("system", "user"):
            for text in _texts(msg.get("content")):
                read_tags(tags, text, pattern, trust, role in roles)
        elif role == "tool":
            docs.extend(_tool_result(msg, tags, pattern, trust))
    for why, n in tags.rejected.items():
        ctx.rejected[why] = ctx.rejected.get(why, 0) + n
    # Tags first, as they were read: of a tag and a document with one id and the same text,
    # the tag's version is the one kept.
    _add_unambiguous(ctx, [*tags.every, *docs])


def _tool_result(
    msg: Mapping[str, object], ctx: _Every, pattern: re.Pattern[str] | None, trust: Trust
) -> list[Chunk]:
    trusted = "tool" in trust.roles
    counts = trust.documents and (trust.key is not None or trusted)
    call = msg.get("tool_call_id")
    call_id = call if isinstance(call, str) and call else None
    content = msg.get("content")
    items: list[object] = [content] if isinstance(content, str) else (
        content if isinstance(content, list) else []
    )
    out: list[Chunk] = []
    for n, item in enumerate(items):
        own: str | None = None
        text: str | None = None
        if isinstance(item, str):
            text = item
        elif isinstance(item, Mapping) and item.get("type") == "text":
            t = item.get("text")
            text = t if isinstance(t, str) else None
        elif isinstance(item, Mapping) and item.get("type") == "document":
            own, text = _document(item.get("document"))
        else:
            continue
        cid = own or (f"{call_id}:{n}" if call_id is not None else None)
        doc = Chunk(id=cid or "", text=text)
        itself = _tags_of_itself(ctx, doc, pattern, trust, trusted)
        if not counts:
            _reject(ctx)
            continue
        if cid is not None and not itself:
            out.append(doc)
    return out


def _tags_of_itself(
    tags: _Every, doc: Chunk, pattern: re.Pattern[str] | None, trust: Trust, trusted: bool
) -> bool:
    """Read the chunk tags of a document's text; whether one carries the document's own id.
    Such a document wraps its chunk in a tag: one source, not two, and its chunk is the
    tag's (as before documents and tags were weighed against each other)."""
    if doc.text is None:
        return False
    before = len(tags.every)
    read_tags(tags, doc.text, pattern, trust, trusted)
    return any(c.id == doc.id for c in tags.every[before:])


def _add_unambiguous(ctx: ContextSet, chunks: Iterable[Chunk]) -> None:
    """The first chunk of each id, unless another gives that id another text (or none)."""
    first: dict[str, Chunk] = {}
    ambiguous: set[str] = set()
    for c in chunks:
        have = first.setdefault(c.id, c)
        if have.text != c.text:
            ambiguous.add(c.id)
    for cid, c in first.items():
        if cid not in ambiguous:
            ctx.add(c)

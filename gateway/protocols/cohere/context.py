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

An id that two documents share with different texts names neither (ambiguous): it is left out
of the context, so a citation of it is hallucinated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping

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


def request_context(
    body: Mapping[str, object],
    ctx: ContextSet,
    pattern: re.Pattern[str] | None,
    trust: Trust = DEFAULT_TRUST,
) -> None:
    docs: list[tuple[str, str | None]] = []
    documents = body.get("documents")
    for n, item in enumerate(documents if isinstance(documents, list) else []):
        own, text = _document(item)
        if not trust.documents:
            _reject(ctx)
            continue
        docs.append((own or f"doc:{n}", text))
        if text is not None:
            read_tags(ctx, text, pattern, trust, True)
    roles = trust.roles
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else []:
        if not isinstance(msg, Mapping):
            continue
        role = msg.get("role")
        if role in ("system", "user"):
            for text in _texts(msg.get("content")):
                read_tags(ctx, text, pattern, trust, role in roles)
        elif role == "tool":
            docs.extend(_tool_result(msg, ctx, pattern, trust))
    _add_unambiguous(ctx, docs)


def _tool_result(
    msg: Mapping[str, object], ctx: ContextSet, pattern: re.Pattern[str] | None, trust: Trust
) -> list[tuple[str, str | None]]:
    trusted = "tool" in trust.roles
    counts = trust.documents and (trust.key is not None or trusted)
    call = msg.get("tool_call_id")
    call_id = call if isinstance(call, str) and call else None
    content = msg.get("content")
    items: list[object] = [content] if isinstance(content, str) else (
        content if isinstance(content, list) else []
    )
    out: list[tuple[str, str | None]] = []
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
        if text is not None:
            read_tags(ctx, text, pattern, trust, trusted)
        if not counts:
            _reject(ctx)
            continue
        cid = own or (f"{call_id}:{n}" if call_id is not None else None)
        if cid is not None:
            out.append((cid, text))
    return out


def _add_unambiguous(ctx: ContextSet, docs: list[tuple[str, str | None]]) -> None:
    texts: dict[str, set[str | None]] = {}
    for cid, text in docs:
        texts.setdefault(cid, set()).add(text)
    for cid, seen in texts.items():
        if len(seen) == 1:
            (text,) = seen
            ctx.add(Chunk(id=cid, text=text))

"""The context set: every chunk / document the upstream was given, from the trusted side only.

Sources (DESIGN §3): the forwarded request (chunk tags or a policy regex; Anthropic `document`
and `search_result` blocks), a rag-json response's context list, and the upstream's
`x-citewarden-context` / `x-citewarden-context-ids` response headers.

Anthropic documents and search results go to `ContextSet.documents` / `.search_results` for
native citations; they are not turned into citable chunk ids (a native citation names its
document by index, and a made-up id such as a title would let a text marker "match" a
document the model never cited by id). `<chunk>` tags inside their text are still read.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

from gateway import jsonpointer
from gateway.errors import ProtocolError
from gateway.policy import ContextSpec, RagSpec
from gateway.types import Chunk, ContextSet, Document

__all__ = [
    "CONTEXT_HEADER",
    "CONTEXT_IDS_HEADER",
    "anthropic_request_context",
    "build_context",
    "chunks_in_text",
    "compile_chunk_pattern",
    "generic_request_context",
    "header_chunks",
    "openai_request_context",
    "request_context",
    "response_chunks",
]

CONTEXT_HEADER = "x-citewarden-context"
CONTEXT_IDS_HEADER = "x-citewarden-context-ids"

_TAG = re.compile(r"<chunk\b(?P<attrs>[^>]*)>(?P<text>.*?)</chunk\s*>", re.S | re.I)
_ATTR = re.compile(r"""([A-Za-z_][\w:.-]*)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos|#39);")
_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'", "#39": "'"}

# Roles whose message text is trusted input; assistant turns are earlier model output.
_OPENAI_ROLES = frozenset({"system", "developer", "user", "tool", "function"})


def _unescape(s: str) -> str:
    # One pass, so "&amp;lt;" becomes "&lt;" and is not unescaped twice.
    return _ENTITY.sub(lambda m: _ENTITIES[m.group(1)], s)


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    rx = re.compile(pattern, re.S)
    missing = {"id", "text"} - set(rx.groupindex)
    if missing:
        raise ValueError(f"chunk_pattern needs named groups {sorted(missing)}")
    return rx


def compile_chunk_pattern(spec: ContextSpec) -> re.Pattern[str] | None:
    """The policy's chunk regex, compiled once (None = the default `<chunk>` tags)."""
    return _compile(spec.chunk_pattern) if spec.chunk_pattern else None


# Multi-turn chats resend the same system prompt with every turn, and popular documents recur
# across requests: extracting the chunks of one piece of prompt text is cached. Chunks are
# immutable; the bound keeps the cache at a few MiB at most.
_CACHED_TEXT_MAX = 32 * 1024


def chunks_in_text(text: str, pattern: re.Pattern[str] | None = None) -> list[Chunk]:
    """Chunks embedded in one piece of prompt text, in order of appearance."""
    if len(text) > _CACHED_TEXT_MAX:
        return _chunks_in_text(text, pattern)
    return list(_cached_chunks(text, pattern))


@functools.lru_cache(maxsize=128)
def _cached_chunks(text: str, pattern: re.Pattern[str] | None) -> tuple[Chunk, ...]:
    return tuple(_chunks_in_text(text, pattern))


def _chunks_in_text(text: str, pattern: re.Pattern[str] | None) -> list[Chunk]:
    out: list[Chunk] = []
    if pattern is not None:
        for m in pattern.finditer(text):
            cid = m.group("id")
            if not cid:
                continue
            version = m.group("version") if "version" in pattern.groupindex else None
            out.append(Chunk(id=cid, text=m.group("text") or "", version=version or None))
        return out
    if "<" not in text:
        return out
    for m in _TAG.finditer(text):
        attrs: dict[str, str] = {}
        for a in _ATTR.finditer(m.group("attrs")):
            value = a.group(2) if a.group(2) is not None else a.group(3)
            attrs[a.group(1).lower()] = _unescape(value)
        cid = attrs.get("id")
        if not cid:
            continue  # a chunk without an id cannot be cited
        out.append(
            Chunk(
                id=cid,
                text=_unescape(m.group("text")),
                version=attrs.get("version") or None,
                source=attrs.get("source") or None,
            )
        )
    return out


# -- request side ------------------------------------------------------------------------------


def _content_texts(content: object) -> Iterator[str]:
    """Text of a message `content`: a string, or a list of parts / blocks with `text`."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                yield part
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]


def openai_request_context(
    body: Mapping[str, object], ctx: ContextSet, pattern: re.Pattern[str] | None
) -> None:
    """Chunks in the system / developer / user / tool messages of a chat completion request."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for msg in messages:
        role = msg.get("role") if isinstance(msg, Mapping) else None
        if not isinstance(role, str) or role not in _OPENAI_ROLES:
            continue
        for text in _content_texts(msg.get("content")):
            ctx.extend(chunks_in_text(text, pattern))


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _doc_from_block(block: Mapping[str, object], index: int) -> Document:
    title = _str(block.get("title"))
    src = block.get("source")
    if not isinstance(src, Mapping):
        return Document(index=index, kind="pdf", title=title)  # unknown source: text unknown
    stype = src.get("type")
    if stype == "text" and isinstance(src.get("data"), str):
        return Document(index=index, kind="text", text=str(src["data"]), title=title)
    if stype == "content":
        blocks = tuple(_content_texts(src.get("content")))
        return Document(index=index, kind="content", blocks=blocks, title=title)
    url = _str(src.get("url"))
    return Document(index=index, kind="pdf", title=title, source=url)


def _search_result(block: Mapping[str, object], index: int) -> Document:
    title = _str(block.get("title"))
    source = _str(block.get("source"))
    blocks = tuple(_content_texts(block.get("content")))
    return Document(index=index, kind="search_result", blocks=blocks, title=title, source=source)


def anthropic_request_context(
    body: Mapping[str, object], ctx: ContextSet, pattern: re.Pattern[str] | None
) -> None:
    """Chunks in `system` and user turns; `document` / `search_result` blocks in request order.

    `document_index` counts document blocks across all messages; `search_result_index` counts
    search_result blocks, including those inside `tool_result` content.
    """
    for text in _content_texts(body.get("system")):
        ctx.extend(chunks_in_text(text, pattern))
    messages = body.get("messages")
    if not isinstance(messages, list):
        return

    def walk(blocks: object, trusted: bool) -> None:
        if isinstance(blocks, str):
            if trusted:
                ctx.extend(chunks_in_text(blocks, pattern))
            return
        if not isinstance(blocks, list):
            return
        for block in blocks:
            if not isinstance(block, Mapping):
                continue
            btype = block.get("type")
            if btype == "text" and trusted and isinstance(block.get("text"), str):
                ctx.extend(chunks_in_text(str(block["text"]), pattern))
            elif btype == "document":
                doc = _doc_from_block(block, len(ctx.documents))
                ctx.documents.append(doc)
                for t in (doc.text or "", *doc.blocks):
                    ctx.extend(chunks_in_text(t, pattern))
            elif btype == "search_result":
                sr = _search_result(block, len(ctx.search_results))
                ctx.search_results.append(sr)
                for t in sr.blocks:
                    ctx.extend(chunks_in_text(t, pattern))
            elif btype == "tool_result":
                walk(block.get("content"), trusted)

    for msg in messages:
        if isinstance(msg, Mapping):
            walk(msg.get("content"), msg.get("role") != "assistant")


def generic_request_context(body: object, ctx: ContextSet, pattern: re.Pattern[str] | None) -> None:
    """Chunks in every string of an arbitrary JSON request (rag-json)."""
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            ctx.extend(chunks_in_text(node, pattern))
        elif isinstance(node, Mapping):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def request_context(
    protocol: str,
    body: Mapping[str, object],
    spec: ContextSpec,
    ctx: ContextSet | None = None,
) -> ContextSet:
    """The chunks and documents a request carries (added to `ctx` when given)."""
    ctx = ContextSet() if ctx is None else ctx
    pattern = compile_chunk_pattern(spec)
    if protocol == "openai-chat":
        openai_request_context(body, ctx, pattern)
    elif protocol == "anthropic-messages":
        anthropic_request_context(body, ctx, pattern)
    elif protocol == "openai-responses":
        from gateway.protocols.openai_responses import context as responses

        responses.request_context(body, ctx, pattern, spec)
    else:
        generic_request_context(body, ctx, pattern)
    return ctx


# -- response side -----------------------------------------------------------------------------


def _opt_str(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int | float):
        return str(value)
    return None


def response_chunks(body: object, rag: RagSpec) -> list[Chunk]:
    """Chunks of a rag-json response's context list (objects or strings).

    Items without an id get their 1-based position as id, so numeric `[N]` markers resolve.
    A context pointer that resolves to something other than a list is a protocol error.
    """
    if rag.context is None:
        return []
    value = jsonpointer.resolve(body, rag.context)
    if value is jsonpointer.MISSING or value is None:
        return []
    if not isinstance(value, list):
        raise ProtocolError(f"rag-json context at {rag.context!r} is not a list")
    out: list[Chunk] = []
    for pos, item in enumerate(value, start=1):
        if isinstance(item, str):
            out.append(Chunk(id=str(pos), text=item))
        elif isinstance(item, Mapping):
            cid = _opt_str(item.get(rag.context_id)) or str(pos)
            text = item.get(rag.context_text)
            out.append(
                Chunk(
                    id=cid,
                    text=text if isinstance(text, str) else None,
                    version=_opt_str(item.get(rag.context_version)),
                    source=_opt_str(item.get(rag.context_source)),
                )
            )
        else:
            raise ProtocolError(f"rag-json context item {pos} is neither an object nor a string")
    return out


def _header_values(headers: Mapping[str, str] | Iterable[tuple[str, str]], name: str) -> list[str]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    return [v for k, v in items if k.lower() == name]


def _decode_context_header(value: str) -> list[Chunk]:
    raw = value.strip()
    try:
        data = base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_", validate=True)
        items = json.loads(data)
    except (binascii.Error, ValueError) as exc:
        raise ProtocolError(f"{CONTEXT_HEADER} is not base64url JSON") from exc
    if not isinstance(items, list):
        raise ProtocolError(f"{CONTEXT_HEADER} must be a JSON list of chunks")
    out: list[Chunk] = []
    for item in items:
        if not isinstance(item, Mapping) or not isinstance(item.get("id"), str) or not item["id"]:
            raise ProtocolError(f"{CONTEXT_HEADER}: every chunk needs a non-empty string id")
        text, version, source = item.get("text"), item.get("version"), item.get("source")
        for field_name, v in (("text", text), ("version", version), ("source", source)):
            if v is not None and not isinstance(v, str):
                raise ProtocolError(f"{CONTEXT_HEADER}: chunk {field_name} must be a string")
        out.append(Chunk(id=item["id"], text=text, version=version, source=source))
    return out


def _decode_ids_header(value: str) -> list[Chunk]:
    if not value.strip():
        return []
    ids = [p.strip() for p in value.split(",")]
    if any(not i for i in ids):
        raise ProtocolError(f"{CONTEXT_IDS_HEADER} has an empty id")
    return [Chunk(id=i) for i in ids]


def header_chunks(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> list[Chunk]:
    """Chunks from the upstream's context headers; a malformed header raises ProtocolError."""
    out: list[Chunk] = []
    for v in _header_values(headers, CONTEXT_HEADER):
        out.extend(_decode_context_header(v))
    for v in _header_values(headers, CONTEXT_IDS_HEADER):
        out.extend(_decode_ids_header(v))
    return out


def build_context(
    protocol: str,
    spec: ContextSpec,
    *,
    request: Mapping[str, object] | None = None,
    response: object = None,
    headers: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
    rag: RagSpec | None = None,
) -> ContextSet:
    """The context set for one exchange, from the sources `spec.from_` names, in that order."""
    ctx = ContextSet()
    for source in spec.from_:
        if source == "request" and request is not None:
            request_context(protocol, request, spec, ctx)
        elif source == "response" and response is not None and rag is not None:
            ctx.extend(response_chunks(response, rag))
        elif source == "response" and response is not None and protocol == "openai-responses":
            from gateway.protocols.openai_responses import context as responses

            responses.response_context(response, ctx, compile_chunk_pattern(spec), spec)
        elif source == "header" and headers is not None:
            ctx.extend(header_chunks(headers))
    return ctx

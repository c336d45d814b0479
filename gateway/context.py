"""The context set: every chunk / document the upstream was given, from the trusted side only.

Sources (DESIGN §3): the forwarded request (chunk tags or a policy regex; Anthropic `document`
and `search_result` blocks), a rag-json response's context list, and the upstream's
`x-citewarden-context` / `x-citewarden-context-ids` response headers.

In the request, only trusted places count (`context.trust`, docs/protocols.md lists them per
protocol): chunk tags in `system` / `developer` messages and tool results, structured document
blocks of non-assistant turns. Chunk tags a `user` could have typed are not context, and
assistant turns are not read at all. With `context.signing` a chunk tag counts only when it
carries a valid `sig` (HMAC-SHA256, see `chunk_signature`), from any non-assistant place.
What was refused is counted in `ContextSet.rejected` by a reason of REJECT_REASONS.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from gateway import jsonpointer
from gateway.errors import ProtocolError
from gateway.policy import ContextSpec, RagSpec
from gateway.types import Chunk, ContextSet

__all__ = [
    "CONTEXT_HEADER",
    "CONTEXT_IDS_HEADER",
    "DEFAULT_TRUST",
    "REJECT_REASONS",
    "Trust",
    "build_context",
    "chunk_signature",
    "chunks_in_text",
    "content_texts",
    "generic_request_context",
    "header_chunks",
    "request_context",
    "response_chunks",
    "sign_chunk",
    "trust_of",
]

CONTEXT_HEADER = "x-citewarden-context"
CONTEXT_IDS_HEADER = "x-citewarden-context-ids"

# Why a chunk tag or document block of the request is not context (the `why` metric label).
UNTRUSTED_ROLE = "untrusted_role"  # a chunk tag in a place `context.trust.roles` leaves out
UNTRUSTED_DOCUMENT = "untrusted_document"  # a document block with `trust.documents: false`
UNSIGNED = "unsigned"  # with `context.signing`: a chunk tag without `sig`
BAD_SIGNATURE = "bad_signature"  # with `context.signing`: a `sig` that does not verify
REJECT_REASONS = (UNTRUSTED_ROLE, UNTRUSTED_DOCUMENT, UNSIGNED, BAD_SIGNATURE)

# A tag is `<chunk` + attributes up to the first `>` + text up to the first `</chunk\s*>`. It
# is scanned by hand (`_tag_spans`), not by one regex: request text is the client's, and a
# regex with a lazy body or an unbounded attribute run backtracks quadratically on inputs such
# as many unclosed `<chunk` openings (40 KB took 25 s).
_OPEN = re.compile(r"<chunk\b", re.I)
_CLOSE = re.compile(r"</chunk\s*+>", re.I)
# Names start only where no name character precedes, and quantifiers are possessive, so a long
# run of name characters is tried once, not once per position.
_ATTR = re.compile(r"""(?<![\w:.-])([A-Za-z_][\w:.-]*+)\s*+=\s*+(?:"([^"]*+)"|'([^']*+)')""")
_ENTITY = re.compile(r"&(lt|gt|amp|quot|apos|#39);")
_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'", "#39": "'"}

# The separator of the signed fields; never part of a signed id or version.
_SEP = "\x1f"


@dataclass(frozen=True, slots=True)
class Trust:
    """Where chunk tags count (`context.trust` and `context.signing`, resolved at load).

    `roles` are the trusted roles of DESIGN §3 ("tool" = OpenAI `tool` / `function` messages
    and Anthropic `tool_result` blocks); `documents` trusts Anthropic document / search_result
    blocks of non-assistant turns; with a signing `key`, only signed chunk tags count, from any
    non-assistant place, and `roles` is not consulted.
    """

    roles: frozenset[str] = frozenset({"system", "developer", "tool"})
    documents: bool = True
    key: bytes | None = None
    pattern: re.Pattern[str] | None = None  # the compiled `chunk_pattern`; None: `<chunk>` tags


DEFAULT_TRUST = Trust()

# Each policy's ContextSpec is resolved once; keyed by identity (specs are immutable).
_TRUST_BY_SPEC: dict[int, tuple[ContextSpec, Trust]] = {}


def trust_of(spec: ContextSpec) -> Trust:
    """The Trust of a policy's `context:` section."""
    got = _TRUST_BY_SPEC.get(id(spec))
    if got is not None and got[0] is spec:
        return got[1]
    trust = Trust(
        roles=frozenset(spec.trust.roles),
        documents=spec.trust.documents,
        key=spec.signing.key if spec.signing is not None else None,
        pattern=spec.chunk_re,  # a pydantic private attribute: slow to read per request
    )
    if len(_TRUST_BY_SPEC) >= 256:  # reloads retire specs; keep the map bounded
        _TRUST_BY_SPEC.clear()
    _TRUST_BY_SPEC[id(spec)] = (spec, trust)
    return trust


def _unescape(s: str) -> str:
    # One pass, so "&amp;lt;" becomes "&lt;" and is not unescaped twice.
    return _ENTITY.sub(lambda m: _ENTITIES[m.group(1)], s)


# -- signing -----------------------------------------------------------------------------------


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key


def chunk_signature(key: bytes | str, id: str, version: str | None, raw_text: str) -> str:
    """Lowercase hex HMAC-SHA256 under `key` of `id`, `version` ("" when absent) and the tag's
    raw text (as it stands between the tags, entities not decoded), joined by U+001F."""
    msg = _SEP.join((id, version or "", raw_text)).encode("utf-8", "surrogatepass")
    return hmac.digest(_key_bytes(key), msg, "sha256").hex()  # the one-shot C path


def _escape_text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _escape_attr(s: str) -> str:
    return _escape_text(s).replace('"', "&quot;")


def sign_chunk(key: bytes | str, id: str, version: str | None, text: str) -> str:
    """A signed `<chunk id=".." version=".." sig="..">text</chunk>` tag for `text`.

    For applications that put retrieved chunks into the prompt on a route with
    `context.signing`: `key` is the value of the policy's `key_env` variable. `text` is
    escaped (`&`, `<`, `>`), and the signature covers the escaped form the tag carries, so
    the gateway reads back exactly `text`. `version` None (or "") leaves the attribute out.
    """
    if not id:
        raise ValueError("a chunk needs a non-empty id")
    if _SEP in id or _SEP in (version or ""):
        raise ValueError("a signed chunk's id and version cannot contain U+001F")
    raw = _escape_text(text)
    sig = chunk_signature(key, id, version, raw)
    ver = f' version="{_escape_attr(version)}"' if version else ""
    return f'<chunk id="{_escape_attr(id)}"{ver} sig="{sig}">{raw}</chunk>'


def _signature_ok(key: bytes, chunk: Chunk, raw: str, sig: str) -> bool:
    if _SEP in chunk.id or _SEP in (chunk.version or ""):
        return False  # the joined fields would be ambiguous
    want = chunk_signature(key, chunk.id, chunk.version, raw).encode()
    return hmac.compare_digest(want, sig.encode("utf-8", "surrogatepass"))


# -- chunk tags ----------------------------------------------------------------------------------

# Multi-turn chats resend the same system prompt with every turn, and popular documents recur
# across requests: extracting the chunks of one piece of prompt text is cached. Chunks are
# immutable; the bound keeps the cache at a few MiB at most.
_CACHED_TEXT_MAX = 32 * 1024

# Of one tag, besides its chunk: its `sig` attribute (None when absent) and its raw text.
_SigRaw = tuple[str | None, str]


def chunks_in_text(text: str, pattern: re.Pattern[str] | None = None) -> list[Chunk]:
    """Chunks embedded in one piece of prompt text, in order of appearance (unauthenticated:
    the caller decides whether the place is trusted)."""
    if len(text) > _CACHED_TEXT_MAX:
        return _tags(text, pattern)
    return list(_cached_chunks(text, pattern))


@functools.lru_cache(maxsize=128)
def _cached_chunks(text: str, pattern: re.Pattern[str] | None) -> tuple[Chunk, ...]:
    return tuple(_tags(text, pattern))


def _tags(
    text: str, pattern: re.Pattern[str] | None, sigs: list[_SigRaw] | None = None
) -> list[Chunk]:
    """The chunk tags of `text`; with `sigs`, each one's (sig, raw text) appended there too."""
    out: list[Chunk] = []
    if pattern is not None:
        groups = pattern.groupindex
        for m in pattern.finditer(text):
            cid = m.group("id")
            if not cid:
                continue
            version = m.group("version") if "version" in groups else None
            raw = m.group("text") or ""
            out.append(Chunk(id=cid, text=raw, version=version or None))
            if sigs is not None:
                sigs.append((m.group("sig") if "sig" in groups else None, raw))
        return out
    if "<" not in text:
        return out
    for head, raw in _tag_spans(text):
        attrs: dict[str, str] = {}
        for a in _ATTR.finditer(head):
            value = a.group(2) if a.group(2) is not None else a.group(3)
            attrs[a.group(1).lower()] = _unescape(value)
        cid = attrs.get("id")
        if not cid:
            continue  # a chunk without an id cannot be cited
        out.append(
            Chunk(
                id=cid,
                text=_unescape(raw),
                version=attrs.get("version") or None,
                source=attrs.get("source") or None,
            )
        )
        if sigs is not None:
            sigs.append((attrs.get("sig"), raw))
    return out


def _tag_spans(text: str) -> Iterator[tuple[str, str]]:
    """(attributes, raw text) of each `<chunk …>…</chunk>` tag, in linear time."""
    pos = 0
    while True:
        m = _OPEN.search(text, pos)
        if m is None:
            return
        gt = text.find(">", m.end())
        if gt < 0:
            return  # no `>` left: no later tag can open either
        close = _CLOSE.search(text, gt + 1)
        if close is None:
            return  # no close left: no later tag can close either
        yield text[m.end() : gt], text[gt + 1 : close.start()]
        pos = close.end()


# Chunks whose signature verified, and the count of those refused, by reason.
_Signed = tuple[tuple[Chunk, ...], tuple[tuple[str, int], ...]]


def signed_chunks_in_text(text: str, pattern: re.Pattern[str] | None, key: bytes) -> _Signed:
    """The chunk tags of `text` whose `sig` verifies under `key` (their `source`, which the
    signature does not cover, dropped), and how many were refused, by reason."""
    if len(text) > _CACHED_TEXT_MAX:
        return _signed(text, pattern, key)
    return _cached_signed(text, pattern, key)


@functools.lru_cache(maxsize=128)
def _cached_signed(text: str, pattern: re.Pattern[str] | None, key: bytes) -> _Signed:
    return _signed(text, pattern, key)


def _signed(text: str, pattern: re.Pattern[str] | None, key: bytes) -> _Signed:
    good: list[Chunk] = []
    unsigned = bad = 0
    sigs: list[_SigRaw] = []
    for chunk, (sig, raw) in zip(_tags(text, pattern, sigs), sigs, strict=True):
        if sig is None:
            unsigned += 1
        elif _signature_ok(key, chunk, raw, sig):
            good.append(
                chunk if chunk.source is None else Chunk(chunk.id, chunk.text, chunk.version)
            )
        else:
            bad += 1
    refused = tuple((why, n) for why, n in ((UNSIGNED, unsigned), (BAD_SIGNATURE, bad)) if n)
    return tuple(good), refused


def reject(ctx: ContextSet, why: str, n: int = 1) -> None:
    ctx.rejected[why] = ctx.rejected.get(why, 0) + n


def read_tags(
    ctx: ContextSet, text: str, pattern: re.Pattern[str] | None, trust: Trust, trusted: bool
) -> None:
    """Add the chunk tags of one piece of request text from a place trusted or not."""
    if trust.key is not None:
        chunks, refused = signed_chunks_in_text(text, pattern, trust.key)
        ctx.extend(chunks)
        for why, n in refused:
            reject(ctx, why, n)
    elif trusted:
        ctx.extend(chunks_in_text(text, pattern))
    elif pattern is not None or "<" in text:
        n = len(chunks_in_text(text, pattern))
        if n:
            reject(ctx, UNTRUSTED_ROLE, n)


# -- request side ------------------------------------------------------------------------------


def content_texts(content: object) -> Iterator[str]:
    """Text of a message `content`: a string, or a list of strings and `text` parts / blocks.

    A `text` key on a part of another type (an image, a file) is not read: the model is not
    shown it as text.
    """
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, str):
                yield part
            elif (
                isinstance(part, Mapping)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                yield part["text"]


def generic_request_context(
    body: object,
    ctx: ContextSet,
    pattern: re.Pattern[str] | None,
    trust: Trust = DEFAULT_TRUST,
) -> None:
    """Chunk tags in every string of an arbitrary JSON request (rag-json): a rag-json request
    has no trusted place, so only signed tags count (with `context.signing`); others are
    refused as `untrusted_role`."""
    untrusted = Trust(frozenset(), False, trust.key, pattern)
    stack = [body]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            read_tags(ctx, node, pattern, untrusted, False)
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
    from gateway.protocols import get  # the registry imports this module

    ctx = ContextSet() if ctx is None else ctx
    get(protocol).request_context(body, ctx, trust_of(spec))
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
    # Imported here: the adapters import this module (an import cycle at load time).
    from gateway.protocols.fields import loads_unique

    raw = value.strip()
    try:
        data = base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_", validate=True)
        # The upstream's JSON, read as its bodies are: a repeated key or a lone surrogate
        # (which no text can hold) is refused.
        items = loads_unique(data)
    except (binascii.Error, ValueError, ProtocolError) as exc:
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
    prepared: ContextSet | None = None,
) -> ContextSet:
    """The context set for one exchange, from the sources `spec.from_` names, in that order.
    `prepared`: the request's context already read (`request_context`), used in place of
    reading `request` again."""
    ctx = ContextSet()
    for source in spec.from_:
        if source == "request" and prepared is not None:
            ctx.update(prepared)
        elif source == "request" and request is not None:
            request_context(protocol, request, spec, ctx)
        elif source == "response" and response is not None and rag is not None:
            ctx.extend(response_chunks(response, rag))
        elif source == "response" and response is not None:
            # Answers that carry their own retrieval results (file_search results, grounding
            # metadata, Perplexity's search_results) are read by the protocol's adapter.
            from gateway.protocols import get

            get(protocol).response_context(response, ctx, trust_of(spec))
        elif source == "header" and headers is not None:
            ctx.extend(header_chunks(headers))
    return ctx

"""A Converse response body → Answer: the primary text (every `text` block and the text of
every `citationsContent` block, in order), native citations spanning their block's text,
`reasoningContent` and `toolUse.input` channels, and usage."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.base import channel_key
from gateway.protocols.bedrock.fields import BLOCK_MEMBERS, BODY_TABLE
from gateway.protocols.fields import FieldLog, clean
from gateway.types import Answer, Channel, Citation, NativeLocation

__all__ = [
    "CONTENT_PATH",
    "NAME",
    "PRIMARY",
    "block_text",
    "native_citation",
    "parse_body",
    "text_ranges",
]

NAME = "bedrock-converse"
CONTENT_PATH: tuple[str | int, ...] = ("output", "message", "content")
PRIMARY = channel_key(CONTENT_PATH)
Json = dict[str, Any]

# Bedrock location member → (NativeLocation type, index key). Ends are exclusive, as in the
# Anthropic citations Bedrock carries (docs/protocols.md).
_LOCATIONS: dict[str, tuple[Any, str]] = {
    "documentChar": ("char_location", "documentIndex"),
    "documentPage": ("page_location", "documentIndex"),
    "documentChunk": ("content_block_location", "documentIndex"),
    "searchResultLocation": ("search_result_location", "searchResultIndex"),
}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def native_citation(raw: object) -> Citation:
    """A Bedrock citation as a native Citation. One the gateway cannot check against the
    request (a `web` location, an unknown or missing one) points at no document, so it fails
    as `hallucinated_citation`: never released."""
    if not isinstance(raw, Mapping):
        raise ProtocolError("bedrock-converse: citation is not an object")
    pieces = raw.get("sourceContent")
    cited = ""
    if isinstance(pieces, list):
        # Every piece is checked text: one of another shape would ride along unchecked.
        if not all(isinstance(p, Mapping) and type(p.get("text")) is str for p in pieces):
            raise ProtocolError("bedrock-converse: a citation's source content is not text")
        cited = "".join(p["text"] for p in pieces)
    location = raw.get("location")
    if isinstance(location, Mapping) and len(location) == 1:
        (member, loc), = location.items()
        known = _LOCATIONS.get(member)
        if known is not None and isinstance(loc, Mapping):
            kind, index_key = known
            idx = _int(loc.get(index_key))
            start, end = _int(loc.get("start")), _int(loc.get("end"))
            if kind == "search_result_location":
                native = NativeLocation(kind, cited, search_result_index=idx, start=start, end=end)
                cid = f"search_result:{idx}"
            else:
                native = NativeLocation(kind, cited, document_index=idx, start=start, end=end)
                cid = f"document:{idx}"
            return Citation(id=cid, raw=cid, native=native)
    unknown = NativeLocation("char_location", cited, document_index=None)
    return Citation(id="document:?", raw="document:?", native=unknown)


def _member(block: object, bi: int) -> str | None:
    """The one known union member of a content block (None: none the table knows)."""
    if not isinstance(block, Mapping):
        raise ProtocolError(f"bedrock-converse: content block {bi} is not an object")
    members = [k for k in BLOCK_MEMBERS if k in block]
    if len(members) > 1:
        raise ProtocolError(f"bedrock-converse: content block {bi} has several members")
    return members[0] if members else None


def block_text(block: Mapping[str, object]) -> str | None:
    """The primary text a `text` or `citationsContent` block holds, else None."""
    if "text" in block:
        text = block["text"]
        if not isinstance(text, str):
            raise ProtocolError("bedrock-converse: text block without text")
        return text
    cc = block.get("citationsContent")
    if isinstance(cc, Mapping):
        content = cc.get("content")
        if content is None:
            return ""
        if not isinstance(content, list):
            raise ProtocolError("bedrock-converse: citationsContent content is not a list")
        out: list[str] = []
        for piece in content:
            text = piece.get("text") if isinstance(piece, Mapping) else None
            if not isinstance(text, str):
                raise ProtocolError("bedrock-converse: citationsContent text is not a string")
            out.append(text)
        return "".join(out)
    return None


def text_ranges(content: Sequence[object]) -> list[tuple[int, int, int]]:
    """(block index, start, end) of every primary-text block in the concatenated text."""
    out: list[tuple[int, int, int]] = []
    pos = 0
    for bi, block in enumerate(content):
        text = block_text(block) if isinstance(block, Mapping) else None
        if text is not None:
            out.append((bi, pos, pos + len(text)))
            pos += len(text)
    return out


def _message_content(body: Mapping[str, object]) -> list[object]:
    output = body.get("output")
    message = output.get("message") if isinstance(output, Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list):
        raise ProtocolError("bedrock-converse: response has no output.message.content list")
    return content


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping):
        raise ProtocolError("bedrock-converse: response body is not an object")
    for bi, first in enumerate(_message_content(body)):
        _member(first, bi)
    log = FieldLog()
    kept: Json = clean(BODY_TABLE, dict(body), log)  # type: ignore[assignment]
    content = _message_content(kept)
    answer = Answer(protocol=NAME, body=kept)
    answer.unknown_fields.extend(path for _, path in log.unknown)
    answer.dropped.extend(log.dropped)
    usage = kept.get("usage")
    if isinstance(usage, Mapping):
        names = (("inputTokens", "input"), ("outputTokens", "output"), ("totalTokens", "total"))
        for src, dst in names:
            v = _int(usage.get(src))
            if v is not None:
                answer.usage = {**answer.usage, dst: v}
    texts: list[str] = []
    native: list[tuple[int, int, Citation]] = []
    pos = 0
    has_text = False
    for bi, raw_block in enumerate(content):
        member = _member(raw_block, bi)
        block: Mapping[str, Any] = raw_block  # type: ignore[assignment]
        here = (*CONTENT_PATH, bi)
        if member in ("text", "citationsContent"):
            text = block_text(block)
            if text is None:  # a citationsContent the table dropped (wrong shape)
                continue
            has_text = True
            if member == "citationsContent":
                cits = block["citationsContent"].get("citations")
                if isinstance(cits, list):
                    for raw in cits:
                        native.append((pos, pos + len(text), native_citation(raw)))
                elif cits is not None:
                    raise ProtocolError("bedrock-converse: citations is not a list")
            texts.append(text)
            pos += len(text)
        elif member == "reasoningContent":
            rc = block["reasoningContent"]
            rt = rc.get("reasoningText") if isinstance(rc, Mapping) else None
            if isinstance(rt, Mapping) and rt.get("text") is not None:
                if not isinstance(rt["text"], str):
                    raise ProtocolError("bedrock-converse: reasoning text is not a string")
                path = (*here, "reasoningContent", "reasoningText", "text")
                answer.channels.append(Channel("reasoning", path, rt["text"]))
        elif member == "toolUse":
            tu = block["toolUse"]
            if not isinstance(tu, Mapping):
                continue
            inp = tu.get("input")
            text = json.dumps(inp, ensure_ascii=False)
            answer.channels.append(Channel("tool_arguments", (*here, "toolUse", "input"), text))
    if has_text:
        answer.channels.insert(
            0, Channel("content", CONTENT_PATH, "".join(texts), native=tuple(native))
        )
    return answer

"""anthropic-messages: a `POST /v1/messages` response body → Answer.

All text blocks of a message form ONE content channel (their concatenation); each block's
native citations become `Channel.native` spans over that block's range. Thinking blocks and
tool_use inputs are channels of their own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.anthropic_messages.fields import BODY_TABLE, CITATION_FIELDS
from gateway.protocols.fields import FieldLog, clean
from gateway.types import Answer, Channel, Citation, NativeLocation

__all__ = ["CONTENT_PATH", "NAME", "native_citation", "parse_body", "text_block_ranges"]

NAME = "anthropic-messages"
Json = dict[str, Any]
CONTENT_PATH: tuple[str | int, ...] = ("content",)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def native_citation(raw: object) -> Citation | None:
    """A text block citation as a Citation; None for kinds the gateway cannot verify."""
    if not isinstance(raw, Mapping):
        raise ProtocolError("anthropic-messages: citation is not an object")
    ctype = raw.get("type")
    if not isinstance(ctype, str):  # a list or an object would not even hash
        raise ProtocolError("anthropic-messages: citation type is not a string")
    if ctype not in CITATION_FIELDS:
        return None
    doc_key, start_key, end_key = CITATION_FIELDS[ctype]
    kind: Any = ctype  # one of the keys above: NativeLocation's literal types
    cited = raw.get("cited_text")
    if not isinstance(cited, str):
        raise ProtocolError("anthropic-messages: citation without cited_text")
    if doc_key is None:
        idx = _int(raw.get("search_result_index"))
        loc = NativeLocation(
            type="search_result_location",
            cited_text=cited,
            search_result_index=idx,
            start=_int(raw.get(start_key)),
            end=_int(raw.get(end_key)),
        )
        cid = f"search_result:{idx}"
    else:
        idx = _int(raw.get(doc_key))
        loc = NativeLocation(
            type=kind,
            cited_text=cited,
            document_index=idx,
            start=_int(raw.get(start_key)),
            end=_int(raw.get(end_key)),
        )
        cid = f"document:{idx}"
    return Citation(id=cid, raw=cid, native=loc)


def text_block_ranges(content: Sequence[object]) -> list[tuple[int, int, int]]:
    """(block index, start, end) of every text block in the concatenated content text."""
    out: list[tuple[int, int, int]] = []
    pos = 0
    for bi, block in enumerate(content):
        if isinstance(block, Mapping) and block.get("type") == "text":
            n = len(str(block.get("text", "")))
            out.append((bi, pos, pos + n))
            pos += n
    return out


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping) or body.get("type") != "message":
        raise ProtocolError("anthropic-messages: response body is not a message")
    if not isinstance(body.get("content"), list):
        raise ProtocolError("anthropic-messages: message has no content list")
    raw_content: list[object] = body["content"]  # type: ignore[assignment]
    for bi, block in enumerate(raw_content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise ProtocolError(f"anthropic-messages: content block {bi} has no type")
    log = FieldLog()
    kept: Json = clean(BODY_TABLE, dict(body), log)  # type: ignore[assignment]
    content = kept.get("content")
    if not isinstance(content, list):
        raise ProtocolError("anthropic-messages: message has no content list")
    answer = Answer(protocol=NAME, body=kept)
    answer.unknown_fields.extend(path for _, path in log.unknown)
    answer.dropped.extend(log.dropped)
    usage = kept.get("usage")
    if isinstance(usage, Mapping):
        for src, dst in (("input_tokens", "input"), ("output_tokens", "output")):
            v = _int(usage.get(src))
            if v is not None:
                answer.usage = {**answer.usage, dst: v}
        if "input" in answer.usage and "output" in answer.usage:
            answer.usage = {**answer.usage, "total": answer.usage["input"] + answer.usage["output"]}
    texts: list[str] = []
    native: list[tuple[int, int, Citation]] = []
    pos = 0
    has_text = False
    for bi, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise ProtocolError(f"anthropic-messages: content block {bi} has no type")
        btype = str(block["type"])
        if btype == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise ProtocolError("anthropic-messages: text block without text")
            has_text = True
            cits = block.get("citations")
            if isinstance(cits, list):
                for raw in cits:
                    cit = native_citation(raw)  # None: a kind the table left unknown
                    if cit is not None:
                        native.append((pos, pos + len(text), cit))
            elif cits is not None:
                raise ProtocolError("anthropic-messages: citations is not a list")
            texts.append(text)
            pos += len(text)
        elif btype == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise ProtocolError("anthropic-messages: thinking block without thinking")
            answer.channels.append(Channel("reasoning", ("content", bi, "thinking"), thinking))
        elif btype == "tool_use":
            inp = block.get("input")
            if not isinstance(inp, Mapping):
                raise ProtocolError("anthropic-messages: tool_use block without input object")
            text = json.dumps(inp, ensure_ascii=False)
            answer.channels.append(Channel("tool_arguments", ("content", bi, "input"), text))
    if has_text:
        answer.channels.insert(
            0, Channel("content", CONTENT_PATH, "".join(texts), native=tuple(native))
        )
    return answer

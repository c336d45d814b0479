"""A `/v2/chat` response body → the protocol-neutral Answer.

Channels: each `text` item of `message.content` (path `("text", n)`, the n-th text item, so the
first one has the same name in every answer and a stream verifier can follow it), `thinking`
items and `tool_plan` (reasoning), `tool_calls[].function.arguments`. Native citations become
spans of the channel they cite: `start` / `end` are code-point offsets into that item's text
(`content_index`; `type: PLAN` cites `tool_plan`), and `text` must equal that slice, else each
of the citation's sources is a malformed citation. Offsets outside the text make the body
ambiguous (ProtocolError).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.cohere.fields import BODY_TABLE, is_source_id
from gateway.protocols.fields import FieldLog, clean, is_index
from gateway.types import Answer, Channel, Citation

__all__ = [
    "MISMATCH",
    "NAME",
    "TEXT",
    "citation_target",
    "content_index",
    "parse_body",
    "text_items",
    "valid_sources",
]

NAME = "cohere-chat"
TEXT = "text"  # first element of a text item's channel path: ("text", n)
MISMATCH = "citation text is not the answer's span at its offsets"

Json = dict[str, Any]
Path = tuple[str | int, ...]


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def content_index(citation: Mapping[str, Any]) -> int | None:
    """A citation's `content_index`: None when absent (the first item of its kind), else a
    non-negative integer. Any other value (`true`, `"0"`, `-1`, `0.0`) names no item for sure
    (`true == 1` in one reader, absent in another), so it is refused, in a body and a stream
    alike."""
    v = citation.get("content_index")
    if v is None:
        return None
    if not is_index(v):
        raise ProtocolError("cohere-chat: a citation's content_index is not an index")
    return v


def _content(body: Mapping[str, Any]) -> list[Any]:
    message = body.get("message")
    content = message.get("content") if isinstance(message, Mapping) else None
    return content if isinstance(content, list) else []


def text_items(body: Mapping[str, Any]) -> list[int]:
    """Content indices of the text items, in order: entry n is channel ("text", n)."""
    return [
        i for i, item in enumerate(_content(body))
        if isinstance(item, Mapping) and item.get("type") == "text"
    ]


def citation_target(
    body: Mapping[str, Any], citation: Mapping[str, Any]
) -> tuple[str | int, ...] | None:
    """The body path of the text a citation's offsets index: a content item's `text` /
    `thinking`, or `tool_plan`; None when it names nothing there."""
    ctype = citation.get("type", "TEXT_CONTENT")
    message = body.get("message")
    if not isinstance(message, Mapping):
        return None
    if ctype == "PLAN":
        return ("message", "tool_plan") if isinstance(message.get("tool_plan"), str) else None
    want = "thinking" if ctype == "THINKING_CONTENT" else "text"
    content = _content(body)
    index = _int(citation.get("content_index"))
    if index is None:
        # Without content_index a citation indexes the first item of its kind.
        index = next(
            (
                i for i, it in enumerate(content)
                if isinstance(it, Mapping) and it.get("type") == want
            ),
            None,
        )
    if index is None or not 0 <= index < len(content):
        return None
    item = content[index]
    if not isinstance(item, Mapping) or item.get("type") != want:
        return None
    return ("message", "content", index, want)


def _at(body: Mapping[str, Any], path: Sequence[str | int]) -> Any:
    node: Any = body
    for p in path:
        node = node[p]
    return node


def valid_sources(citation: Mapping[str, Any]) -> list[Json]:
    sources = citation.get("sources")
    return [
        s for s in (sources if isinstance(sources, list) else [])
        if isinstance(s, dict)
        and s.get("type") in ("document", "tool")
        and is_source_id(s.get("id"))
    ]


def _citations(
    body: Mapping[str, Any], citations: object
) -> dict[tuple[str | int, ...], list[tuple[int, int, Citation]]]:
    """Native spans per cited body path."""
    out: dict[tuple[str | int, ...], list[tuple[int, int, Citation]]] = {}
    if citations is None:
        return out
    if not isinstance(citations, list):
        raise ProtocolError("cohere-chat: citations is not a list")
    for c in citations:
        if not isinstance(c, Mapping):
            raise ProtocolError("cohere-chat: a citation is not an object")
        target = citation_target(body, c)
        if target is None:
            raise ProtocolError("cohere-chat: a citation names no content of the answer")
        text: str = _at(body, target)
        s, e = _int(c.get("start")), _int(c.get("end"))
        if s is None or e is None or not 0 <= s <= e <= len(text):
            raise ProtocolError("cohere-chat: citation offsets outside the cited text")
        problem = None if c.get("text") == text[s:e] else MISMATCH
        cits: list[Citation] = []
        sources = c.get("sources")
        for src in sources if isinstance(sources, list) else []:
            sid = src.get("id") if isinstance(src, Mapping) else None
            if is_source_id(sid):
                cits.append(Citation(id=str(sid), raw=str(sid), malformed=problem))
            else:
                cits.append(Citation(id="", raw="", malformed="a citation source without an id"))
        if problem is not None and not cits:
            cits.append(Citation(id="", raw="", malformed=problem))
        out.setdefault(target, []).extend((s, e, cit) for cit in cits)
    return out


def _usage(body: Mapping[str, Any]) -> dict[str, int]:
    usage = body.get("usage")
    tokens = usage.get("tokens") if isinstance(usage, Mapping) else None
    if not isinstance(tokens, Mapping):
        tokens = usage.get("billed_units") if isinstance(usage, Mapping) else None
    if not isinstance(tokens, Mapping):
        return {}
    out: dict[str, int] = {}
    for src, dst in (("input_tokens", "input"), ("output_tokens", "output")):
        v = tokens.get(src)
        if type(v) is int or (type(v) is float and v.is_integer()):
            out[dst] = int(v)
    if "input" in out and "output" in out:
        out["total"] = out["input"] + out["output"]
    return out


_LOGPROB_KEYS = frozenset({"text", "token_ids", "logprobs"})
_INT_TYPES = frozenset({int})
_NUMBER_TYPES = frozenset({int, float})


def _logprobs(lps: object, dropped: list[tuple[str, Path]]) -> list[Json] | None:
    """`logprobs` of the shape the API defines, `[{text, token_ids, logprobs}]`: a string, a
    list of integers and (unless absent or null) as many numbers. Other keys of an entry are
    cut; any other value drops the whole list (its entries are read together, their texts
    joined): no prose reaches a client through a field `channels.logprobs` takes for numbers.
    Each removal is recorded, so a stream holding one is re-framed, never relayed."""
    if type(lps) is not list:
        dropped.append(("top", ("logprobs",)))
        return None
    out: list[Json] = []
    for n, x in enumerate(lps):
        if type(x) is not dict:
            dropped.append(("top", ("logprobs",)))
            return None
        ids, probs = x.get("token_ids"), x.get("logprobs")
        # Type sets, not a generator per value: an answer has an entry per few tokens.
        if (
            type(x.get("text")) is not str
            or type(ids) is not list
            or not set(map(type, ids)) <= _INT_TYPES
            or (probs is not None and (
                type(probs) is not list
                or len(probs) != len(ids)
                or not set(map(type, probs)) <= _NUMBER_TYPES
            ))
        ):
            dropped.append(("top", ("logprobs",)))
            return None
        if x.keys() <= _LOGPROB_KEYS:
            out.append(x)
            continue
        for key in x:
            if key not in _LOGPROB_KEYS:
                dropped.append(("top", ("logprobs", n, key)))
        out.append({k: v for k, v in x.items() if k in _LOGPROB_KEYS})
    return out


def _check_shape(body: Mapping[str, object]) -> None:
    """What the table cannot drop without moving indices a citation relies on."""
    message = body.get("message")
    if not isinstance(message, Mapping):
        raise ProtocolError("cohere-chat: response has no message object")
    content = message.get("content")
    if content is None:
        return
    if not isinstance(content, list):
        raise ProtocolError("cohere-chat: message content is not a list")
    for item in content:
        if not isinstance(item, Mapping) or not isinstance(item.get("type"), str):
            raise ProtocolError("cohere-chat: a content item without a type")
        kind = item["type"]
        if kind in ("text", "thinking") and not isinstance(item.get(kind), str):
            raise ProtocolError(f"cohere-chat: a {kind} item without its text")
    citations = message.get("citations")
    for c in citations if isinstance(citations, list) else []:
        if isinstance(c, Mapping):
            content_index(c)


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping):
        raise ProtocolError("cohere-chat: response body is not a JSON object")
    _check_shape(body)
    log = FieldLog()
    kept: Json = clean(BODY_TABLE, dict(body), log)  # type: ignore[assignment]
    answer = Answer(protocol=NAME, body=kept, usage=_usage(kept))
    answer.unknown_fields.extend(path for _, path in log.unknown)
    answer.dropped.extend(log.dropped)
    message: Json = kept["message"]
    spans = _citations(kept, message.get("citations"))
    if kept.get("logprobs") is not None:
        lps = _logprobs(kept["logprobs"], answer.dropped)
        if lps is None:
            del kept["logprobs"]
        else:
            kept["logprobs"] = lps
    answer.has_logprobs = bool(kept.get("logprobs"))
    content = _content(kept)
    n = 0
    for i, item in enumerate(content):
        if isinstance(item, Mapping) and item.get("type") == "text":
            path: Path = ("message", "content", i, "text")
            native = tuple(sorted(spans.get(path, []), key=lambda x: (x[0], x[1])))
            answer.channels.append(Channel("content", (TEXT, n), item["text"], native=native))
            n += 1
    for i, item in enumerate(content):
        if isinstance(item, Mapping) and item.get("type") == "thinking":
            path = ("message", "content", i, "thinking")
            native = tuple(spans.get(path, []))
            answer.channels.append(Channel("reasoning", path, item["thinking"], native=native))
    plan = message.get("tool_plan")
    if isinstance(plan, str):
        path = ("message", "tool_plan")
        answer.channels.append(Channel("reasoning", path, plan, native=tuple(spans.get(path, []))))
    calls = message.get("tool_calls")
    for k, call in enumerate(calls if isinstance(calls, list) else []):
        fn = call.get("function") if isinstance(call, Mapping) else None
        args = fn.get("arguments") if isinstance(fn, Mapping) else None
        if args is not None and not isinstance(args, str):
            raise ProtocolError("cohere-chat: tool call arguments are not a string")
        path = ("message", "tool_calls", k, "function", "arguments")
        answer.channels.append(Channel("tool_arguments", path, args or ""))
    return answer

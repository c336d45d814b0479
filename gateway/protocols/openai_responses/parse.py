"""A Responses API `response` object → the protocol-neutral Answer.

Channels: each `output_text` part of a `message` item (path `("output_text", n)`, the n-th such
part of the answer in output order, so the first one has the same name in every answer and a
stream verifier can follow it), `refusal` parts, `function_call` arguments, `custom_tool_call`
input, `reasoning` summary and content text, `file_search_call` queries and `web_search_call`
actions. Native annotations become citations on the claims they point at.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.openai_responses.context import client_request, client_wants_encrypted
from gateway.protocols.openai_responses.fields import (
    ANNOTATION_KEYS,
    ANNOTATION_SHAPES,
    BLANKED,
    ECHOES,
    ITEM_KEYS,
    ITEM_SHAPES,
    PART_KEYS,
    RESULT_KEYS,
    RESULT_SHAPES,
    TOP_KEYS,
    annotation_field_ok,
    attribute_ok,
    shape_ok,
)
from gateway.types import Answer, Channel, Citation

__all__ = [
    "NAME",
    "TEXT",
    "annotation_unknown",
    "cited_position",
    "parse_body",
    "text_parts",
    "top_unknown",
]

NAME = "openai-responses"
TEXT = "output_text"  # first element of an output_text channel's path

Json = dict[str, Any]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def text_parts(body: Mapping[str, object]) -> list[tuple[int, int]]:
    """(item index, part index) of every output_text part, in answer order: entry n is the
    part whose channel path is ("output_text", n)."""
    out: list[tuple[int, int]] = []
    output = body.get("output")
    for i, item in enumerate(output if isinstance(output, list) else []):
        if not isinstance(item, Mapping) or item.get("type") != "message":
            continue
        content = item.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, Mapping) and part.get("type") == "output_text":
                out.append((i, j))
    return out


def cited_position(text: str, index: int) -> int:
    """Where a `file_citation`'s claim ends: its `index` points just after the claim, possibly
    past the whitespace that follows it."""
    k = min(max(index, 0), len(text))
    while k > 0 and text[k - 1].isspace():
        k -= 1
    return k


def _citation(cid: object, key: str) -> Citation:
    """A native citation naming chunk `cid`; a value of the wrong shape is malformed."""
    if shape_ok(ANNOTATION_SHAPES, key, cid) and isinstance(cid, str):
        return Citation(id=cid, raw=cid)
    shown = cid if isinstance(cid, str) else json.dumps(cid)
    return Citation(id=str(shown), raw=str(shown), malformed=f"annotation {key} has a bad shape")


def annotation_unknown(
    ann: Mapping[str, object], apath: tuple[str | int, ...]
) -> list[tuple[str | int, ...]]:
    """The paths of an annotation that do not go out as they are: the whole annotation when
    its type is unknown or an id, URL or offset of it has another shape (a file_path's
    `file_id` could carry a sentence), else its unknown keys, its `title` (web page text)
    and a `filename` that is not shaped like one (both blanked)."""
    atype = ann.get("type")
    if not isinstance(atype, str) or atype not in ANNOTATION_KEYS:
        return [apath]
    known = ANNOTATION_KEYS[atype]
    out: list[tuple[str | int, ...]] = []
    for key, value in ann.items():
        if key not in known or key == "title":
            out.append((*apath, key))
        elif not annotation_field_ok(atype, key, value):
            if key not in BLANKED:
                return [apath]
            out.append((*apath, key))
    return out


def annotation_spans(
    text: str,
    annotations: object,
    where: tuple[str | int, ...],
    unknown: list[tuple[str | int, ...]],
) -> list[tuple[int, int, Citation]]:
    """The (start, end, citation) spans of an output_text part's citing annotations. Offsets
    outside the text make the part ambiguous (ProtocolError)."""
    if annotations is None:
        return []
    if not isinstance(annotations, list):
        raise ProtocolError("openai-responses: annotations is not a list")
    spans: list[tuple[int, int, Citation]] = []
    n = len(text)
    for k, ann in enumerate(annotations):
        if not isinstance(ann, Mapping) or not isinstance(ann.get("type"), str):
            raise ProtocolError("openai-responses: annotation without a type")
        atype = str(ann["type"])
        apath = (*where, "annotations", k)
        unknown.extend(annotation_unknown(ann, apath))
        if atype not in ANNOTATION_KEYS:
            continue
        if atype in ("url_citation", "container_file_citation"):
            s, e = _int(ann.get("start_index")), _int(ann.get("end_index"))
            if s is None or e is None or not 0 <= s <= e <= n:
                raise ProtocolError(f"openai-responses: {atype} offsets outside the text")
            key = "url" if atype == "url_citation" else "file_id"
            spans.append((s, e, _citation(ann.get(key), key)))
        else:  # file_citation, file_path: a point in the text
            idx = _int(ann.get("index"))
            if idx is None or not 0 <= idx <= n:
                raise ProtocolError(f"openai-responses: {atype} index outside the text")
            if atype == "file_citation":
                k_end = cited_position(text, idx)
                if k_end > 0:
                    spans.append((k_end - 1, k_end, _citation(ann.get("file_id"), "file_id")))
    return spans


_ABSENT = object()


def top_unknown(body: Mapping[str, object]) -> list[tuple[str | int, ...]]:
    """Top-level fields that do not go out as they are: unknown, of the wrong shape, or an echo
    of the request that is neither a bare setting nor what this exchange's client sent."""
    out: list[tuple[str | int, ...]] = []
    request: Mapping[str, object] | None = None
    for key, value in body.items():
        if key not in TOP_KEYS or not TOP_KEYS[key](value):
            out.append((key,))
            continue
        echo = ECHOES.get(key)
        if echo is not None and not echo[0](value):
            if request is None:
                request = client_request()
            if request.get(key, _ABSENT) != value:
                out.append((key,))
    return out


def _result_unknown(
    results: Sequence[object], where: tuple[str | int, ...]
) -> list[tuple[str | int, ...]]:
    """The paths of file_search results that do not go out as they are: a whole entry that is
    not an object with a `file_id`, else its unknown keys, keys of the wrong shape, and
    attributes that are not scalars."""
    out: list[tuple[str | int, ...]] = []
    for r, result in enumerate(results):
        rpath = (*where, r)
        if not isinstance(result, Mapping) or not shape_ok(
            RESULT_SHAPES, "file_id", result.get("file_id")
        ):
            out.append(rpath)
            continue
        for key, value in result.items():
            if key not in RESULT_KEYS or not shape_ok(RESULT_SHAPES, key, value):
                out.append((*rpath, key))
            elif key == "attributes" and value:
                out.extend((*rpath, key, k) for k, x in value.items() if not attribute_ok(k, x))
    return out


def _str(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(f"openai-responses: {what} is not a string")
    return value


def _usage(body: Mapping[str, object]) -> dict[str, int]:
    u = body.get("usage")
    if not isinstance(u, Mapping):
        return {}
    out: dict[str, int] = {}
    names = (("input_tokens", "input"), ("output_tokens", "output"), ("total_tokens", "total"))
    for src, dst in names:
        v = _int(u.get(src))
        if v is not None:
            out[dst] = v
    return out


def _items(output: Sequence[object]) -> Iterator[tuple[int, Mapping[str, Any], str]]:
    for i, item in enumerate(output):
        if not isinstance(item, Mapping) or not isinstance(item.get("type"), str):
            raise ProtocolError(f"openai-responses: output item {i} has no type")
        yield i, item, str(item["type"])


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping):
        raise ProtocolError("openai-responses: response body is not a JSON object")
    if body.get("object") != "response":
        raise ProtocolError("openai-responses: the body is not a response object")
    output = body.get("output")
    if output is None:
        output = []
    if not isinstance(output, list):
        raise ProtocolError("openai-responses: output is not a list")
    answer = Answer(protocol=NAME, body=dict(body), usage=_usage(body))
    unknown = answer.unknown_fields
    unknown.extend(top_unknown(body))
    n_text = 0
    for i, item, itype in _items(output):
        known = ITEM_KEYS.get(itype)
        if known is None:
            unknown.append(("output", i))
            continue
        for key, value in item.items():
            if key not in known or not shape_ok(ITEM_SHAPES, key, value) or (
                key == "encrypted_content" and value is not None and not client_wants_encrypted()
            ):
                unknown.append(("output", i, key))
        if itype == "message":
            content = item.get("content")
            if not isinstance(content, list):
                raise ProtocolError("openai-responses: message without a content list")
            for j, part in enumerate(content):
                where = ("output", i, "content", j)
                if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                    raise ProtocolError("openai-responses: content part without a type")
                ptype = str(part["type"])
                pkeys = PART_KEYS.get(ptype)
                if pkeys is None:
                    unknown.append(where)
                    continue
                for key in part:
                    if key not in pkeys:
                        unknown.append((*where, key))
                if ptype == "output_text":
                    text = _str(part.get("text"), "output_text text")
                    spans = annotation_spans(text, part.get("annotations"), where, unknown)
                    if part.get("logprobs"):
                        answer.has_logprobs = True
                    answer.channels.append(
                        Channel("content", (TEXT, n_text), text, native=tuple(spans))
                    )
                    n_text += 1
                else:
                    text = _str(part.get("refusal"), "refusal")
                    answer.channels.append(Channel("refusal", (*where, "refusal"), text))
        elif itype == "function_call":
            args = _str(item.get("arguments", ""), "function_call arguments")
            answer.channels.append(Channel("tool_arguments", ("output", i, "arguments"), args))
        elif itype == "custom_tool_call":
            inp = _str(item.get("input", ""), "custom_tool_call input")
            answer.channels.append(Channel("tool_arguments", ("output", i, "input"), inp))
        elif itype == "reasoning":
            for field, ptype in (("summary", "summary_text"), ("content", "reasoning_text")):
                parts = item.get(field)
                if parts is None:
                    continue
                if not isinstance(parts, list):
                    raise ProtocolError(f"openai-responses: reasoning {field} is not a list")
                for k, part in enumerate(parts):
                    if not isinstance(part, Mapping) or part.get("type") != ptype:
                        unknown.append(("output", i, field, k))
                        continue
                    text = _str(part.get("text"), f"reasoning {field} text")
                    path = ("output", i, field, k, "text")
                    answer.channels.append(Channel("reasoning", path, text))
        elif itype == "file_search_call":
            queries = item.get("queries") or []
            if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
                raise ProtocolError("openai-responses: file_search_call queries are not strings")
            text = json.dumps(queries, ensure_ascii=False)
            answer.channels.append(Channel("tool_arguments", ("output", i, "queries"), text))
            results = item.get("results")
            if results is not None and not isinstance(results, list):
                raise ProtocolError("openai-responses: file_search_call results is not a list")
            unknown.extend(_result_unknown(results or [], ("output", i, "results")))
        elif itype == "web_search_call":
            action = item.get("action")
            if action is not None:
                text = json.dumps(action, ensure_ascii=False)
                answer.channels.append(Channel("tool_arguments", ("output", i, "action"), text))
    return answer

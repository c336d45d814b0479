"""Decisions in the `/v2/chat` shapes: the released body under the field and channel rules,
partial answers whose citations stay consistent (a citation of a removed claim is dropped, the
others move with their text, each `text` still the answer's slice at its offsets), the
abstention template as a normal answer, and a body re-framed as the typed event stream.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.policy import Policy
from gateway.protocols.base import (
    disclosure_after,
    field_allowed,
    leaks,
    rebuild_with_map,
    split_claims,
)
from gateway.protocols.cohere.fields import FINISH_REASONS, usage_ok
from gateway.protocols.cohere.parse import TEXT, citation_target, text_items, valid_sources
from gateway.protocols.fields import is_token
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, Outcome

__all__ = [
    "abstained_body",
    "citation_json",
    "message_start",
    "partial_body",
    "released_body",
    "remap",
    "to_events",
]

Json = dict[str, Any]
# (old start, old end, new start) of each piece of a rebuilt text
Mapping_ = Sequence[tuple[int, int, int]]


def remap(start: int, end: int, mapping: Mapping_) -> tuple[int, int] | None:
    """A span's offsets in the rebuilt text, when it lies whole inside one kept piece."""
    for old_s, old_e, new_s in mapping:
        if old_s <= start and end <= old_e:
            return new_s + (start - old_s), new_s + (end - old_s)
    return None


def citation_json(c: Mapping[str, Any], start: int, end: int, text: str) -> Json:
    """A citation as released: its known fields only, sources reduced to `type` and `id`."""
    out: Json = {"start": start, "end": end, "text": text}
    out["sources"] = [{"type": s["type"], "id": s["id"]} for s in valid_sources(c)]
    for key in ("type", "content_index"):
        if key in c:
            out[key] = c[key]
    return out


def _allowed_source_keys(c: Mapping[str, Any], k: int, policy: Policy) -> list[Json]:
    """Sources with the fields they may keep: type, id, and allow-listed unknown fields (the
    echoed `document` / `tool_output` among them)."""
    sources = c.get("sources")
    out: list[Json] = []
    for j, s in enumerate(sources if isinstance(sources, list) else []):
        if s not in valid_sources({"sources": [s]}):
            continue
        kept: Json = {"type": s["type"], "id": s["id"]}
        for key, value in s.items():
            path = ("message", "citations", k, "sources", j, key)
            if key not in kept and field_allowed(path, policy):
                kept[key] = value
        out.append(kept)
    return out


def _logprobs(lps: object, texts: Sequence[str], rule: str, changed: bool) -> object:
    """`channels.logprobs`: `pass` keeps them (unless the text changed), `withhold` drops them,
    `verify` keeps them only when their texts spell the released text exactly."""
    if lps is None or rule == "withhold" or changed:
        return None
    if rule == "pass":
        return lps
    if not isinstance(lps, list):
        return None
    pieces = [x.get("text") if isinstance(x, Mapping) else None for x in lps]
    if not all(isinstance(p, str) for p in pieces) or "".join(pieces) != "".join(texts):  # type: ignore[arg-type]
        return None
    return [
        {k: v for k, v in x.items() if k in ("text", "token_ids", "logprobs")} for x in lps
    ]


def released_body(
    answer: Answer,
    policy: Policy,
    edits: Mapping[int, tuple[str, Mapping_]] | None = None,
    drop_reasoning: set[tuple[str | int, ...]] | None = None,
    drop_calls: set[int] | None = None,
    refused: Mapping[int, set[tuple[int, int]]] | None = None,
) -> Json:
    """The body under the field and channel rules. `edits` maps a content index to its rebuilt
    text and piece mapping; `drop_reasoning` / `drop_calls` remove more channels; `refused`
    maps a content index to the spans whose citations no kept claim may carry."""
    src = answer.body
    edits = edits or {}
    ch = policy.channels
    body: Json = copy.deepcopy(dict(src))
    message: Json = body["message"]
    content: list[Any] = list(message.get("content") or [])
    gone: set[int] = set()  # content indices removed
    for path in sorted(answer.unknown_fields, key=len, reverse=True):
        if path[0] == "stream" or field_allowed(path, policy):
            continue
        if path[:2] == ("message", "citations"):
            continue  # citations are rebuilt below from their known fields
        if path[:2] == ("message", "content") and len(path) == 3:
            gone.add(int(path[2]))  # a whole item of an unknown type: removed below
            continue
        node: Any = body
        try:
            for p in path[:-1]:
                node = node[p]
        except (KeyError, IndexError, TypeError):
            continue
        if isinstance(node, dict):
            node.pop(path[-1], None)
        elif isinstance(node, list) and isinstance(path[-1], int):
            node[path[-1]] = None
    drop_reasoning = drop_reasoning or set()
    plan_gone = ch.reasoning == "withhold" or ("message", "tool_plan") in drop_reasoning
    for i, item in enumerate(content):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "thinking" and (
            ch.reasoning == "withhold" or ("message", "content", i, "thinking") in drop_reasoning
        ):
            gone.add(i)
        elif item.get("type") == "text" and i in edits:
            content[i] = {**item, "text": edits[i][0]}
    if plan_gone:
        message.pop("tool_plan", None)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        if ch.tool_calls == "withhold":
            message.pop("tool_calls")
        else:
            dropped = drop_calls or set()
            left = [c for k, c in enumerate(calls) if k not in dropped and c is not None]
            if left or not calls:
                message["tool_calls"] = left
            else:
                message.pop("tool_calls")
    # Content indices after the removals.
    new_index: dict[int, int] = {}
    for i in range(len(content)):
        if i not in gone:
            new_index[i] = len(new_index)
    kept_content = [content[i] for i in sorted(new_index)]
    if "content" in message:
        message["content"] = kept_content
    src_message: Json = src["message"]  # type: ignore[assignment]
    citations = src_message.get("citations")
    if isinstance(citations, list):
        message["citations"] = _citations(
            src, body, citations, edits, gone, new_index, plan_gone, policy, refused or {}
        )
    texts = [it["text"] for it in kept_content if isinstance(it, dict) and it.get("type") == "text"]
    lps = _logprobs(body.get("logprobs"), texts, ch.logprobs, changed=bool(edits))
    if lps is None:
        body.pop("logprobs", None)
    else:
        body["logprobs"] = lps
    if body.get("finish_reason") == "TOOL_CALL" and not message.get("tool_calls"):
        body["finish_reason"] = "COMPLETE"
    return body


def _citations(
    src: Mapping[str, Any],
    body: Json,
    citations: list[Any],
    edits: Mapping[int, tuple[str, Mapping_]],
    gone: set[int],
    new_index: Mapping[int, int],
    plan_gone: bool,
    policy: Policy,
    refused: Mapping[int, set[tuple[int, int]]],
) -> list[Json]:
    out: list[Json] = []
    for k, c in enumerate(citations):
        if not isinstance(c, Mapping):
            continue
        target = citation_target(src, c)
        s, e = c.get("start"), c.get("end")
        if target is None or type(s) is not int or type(e) is not int:
            continue
        if target[1] == "tool_plan":
            if plan_gone:
                continue
            text = body["message"].get("tool_plan")
        else:
            i = int(target[2])
            if i in gone or (s, e) in refused.get(i, ()):
                continue
            if i in edits:
                moved = remap(s, e, edits[i][1])
                if moved is None:
                    continue
                s, e = moved
                text = edits[i][0]
            else:
                text = src["message"]["content"][i].get(target[3])
        # Pieces of a rebuilt text are copied verbatim: a moved span still reads the same.
        if not isinstance(text, str) or not 0 <= s <= e <= len(text) or c.get("text") != text[s:e]:
            continue
        sources = _allowed_source_keys(c, k, policy)
        if c.get("sources") and not sources:
            continue
        kept: Json = {"start": s, "end": e, "text": text[s:e], "sources": sources}
        if "type" in c:
            kept["type"] = c["type"]
        if target[1] == "content" and "content_index" in c:
            kept["content_index"] = new_index[int(target[2])]
        for key, value in c.items():
            if key not in kept and key not in ("content_index",) and field_allowed(
                ("message", "citations", k, key), policy
            ):
                kept[key] = value
        out.append(kept)
    return out


def partial_body(
    answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
) -> Json:
    """Failing claims removed from each text item (the disclosure appended), their citations
    dropped and the others re-offset; a failing tool call or reasoning text removed whole."""
    kept, failed = split_claims(claims, outcome)
    all_failed = [c for cs in failed.values() for c in cs]
    disclosure = policy.release.templates.partial
    items = text_items(answer.body)
    # A citation stays only where kept claims carry it and no failed one does: one on text
    # that is no claim (a list item's marker) would otherwise ride along inside a kept piece.
    carried = {id(c) for cs in kept.values() for claim in cs for c in claim.citations}
    refuted = {id(c) for claim in all_failed for c in claim.citations}
    refused: dict[int, set[tuple[int, int]]] = {}
    for channel in answer.channels:
        if channel.kind == "content" and channel.path[0] == TEXT:
            refused[items[int(channel.path[1])]] = {
                (s, e) for s, e, c in channel.native if id(c) not in carried or id(c) in refuted
            }
    edits: dict[int, tuple[str, Mapping_]] = {}
    drop_reasoning: set[tuple[str | int, ...]] = set()
    drop_calls: set[int] = set()
    for idx, channel in enumerate(answer.channels):
        if not (idx in failed or (all_failed and leaks(channel, all_failed))):
            continue
        if channel.kind == "content" and channel.path[0] == TEXT:
            new, mapping = rebuild_with_map(channel.text, kept.get(idx, []), disclosure)
            edits[items[int(channel.path[1])]] = (new, mapping)
        elif channel.kind == "reasoning":
            drop_reasoning.add(channel.path)
        else:
            drop_calls.add(int(channel.path[2]))
    if not edits and (drop_reasoning or drop_calls):
        # Only a tool call or reasoning went: the first text item says so all the same.
        first = next(
            (ch for ch in answer.channels if ch.kind == "content" and ch.path[0] == TEXT), None
        )
        if first is not None:
            text = first.text
            new = text + disclosure_after(bool(text), disclosure)
            edits[items[int(first.path[1])]] = (new, [(0, len(text), 0)])
    return released_body(answer, policy, edits, drop_reasoning, drop_calls, refused)


def abstained_body(answer: Answer, text: str) -> Json:
    """The template as the whole answer of a normal response."""
    src = answer.body
    body: Json = {
        "id": src.get("id") if is_token(src.get("id")) else "",
        "finish_reason": "COMPLETE",
        "message": {
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
            "citations": [],
        },
    }
    if usage_ok(src.get("usage")):
        body["usage"] = copy.deepcopy(src["usage"])
    return body


# -- the body as an event stream ----------------------------------------------------------------


def _event(data: Json) -> SSEEvent:
    return SSEEvent(data=json.dumps(data, ensure_ascii=False), event=str(data["type"]))


def message_start(id_: object) -> SSEEvent:
    message = {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": [],
               "citations": []}
    return _event({"id": id_ if is_token(id_) else "", "type": "message-start",
                   "delta": {"message": message}})


def content_events(i: int, kind: str, text: str, logprobs: object = None) -> list[SSEEvent]:
    start = {"type": "content-start", "index": i,
             "delta": {"message": {"content": {"type": kind, kind: ""}}}}
    out = [_event(start)]
    pieces = logprobs if isinstance(logprobs, list) else None
    if pieces and kind == "text":
        for lp in pieces:
            out.append(_event({"type": "content-delta", "index": i,
                               "delta": {"message": {"content": {"text": lp["text"]}}},
                               "logprobs": lp}))
    elif text:
        out.append(_event({"type": "content-delta", "index": i,
                           "delta": {"message": {"content": {kind: text}}}}))
    out.append(_event({"type": "content-end", "index": i}))
    return out


def citation_events(j: int, citation: Mapping[str, Any]) -> list[SSEEvent]:
    return [
        _event({"type": "citation-start", "index": j,
                "delta": {"message": {"citations": copy.deepcopy(dict(citation))}}}),
        _event({"type": "citation-end", "index": j}),
    ]


def tool_events(message: Mapping[str, Any]) -> list[SSEEvent]:
    out: list[SSEEvent] = []
    plan = message.get("tool_plan")
    if isinstance(plan, str) and plan:
        out.append(_event({"type": "tool-plan-delta", "delta": {"message": {"tool_plan": plan}}}))
    for k, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        head = {"id": call.get("id", ""), "type": "function",
                "function": {"name": fn.get("name", ""), "arguments": ""}}
        out.append(_event({"type": "tool-call-start", "index": k,
                           "delta": {"message": {"tool_calls": head}}}))
        args = fn.get("arguments") or ""
        if args:
            call_delta = {"tool_calls": {"function": {"arguments": args}}}
            out.append(_event({"type": "tool-call-delta", "index": k,
                               "delta": {"message": call_delta}}))
        out.append(_event({"type": "tool-call-end", "index": k}))
    return out


def message_end(body: Mapping[str, Any]) -> SSEEvent:
    finish = body.get("finish_reason")
    delta: Json = {"finish_reason": finish if finish in FINISH_REASONS else "COMPLETE"}
    if body.get("usage") is not None:
        delta["usage"] = copy.deepcopy(body["usage"])
    return _event({"type": "message-end", "delta": delta})


def _spells(lps: object, text: str) -> bool:
    """Whether logprob items' texts concatenate to `text` (then each rides on its delta)."""
    if not isinstance(lps, list) or not lps:
        return False
    pieces = [x.get("text") if isinstance(x, Mapping) else None for x in lps]
    return all(isinstance(p, str) for p in pieces) and "".join(pieces) == text  # type: ignore[arg-type]


def to_events(body: Mapping[str, Any]) -> list[SSEEvent]:
    """A whole response body as the event stream `/v2/chat` would have sent for it."""
    message = body.get("message") or {}
    out = [message_start(body.get("id"))]
    out.extend(tool_events(message))
    first_text = True
    for i, item in enumerate(message.get("content") or []):
        kind = item.get("type")
        if kind not in ("text", "thinking"):
            continue
        lps = body.get("logprobs") if kind == "text" and first_text else None
        if kind == "text":
            first_text = False
            if not _spells(lps, item["text"]):
                lps = None
        out.extend(content_events(i, kind, item[kind], lps))
    for j, c in enumerate(message.get("citations") or []):
        out.extend(citation_events(j, c))
    out.append(message_end(body))
    return out


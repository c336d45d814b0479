"""Decisions in the Responses shapes: the released body with the channel and field rules
applied, partial answers with annotation offsets kept consistent, the abstention template as a
normal completed response, and a body re-framed as a typed event stream (`sequence_number`
counted afresh, every repeated copy of a text equal to the released text).
"""

from __future__ import annotations

import copy
import dataclasses
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
from gateway.protocols.fields import verified_token_logprobs
from gateway.protocols.openai_responses.context import client_request, client_wants_results
from gateway.protocols.openai_responses.fields import (
    ANNOTATION_KEYS,
    BLANKED,
    ECHOES,
    clean_annotation,
)
from gateway.protocols.openai_responses.parse import TEXT, cited_position, text_parts
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, Outcome

__all__ = [
    "Events",
    "abstained_body",
    "head_of",
    "item_events",
    "part_events",
    "partial_body",
    "released_body",
    "remap_annotations",
    "skeleton",
    "terminal_type",
    "to_events",
    "withholds_something",
]

Json = dict[str, Any]
TOOL_ITEMS = frozenset({"function_call", "custom_tool_call", "file_search_call", "web_search_call"})


def _resolve(body: Mapping[str, Any], path: Sequence[str | int]) -> tuple[str | int, ...]:
    """The body path of a channel path: ("output_text", n) names the n-th output_text part."""
    if path and path[0] == TEXT:
        i, j = text_parts(body)[int(path[1])]
        return ("output", i, "content", j, "text")
    return tuple(path)


def _allowed(path: Sequence[str | int], body: Mapping[str, Any], policy: Policy) -> bool:
    """An unknown field survives when allow-listed; a whole unknown item by its type."""
    if len(path) == 2 and path[0] == "output":
        item = body["output"][int(path[1])]
        itype = item.get("type") if isinstance(item, Mapping) else None
        return isinstance(itype, str) and field_allowed(("output", itype), policy)
    return field_allowed(path, policy)


def _verified_logprobs(part: Mapping[str, Any]) -> list[dict[str, object]]:
    """An output_text part's logprobs under `channels.logprobs: verify`: each entry cut to
    token, numeric logprob, bytes and empty top_logprobs when the tokens spell the part's text
    (`verified_token_logprobs`), else none. Bytes that are not the token's own are `[]` (the
    schema wants a list)."""
    text = part.get("text")
    entries = verified_token_logprobs(part.get("logprobs"), text if isinstance(text, str) else None)
    if entries is None:
        return []
    for e in entries:
        if e["bytes"] is None:
            e["bytes"] = []
    return entries


def withholds_something(answer: Answer, policy: Policy) -> bool:
    """Whether a channel or field rule removes part of this answer, so that it cannot go out
    as the upstream's bytes."""
    body = answer.body
    ch = policy.channels
    if any(not _allowed(p, body, policy) for p in answer.unknown_fields):
        return True
    for c in answer.channels:
        if c.kind == "reasoning" and ch.reasoning == "withhold":
            return True
        if c.kind == "tool_arguments" and ch.tool_calls == "withhold":
            return True
    want_results = client_wants_results()
    for item in _output(body):
        results = item.get("results")
        if item.get("type") == "file_search_call" and results is not None and not want_results:
            return True
        if item.get("type") == "reasoning" and ch.reasoning == "withhold" and item.get("content"):
            return True
        if item.get("type") == "message" and ch.logprobs != "pass":
            for part in item.get("content") or []:
                lps = part.get("logprobs") if isinstance(part, Mapping) else None
                if lps and (ch.logprobs == "withhold" or _verified_logprobs(part) != lps):
                    return True
    return False


def _output(body: Mapping[str, Any]) -> list[Json]:
    output = body.get("output")
    return [i for i in output if isinstance(i, dict)] if isinstance(output, list) else []


def released_body(
    answer: Answer,
    policy: Policy,
    drop_items: set[int] | None = None,
    rewritten: set[tuple[int, int]] | None = None,
) -> Json:
    """A copy of the body under the field and channel rules; `drop_items` removes more items,
    and the annotations of `rewritten` parts (item, part) were already rebuilt and sanitised."""
    src = answer.body
    body: Json = copy.deepcopy(dict(src))
    ch = policy.channels
    gone: set[int] = set(drop_items or ())
    for path in sorted(answer.unknown_fields, key=len, reverse=True):
        if path[0] == "stream" or _allowed(path, src, policy):
            continue  # stream-level fields are not in the body: they only force a re-render
        if (
            rewritten
            and len(path) > 5
            and path[4] == "annotations"
            and (int(path[1]), int(path[3])) in rewritten
        ):
            continue
        if len(path) == 2 and path[0] == "output":
            gone.add(int(path[1]))
            continue
        if len(path) == 1 and path[0] in ECHOES:
            # The client's own value stands in for the upstream's echo (the SDK expects it).
            key = str(path[0])
            request = client_request()
            body[key] = copy.deepcopy(request[key] if key in request else ECHOES[key][1])
            continue
        node: Any = body
        for p in path[:-1]:
            node = node[p]
        last = path[-1]
        if (
            last in BLANKED
            and isinstance(node, dict)
            and node.get("type") in ANNOTATION_KEYS
        ):
            node[last] = ""  # the annotation keeps its shape; the words do not go out
        elif isinstance(node, dict):
            node.pop(last, None)
        elif isinstance(node, list) and isinstance(last, int):
            node[last] = None  # removed below: indices of other paths stay valid meanwhile
    want_results = client_wants_results()
    output = body.get("output")
    for i, item in enumerate(output if isinstance(output, list) else []):
        if not isinstance(item, dict):
            continue
        itype = item.get("type")
        if itype in TOOL_ITEMS and ch.tool_calls == "withhold":
            gone.add(i)
        if itype == "reasoning" and ch.reasoning == "withhold":
            # Readable reasoning is withheld; an opaque encrypted_content the client asked for
            # stays (parse.py drops an unasked one), so it can send the item back on its next
            # turn (stateless multi-turn).
            item["summary"] = []
            item.pop("content", None)
        if itype == "file_search_call" and not want_results and item.get("results") is not None:
            item["results"] = None
        elif itype == "file_search_call" and isinstance(item.get("results"), list):
            item["results"] = [r for r in item["results"] if r is not None]
        if itype == "message":
            content = item.get("content")
            if isinstance(content, list):
                item["content"] = [p for p in content if p is not None]
                for part in item["content"]:
                    _fix_part(part, ch.logprobs)
        for key in ("summary", "content"):
            if itype == "reasoning" and isinstance(item.get(key), list):
                item[key] = [p for p in item[key] if p is not None]
        if isinstance(item.get("content"), list) and itype == "message":
            for part in item["content"]:
                if isinstance(part, dict) and isinstance(part.get("annotations"), list):
                    part["annotations"] = [a for a in part["annotations"] if a is not None]
    if isinstance(output, list):
        body["output"] = [it for i, it in enumerate(output) if i not in gone]
    return body


def _fix_part(part: object, rule: str) -> None:
    if not isinstance(part, dict) or part.get("type") != "output_text" or rule == "pass":
        return
    lps = part.get("logprobs")
    if not lps:
        return
    part["logprobs"] = [] if rule == "withhold" else _verified_logprobs(part)


def remap_annotations(
    text: str,
    annotations: Sequence[Any],
    mapping: Sequence[tuple[int, int, int]],
    keep_title: bool = False,
) -> list[Any]:
    """Annotations whose span (or cited point) lies inside a kept piece, with offsets moved to
    the rebuilt text, and only their known fields; the others are dropped. `mapping` holds
    (old_start, old_end, new_start)."""
    out: list[Any] = []
    for raw in annotations:
        ann = clean_annotation(raw, keep_title)
        if ann is None:
            continue
        if "start_index" in ann:
            s, e = ann.get("start_index"), ann.get("end_index")
            if not isinstance(s, int) or not isinstance(e, int):
                continue
            for old_s, old_e, new_s in mapping:
                if old_s <= s and e <= old_e:
                    moved = dict(ann)
                    moved["start_index"] = new_s + (s - old_s)
                    moved["end_index"] = new_s + (e - old_s)
                    out.append(moved)
                    break
        elif type(index := ann.get("index")) is int:
            k = cited_position(text, index)
            for old_s, old_e, new_s in mapping:
                if old_s < k <= old_e:
                    moved = dict(ann)
                    moved["index"] = new_s + (k - old_s)
                    out.append(moved)
                    break
    return out


def partial_body(
    answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
) -> Json:
    """Failing claims removed from each text, annotations remapped, the disclosure appended;
    a failing tool call or reasoning text is removed whole."""
    kept, failed = split_claims(claims, outcome)
    all_failed = [c for cs in failed.values() for c in cs]
    disclosure = policy.release.templates.partial
    edited: Json = copy.deepcopy(dict(answer.body))
    drop_items: set[int] = set()
    rewritten: set[tuple[int, int]] = set()
    lost_other = False
    keep_title = field_allowed(("title",), policy)
    for idx, channel in enumerate(answer.channels):
        if not (idx in failed or (all_failed and leaks(channel, all_failed))):
            continue
        path = _resolve(answer.body, channel.path)
        i = int(path[1])
        if channel.kind in ("content", "refusal"):
            j = int(path[3])
            new, mapping = rebuild_with_map(channel.text, kept.get(idx, []), disclosure)
            part = edited["output"][i]["content"][j]
            if channel.kind == "refusal":
                part["refusal"] = new
                continue
            anns = part.get("annotations")
            part["annotations"] = remap_annotations(
                channel.text, anns if isinstance(anns, list) else [], mapping, keep_title
            )
            part["text"] = new
            part["logprobs"] = []
            rewritten.add((i, j))
        elif channel.kind == "reasoning":
            edited["output"][i][str(path[2])][int(path[3])] = None
            lost_other = True
        else:
            drop_items.add(i)
            lost_other = True
    if lost_other and not rewritten:
        # Only a tool call or reasoning went: the answer says it is partial all the same.
        _disclose(edited, answer, disclosure, rewritten)
    return released_body(
        dataclasses.replace(answer, body=edited), policy, drop_items, rewritten
    )


def _disclose(
    edited: Json, answer: Answer, disclosure: str, rewritten: set[tuple[int, int]]
) -> None:
    """The disclosure after the answer's text: its first output_text part, or a message of
    its own when it has none."""
    for channel in answer.channels:
        if channel.kind == "content":
            path = _resolve(answer.body, channel.path)
            i, j = int(path[1]), int(path[3])
            part = edited["output"][i]["content"][j]
            part["text"] = channel.text + disclosure_after(bool(channel.text), disclosure)
            part["logprobs"] = []
            rewritten.add((i, j))
            return
    edited.setdefault("output", []).append({
        "id": "msg_citewarden", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": disclosure, "annotations": [],
                     "logprobs": []}],
    })


def abstained_body(answer: Answer, policy: Policy, text: str) -> Json:
    """The template as the answer of a normal completed response."""
    base = released_body(answer, policy)
    msg_id = next(
        (it.get("id") for it in _output(answer.body) if it.get("type") == "message"), None
    )
    base["output"] = [
        {
            "id": msg_id if isinstance(msg_id, str) else "msg_citewarden",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }
    ]
    base["status"] = "completed"
    base["incomplete_details"] = None
    base["error"] = None
    base.setdefault("object", "response")
    return base


# -- the body as a typed event stream ------------------------------------------------------------


class Events:
    """Typed events numbered in order (`sequence_number` from 0)."""

    def __init__(self) -> None:
        self.out: list[SSEEvent] = []
        self.seq = 0

    def add(self, data: Json) -> None:
        data["sequence_number"] = self.seq
        self.seq += 1
        self.out.append(SSEEvent(data=json.dumps(data, ensure_ascii=False), event=data["type"]))


def skeleton(item: Mapping[str, Any]) -> Json:
    """An output item as `output_item.added` announces it: before any of its text."""
    out: Json = copy.deepcopy(dict(item))
    itype = out.get("type")
    if "status" in out or itype in ("message", "function_call", "reasoning"):
        out["status"] = "in_progress"
    if itype == "message":
        out["content"] = []
    elif itype == "function_call":
        out["arguments"] = ""
    elif itype == "custom_tool_call":
        out["input"] = ""
    elif itype == "reasoning":
        out["summary"] = []
        out.pop("content", None)
    elif itype == "file_search_call":
        out["results"] = None
    return out


def head_of(body: Mapping[str, Any], status: str) -> Json:
    head: Json = {k: copy.deepcopy(v) for k, v in body.items() if k != "output"}
    head["output"] = []
    head["status"] = status
    head["usage"] = None
    for k in ("completed_at", "incomplete_details", "error"):
        if k in head:
            head[k] = None
    return head


def item_events(ev: Events, i: int, item: Mapping[str, Any], skip_added: bool = False) -> None:
    """The events of one output item, from `output_item.added` to `output_item.done`."""
    itype = item.get("type")
    iid = item.get("id", "")
    if not skip_added:
        ev.add({"type": "response.output_item.added", "output_index": i, "item": skeleton(item)})
    base = {"item_id": iid, "output_index": i}
    if itype == "message":
        for j, part in enumerate(item.get("content") or []):
            part_events(ev, base, j, part)
    elif itype == "function_call":
        args = item.get("arguments") or ""
        if args:
            ev.add({"type": "response.function_call_arguments.delta", **base, "delta": args})
        ev.add({"type": "response.function_call_arguments.done", **base, "arguments": args})
    elif itype == "reasoning":
        for k, part in enumerate(item.get("summary") or []):
            text = part.get("text", "") if isinstance(part, Mapping) else ""
            s = {**base, "summary_index": k}
            ev.add({"type": "response.reasoning_summary_part.added", **s,
                    "part": {"type": "summary_text", "text": ""}})
            if text:
                ev.add({"type": "response.reasoning_summary_text.delta", **s, "delta": text})
            ev.add({"type": "response.reasoning_summary_text.done", **s, "text": text})
            ev.add({"type": "response.reasoning_summary_part.done", **s,
                    "part": {"type": "summary_text", "text": text}})
    ev.add({"type": "response.output_item.done", "output_index": i, "item": copy.deepcopy(item)})


def part_events(
    ev: Events, base: Mapping[str, Any], j: int, part: Mapping[str, Any], text_sent: bool = False
) -> None:
    """The events of one content part; with `text_sent`, its text deltas already went out."""
    b = {**base, "content_index": j}
    if part.get("type") == "output_text":
        text = part.get("text", "")
        if not text_sent:
            ev.add({"type": "response.content_part.added", **b,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
            if text:
                ev.add({"type": "response.output_text.delta", **b, "delta": text, "logprobs": []})
        for k, ann in enumerate(part.get("annotations") or []):
            ev.add({"type": "response.output_text.annotation.added", **b,
                    "annotation_index": k, "annotation": copy.deepcopy(ann)})
        ev.add({"type": "response.output_text.done", **b, "text": text,
                "logprobs": copy.deepcopy(part.get("logprobs") or [])})
    elif part.get("type") == "refusal":
        text = part.get("refusal", "")
        if not text_sent:
            ev.add({"type": "response.content_part.added", **b,
                    "part": {"type": "refusal", "refusal": ""}})
            if text:
                ev.add({"type": "response.refusal.delta", **b, "delta": text})
        ev.add({"type": "response.refusal.done", **b, "refusal": text})
    else:
        ev.add({"type": "response.content_part.added", **b, "part": copy.deepcopy(dict(part))})
    ev.add({"type": "response.content_part.done", **b, "part": copy.deepcopy(dict(part))})


def terminal_type(body: Mapping[str, Any]) -> str:
    return "response.incomplete" if body.get("status") == "incomplete" else "response.completed"


def to_events(body: Mapping[str, Any]) -> list[SSEEvent]:
    """A whole response body as the typed SSE stream the API would have sent for it."""
    ev = Events()
    ev.add({"type": "response.created", "response": head_of(body, "in_progress")})
    ev.add({"type": "response.in_progress", "response": head_of(body, "in_progress")})
    for i, item in enumerate(_output(body)):
        item_events(ev, i, item)
    ev.add({"type": terminal_type(body), "response": copy.deepcopy(dict(body))})
    return ev.out

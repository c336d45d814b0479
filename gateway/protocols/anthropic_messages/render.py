"""Decisions in the `/v1/messages` shapes: the released body under the field and channel rules,
partial answers whose text blocks keep only their kept claims' citations, the abstention
template as a normal message, the error envelope, and a body re-framed as its event stream.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.policy import Policy
from gateway.protocols.anthropic_messages.fields import CITATION
from gateway.protocols.anthropic_messages.parse import Json, native_citation, text_block_ranges
from gateway.protocols.base import disclosure_after, field_allowed, kept_spans, leaks, split_claims
from gateway.sse import SSEEvent
from gateway.types import Answer, Channel, Claim, ContextSet, Outcome

__all__ = [
    "abstained_body",
    "cites_a_source",
    "error_body",
    "error_event",
    "known_keys",
    "partial_body",
    "relayed_sources",
    "released_body",
    "stream_events",
]


def released_body(answer: Answer, policy: Policy) -> Json:
    """The upstream's message under the field and channel rules."""
    return _rebuild(answer, policy, set(), None)


def partial_body(
    answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
) -> Json:
    """The message with only its kept claims: the text blocks are rebuilt from them, and a
    thinking or tool_use channel that lost a claim (or leaks a failed one) is dropped."""
    kept, failed = split_claims(claims, outcome)
    all_failed = [c for cs in failed.values() for c in cs]
    drop: set[int] = set()
    text_blocks: list[Json] | None = None
    disclosure = policy.release.templates.partial
    for idx, channel in enumerate(answer.channels):
        lost = idx in failed or (all_failed and leaks(channel, all_failed))
        if not lost:
            continue
        if channel.kind == "content":
            text_blocks = _text_blocks(answer, channel, kept.get(idx, []), disclosure)
        else:
            drop.add(int(channel.path[1]))
    body = _rebuild(answer, policy, drop, text_blocks)
    if text_blocks is None and drop:  # only a tool call or thinking went: say so all the same
        texts = any(b.get("type") == "text" for b in body["content"] if isinstance(b, dict))
        body["content"].append({"type": "text", "text": disclosure_after(texts, disclosure)})
    return body


def abstained_body(answer: Answer, text: str) -> Json:
    """A whole message answering `text` (abstention and review templates)."""
    src = answer.body
    return {
        "id": src.get("id", ""),
        "type": "message",
        "role": "assistant",
        "model": src.get("model", ""),
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": copy.deepcopy(src.get("usage") or {"input_tokens": 0, "output_tokens": 0}),
    }


def _search_result_citations(body: Mapping[str, object]) -> list[Json]:
    out: list[Json] = []
    content = body.get("content")
    for block in content if isinstance(content, list) else []:
        cits = block.get("citations") if isinstance(block, Mapping) else None
        for c in cits if isinstance(cits, list) else []:
            if isinstance(c, dict) and c.get("type") == "search_result_location":
                out.append(c)
    return out


def cites_a_source(body: Mapping[str, object]) -> bool:
    """Does a search result citation name its result's `source`? Only a rendered body has it
    compared with the request's (`relayed_sources`), so such an answer is never relayed as
    the upstream's bytes."""
    return any("source" in c for c in _search_result_citations(body))


def relayed_sources(body: Json, ctx: ContextSet | str) -> Json:
    """`body` with each search result citation's `source` set to the cited search result's
    own, as the request gave it: the upstream's value is text nobody verified (an index and a
    cited text that verify say nothing of it), so it goes out only when it is that value. The
    SDKs require the field: a result the context does not hold (or a context known only by
    its fingerprint) gets an empty source."""
    results = {d.index: d.source for d in ctx.search_results} if isinstance(ctx, ContextSet) else {}
    for c in _search_result_citations(body):
        if "source" in c:
            idx = c.get("search_result_index")
            own = results.get(idx) if type(idx) is int else None
            c["source"] = own if own is not None else ""
    return body


def error_body(message: str, type_: str) -> Json:
    return {"type": "error", "error": {"type": type_, "message": message}}


def error_event(message: str, type_: str) -> SSEEvent:
    """A failure as the stream reports one: an `error` event with the error envelope."""
    return SSEEvent(data=json.dumps(error_body(message, type_)), event="error")


def _drop_set(answer: Answer, policy: Policy) -> tuple[set[int], set[tuple[Any, ...]]]:
    """Block indices to drop and per-field paths to delete under the channel rules."""
    blocks: set[int] = set()
    fields: set[tuple[Any, ...]] = set()
    for path in answer.unknown_fields:
        if field_allowed(path, policy):
            continue
        if len(path) == 2:
            blocks.add(int(path[1]))
        else:
            fields.add(tuple(path))
    content = answer.body.get("content")
    for bi, block in enumerate(content if isinstance(content, list) else []):
        btype = block.get("type") if isinstance(block, Mapping) else None
        rule = policy.channels.reasoning
        if (btype == "redacted_thinking" and rule != "pass") or (
            btype == "thinking" and rule == "withhold"
        ):
            blocks.add(bi)
        if btype == "tool_use" and policy.channels.tool_calls == "withhold":
            blocks.add(bi)
    return blocks, fields


def _rebuild(
    answer: Answer, policy: Policy, extra_drop: set[int], text_blocks: list[Json] | None
) -> Json:
    """Copy of the body with dropped blocks / fields; `text_blocks` replaces the text."""
    body: Json = copy.deepcopy(dict(answer.body))
    drop, fields = _drop_set(answer, policy)
    drop |= extra_drop
    for path in sorted(fields, key=len, reverse=True):
        node: Any = body
        for p in path[:-1]:
            node = node[p]
        if isinstance(node, dict):
            node.pop(path[-1], None)
        elif isinstance(node, list):
            node[path[-1]] = None
    out: list[Json] = []
    placed = False
    for bi, block in enumerate(body["content"]):
        if isinstance(block, dict) and isinstance(block.get("citations"), list):
            block["citations"] = [c for c in block["citations"] if c is not None]
        if bi in drop:
            continue
        if text_blocks is not None and block.get("type") == "text":
            if not placed:
                out.extend(text_blocks)
                placed = True
            continue
        out.append(block)
    if text_blocks is not None and not placed:
        out.extend(text_blocks)
    body["content"] = out
    # A tool_use stop without its tool_use block would send the client looking for a call.
    if body.get("stop_reason") == "tool_use" and not any(
        b.get("type") == "tool_use" for b in out
    ):
        body["stop_reason"] = "end_turn"
    return body


def _text_blocks(
    answer: Answer, channel: Channel, kept: Sequence[Claim], disclosure: str
) -> list[Json]:
    """Text blocks for the kept claims; a block keeps only citations of kept claims."""
    content = answer.body.get("content")
    ranges = text_block_ranges(content if isinstance(content, list) else [])
    raw_cits: dict[int, list[object]] = {}
    for bi, _, _ in ranges:
        block = content[bi] if isinstance(content, list) else {}
        cits = block.get("citations") if isinstance(block, Mapping) else None
        raw_cits[bi] = list(cits) if isinstance(cits, list) else []
    pieces: list[tuple[str, list[object]]] = []
    by_start = sorted(kept, key=lambda c: c.start)
    prev_item: bool | None = None
    for claim, (start, end, is_item) in zip(
        by_start, kept_spans(channel.text, by_start), strict=True
    ):
        if prev_item is not None:
            pieces.append(("\n" if (is_item or prev_item) else " ", []))
        prev_item = is_item
        own = {c.native for c in claim.citations if c.native is not None}
        for bi, bs, be in ranges:
            s, e = max(bs, start), min(be, end)
            if s >= e:
                continue
            cits = [
                known_keys(c)
                for c in raw_cits[bi]
                if (nc := native_citation(c)) is not None and nc.native in own
            ]
            pieces.append((channel.text[s:e], cits))
    pieces.append((disclosure_after(bool(pieces), disclosure), []))
    blocks: list[Json] = []
    for text, cits in pieces:
        if not text:
            continue
        if blocks and not cits and not blocks[-1].get("citations"):
            blocks[-1]["text"] += text
            continue
        new: Json = {"type": "text", "text": text}
        if cits:
            new["citations"] = copy.deepcopy(cits)
        blocks.append(new)
    return blocks


def known_keys(citation: object) -> object:
    """A citation with only the keys the field table knows for its type (a rebuilt block
    carries no unknown field, allow-listed or not)."""
    if not isinstance(citation, dict):
        return citation
    table = CITATION.types.get(str(citation.get("type")))
    return {k: v for k, v in citation.items() if table is not None and k in table.fields}


def stream_events(body: Mapping[str, object]) -> list[Json]:
    """The event stream (each event's data) that delivers `body` as a message stream."""
    raw_usage = body.get("usage")
    usage: Json = dict(raw_usage) if isinstance(raw_usage, Mapping) else {}
    start_msg: Json = {k: copy.deepcopy(v) for k, v in body.items() if k != "content"}
    start_msg.update(
        content=[], stop_reason=None, stop_sequence=None, usage={**usage, "output_tokens": 0}
    )
    events: list[Json] = [{"type": "message_start", "message": start_msg}]
    content = body.get("content")
    for i, block in enumerate(content if isinstance(content, list) else []):
        btype = block.get("type")
        deltas: list[Json] = []
        if btype == "text":
            start: Json = {"type": "text", "text": ""}
            if "citations" in block:
                start["citations"] = []
            for cit in block.get("citations") or []:
                deltas.append({"type": "citations_delta", "citation": cit})
            if block.get("text"):
                deltas.append({"type": "text_delta", "text": block["text"]})
        elif btype == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            if block.get("thinking"):
                deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
            if block.get("signature"):
                deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif btype == "tool_use":
            start = {k: v for k, v in block.items() if k != "input"}
            start["input"] = {}
            deltas.append(
                {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(block.get("input", {}), ensure_ascii=False),
                }
            )
        else:
            start = copy.deepcopy(block)
        events.append({"type": "content_block_start", "index": i, "content_block": start})
        for d in deltas:
            events.append({"type": "content_block_delta", "index": i, "delta": d})
        events.append({"type": "content_block_stop", "index": i})
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": body.get("stop_reason"),
                "stop_sequence": body.get("stop_sequence"),
            },
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        }
    )
    events.append({"type": "message_stop"})
    return events

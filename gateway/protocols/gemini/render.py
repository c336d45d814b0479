"""Decisions in Gemini's shapes, and a rendered body re-framed as a `streamGenerateContent`
SSE stream.

Every re-rendered candidate holds its answer text as one `text` part (at the place of its
first text part, carrying that part's `thoughtSignature`), so each `groundingSupports[]`
segment is rewritten against it: byte offsets recomputed from the released text, `text` set
to the released slice, `partIndex` left out (the offsets index the candidate's answer text).
In a partial answer a support stays only when its span is wholly inside a kept span and every
citation it made is carried by kept claims and by no failed one: a kept span can hold text that
is no part of its claim (a list item's marker), where a support failed as a claim of its own.
Withheld thought parts keep
their `thoughtSignature` (in an empty thought part), so multi-turn with thinking still works.
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
from gateway.protocols.gemini.offsets import to_bytes
from gateway.protocols.gemini.parse import (
    answer_text,
    candidate_numbers,
    grounding_ids,
    is_thought,
    locate_supports,
    support_citations,
)
from gateway.sse import SSEEvent
from gateway.types import Answer, Channel, Claim, Outcome

__all__ = ["abstained_body", "partial_body", "released_body", "to_events"]

Json = dict[str, Any]
# (old_start, old_end, new_start) pieces of a rebuilt text (gateway.protocols.base).
Mapping_ = Sequence[tuple[int, int, int]]


def _del_path(body: Any, path: Sequence[str | int]) -> None:
    node = body
    for p in path[:-1]:
        try:
            node = node[p]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _base(answer: Answer, policy: Policy) -> Json:
    body: Json = copy.deepcopy(dict(answer.body))
    for path in answer.unknown_fields:
        if not field_allowed(path, policy):
            _del_path(body, path)
    return body


def _support_moved(
    support: Mapping[str, Any], span: tuple[int, int], new_text: str, mapping: Mapping_ | None
) -> Json | None:
    s, e = span
    if mapping is not None:
        for old_s, old_e, new_s in mapping:
            if old_s <= s and e <= old_e:
                s, e = new_s + (s - old_s), new_s + (e - old_s)
                break
        else:
            return None
    seg: Json = {"startIndex": to_bytes(new_text, s), "endIndex": to_bytes(new_text, e)}
    seg["text"] = new_text[s:e]
    out = {k: copy.deepcopy(v) for k, v in support.items() if k != "segment"}
    out["segment"] = seg
    return out


def _candidate(
    original: Mapping[str, Any],
    cand: Json,
    policy: Policy,
    new_text: str | None,
    mapping: Mapping_ | None,
    drop_parts: set[int],
    keep: Sequence[bool] | None = None,
) -> None:
    """Rewrite `cand` (a copy of `original` without the fields the client does not receive)
    in place: parts per the channel rules, the answer text as one part, supports re-indexed
    (`keep`: per support, whether it may stay at all; None: each may)."""
    ct = answer_text(original)
    text = ct.text if new_text is None else new_text
    spans = locate_supports(original, ct)
    content = cand.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    if isinstance(content, dict) and isinstance(parts, list):
        out: list[Json] = []
        text_at: int | None = None
        signature: object = None
        for pi, part in enumerate(parts):
            if not isinstance(part, dict) or pi in drop_parts:
                continue
            if "functionCall" in part:
                if policy.channels.tool_calls != "withhold":
                    out.append(part)
            elif is_thought(part):
                if policy.channels.reasoning != "withhold":
                    out.append(part)
                elif "thoughtSignature" in part:
                    out.append({"text": "", "thought": True,
                                "thoughtSignature": part["thoughtSignature"]})
            elif isinstance(part.get("text"), str):
                if text_at is None:
                    text_at = len(out)
                    out.append({})
                if signature is None and "thoughtSignature" in part:
                    signature = part["thoughtSignature"]
            elif part:
                out.append(part)  # fields the policy allow-lists
        if text_at is not None:
            merged: Json = {"text": text}
            if signature is not None:
                merged["thoughtSignature"] = signature
            out[text_at] = merged
        content["parts"] = out
    gm = cand.get("groundingMetadata")
    supports = gm.get("groundingSupports") if isinstance(gm, dict) else None
    if isinstance(gm, dict) and isinstance(supports, list):
        moved: list[Json] = []
        for si, (support, span) in enumerate(zip(supports, spans, strict=True)):
            if span is None or not isinstance(support, Mapping):
                continue
            if keep is not None and not (si < len(keep) and keep[si]):
                continue
            m = _support_moved(support, (span[0], span[1]), text, mapping)
            if m is not None:
                moved.append(m)
        gm["groundingSupports"] = moved


def _candidates(body: Json) -> list[Any]:
    c = body.get("candidates")
    return c if isinstance(c, list) else []


def _supports_kept(
    answer: Answer, channel: Channel, kept: set[int], failed: set[int]
) -> list[bool] | None:
    """Per grounding support of `channel`'s candidate, whether every citation it made is
    carried by a kept claim (`kept`: ids of their Citation objects) and by no failed one
    (`failed`). The channel's `native` is the supports' citations in order
    (`parse.support_citations`); None when it is not (every support is then dropped)."""
    cands = _candidates(answer.body)
    ci = channel.choice
    if not 0 <= ci < len(cands):
        return None
    groups = support_citations(
        cands[ci], answer_text(cands[ci]), grounding_ids(cands)[ci], candidate_numbers(cands)[ci]
    )
    if sum(len(g) for g in groups) != len(channel.native):
        return None
    out: list[bool] = []
    at = 0
    for group in groups:
        mine = channel.native[at : at + len(group)]
        at += len(group)
        out.append(all(id(c) in kept and id(c) not in failed for _, _, c in mine))
    return out


def released_body(answer: Answer, policy: Policy) -> Json:
    body = _base(answer, policy)
    originals = _candidates(answer.body)
    for ci, cand in enumerate(_candidates(body)):
        _candidate(originals[ci], cand, policy, None, None, set())
    return body


def partial_body(
    answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
) -> Json:
    body = _base(answer, policy)
    disclosure = policy.release.templates.partial
    kept, failed = split_claims(claims, outcome)
    all_failed = [c for cs in failed.values() for c in cs]
    carried = {id(c) for cs in kept.values() for claim in cs for c in claim.citations}
    refuted = {id(c) for claim in all_failed for c in claim.citations}
    texts: dict[int, tuple[str, Mapping_]] = {}
    keeps: dict[int, list[bool]] = {}
    drops: dict[int, set[int]] = {}
    for idx, channel in enumerate(answer.channels):
        if not (idx in failed or (all_failed and leaks(channel, all_failed))):
            continue
        ci = channel.choice
        if channel.kind == "content":
            texts[ci] = rebuild_with_map(channel.text, kept.get(idx, []), disclosure)
            keeps[ci] = _supports_kept(answer, channel, carried, refuted) or []
        else:  # a failing tool call or thought part goes whole
            pi = channel.path[4] if channel.kind == "tool_arguments" else channel.path[3]
            drops.setdefault(ci, set()).add(int(pi))
    originals = _candidates(answer.body)
    for ci, cand in enumerate(_candidates(body)):
        new = texts.get(ci)
        _candidate(
            originals[ci], cand, policy,
            None if new is None else new[0], None if new is None else new[1],
            drops.get(ci, set()), keeps.get(ci),
        )
        if new is not None and not answer_text(originals[ci]).parts:
            cand.setdefault("content", {"role": "model", "parts": []})["parts"].append(
                {"text": new[0]}
            )
        elif new is None and drops.get(ci):  # only a call or thought went: say so all the same
            parts = cand.setdefault("content", {"role": "model", "parts": []}).setdefault(
                "parts", []
            )
            has_text = any(
                "text" in p and not p.get("thought") for p in parts if isinstance(p, dict)
            )
            parts.append({"text": disclosure_after(has_text, disclosure)})
    return body


def abstained_body(answer: Answer, text: str) -> Json:
    """A normal response whose every candidate answers `text` (ids, model, usage kept)."""
    src = answer.body
    count = max(1, len(_candidates(src)))
    body: Json = {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": text}]},
             "finishReason": "STOP", "index": i}
            for i in range(count)
        ]
    }
    for key in ("usageMetadata", "modelVersion", "responseId", "createTime"):
        if key in src:
            body[key] = copy.deepcopy(src[key])
    return body


def to_events(body: Mapping[str, Any]) -> list[SSEEvent]:
    """A rendered body as stream chunks: each part of each candidate in its own chunk, then
    a last chunk with each candidate's finish reason, grounding metadata and the usage."""
    head = {k: body[k] for k in ("modelVersion", "responseId", "createTime") if k in body}
    events: list[SSEEvent] = []

    def emit(chunk: Json) -> None:
        events.append(SSEEvent(data=json.dumps({**chunk, **head}, ensure_ascii=False)))

    cands = [c for c in _candidates(dict(body)) if isinstance(c, Mapping)]
    for pos, cand in enumerate(cands):
        index = cand.get("index", pos)
        content = cand.get("content")
        parts = content.get("parts") if isinstance(content, Mapping) else None
        for part in parts if isinstance(parts, list) else []:
            emit({"candidates": [{"content": {"role": "model", "parts": [part]}, "index": index}]})
    last: list[Json] = []
    for pos, cand in enumerate(cands):
        tail: Json = {"content": {"role": "model", "parts": []}}
        tail.update({k: copy.deepcopy(v) for k, v in cand.items() if k != "content"})
        tail.setdefault("index", pos)
        tail.setdefault("finishReason", "STOP")
        last.append(tail)
    final: Json = {"candidates": last} if last else {}
    for key in ("promptFeedback", "usageMetadata"):
        if key in body:
            final[key] = body[key]
    emit(final)
    return events

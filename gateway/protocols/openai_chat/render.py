"""Decisions in the `chat.completion` shape: the released body under the field and channel
rules, partial answers (annotations and Mistral references move with their kept text), the
template answer, `channels.logprobs`, the error envelope, and a body re-framed as a stream.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Container, Mapping, Sequence
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
from gateway.protocols.openai_chat.chunks import rebuild_chunks
from gateway.protocols.openai_chat.fields import REASONING_KEYS, SEARCH_KEYS
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, Outcome

__all__ = [
    "drop_unverified_urls",
    "error_envelope",
    "error_event",
    "has_annotations",
    "logprobs_change",
    "partial_body",
    "released_body",
    "template_body",
    "to_events",
]

Json = dict[str, Any]

# Message fields `to_events` frames by name; any other is framed as it is.
_MESSAGE_KEYS = frozenset(
    {
        "role",
        "content",
        "refusal",
        "tool_calls",
        "function_call",
        "annotations",
        "audio",
        "reasoning_content",
        "reasoning",
        "reasoning_details",
    }
)


def released_body(answer: Answer, policy: Policy) -> Json:
    body = _base(answer, policy)
    _decide_logprobs(body, policy, changed=False)
    _fix_finish_reasons(body)
    return body


def partial_body(
    answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
) -> Json:
    body = _partial(answer, claims, outcome, policy)
    _decide_logprobs(body, policy, changed=True)
    _fix_finish_reasons(body)
    return body


def template_body(answer: Answer, text: str) -> Json:
    """A whole answer whose every choice says `text` (abstained / review)."""
    src = answer.body
    choices = src.get("choices")
    count = len(choices) if isinstance(choices, list) and choices else 1
    body: Json = {
        "id": src.get("id", ""),
        "object": "chat.completion",
        "created": src.get("created", 0),
        "model": src.get("model", ""),
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
            for i in range(count)
        ],
    }
    for k in ("system_fingerprint", "service_tier", "usage"):
        if src.get(k) is not None:
            body[k] = copy.deepcopy(src[k])
    return body


def has_annotations(answer: Answer) -> bool:
    """Whether some choice carries annotations: their URLs are decided against the context
    when the body is rendered (`drop_unverified_urls`), so such an answer is re-rendered."""
    choices = answer.body.get("choices")
    return any(
        isinstance(c, dict) and isinstance(c.get("message"), dict) and c["message"].get(
            "annotations")
        for c in (choices if isinstance(choices, list) else [])
    )


def drop_unverified_urls(body: Json, chunk_ids: Container[str] | None) -> None:
    """A `url_citation` says its span comes from its URL; nothing else checks that, so it is
    kept only when the URL names a chunk of the context the claims were checked against (as a
    Responses `url_citation` verifies only against such a chunk). Any other annotation goes.
    `chunk_ids` None: the report carries only the context's fingerprint (its audit copy), no
    chunks to check against; the annotations stay as the field table left them."""
    if chunk_ids is None:
        return
    for choice in body.get("choices") or []:
        msg = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(msg, dict) or not isinstance(msg.get("annotations"), list):
            continue
        msg["annotations"] = [
            a for a in msg["annotations"]
            if isinstance(a, dict)
            and isinstance(a.get("url_citation"), dict)
            and a["url_citation"].get("url") in chunk_ids
        ]


def logprobs_change(answer: Answer, policy: Policy) -> bool:
    """Whether `channels.logprobs` changes the logprobs of some choice of the answer."""
    if not answer.has_logprobs or policy.channels.logprobs == "pass":
        return False
    choices = answer.body.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        lp = choice.get("logprobs")
        if lp is not None and _logprobs(lp, choice["message"], policy) != lp:
            return True
    return False


def error_envelope(message: str, type_: str) -> Json:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def error_event(message: str, type_: str) -> SSEEvent:
    return SSEEvent(data=json.dumps(error_envelope(message, type_)))


def to_events(body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
    """A valid `chat.completion.chunk` stream of a final body, ending with `[DONE]`."""
    head: Json = {
        "id": body.get("id", ""),
        "object": "chat.completion.chunk",
        "created": body.get("created", 0),
        "model": body.get("model", ""),
    }
    for k in ("system_fingerprint", "service_tier"):
        if body.get(k) is not None:
            head[k] = body[k]
    events: list[SSEEvent] = []

    def frame(index: int, delta: Json, finish: object = None, logprobs: object = None) -> None:
        chunk: Json = {
            **head,
            "choices": [
                {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
            ],
        }
        if include_usage:
            chunk["usage"] = None
        events.append(SSEEvent(data=json.dumps(chunk, ensure_ascii=False)))

    choices = body.get("choices")
    for pos, choice in enumerate(choices if isinstance(choices, list) else []):
        i = choice.get("index", pos)
        msg: Json = dict(choice.get("message") or {})
        first: Json = {"role": msg.get("role", "assistant"), "content": ""}
        if msg.get("refusal") is None and "refusal" in msg:
            first["refusal"] = None
        frame(i, first)
        for key in (*REASONING_KEYS, "content", "refusal"):
            if isinstance(msg.get(key), str) and msg[key]:
                lp = choice.get("logprobs") if key == "content" else None
                frame(i, {key: msg[key]}, logprobs=lp)
            elif key == "content" and isinstance(msg.get(key), list) and msg[key]:
                frame(i, {key: msg[key]}, logprobs=choice.get("logprobs"))
        if msg.get("reasoning_details"):
            frame(i, {"reasoning_details": msg["reasoning_details"]})
        for ti, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") or {}
            frame(
                i,
                {
                    "tool_calls": [
                        {
                            "index": ti,
                            "id": call.get("id"),
                            "type": call.get("type", "function"),
                            "function": {"name": fn.get("name", ""), "arguments": ""},
                        }
                    ]
                },
            )
            if fn.get("arguments"):
                frame(
                    i,
                    {"tool_calls": [{"index": ti, "function": {"arguments": fn["arguments"]}}]},
                )
        if isinstance(msg.get("function_call"), dict):
            frame(i, {"function_call": msg["function_call"]})
        if isinstance(msg.get("audio"), dict):
            frame(i, {"audio": msg["audio"]})
        if msg.get("annotations"):
            frame(i, {"annotations": msg["annotations"]})
        for k, v in msg.items():
            if k not in _MESSAGE_KEYS:
                frame(i, {k: v})
        frame(i, {}, finish=choice.get("finish_reason") or "stop")
    search = {k: body[k] for k in SEARCH_KEYS if body.get(k) is not None}
    if search:
        chunk = {**head, "choices": [], **search}
        if include_usage:
            chunk["usage"] = None
        events.append(SSEEvent(data=json.dumps(chunk, ensure_ascii=False)))
    if include_usage and body.get("usage") is not None:
        events.append(
            SSEEvent(data=json.dumps({**head, "choices": [], "usage": body["usage"]}))
        )
    events.append(SSEEvent(data="[DONE]"))
    return events


def _base(answer: Answer, policy: Policy) -> Json:
    """The answer's body under the field rules and the channel rules that withhold."""
    body: Json = copy.deepcopy(dict(answer.body))
    ch = policy.channels
    for path in answer.unknown_fields:
        if not field_allowed(path, policy):
            _del_path(body, path)
    for choice in body.get("choices", []):
        msg = choice["message"]
        if ch.reasoning == "withhold":
            for key in REASONING_KEYS:
                msg.pop(key, None)
            _withhold_details(msg)
            if isinstance(msg.get("content"), list):
                msg["content"] = [c for c in msg["content"] if c.get("type") != "thinking"]
        if ch.tool_calls == "withhold":
            msg.pop("tool_calls", None)
            msg.pop("function_call", None)
    return body


def _partial(answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy) -> Json:
    body = _base(answer, policy)
    disclosure = policy.release.templates.partial
    kept, failed = split_claims(claims, outcome)
    all_failed = [c for cs in failed.values() for c in cs]
    drop_tools: dict[int, set[int]] = {}
    # Reasoning entries of a list (reasoning_details, thinking chunks), as the answer
    # holds them: removed by value at the end, since the lists of the rendered body may
    # have changed (withheld entries removed, content chunks rebuilt).
    drop_entries: list[tuple[int, str, object]] = []
    disclosed: set[int] = set()  # choices whose text carries the disclosure
    cut: set[int] = set()  # choices that lost something
    for idx, channel in enumerate(answer.channels):
        lost = idx in failed or (all_failed and leaks(channel, all_failed))
        if not lost:
            continue
        msg = body["choices"][channel.choice]["message"]
        path = channel.path
        cut.add(channel.choice)
        if channel.kind in ("content", "refusal", "transcript"):
            disclosed.add(channel.choice)
            new, mapping = rebuild_with_map(channel.text, kept.get(idx, []), disclosure)
            if channel.kind == "transcript":
                # The audio speaks the removed claim; only the rebuilt text may go out.
                msg.pop("audio", None)
                if msg.get("content") is None:
                    msg["content"] = new
                continue
            if channel.kind == "content" and isinstance(msg.get("content"), list):
                msg["content"] = rebuild_chunks(msg["content"], new, mapping)
                continue
            _set_path(body, path, new)
            if channel.kind == "content" and isinstance(msg.get("annotations"), list):
                msg["annotations"] = _remap_annotations(msg["annotations"], mapping)
        elif channel.kind == "tool_arguments":
            if "tool_calls" in path:
                drop_tools.setdefault(channel.choice, set()).add(int(path[4]))
            else:
                msg.pop("function_call", None)
        elif channel.kind == "reasoning" and len(path) > 4 and isinstance(path[4], int):
            source = answer.body["choices"][channel.choice]["message"]  # type: ignore[index]
            drop_entries.append((channel.choice, str(path[3]), source[path[3]][path[4]]))
        elif channel.kind == "reasoning":
            msg.pop(str(path[-1]), None)
    for ci, key, entry in drop_entries:
        msg = body["choices"][ci]["message"]
        entries = msg.get(key)
        if isinstance(entries, list):
            msg[key] = [e for e in entries if e != entry]
            if key == "reasoning_details" and not msg[key]:
                msg.pop(key)
    for ci, gone in drop_tools.items():
        msg = body["choices"][ci]["message"]
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            left = [c for i, c in enumerate(calls) if i not in gone]
            if left:
                msg["tool_calls"] = left
            else:
                msg.pop("tool_calls")
    # A choice that lost only a tool call or reasoning says so too (DESIGN §5: a partial
    # answer carries the disclosure).
    for ci in cut - disclosed:
        msg = body["choices"][ci]["message"]
        text = msg.get("content")
        if text is None or isinstance(text, str):
            msg["content"] = (text or "") + disclosure_after(bool(text), disclosure)
        elif isinstance(text, list):
            msg["content"] = [*text, {"type": "text", "text": disclosure_after(True, disclosure)}]
    return body


def _decide_logprobs(body: Json, policy: Policy, changed: bool) -> None:
    """`channels.logprobs` over each choice of a rendered body. `pass` relays them as they
    are, except in a partial answer, whose texts they no longer describe."""
    for choice in body.get("choices", []):
        lp = choice.get("logprobs")
        if lp is None:
            continue
        if policy.channels.logprobs == "pass" and not changed:
            continue
        choice["logprobs"] = _logprobs(lp, choice["message"], policy)


def _fix_finish_reasons(body: Json) -> None:
    for choice in body.get("choices", []):
        msg = choice.get("message", {})
        if choice.get("finish_reason") == "tool_calls" and not msg.get("tool_calls"):
            choice["finish_reason"] = "stop"
        if choice.get("finish_reason") == "function_call" and not msg.get("function_call"):
            choice["finish_reason"] = "stop"


def _del_path(body: Json, path: Sequence[str | int]) -> None:
    node: Any = body
    for p in path[:-1]:
        node = node[p]
    last = path[-1]
    if isinstance(node, dict):
        node.pop(last, None)


def _set_path(body: Json, path: Sequence[str | int], value: object) -> None:
    node: Any = body
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def _withhold_details(msg: Json) -> None:
    """`channels.reasoning: withhold` over OpenRouter reasoning_details: readable entries go,
    encrypted ones (opaque, needed to continue a conversation) stay."""
    details = msg.get("reasoning_details")
    if not isinstance(details, list):
        return
    kept = [d for d in details if isinstance(d, dict) and d.get("type") == "reasoning.encrypted"]
    if kept:
        msg["reasoning_details"] = kept
    else:
        msg.pop("reasoning_details")


def _logprobs(lp: object, msg: Mapping[str, object], policy: Policy) -> object:
    """A choice's logprobs under `verify` / `withhold` (see `verified_token_logprobs`): each of
    `content` / `refusal` is kept only when its tokens spell the released text."""
    if policy.channels.logprobs == "withhold" or type(lp) is not dict:
        return None
    out: Json = {}
    for key in ("content", "refusal"):
        if key not in lp:
            continue
        entries = lp[key]
        text = msg.get(key)
        out[key] = (
            None
            if entries is None
            else verified_token_logprobs(entries, text if isinstance(text, str) else None)
        )
    return out if any(v is not None for v in out.values()) else None


def _remap_annotations(
    annotations: list[Any], mapping: Sequence[tuple[int, int, int]]
) -> list[Any]:
    """Keep annotations whose span survives whole in a kept piece, with shifted offsets."""
    out: list[Any] = []
    for ann in annotations:
        span = ann.get("url_citation") if isinstance(ann, dict) else None
        if not isinstance(span, dict):
            continue
        s, e = span.get("start_index"), span.get("end_index")
        if not isinstance(s, int) or not isinstance(e, int):
            continue
        for old_s, old_e, new_s in mapping:
            if old_s <= s and e <= old_e:
                moved = copy.deepcopy(ann)
                moved["url_citation"]["start_index"] = new_s + (s - old_s)
                moved["url_citation"]["end_index"] = new_s + (e - old_s)
                out.append(moved)
                break
    return out

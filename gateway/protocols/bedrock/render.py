"""Decisions in the Converse shapes: a released body with the channel rules applied, a partial
body rebuilt from the kept claims (each text piece keeps only its kept claims' citations), the
template answer, and the error envelope `{"message"}` with its `x-amzn-ErrorType`."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.policy import Policy
from gateway.protocols.base import disclosure_after, field_allowed, kept_spans, leaks, split_claims
from gateway.protocols.bedrock.fields import CITATION, known_only
from gateway.protocols.bedrock.parse import block_text, native_citation, text_ranges
from gateway.types import Answer, Channel, Claim, Outcome

__all__ = [
    "error_type",
    "exception_member",
    "partial_body",
    "released_body",
    "template_body",
    "withholds_something",
]

Json = dict[str, Any]

# The status of an error envelope → the error type boto3 reads from `x-amzn-ErrorType`
# (each is a modelled Converse error, so `client.exceptions.<Type>` catches it).
_ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    413: "ValidationException",
    422: "ValidationException",  # the default block status: a request the gateway refuses
    424: "ModelErrorException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
    504: "ModelTimeoutException",
}


def error_type(status: int) -> str:
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    return "ValidationException" if 400 <= status < 500 else "InternalServerException"


def exception_member(type_: str) -> str:
    """The ConverseStream exception event a stream that failed ends with: a block is the
    client's to handle like a bad request; anything else is the service failing."""
    if type_ == "citation_verification_failed":
        return "validationException"
    return "internalServerException"


def _content(body: Mapping[str, Any]) -> list[Any]:
    return list(body["output"]["message"]["content"])


def _withheld_block(block: Mapping[str, Any], policy: Policy) -> bool:
    rules = policy.channels
    if "toolUse" in block:
        return rules.tool_calls == "withhold"
    rc = block.get("reasoningContent")
    if isinstance(rc, Mapping):
        # Opaque redacted reasoning is withheld unless reasoning passes: nothing can check it.
        return rules.reasoning == "withhold" or (
            "redactedContent" in rc and rules.reasoning != "pass"
        )
    return False


def withholds_something(answer: Answer, policy: Policy) -> bool:
    if answer.dropped or any(not field_allowed(p, policy) for p in answer.unknown_fields):
        return True
    return any(_withheld_block(b, policy) for b in _content(answer.body))


def _rebuild(
    answer: Answer, policy: Policy, extra_drop: set[int], text_blocks: list[Json] | None
) -> Json:
    """A copy of the body without unknown fields, withheld blocks and `extra_drop`; with
    `text_blocks` in place of the primary text blocks."""
    body: Json = copy.deepcopy(dict(answer.body))
    for path in sorted(answer.unknown_fields, key=len, reverse=True):
        if field_allowed(path, policy):
            continue
        node: Any = body
        for p in path[:-1]:
            node = node[p]
        if isinstance(node, dict):
            node.pop(path[-1], None)
    out: list[Json] = []
    placed = False
    for bi, block in enumerate(_content(body)):
        if bi in extra_drop or not block or _withheld_block(block, policy):
            continue
        if text_blocks is not None and block_text(block) is not None:
            if not placed:
                out.extend(text_blocks)
                placed = True
            continue
        out.append(block)
    if text_blocks is not None and not placed:
        out.extend(text_blocks)
    body["output"]["message"]["content"] = out
    if body.get("stopReason") == "tool_use" and not any("toolUse" in b for b in out):
        body["stopReason"] = "end_turn"
    return body


def released_body(answer: Answer, policy: Policy) -> Json:
    return _rebuild(answer, policy, set(), None)


def _text_blocks(
    answer: Answer, channel: Channel, kept: Sequence[Claim], disclosure: str
) -> list[Json]:
    """Blocks for the kept claims: a piece of a `citationsContent` block stays one, with only
    the citations of kept claims; other pieces are plain text."""
    content = _content(answer.body)
    ranges = text_ranges(content)
    pieces: list[tuple[str, list[Any]]] = []
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
            cc = content[bi].get("citationsContent")
            raws = (cc.get("citations") or []) if isinstance(cc, Mapping) else []
            cits = [known_only(CITATION, c) for c in raws if native_citation(c).native in own]
            pieces.append((channel.text[s:e], cits))
    pieces.append((disclosure_after(bool(pieces), disclosure), []))
    blocks: list[Json] = []
    for text, cits in pieces:
        if not text:
            continue
        if blocks and not cits and "text" in blocks[-1]:
            blocks[-1]["text"] += text
            continue
        if cits:
            blocks.append(
                {
                    "citationsContent": {
                        "content": [{"text": text}],
                        "citations": copy.deepcopy(cits),
                    }
                }
            )
        else:
            blocks.append({"text": text})
    return blocks


def partial_body(
    answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
) -> Json:
    kept, failed = split_claims(claims, outcome)
    all_failed = [c for cs in failed.values() for c in cs]
    drop: set[int] = set()
    text_blocks: list[Json] | None = None
    disclosure = policy.release.templates.partial
    for idx, channel in enumerate(answer.channels):
        if not (idx in failed or (all_failed and leaks(channel, all_failed))):
            continue
        if channel.kind == "content":
            text_blocks = _text_blocks(answer, channel, kept.get(idx, []), disclosure)
        else:
            drop.add(int(channel.path[3]))  # ("output", "message", "content", bi, ...)
    body = _rebuild(answer, policy, drop, text_blocks)
    if text_blocks is None and drop:  # only a tool use or reasoning went: say so all the same
        blocks = body["output"]["message"]["content"]
        texts = any("text" in b for b in blocks if isinstance(b, dict))
        blocks.append({"text": disclosure_after(texts, disclosure)})
    return body


def template_body(source: Mapping[str, Any], text: str) -> Json:
    """The template as a normal answer, with the upstream's usage and metrics."""
    usage = source.get("usage")
    metrics = source.get("metrics")
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
        "stopReason": "end_turn",
        "usage": copy.deepcopy(usage)
        if isinstance(usage, Mapping)
        else {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
        "metrics": copy.deepcopy(metrics) if isinstance(metrics, Mapping) else {"latencyMs": 0},
    }

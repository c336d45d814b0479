"""What every protocol adapter offers, plus the helpers renderers share.

An adapter is sans-io: it turns a protocol body or SSE events into an `Answer`, and turns a
decision back into a body or a stream in that protocol's normal shape.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.policy import Policy, Route
from gateway.protocols.fields import allowed
from gateway.sse import SSEEvent
from gateway.types import (
    Answer,
    Channel,
    Claim,
    ContextSet,
    Decision,
    Outcome,
    Report,
    TemplateName,
)

__all__ = [
    "BLOCKED_TYPE",
    "Adapter",
    "RequestInfo",
    "StreamParser",
    "TextDelta",
    "blocked_message",
    "channel_key",
    "claim_core",
    "field_allowed",
    "kept_spans",
    "leaks",
    "rebuild_text",
    "rebuild_with_map",
    "rule_withholds_something",
    "split_claims",
    "template_text",
]

# (channel key, text): the key is `channel_key(channel.path)` of the channel the text extends.
TextDelta = tuple[str, str]


@dataclass(frozen=True, slots=True)
class RequestInfo:
    stream: bool
    include_usage: bool
    n: int


class StreamParser(Protocol):
    @property
    def done(self) -> bool: ...

    def feed(self, event: SSEEvent) -> list[TextDelta]: ...

    def finish(self) -> Answer: ...


class Adapter(Protocol):
    name: str

    def request_info(self, body: Mapping[str, object]) -> RequestInfo: ...

    def request_context(
        self, body: Mapping[str, object], ctx: ContextSet, chunk_re: re.Pattern[str] | None
    ) -> None: ...

    def parse(self, body: Mapping[str, object], route: Route) -> Answer: ...

    def stream_parser(self, route: Route) -> StreamParser: ...

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool: ...

    def render(
        self,
        answer: Answer,
        claims: Sequence[Claim],
        outcome: Outcome,
        report: Report,
        policy: Policy,
    ) -> dict[str, object]: ...

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]: ...

    def error_event(self, message: str, type_: str) -> SSEEvent: ...

    def relay_error(self, body: object) -> dict[str, object] | None:
        """An upstream 4xx body, if it is this protocol's error envelope, rebuilt from the
        envelope's known fields only (gateway/protocols/relay.py); else None."""
        ...

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]: ...


def channel_key(path: Sequence[str | int]) -> str:
    """The stable string name of a channel, used in TextDelta."""
    return "/".join(str(p) for p in path)


def field_allowed(path: Sequence[str | int], policy: Policy) -> bool:
    """An unknown field survives a verified route only when the policy allow-lists it."""
    return allowed(path, policy.channels.allow_fields)


def rule_withholds_something(answer: Answer, policy: Policy) -> bool:
    """Does a channel rule remove part of this answer (a withheld reasoning or tool-call
    channel, a field the field table dropped, or an unknown field not allow-listed)? Then it
    cannot go out byte-identical."""
    if answer.dropped:
        return True
    ch = policy.channels
    for c in answer.channels:
        if c.kind == "reasoning" and ch.reasoning == "withhold":
            return True
        if c.kind == "tool_arguments" and ch.tool_calls == "withhold":
            return True
    return any(not field_allowed(p, policy) for p in answer.unknown_fields)


BLOCKED_TYPE = "citation_verification_failed"


def blocked_message(outcome: Outcome) -> str:
    reason = outcome.reason or "unverified"
    return f"The answer was blocked: a claim failed citation verification ({reason})."


def template_text(outcome: Outcome, policy: Policy, default: TemplateName) -> str:
    return str(getattr(policy.release.templates, outcome.template or default))


Body = dict[str, object]


def render_decision(
    outcome: Outcome,
    policy: Policy,
    *,
    released: Callable[[], Body],
    partial: Callable[[], Body],
    template: Callable[[str], Body],
    blocked: Callable[[str], Body],
) -> Body:
    """The exhaustive decision → body dispatch of an adapter's `render`: the adapter supplies
    how its protocol shapes each body; abstained / review get their template's text, blocked
    its message. An unknown decision raises, never releases."""
    match outcome.decision:
        case Decision.RELEASED:
            return released()
        case Decision.PARTIAL:
            return partial()
        case Decision.ABSTAINED:
            return template(template_text(outcome, policy, "no_evidence"))
        case Decision.REVIEW:
            return template(template_text(outcome, policy, "review_required"))
        case Decision.BLOCKED:
            return blocked(blocked_message(outcome))
        case _:
            raise ValueError(f"unknown decision {outcome.decision!r}")


# A list item's marker in front of a claim: "- ", "* ", "+ ", "• ", "1. ", "2) ".
_LIST_MARKER = re.compile(r"[ \t]*(?:[-*+•]|\d{1,9}[.)])[ \t]+")


def kept_spans(text: str, kept: Sequence[Claim]) -> list[tuple[int, int, bool]]:
    """(start, end, is_list_item) of each kept claim in `text`, in text order.

    A list item's span is widened to include its marker so it stays a list item.
    """
    out: list[tuple[int, int, bool]] = []
    for c in sorted(kept, key=lambda c: c.start):
        start, end = c.start, c.end
        line_start = text.rfind("\n", 0, start) + 1
        prefix = text[line_start:start]
        is_item = False
        if _LIST_MARKER.fullmatch(prefix):
            start, is_item = line_start, True
        elif _LIST_MARKER.match(text, start, end) and (not prefix.strip()):
            is_item = True
        out.append((start, end, is_item))
    return out


def rebuild_with_map(
    text: str, kept: Sequence[Claim], disclosure: str | None
) -> tuple[str, list[tuple[int, int, int]]]:
    """The partial text, and (old_start, old_end, new_start) for each kept span.

    Kept claims are sliced out of `text`; list items stay on their own lines, other claims
    are joined with a space; the disclosure follows after a blank line.
    """
    parts: list[str] = []
    mapping: list[tuple[int, int, int]] = []
    pos = 0
    prev_item: bool | None = None
    for start, end, is_item in kept_spans(text, kept):
        if prev_item is not None:
            sep = "\n" if (is_item or prev_item) else " "
            parts.append(sep)
            pos += len(sep)
        mapping.append((start, end, pos))
        parts.append(text[start:end])
        pos += end - start
        prev_item = is_item
    if disclosure:
        parts.append(("\n\n" if parts else "") + disclosure)
    return "".join(parts), mapping


def rebuild_text(text: str, kept: Sequence[Claim], disclosure: str | None) -> str:
    return rebuild_with_map(text, kept, disclosure)[0]


def claim_core(claim: Claim) -> str:
    """A claim's own words: its text without citation markers, trimmed (for leak sweeps)."""
    text = claim.text
    for cit in sorted(claim.citations, key=lambda c: c.start, reverse=True):
        if cit.start >= claim.start and cit.end <= claim.end and cit.start >= 0:
            a, b = cit.start - claim.start, cit.end - claim.start
            text = text[:a] + text[b:]
    return text.strip()


def leaks(channel: Channel, failed: Sequence[Claim]) -> bool:
    """Does this channel's text contain the words of a failed claim?"""
    return any((core := claim_core(c)) and core in channel.text for c in failed)


def split_claims(
    claims: Sequence[Claim], outcome: Outcome
) -> tuple[dict[int, list[Claim]], dict[int, list[Claim]]]:
    """Claims per channel index: (kept, failed). Exempt claims are always kept."""
    kept: dict[int, list[Claim]] = {}
    failed: dict[int, list[Claim]] = {}
    for c in claims:
        target = kept if (c.index in outcome.kept or c.exempt) else failed
        target.setdefault(c.channel, []).append(c)
    return kept, failed

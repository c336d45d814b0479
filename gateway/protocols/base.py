"""What every protocol adapter offers, plus the helpers renderers share.

An adapter is sans-io: it turns a protocol body or SSE events into an `Answer`, and turns a
decision back into a body or a stream in that protocol's normal shape.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from gateway import release
from gateway.context import Trust
from gateway.framing import SSE_CODEC, StreamCodec
from gateway.policy import ContextSpec, Policy, Route
from gateway.protocols.fields import Rule, allowed
from gateway.sse import SSEDecoder, SSEEvent, encode
from gateway.types import (
    Answer,
    Channel,
    Citation,
    Claim,
    ContextSet,
    Decision,
    Outcome,
    Report,
)

if TYPE_CHECKING:
    from gateway.pipeline import RoutePipeline

__all__ = [
    "BLOCKED_TYPE",
    "QUESTION_MAX",
    "Adapter",
    "BlockSpans",
    "Framer",
    "NativeSpans",
    "RequestInfo",
    "StreamParser",
    "TextDelta",
    "blocked_message",
    "channel_key",
    "claim_core",
    "disclosure_after",
    "field_allowed",
    "kept_spans",
    "last_user_text",
    "leaks",
    "rebuild_text",
    "rebuild_with_map",
    "relayable_sse",
    "rule_withholds_something",
    "split_claims",
]

# (channel key, text): the key is `channel_key(channel.path)` of the channel the text extends.
TextDelta = tuple[str, str]
# A key path in a policy file, for `policy check` messages.
KeyPath = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class RequestInfo:
    stream: bool
    include_usage: bool
    n: int


class NativeSpans(Protocol):
    """Citations a stream carries beside its text (Anthropic citation deltas, annotations),
    located by offset in the primary text; the stream parser records them as it is fed."""

    def overlapping(self, start: int, end: int, length: int) -> tuple[Citation, ...]: ...


class BlockSpans:
    """Native citations per text block of the primary text: each citation spans its whole
    block, as the protocol's `parse_body` attaches them to the whole answer (Anthropic
    citations, Bedrock citationsContent). The stream parser appends blocks as they start."""

    def __init__(self) -> None:
        self.blocks: list[tuple[int, list[Citation]]] = []  # (start offset, citations)

    def overlapping(self, start: int, end: int, length: int) -> tuple[Citation, ...]:
        out: list[Citation] = []
        for i, (s, cits) in enumerate(self.blocks):
            e = self.blocks[i + 1][0] if i + 1 < len(self.blocks) else length
            if (s < end and e > start) or (s == e and start <= s <= end):
                out.extend(cits)
        return tuple(out)


class StreamParser(ABC):
    """A protocol's incremental stream parser: events in, text deltas per channel out, the
    whole `Answer` at the end (ProtocolError if the stream is cut short)."""

    # Context arrived in the stream after claims were checked (search results with the last
    # frame): buffer mode then checks every claim again.
    context_grew_late: bool = False

    @property
    @abstractmethod
    def done(self) -> bool: ...

    @abstractmethod
    def feed(self, event: SSEEvent) -> list[TextDelta]: ...

    @abstractmethod
    def finish(self) -> Answer: ...

    @property
    def native_spans(self) -> NativeSpans | None:
        """The stream's native citations, when the protocol has any."""
        return None

    def bind_context(self, ctx: ContextSet, spec: ContextSpec) -> None:
        """Context that arrives in the stream itself (file_search results) is added to `ctx`;
        most protocols have none."""
        return None


class Framer(ABC):
    """How progressive release writes released text in a protocol's stream shape. One per
    stream; it learns the stream's head (ids, model) from the upstream's events."""

    @abstractmethod
    def observe(self, event: SSEEvent) -> None: ...

    @property
    @abstractmethod
    def started(self) -> bool:
        """Whether anything has been written to the client yet."""

    @abstractmethod
    def opening(self) -> bytes: ...

    @abstractmethod
    def text(self, text: str, citations: Sequence[Claim] = ()) -> bytes: ...

    @abstractmethod
    def tail(self, pipeline: RoutePipeline, body: Mapping[str, Any]) -> bytes:
        """Everything of the final body but the primary text, which was already released."""

    @abstractmethod
    def template_body(self, text: str) -> dict[str, Any]:
        """A whole answer carrying `text`, for a stream that ends in a template."""

    @abstractmethod
    def error(self, message: str, type_: str) -> bytes:
        """The bytes that end the stream on a failure, in the protocol's error shape."""


class Adapter(ABC):
    """Everything protocol-specific, registered by name in `gateway.protocols.ADAPTERS`.
    Shared code calls these methods and never names a protocol.

    Optional behaviour has a default here; an adapter overrides what its protocol needs.
    """

    name: ClassVar[str]
    # The field table of the answer body (`fields.Rule`): the level a dropped field is
    # counted at. None: every dropped field is counted at level `top`.
    field_table: ClassVar[Rule | None] = None
    # The text channel a stream verifier segments while the stream arrives (`channel_key`);
    # None: the answer is judged whole when the stream ends.
    primary_channel: ClassVar[str | None] = None
    # The last bytes of a well-formed stream, up to the event's closing brace; None: the
    # adapter's `stream_relayable` decides.
    terminal_event: ClassVar[bytes | None] = None
    # A GET with no body is an answer too (stored responses): it is verified like one.
    stored_answers: ClassVar[bool] = False
    # `release.retry` applies: the request can be re-sent with a grounding instruction.
    retries: ClassVar[bool] = False
    # Why `release.retry` does not apply, for `policy check` to warn (None: no warning).
    no_retry_reason: ClassVar[str | None] = None
    # The route's `rag:` section is read (else `policy check` warns that it is ignored).
    reads_rag: ClassVar[bool] = False

    # -- the request ---------------------------------------------------------------------------

    @abstractmethod
    def request_info(self, body: Mapping[str, object]) -> RequestInfo: ...

    def streams_by_path(self, path: str) -> bool | None:
        """Whether the path alone asks for a stream (Gemini, Bedrock); None: the body says."""
        return None

    def stored_request_info(self, query: str) -> RequestInfo:
        """A stored answer's GET (`stored_answers`): what its query asks for. ProtocolError:
        a query the gateway cannot verify the answer to (a client error)."""
        return self.request_info({})

    def forward_body(self, raw: bytes, path_qs: str, policy: Policy) -> bytes:
        """The request body to forward upstream (a rewrite such as Responses' `include`)."""
        return raw

    def question(self, body: Mapping[str, object] | None) -> str | None:
        """The end user's question: the text of the request's last user message, shown to
        the judge to read a claim by, never as evidence (DESIGN §10). None when there is
        none. The default reads a `messages` list (chat, Anthropic, Cohere, Bedrock)."""
        if not isinstance(body, Mapping):
            return None
        return last_user_text(body.get("messages"))

    @abstractmethod
    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        """Add the chunks and documents of the request's trusted places to `ctx`."""

    def response_context(self, body: object, ctx: ContextSet, trust: Trust) -> None:
        """Add context the answer itself carries (retrieval results) to `ctx`; most
        protocols' answers carry none."""
        return None

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        """`request` (a copy, free to change) with the grounding instruction where the
        protocol puts it. Only called when `retries` is True."""
        raise ValueError(f"release.retry is not supported for protocol {self.name!r}")

    def lint_route(self, route: Route, at: KeyPath, policy: Policy) -> list[tuple[KeyPath, str]]:
        """What `policy check` warns about a route of this protocol (at key path `at`), as
        (key path, message) pairs."""
        out: list[tuple[KeyPath, str]] = []
        if policy.release.retry and not self.retries and self.no_retry_reason:
            out.append((
                ("release", "retry"),
                f"release.retry is not applied on route {route.name!r} ({self.name}): "
                f"{self.no_retry_reason}",
            ))
        if route.rag is not None and not self.reads_rag:
            out.append(((*at, "rag"), f"rag is ignored for protocol {self.name}"))
        return out

    def relays_model_output(self, passthrough: str) -> str | None:
        """What model output of this protocol a passthrough entry would relay unverified
        (for `policy check` to warn), or None."""
        return None

    # -- the answer ----------------------------------------------------------------------------

    @abstractmethod
    def parse(self, body: Mapping[str, object], route: Route) -> Answer: ...

    @abstractmethod
    def stream_parser(self, route: Route) -> StreamParser: ...

    @abstractmethod
    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool: ...

    def kept_fields(self, answer: Answer) -> dict[str, object]:
        """Fields of the answer a block envelope keeps (rag-json's `rag.keep`)."""
        return {}

    def stream_relayable(self, raw: bytes) -> bool:
        """Whether a captured stream may go out as is: it ends with its first terminal
        event. Parsers stop there, so bytes after it were never verified."""
        marker = self.terminal_event
        if marker is None:
            return False
        at = raw.find(marker)
        return at >= 0 and not raw[at + len(marker) :].strip(b" \t\r\n}")

    # -- what the client receives --------------------------------------------------------------

    def render(
        self,
        answer: Answer,
        claims: Sequence[Claim],
        outcome: Outcome,
        report: Report,
        policy: Policy,
    ) -> dict[str, object]:
        """The body for a decision: one exhaustive match (`render_decision`) over the
        protocol's three shapes and its error envelope."""
        return render_decision(
            outcome,
            policy,
            released=lambda: self.released_body(answer, policy),
            partial=lambda: self.partial_body(answer, claims, outcome, policy),
            template=lambda text: self.template_body(answer, text, policy),
            blocked=lambda message: self.error_envelope(
                policy.release.block_status, message, BLOCKED_TYPE
            ),
        )

    @abstractmethod
    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        """The released answer with channel and field rules applied."""

    @abstractmethod
    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        """The answer with only the kept claims and the disclosure."""

    @abstractmethod
    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        """The answer replaced by a template's text (abstained, review)."""

    @abstractmethod
    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]: ...

    def stream_codec(self) -> StreamCodec:
        """How this protocol frames streams on the wire (SSE unless overridden)."""
        return SSE_CODEC

    def progressive_framer(self, include_usage: bool) -> Framer:
        """The framer of a progressive stream. Only called for a request whose
        `request_info` (or `streams_by_path`) asks for a stream."""
        raise ValueError(f"protocol {self.name!r} has no progressive streams")

    @abstractmethod
    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]: ...

    @abstractmethod
    def error_event(self, message: str, type_: str) -> SSEEvent: ...

    def error_headers(self, status: int) -> list[tuple[bytes, bytes]]:
        """Extra headers on every error answer (Bedrock's `x-amzn-ErrorType`)."""
        return []

    @abstractmethod
    def relay_error(self, body: object) -> dict[str, object] | None:
        """An upstream 4xx body, if it is this protocol's error envelope, rebuilt from the
        envelope's known fields only (gateway/protocols/relay.py); else None."""


def relayable_sse(raw: bytes, terminal: Callable[[SSEEvent], bool]) -> bool:
    """Whether a captured SSE stream may go out as the upstream's bytes: its first terminal
    event is its last event (parsers stop there, so anything after it was never verified),
    and it holds nothing but the event lines the gateway would write itself (no comments,
    ids or retries). `terminal` may raise on an unreadable event: then it is not relayable."""
    decoder = SSEDecoder()
    events = decoder.feed(raw) + decoder.finish()
    if not events:
        return False
    try:
        if any(terminal(e) for e in events[:-1]) or not terminal(events[-1]):
            return False
    except Exception:
        return False
    return b"".join(encode(e) for e in events) == raw


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
        case Decision.ABSTAINED | Decision.REVIEW:
            # Never None for these two decisions: each shows a template.
            return template(release.template_text(outcome, policy.release.templates) or "")
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
        parts.append(disclosure_after(bool(parts), disclosure))
    return "".join(parts), mapping


QUESTION_MAX = 2000  # characters of a question shown to the judge


def last_user_text(messages: object, user: str = "user", content: str = "content") -> str | None:
    """The text of the last message of role `user` in a list of messages: its `content`
    string, or the text of its text parts (`{"type": "text", "text": …}`, a part with no type,
    Responses' `input_text`); None when that message has no text."""
    if not isinstance(messages, list):
        return None
    for m in reversed(messages):
        if isinstance(m, Mapping) and m.get("role") == user:
            return _text_of(m.get(content))
    return None


def _text_of(content: object) -> str | None:
    if isinstance(content, str):
        return content[:QUESTION_MAX] or None
    if isinstance(content, list):
        parts = [
            p["text"]
            for p in content
            if isinstance(p, Mapping) and isinstance(p.get("text"), str)
            and p.get("type") in ("text", "input_text", None)
        ]
        return "\n".join(parts)[:QUESTION_MAX] or None
    return None


def disclosure_after(text_before: bool, disclosure: str) -> str:
    """The disclosure as it follows an answer's text: after a blank line, when there is text."""
    return ("\n\n" if text_before else "") + disclosure


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

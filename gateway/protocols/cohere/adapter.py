"""cohere-chat: `POST /v2/chat`, JSON and SSE. The adapter ties parse, stream, render, context
and framer together behind the interface every protocol offers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.context import Trust
from gateway.policy import Policy, Route
from gateway.protocols.base import (
    Adapter,
    RequestInfo,
    channel_key,
    relayable_sse,
    rule_withholds_something,
)
from gateway.protocols.cohere import context as cctx
from gateway.protocols.cohere.fields import BODY_TABLE
from gateway.protocols.cohere.framer import CohereFramer
from gateway.protocols.cohere.parse import NAME, parse_body
from gateway.protocols.cohere.render import (
    abstained_body,
    partial_body,
    released_body,
    to_events,
)
from gateway.protocols.cohere.retry import with_grounding
from gateway.protocols.cohere.stream import CohereStreamParser, loads
from gateway.protocols.relay import relayed_message
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, ContextSet, Outcome

__all__ = ["CohereChat"]


def _terminal(event: SSEEvent) -> bool:
    """A `message-end` event (parsed only when it could be one)."""
    return "message-end" in event.data and loads(event.data).get("type") == "message-end"


class CohereChat(Adapter):
    name = NAME
    primary_channel = channel_key(("text", 0))  # the first text item of message.content
    retries = True
    field_table = BODY_TABLE

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        return RequestInfo(stream=body.get("stream") is True, include_usage=True, n=1)

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        cctx.request_context(body, ctx, trust.pattern, trust)

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        return with_grounding(request, instruction)

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def stream_parser(self, route: Route) -> CohereStreamParser:
        return CohereStreamParser()

    def progressive_framer(self, include_usage: bool) -> CohereFramer:
        return CohereFramer(include_usage)

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        """Whether the released body differs from the upstream's: a channel or field rule
        withholds something, or a citation or the logprobs cannot go out as they are."""
        if rule_withholds_something(answer, policy):
            return True
        return released_body(answer, policy) != answer.body

    def stream_relayable(self, raw: bytes) -> bool:
        """A captured stream goes out as the upstream's bytes only when it ends with
        `message-end` and holds nothing but the event lines the gateway would write. The
        parser stops at the first `message-end`: a stream with any event after it is never
        relayed."""
        return relayable_sse(raw, _terminal)

    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        return released_body(answer, policy)

    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        return partial_body(answer, claims, outcome, policy)

    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        return abstained_body(answer, text)

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        """Cohere's error body is `{"message"}`; the gateway's own facts go in `citewarden`."""
        return {"message": message}

    def error_event(self, message: str, type_: str) -> SSEEvent:
        """A failed generation as the stream reports one: `message-end` with
        `finish_reason: ERROR` and the reason in `delta.error`."""
        data = {"type": "message-end", "delta": {"finish_reason": "ERROR", "error": message}}
        return SSEEvent(data=json.dumps(data, ensure_ascii=False), event="message-end")

    def relay_error(self, body: object) -> dict[str, object] | None:
        if not isinstance(body, Mapping):
            return None
        message = relayed_message(body.get("message"))
        return None if message is None else {"message": message}

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        return to_events(body)

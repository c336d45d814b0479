"""anthropic-messages: `POST /v1/messages`, JSON and SSE. The adapter ties parse, stream,
render, context and framer together behind the interface every protocol offers."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.context import Trust
from gateway.policy import Policy, Route
from gateway.protocols.anthropic_messages import context as actx
from gateway.protocols.anthropic_messages.fields import BODY_TABLE, FRAME_TABLE
from gateway.protocols.anthropic_messages.framer import AnthropicFramer
from gateway.protocols.anthropic_messages.parse import NAME, parse_body
from gateway.protocols.anthropic_messages.render import (
    abstained_body,
    cites_a_source,
    error_body,
    error_event,
    partial_body,
    relayed_sources,
    released_body,
    stream_events,
)
from gateway.protocols.anthropic_messages.stream import AnthropicStreamParser
from gateway.protocols.base import (
    Adapter,
    RequestInfo,
    channel_key,
    rule_withholds_something,
)
from gateway.protocols.relay import relayed_message, relayed_token
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, ContextSet, Outcome, Report

__all__ = ["AnthropicMessages"]


class AnthropicMessages(Adapter):
    name = NAME
    primary_channel = channel_key(("content",))
    terminal_event = b'message_stop"'
    retries = True
    field_table = BODY_TABLE
    frame_table = FRAME_TABLE

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        return RequestInfo(stream=body.get("stream") is True, include_usage=True, n=1)

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        actx.request_context(body, ctx, trust.pattern, trust)

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        system = request.get("system")
        if isinstance(system, list):
            system.append({"type": "text", "text": instruction})
        elif isinstance(system, str) and system:
            request["system"] = f"{system}\n\n{instruction}"
        else:
            request["system"] = instruction
        return request

    def progressive_framer(self, include_usage: bool) -> AnthropicFramer:
        return AnthropicFramer(include_usage)

    def stream_parser(self, route: Route) -> AnthropicStreamParser:
        return AnthropicStreamParser()

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        content = answer.body.get("content")
        redacted = isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "redacted_thinking" for b in content
        )
        if redacted and policy.channels.reasoning != "pass":
            return True
        return cites_a_source(answer.body) or rule_withholds_something(answer, policy)

    def render(
        self,
        answer: Answer,
        claims: Sequence[Claim],
        outcome: Outcome,
        report: Report,
        policy: Policy,
    ) -> dict[str, object]:
        body = super().render(answer, claims, outcome, report, policy)
        return relayed_sources(body, report.context)

    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        return released_body(answer, policy)

    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        return partial_body(answer, claims, outcome, policy)

    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        return abstained_body(answer, text)

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return error_body(message, type_)

    def error_event(self, message: str, type_: str) -> SSEEvent:
        return error_event(message, type_)

    def relay_error(self, body: object) -> dict[str, object] | None:
        if not isinstance(body, Mapping) or body.get("type") != "error":
            return None
        error = body.get("error")
        if not isinstance(error, Mapping):
            return None
        message = relayed_message(error.get("message"))
        if message is None:
            return None
        type_ = relayed_token(error.get("type")) or "api_error"
        return error_body(message, type_)

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        return [
            SSEEvent(data=json.dumps(data, ensure_ascii=False), event=str(data["type"]))
            for data in stream_events(body)
        ]

"""openai-chat: `POST /v1/chat/completions`, JSON and SSE. The adapter ties parse, stream,
render, context and framer together behind the interface every protocol offers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.context import Trust
from gateway.policy import Policy, Route
from gateway.protocols.base import (
    Adapter,
    RequestInfo,
    channel_key,
    rule_withholds_something,
)
from gateway.protocols.openai_chat import context as octx
from gateway.protocols.openai_chat.fields import BODY_TABLE, FRAME_TABLE
from gateway.protocols.openai_chat.framer import OpenAIFramer
from gateway.protocols.openai_chat.parse import NAME, parse_body
from gateway.protocols.openai_chat.render import (
    drop_unverified_urls,
    error_envelope,
    error_event,
    has_annotations,
    logprobs_change,
    partial_body,
    released_body,
    template_body,
    to_events,
)
from gateway.protocols.openai_chat.stream import OpenAIStreamParser
from gateway.protocols.relay import relayed_code, relayed_fields, relayed_message, relayed_token
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, ContextSet, Outcome, Report

__all__ = ["OpenAIChat"]


class OpenAIChat(Adapter):
    name = NAME
    primary_channel = channel_key(("choices", 0, "message", "content"))
    terminal_event = b"[DONE]"
    retries = True
    field_table = BODY_TABLE
    frame_table = FRAME_TABLE

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        opts = body.get("stream_options")
        include = isinstance(opts, Mapping) and opts.get("include_usage") is True
        n = body.get("n")
        return RequestInfo(
            stream=body.get("stream") is True,
            include_usage=include,
            n=n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1,
        )

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        octx.request_context(body, ctx, trust.pattern, trust)

    def response_context(self, body: object, ctx: ContextSet, trust: Trust) -> None:
        """Context the response itself carries (`context.from: response`): Perplexity's
        search results and citations, for numeric `[N]` markers only (`response_context`)."""
        octx.response_context(body, ctx)

    def forward_body(self, raw: bytes, path_qs: str, policy: Policy) -> bytes:
        """The request as sent; this exchange learns its route's citation format here, which
        decides whether search results in the answer are context (`set_route_format`)."""
        octx.set_route_format(policy.citations.format)
        return raw

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        messages = request.setdefault("messages", [])
        messages.append({"role": "system", "content": instruction})
        return request

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def stream_parser(self, route: Route) -> OpenAIStreamParser:
        return OpenAIStreamParser()

    def progressive_framer(self, include_usage: bool) -> OpenAIFramer:
        return OpenAIFramer(include_usage)

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        return (
            rule_withholds_something(answer, policy)
            or logprobs_change(answer, policy)
            or has_annotations(answer)
        )

    def render(
        self,
        answer: Answer,
        claims: Sequence[Claim],
        outcome: Outcome,
        report: Report,
        policy: Policy,
    ) -> dict[str, object]:
        """The body for a decision, its annotations' URLs decided against the context the
        claims were checked against (`drop_unverified_urls`)."""
        body = super().render(answer, claims, outcome, report, policy)
        ctx = report.context
        drop_unverified_urls(body, ctx.chunks if isinstance(ctx, ContextSet) else None)
        return body

    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        return released_body(answer, policy)

    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        return partial_body(answer, claims, outcome, policy)

    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        return template_body(answer, text)

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return error_envelope(message, type_)

    def error_event(self, message: str, type_: str) -> SSEEvent:
        return error_event(message, type_)

    def relay_error(self, body: object) -> dict[str, object] | None:
        if not isinstance(body, Mapping) or not isinstance(body.get("error"), Mapping):
            return None
        error = body["error"]
        message = relayed_message(error.get("message"))
        if message is None:
            return None
        return {"error": relayed_fields(error, message, type=relayed_token, param=relayed_token,
                                        code=relayed_code)}

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        return to_events(body, include_usage)

"""openai-responses: `POST /v1/responses` (JSON and typed SSE) and stored responses
(`GET /v1/responses/{id}`), verified like any answer. The adapter ties parse, stream, render,
context and framer together behind the interface every protocol offers."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.context import Trust
from gateway.errors import ProtocolError
from gateway.policy import Policy, Route
from gateway.protocols.base import (
    QUESTION_MAX,
    Adapter,
    RequestInfo,
    channel_key,
    last_user_text,
    relayable_sse,
)
from gateway.protocols.openai_responses import context as rctx
from gateway.protocols.openai_responses.framer import ResponsesFramer
from gateway.protocols.openai_responses.lint import returns_model_output
from gateway.protocols.openai_responses.parse import NAME, parse_body
from gateway.protocols.openai_responses.render import (
    abstained_body,
    partial_body,
    released_body,
    to_events,
    withholds_something,
)
from gateway.protocols.openai_responses.retry import with_grounding
from gateway.protocols.openai_responses.stream import TERMINAL, ResponsesStreamParser, loads
from gateway.protocols.relay import relayed_code, relayed_fields, relayed_message, relayed_token
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, ContextSet, Outcome

__all__ = ["OpenAIResponses"]


def stored_stream(query: str) -> bool:
    """Whether a stored response's GET query asks for a stream (`stream=true`). ProtocolError
    for `starting_after` (a resumed stream) and for a `stream` given twice or as anything but
    `true` / `false`: which one the upstream reads is not the gateway's to guess."""
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    if any(k == "starting_after" for k, _ in pairs):
        raise ProtocolError(
            "citewarden verifies a stored response's stream only from its start: "
            "starting_after is not supported"
        )
    values = [v for k, v in pairs if k == "stream"]
    if not values:
        return False
    if len(values) > 1 or values[0] not in ("true", "false"):
        raise ProtocolError("the stream query parameter must be given once, as true or false")
    return values[0] == "true"


def _terminal(event: SSEEvent) -> bool:
    """A `response.completed` / `response.incomplete` event (parsed only when it could be)."""
    return "response." in event.data and loads(event.data).get("type") in TERMINAL


class OpenAIResponses(Adapter):
    name = NAME
    primary_channel = channel_key(("output_text", 0))
    retries = True
    # A GET of a stored response (`/v1/responses/{id}`, background-mode polling) is an answer
    # too: the proxy verifies it with an empty request.
    stored_answers = True

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        return RequestInfo(stream=body.get("stream") is True, include_usage=True, n=1)

    def stored_request_info(self, query: str) -> RequestInfo:
        """`GET /v1/responses/{id}?stream=true` replays a stored response as a stream, verified
        like a create stream. A resumed one (`starting_after`) is refused: the text before
        its first event is never seen, so a claim cut there could not be checked whole."""
        return RequestInfo(stream=stored_stream(query), include_usage=True, n=1)

    def question(self, body: Mapping[str, object] | None) -> str | None:
        # `input`: the question itself, or a list of items whose user messages hold it.
        if not isinstance(body, Mapping):
            return None
        given = body.get("input")
        if isinstance(given, str):
            return given[:QUESTION_MAX] or None
        return last_user_text(given)

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        rctx.request_context(body, ctx, trust.pattern, trust)

    def response_context(self, body: object, ctx: ContextSet, trust: Trust) -> None:
        rctx.response_context(body, ctx, trust.pattern, trust)

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        return with_grounding(request, instruction)

    def relays_model_output(self, passthrough: str) -> str | None:
        return returns_model_output(passthrough)

    def forward_body(self, raw: bytes, path_qs: str, policy: Policy) -> bytes:
        """The request body to forward (with the file_search results asked for)."""
        return rctx.forward_body(raw, path_qs, policy.context, shadow=policy.mode == "shadow")

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def stream_parser(self, route: Route) -> ResponsesStreamParser:
        return ResponsesStreamParser()

    def progressive_framer(self, include_usage: bool) -> ResponsesFramer:
        return ResponsesFramer(include_usage)

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        return withholds_something(answer, policy)

    def stream_relayable(self, raw: bytes) -> bool:
        """Whether a captured stream may be relayed as the upstream's bytes: it ends with its
        terminal event and holds nothing but `event:` + `data:` lines the gateway would have
        written itself (no comments, ids, retries or bytes after the end). The parser stops at
        the first terminal event: a stream with another event after it is never relayed."""
        return relayable_sse(raw, _terminal)

    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        return released_body(answer, policy)

    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        return partial_body(answer, claims, outcome, policy)

    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        return abstained_body(answer, policy, text)

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return {"error": {"message": message, "type": type_, "param": None, "code": type_}}

    def relay_error(self, body: object) -> dict[str, object] | None:
        """A 4xx envelope rebuilt from its known fields only (the chat completions shape)."""
        if not isinstance(body, Mapping) or not isinstance(body.get("error"), Mapping):
            return None
        error = body["error"]
        message = relayed_message(error.get("message"))
        if message is None:
            return None
        fields = relayed_fields(
            error, message, type=relayed_token, param=relayed_token, code=relayed_code
        )
        return {"error": fields}

    def error_event(self, message: str, type_: str) -> SSEEvent:
        data: dict[str, Any] = {
            "type": "error",
            "code": type_,
            "message": message,
            "param": None,
            "sequence_number": 0,
        }
        return SSEEvent(data=json.dumps(data), event="error")

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        return to_events(body)

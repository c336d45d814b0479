"""gemini: `POST /v1beta/models/{model}:generateContent` (JSON) and `:streamGenerateContent`
(`?alt=sse`), streaming chosen by the path. The adapter ties parse, stream, render, context and
framer together behind the interface every protocol offers."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from gateway.context import Trust
from gateway.policy import Policy, Route
from gateway.protocols.base import (
    Adapter,
    RequestInfo,
    last_user_text,
    rule_withholds_something,
)
from gateway.protocols.gemini import context as gctx
from gateway.protocols.gemini.fields import BODY_TABLE
from gateway.protocols.gemini.framer import GeminiFramer
from gateway.protocols.gemini.parse import NAME, parse_body
from gateway.protocols.gemini.render import (
    abstained_body,
    partial_body,
    released_body,
    to_events,
)
from gateway.protocols.gemini.retry import with_grounding
from gateway.protocols.gemini.stream import GeminiStreamParser
from gateway.protocols.relay import relayed_code, relayed_fields, relayed_message, relayed_token
from gateway.sse import SSEDecoder, SSEEvent, encode
from gateway.types import Answer, Claim, ContextSet, Outcome

__all__ = ["Gemini", "error_body", "status_name"]

# Google's canonical status names for the HTTP statuses the gateway answers with.
_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    422: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

_STREAM_PATH = re.compile(r":streamGenerateContent(?:\?|$)")


def status_name(status: int) -> str:
    if status in _STATUS:
        return _STATUS[status]
    return "FAILED_PRECONDITION" if 400 <= status < 500 else "INTERNAL"


def error_body(status: int, message: str) -> dict[str, object]:
    return {"error": {"code": status, "message": message, "status": status_name(status)}}


class Gemini(Adapter):
    name = NAME
    retries = True
    field_table = BODY_TABLE

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        # The body says nothing of streaming: the path does (`streams_by_path`).
        return RequestInfo(stream=False, include_usage=True, n=1)

    def streams_by_path(self, path: str) -> bool:
        """Whether the request asks for a stream: `:streamGenerateContent` in the path."""
        return _STREAM_PATH.search(unquote(path)) is not None

    def question(self, body: Mapping[str, object] | None) -> str | None:
        # `contents` turns of role `user`, their text in `parts`.
        if not isinstance(body, Mapping):
            return None
        return last_user_text(body.get("contents"), content="parts")

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        gctx.request_context(body, ctx, trust.pattern, trust)

    def response_context(self, body: object, ctx: ContextSet, trust: Trust) -> None:
        gctx.response_context(body, ctx)

    def retry_request(self, request: dict[str, Any], instruction: str) -> dict[str, Any]:
        return with_grounding(request, instruction)

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def stream_parser(self, route: Route) -> GeminiStreamParser:
        return GeminiStreamParser()

    def progressive_framer(self, include_usage: bool) -> GeminiFramer:
        return GeminiFramer(include_usage)

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        return rule_withholds_something(answer, policy)

    def stream_relayable(self, raw: bytes) -> bool:
        """A captured stream goes out as the upstream's bytes only when it holds nothing but
        `data:` lines the gateway would have written itself (LF line ends, no comments, ids
        or event names)."""
        decoder = SSEDecoder()
        events = decoder.feed(raw) + decoder.finish()
        if not events or decoder.undefined:
            return False
        return b"".join(encode(e) for e in events) == raw and all(
            e.event is None for e in events
        )

    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        return released_body(answer, policy)

    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        return partial_body(answer, claims, outcome, policy)

    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        return abstained_body(answer, text)

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return error_body(status, message)

    def error_event(self, message: str, type_: str) -> SSEEvent:
        """A stream's error: a data chunk carrying the error envelope, as the API sends one."""
        code = 422 if type_ == "citation_verification_failed" else 502
        return SSEEvent(data=json.dumps(error_body(code, message)))

    def relay_error(self, body: object) -> dict[str, object] | None:
        """A 4xx `{"error": {"code", "message", "status"}}` rebuilt from those fields only."""
        if not isinstance(body, Mapping) or not isinstance(body.get("error"), Mapping):
            return None
        error = body["error"]
        message = relayed_message(error.get("message"))
        if message is None:
            return None
        return {"error": relayed_fields(error, message, code=relayed_code, status=relayed_token)}

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        return to_events(body)

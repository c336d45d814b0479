"""bedrock-converse: `POST /model/{modelId}/converse` (JSON) and `/converse-stream` (the AWS
binary event-stream). The adapter ties parse, stream, render, context and framer together
behind the interface every protocol offers, plus its own hooks: streaming is chosen by the
path, the stream codec is the event-stream one, and error envelopes carry `x-amzn-ErrorType`.

The request is forwarded with its headers as sent (its SigV4 signature covers them and the
body): re-signing for another upstream host, and `release.retry` (a rewritten body), are out
of scope on this protocol.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gateway.context import Trust
from gateway.policy import Policy, Route
from gateway.protocols.base import (
    Adapter,
    RequestInfo,
    channel_key,
)
from gateway.protocols.bedrock.codec import BedrockCodec
from gateway.protocols.bedrock.context import request_context
from gateway.protocols.bedrock.fields import BODY_TABLE
from gateway.protocols.bedrock.framer import BedrockFramer, exception_event
from gateway.protocols.bedrock.parse import NAME, parse_body
from gateway.protocols.bedrock.render import (
    error_type,
    partial_body,
    released_body,
    template_body,
    withholds_something,
)
from gateway.protocols.bedrock.stream import BedrockStreamParser, to_events
from gateway.protocols.relay import relayed_message
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, ContextSet, Outcome

__all__ = ["BedrockConverse"]

_CODEC = BedrockCodec()


class BedrockConverse(Adapter):
    name = NAME
    primary_channel = channel_key(("output", "message", "content"))
    field_table = BODY_TABLE
    no_retry_reason = (
        "a re-asked request would need a new body, which the client's SigV4 signature does not "
        "cover"
    )

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        return RequestInfo(stream=False, include_usage=True, n=1)

    def streams_by_path(self, path: str) -> bool | None:
        """`…/converse-stream` streams, `…/converse` does not; the body has no stream flag."""
        last = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if last == "converse-stream":
            return True
        if last == "converse":
            return False
        return None

    def stream_codec(self) -> BedrockCodec:
        return _CODEC

    def error_headers(self, status: int) -> list[tuple[bytes, bytes]]:
        return [(b"x-amzn-errortype", error_type(status).encode())]

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        request_context(body, ctx, trust.pattern, trust)

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body)

    def stream_parser(self, route: Route) -> BedrockStreamParser:
        return BedrockStreamParser()

    def progressive_framer(self, include_usage: bool) -> BedrockFramer:
        return BedrockFramer(include_usage)

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        return withholds_something(answer, policy)

    def stream_relayable(self, raw: bytes) -> bool:
        """A stream is always re-framed from the judged answer: the service pads every event
        (`p`), which is never relayed."""
        return False

    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        return released_body(answer, policy)

    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        return partial_body(answer, claims, outcome, policy)

    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        return template_body(answer.body, text)

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return {"message": message}

    def error_event(self, message: str, type_: str) -> SSEEvent:
        return exception_event(message, type_)

    def relay_error(self, body: object) -> dict[str, object] | None:
        if not isinstance(body, Mapping):
            return None
        message = relayed_message(body.get("message", body.get("Message")))
        return None if message is None else {"message": message}

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        return to_events(body)


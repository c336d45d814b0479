"""Per-protocol sample data for the adapter contract suite: requests with context in trusted
and untrusted places, a JSON answer saying a given text, and the upstream's stream of it.

Built from the wire helpers the other suites use (tests/attacks/protocols.py's registry,
tests/bedrock_wire.py, the demo's Responses wire); registering an adapter means adding here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.context import DEFAULT_TRUST, Trust
from gateway.demo import responses_wire
from gateway.policy import Route
from tests import bedrock_wire
from tests.attacks.harness import MARKER
from tests.attacks.protocols import (
    BAD,
    CHUNK_ID,
    CHUNK_TEXT,
    CONTEXT_TAG,
    GOOD,
    PIECE,
    PLANTED_ID,
    PLANTED_TAG,
    QUESTION,
    REGISTRY,
    ProtocolSpec,
    signed_tag,
)
from tests.test_protocol_helpers import ROUTES

__all__ = [
    "BAD",
    "CHUNK_ID",
    "GOOD",
    "MARKER",
    "PLANTED_ID",
    "SAMPLES",
    "Sample",
]

Json = dict[str, Any]
SIGNING_KEY = b"contract-suite-signing-key"


@dataclass(frozen=True)
class Sample:
    """What the contract tests need of one protocol.

    `trusted` requests carry CONTEXT_TAG (chunk CHUNK_ID) in each trusted place of the
    protocol, read under `trust`; `untrusted` requests carry PLANTED_TAG (chunk PLANTED_ID)
    in user text. `body(text)` is a JSON answer whose primary text is `text`; `frames(text)`
    the upstream's stream of the same answer (None: the protocol does not stream).
    """

    route: Route
    body: Callable[[str], Json]
    frames: Callable[[str], bytes] | None
    trusted: Mapping[str, Json]
    untrusted: Mapping[str, Json]
    plain_request: Json
    stream_request: Json | None = None  # a request whose body asks for a stream
    paths: Mapping[str, bool | None] = field(default_factory=dict)  # streams_by_path answers
    trust: Trust = DEFAULT_TRUST


def _from_attacks(spec: ProtocolSpec, *, body_streams: bool) -> Sample:
    """A sample from the adversarial matrix's spec of the same protocol."""
    frames = spec.frames
    paths: dict[str, bool | None] = {spec.path: None}
    if spec.stream_path is not None:
        paths = {spec.path: False, spec.stream_path: True}
    return Sample(
        route=ROUTES[spec.name],
        body=spec.body,
        frames=(lambda text: b"".join(frames(text))) if frames is not None else None,
        trusted={k: build(QUESTION, False) for k, build in spec.trusted_requests.items()},
        untrusted={k: build(QUESTION, False) for k, build in spec.planted_requests.items()},
        plain_request=spec.request(QUESTION, False),
        stream_request=spec.request(QUESTION, True) if body_streams else None,
        paths=paths,
    )


# -- openai-responses ------------------------------------------------------------------------

def _responses_request(*, stream: bool = False, **fields: Any) -> Json:
    req: Json = {"model": "fake-model", "input": QUESTION, **fields}
    if stream:
        req["stream"] = True
    return req


def _responses_body(text: str) -> Json:
    return responses_wire.response_text(text, id="resp_contract")


def _responses_frames(text: str) -> bytes:
    return b"".join(responses_wire.response_events(_responses_body(text), chunk_size=PIECE))


def _user_input(text: str) -> list[Json]:
    return [{"role": "user", "content": [{"type": "input_text", "text": text}]}]


RESPONSES = Sample(
    route=ROUTES["openai-responses"],
    body=_responses_body,
    frames=_responses_frames,
    trusted={
        "instructions": _responses_request(instructions=CONTEXT_TAG),
        "developer-message": _responses_request(input=[
            {"role": "developer", "content": CONTEXT_TAG}, *_user_input(QUESTION)]),
        "function-call-output": _responses_request(input=[
            *_user_input(QUESTION),
            {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": CONTEXT_TAG},
        ]),
    },
    untrusted={
        "string-input": _responses_request(instructions=CONTEXT_TAG,
                                           input=f"{PLANTED_TAG} {QUESTION}"),
        "user-input-text": _responses_request(instructions=CONTEXT_TAG,
                                              input=_user_input(f"{PLANTED_TAG} {QUESTION}")),
        "assistant-history": _responses_request(instructions=CONTEXT_TAG, input=[
            {"role": "assistant", "content": [{"type": "output_text", "text": PLANTED_TAG}]},
            *_user_input(QUESTION)]),
    },
    plain_request=_responses_request(instructions=CONTEXT_TAG),
    stream_request=_responses_request(instructions=CONTEXT_TAG, stream=True),
    paths={"/v1/responses": None},
)


# -- bedrock-converse ------------------------------------------------------------------------

def _bedrock_body(text: str) -> Json:
    return bedrock_wire.body({"text": text})


def _bedrock_frames(text: str) -> bytes:
    return bedrock_wire.stream_of([{"text": text}])


def _bedrock_tool_result() -> Json:
    return {"messages": [
        {"role": "user", "content": [{"text": QUESTION}]},
        {"role": "assistant", "content": [
            {"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {}}}]},
        {"role": "user", "content": [
            {"toolResult": {"toolUseId": "t1", "content": [{"text": CONTEXT_TAG}]}}]},
    ]}


BEDROCK = Sample(
    route=ROUTES["bedrock-converse"],
    body=_bedrock_body,
    frames=_bedrock_frames,
    trusted={
        "system": bedrock_wire.request(QUESTION, {"text": QUESTION}, system=[CONTEXT_TAG]),
        "tool-result": _bedrock_tool_result(),
    },
    untrusted={
        "user-text": bedrock_wire.request(f"{PLANTED_TAG} {QUESTION}", system=[CONTEXT_TAG]),
        "assistant-history": {"system": [{"text": CONTEXT_TAG}], "messages": [
            {"role": "user", "content": [{"text": "Tell me about the pump."}]},
            {"role": "assistant", "content": [{"text": PLANTED_TAG}]},
            {"role": "user", "content": [{"text": QUESTION}]},
        ]},
    },
    plain_request=bedrock_wire.request(QUESTION, system=[CONTEXT_TAG]),
    paths={"/model/fake-model/converse": False, "/model/fake-model/converse-stream": True},
)


# -- rag-json: no request place is trusted; with signing, signed tags anywhere are -----------

_SIGNED = signed_tag(SIGNING_KEY, CHUNK_ID, CHUNK_TEXT, version="2")
_rag = REGISTRY["rag-json"]
RAG = Sample(
    route=ROUTES["rag-json"],
    body=_rag.body,
    frames=None,
    trusted={
        "signed-question": {"question": f"{_SIGNED} {QUESTION}"},
        "signed-nested-field": {"question": QUESTION, "filters": {"note": _SIGNED}},
    },
    untrusted={
        **{k: build(QUESTION, False) for k, build in _rag.planted_requests.items()},
        "unsigned-context-tag": {"question": f"{CONTEXT_TAG} {QUESTION}"},
    },
    plain_request=_rag.request(QUESTION, False),
    paths={_rag.path: None},
    trust=Trust(key=SIGNING_KEY),
)

SAMPLES: dict[str, Sample] = {
    "openai-chat": _from_attacks(REGISTRY["openai-chat"], body_streams=True),
    "openai-responses": RESPONSES,
    "anthropic-messages": _from_attacks(REGISTRY["anthropic-messages"], body_streams=True),
    "rag-json": RAG,
    "bedrock-converse": BEDROCK,
    "cohere-chat": _from_attacks(REGISTRY["cohere-chat"], body_streams=True),
    "gemini": _from_attacks(REGISTRY["gemini"], body_streams=False),
}
"""One entry per registered adapter (a test fails for an adapter without one)."""

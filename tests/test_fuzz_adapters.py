"""Fuzz of each protocol adapter's JSON parser and stream parser, end to end through the
route pipeline the proxy uses (parse, context, judge, render), with the adversarial matrix's
policy (tests/attacks/policies/base.yaml).

Random bytes must give an answer or a clean `ProtocolError`. Protocol-shaped bodies and streams
with random extra keys and random values, some of which are a hallucinated claim carrying a
marker, must give a decision whose rendered body never carries the marker: every field is a
verified channel, checked metadata or dropped (DESIGN §2)."""

from __future__ import annotations

import copy
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ProtocolError
from gateway.pipeline import RoutePipeline
from gateway.policy import LoadedPolicy, load_policy
from tests.attacks.harness import MARKER, POLICIES, leaks, parse_response
from tests.attacks.protocols import BAD, GOOD, QUESTION, REGISTRY, ProtocolSpec
from tests.conftest import fuzz_examples

ROUTES = {
    "openai-chat": "chat",
    "anthropic-messages": "messages",
    "rag-json": "kb",
    "cohere-chat": "cohere",
    "gemini": "gemini",
    "openai-responses": "responses",
    "bedrock-converse": "bedrock",
}
_LOADED: list[LoadedPolicy] = []


def _pipeline(protocol: str) -> RoutePipeline:
    if not _LOADED:
        _LOADED.append(load_policy(POLICIES / "base.yaml"))
    loaded = _LOADED[0]
    route = next(r for r in loaded.policy.routes if r.name == ROUTES[protocol])
    return RoutePipeline(loaded, route)


SPECS = list(REGISTRY)
# SSE streams only: Bedrock's binary event-streams are fuzzed by tests/test_bedrock_fuzz.py.
STREAM_SPECS = [
    name for name, s in REGISTRY.items() if s.frames is not None and s.stream_content_type is None
]

KEYS = [
    "content", "text", "refusal", "reasoning_content", "reasoning", "reasoning_details",
    "thinking", "tool_calls", "function_call", "function", "arguments", "input", "annotations",
    "logprobs", "top_logprobs", "token", "audio", "transcript", "id", "model", "type", "role",
    "name", "title", "citations", "cited_text", "usage", "finish_reason", "stop_reason",
    "index", "delta", "choices", "message", "content_block", "answer", "claims", "metadata",
    "x_note", "",
]  # fmt: skip

leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.just(BAD),
    st.just(GOOD),
)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=3),
    ),
    max_leaves=8,
)
CONTEXT_KEYS = {"sources", "citations", "search_results"}  # the response's own context


def _nodes(obj: Any, top: bool = True) -> list[dict[str, Any] | list[Any]]:
    out: list[dict[str, Any] | list[Any]] = []
    if isinstance(obj, dict):
        out.append(obj)
        for k, v in obj.items():
            if not (top and k in CONTEXT_KEYS):
                out += _nodes(v, False)
    elif isinstance(obj, list):
        out.append(obj)
        for v in obj:
            out += _nodes(v, False)
    return out


@st.composite
def mutated(draw: st.DrawFn, body: Any) -> Any:
    """`body` with a few random keys set or items replaced anywhere but in its context."""
    body = copy.deepcopy(body)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        nodes = _nodes(body)
        node = nodes[draw(st.integers(min_value=0, max_value=len(nodes) - 1))]
        new = draw(value)
        if isinstance(node, dict):
            key = draw(st.sampled_from(KEYS) | st.text(max_size=6))
            if node is body and key in CONTEXT_KEYS:
                continue
            node[key] = new
        elif node:
            node[draw(st.integers(min_value=0, max_value=len(node) - 1))] = new
        else:
            node.append(new)
    return body


def _assert_clean(rendered_body: bytes) -> None:
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(rendered_body) + rendered_body
    where = leaks(parse_response(raw))
    assert not where, f"{MARKER} in the rendered body ({where}): {rendered_body[:2000]!r}"


def _judge_json(spec: ProtocolSpec, raw: bytes) -> None:
    pipeline = _pipeline(spec.name)
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return  # the proxy answers 502 before any adapter sees it
    if not isinstance(parsed, dict):
        return
    request = spec.request(QUESTION, False)
    try:
        answer = pipeline.adapter.parse(parsed, pipeline.route)
        ctx = pipeline.context(request, answer.body, None)
    except ProtocolError:
        return
    judgement = pipeline.judge(answer, ctx)
    rendered = pipeline.render(answer, judgement, raw, "fuzz")
    _assert_clean(rendered.body)


def _judge_stream(spec: ProtocolSpec, raw: bytes) -> None:
    pipeline = _pipeline(spec.name)
    request = spec.request(QUESTION, True)
    try:
        answer = pipeline.parse_stream(raw)
        ctx = pipeline.context(request, answer.body, None)
    except ProtocolError:
        return
    judgement = pipeline.judge(answer, ctx)
    rendered = pipeline.render(answer, judgement, raw, "fuzz", stream=True)
    _assert_clean(rendered.body)


@pytest.mark.parametrize("protocol", SPECS)
@settings(max_examples=fuzz_examples(60))
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_adapter_json_parser_takes_random_bytes(protocol: str, data: bytes) -> None:
    spec = REGISTRY[protocol]
    _judge_json(spec, data)


@pytest.mark.parametrize("protocol", SPECS)
@settings(max_examples=fuzz_examples(80))
@given(data=st.data())
def test_adapter_json_parser_never_leaks_a_planted_field(
    protocol: str, data: st.DataObject
) -> None:
    spec = REGISTRY[protocol]
    body = data.draw(mutated(spec.body(GOOD)))
    _judge_json(spec, json.dumps(body).encode())


@pytest.mark.parametrize("protocol", STREAM_SPECS)
@settings(max_examples=fuzz_examples(60))
@given(data=st.binary(max_size=400))
def test_adapter_stream_parser_takes_random_bytes(protocol: str, data: bytes) -> None:
    spec = REGISTRY[protocol]
    _judge_stream(spec, b"data: " + data + b"\n\n")
    _judge_stream(spec, data)


SSE_EXTRAS = [
    b": " + BAD.encode() + b"\n\n",
    b"event: " + BAD.encode() + b"\n",
    b"id: " + BAD.encode() + b"\n",
    b"retry: 5\n",
    b"data: [DONE]\n\n",
    b"data: {}\n\n",
    b"data: " + json.dumps({"type": "x", "text": BAD}).encode() + b"\n\n",
    b'event: ping\ndata: {"type": "ping"}\n\n',
]


@st.composite
def mutated_stream(draw: st.DrawFn, spec: ProtocolSpec) -> bytes:
    assert spec.frames is not None
    frames = spec.frames(GOOD)
    out: list[bytes] = []
    for frame in frames:
        text = frame.decode()
        head, sep, payload = text.rpartition("data: ")
        if sep and draw(st.integers(min_value=0, max_value=3)) == 0:
            try:
                obj = json.loads(payload)
            except ValueError:
                obj = None
            if obj is not None:
                obj = draw(mutated(obj))
                frame = (head + sep + json.dumps(obj) + "\n\n").encode()
        out.append(frame)
        if draw(st.integers(min_value=0, max_value=6)) == 0:
            out.append(draw(st.sampled_from(SSE_EXTRAS)))
    return b"".join(out)


@pytest.mark.parametrize("protocol", STREAM_SPECS)
@settings(max_examples=fuzz_examples(80))
@given(data=st.data())
def test_adapter_stream_parser_never_leaks_a_planted_field(
    protocol: str, data: st.DataObject
) -> None:
    spec = REGISTRY[protocol]
    _judge_stream(spec, data.draw(mutated_stream(spec)))


@pytest.mark.parametrize("protocol", SPECS)
def test_fuzz_harness_sees_a_hallucinated_answer_blocked(protocol: str) -> None:
    """The positive control: the harness judges, and a good answer is released untouched."""
    spec = REGISTRY[protocol]
    pipeline = _pipeline(spec.name)
    raw = json.dumps(spec.body(GOOD)).encode()
    answer = pipeline.adapter.parse(json.loads(raw), pipeline.route)
    ctx = pipeline.context(spec.request(QUESTION, False), answer.body, None)
    judgement = pipeline.judge(answer, ctx)
    assert judgement.outcome.decision.value == "released"
    bad = json.dumps(spec.body(f"{GOOD} {BAD}")).encode()
    answer = pipeline.adapter.parse(json.loads(bad), pipeline.route)
    judgement = pipeline.judge(
        answer, pipeline.context(spec.request(QUESTION, False), answer.body, None)
    )
    assert judgement.outcome.decision.value != "released"
    _assert_clean(pipeline.render(answer, judgement, bad, "fuzz").body)

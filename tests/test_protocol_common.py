"""Every adapter through the same tests: fixtures parse, streams match bodies, renders validate."""

from __future__ import annotations

import contextvars
import json
from typing import Any

import anthropic.types
import cohere.v2.types
import openai.types.chat
import openai.types.responses
import pytest
from google.genai import types as genai_types
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ProtocolError
from gateway.policy import ContextSpec
from gateway.protocols import ADAPTERS, get
from gateway.protocols.openai_responses import context as rctx
from gateway.types import Decision, Outcome, Report
from tests.bedrock_wire import boto_parse
from tests.test_protocol_helpers import (
    DIRS,
    FIXTURES,
    POLICY,
    ROUTES,
    load,
    parse_json,
    parse_stream,
    raw,
    summary,
)

JSON_FIXTURES = [
    (p, f.name)
    for p, d in DIRS.items()
    for f in sorted((FIXTURES / d).glob("*.json"))
    if not f.name.startswith("request")
]
SSE_PAIRS = [
    ("openai-chat", "good.sse", "good.json"),
    ("openai-chat", "hallucinated.sse", "hallucinated.json"),
    ("openai-chat", "tool_call.sse", "tool_call.json"),
    ("openai-chat", "n2_reasoning_logprobs.sse", "n2_reasoning_logprobs.json"),
    ("openai-chat", "openrouter_reasoning_details.sse", "openrouter_reasoning_details.json"),
    ("openai-chat", "mistral_thinking.sse", "mistral_thinking.json"),
    ("openai-chat", "perplexity.sse", "perplexity.json"),
    ("anthropic-messages", "native_good.sse", "native_good.json"),
    ("anthropic-messages", "native_bad_cited_text.sse", "native_bad_cited_text.json"),
    ("anthropic-messages", "thinking_tool_use.sse", "thinking_tool_use.json"),
    ("openai-responses", "good.sse", "good.json"),
    ("openai-responses", "file_search.sse", "file_search.json"),
    ("openai-responses", "reasoning_tool.sse", "reasoning_tool.json"),
    ("bedrock-converse", "good.eventstream", "good.json"),
    ("bedrock-converse", "partial.eventstream", "partial.json"),
    ("bedrock-converse", "reasoning_tool.eventstream", "reasoning_tool.json"),
    ("cohere-chat", "good.sse", "good.json"),
    ("cohere-chat", "hallucinated.sse", "hallucinated.json"),
    ("cohere-chat", "tool_call.sse", "tool_call.json"),
    ("gemini", "good.sse", "good.json"),
    ("gemini", "grounded.sse", "grounded.json"),
    ("gemini", "thought_tool.sse", "thought_tool.json"),
]


def validate(protocol: str, body: dict[str, object]) -> None:
    if protocol == "openai-chat":
        openai.types.chat.ChatCompletion.model_validate(_string_content(body))
    elif protocol == "anthropic-messages":
        anthropic.types.Message.model_validate(body)
    elif protocol == "openai-responses":
        openai.types.responses.Response.model_validate(body)
    elif protocol == "bedrock-converse":
        boto_parse(body)
    elif protocol == "cohere-chat":
        cohere.v2.types.V2ChatResponse.model_validate(body)
    elif protocol == "gemini":
        genai_types.GenerateContentResponse.model_validate(body)
    else:
        json.dumps(body)


def _string_content(body: dict[str, object]) -> dict[str, object]:
    """A chat body with Mistral content chunks as the SDK types know it: the SDK relays the
    list as it is, its pydantic type says string, so the chunks must be a valid list whose
    text chunks make the string."""
    out = json.loads(json.dumps(body))
    for choice in out.get("choices", []):
        content = choice["message"].get("content")
        if isinstance(content, list):
            assert all(c["type"] in ("text", "reference", "thinking") for c in content)
            choice["message"]["content"] = "".join(
                c["text"] for c in content if c["type"] == "text"
            )
    return out  # type: ignore[no-any-return]


def test_registry_names() -> None:
    assert set(ADAPTERS) == {
        "openai-chat", "openai-responses", "anthropic-messages", "rag-json",
        "bedrock-converse", "cohere-chat", "gemini"
    }
    assert get("rag-json").name == "rag-json"
    with pytest.raises(KeyError):
        get("nope")


@pytest.mark.parametrize(("protocol", "name"), JSON_FIXTURES)
def test_every_fixture_parses(protocol: str, name: str) -> None:
    answer = parse_json(protocol, name)
    assert answer.protocol == protocol
    assert answer.channels
    assert answer.usage or protocol == "rag-json"


@pytest.mark.parametrize(("protocol", "sse", "body"), SSE_PAIRS)
def test_sse_capture_equals_json(protocol: str, sse: str, body: str) -> None:
    def both() -> tuple[Any, Any]:
        # A capture with reasoning's encrypted_content answers a client that asked for it.
        asked = b'{"include": ["reasoning.encrypted_content"]}'
        rctx.forward_body(asked, "/v1/responses", ContextSpec())
        return (summary(parse_stream(protocol, [raw(protocol, sse)])),
                summary(parse_json(protocol, body)))

    streamed, whole = contextvars.Context().run(both)
    if protocol == "openai-chat" and sse == "hallucinated.sse":  # no include_usage
        assert streamed[3] == {}
        streamed, whole = streamed[:3], whole[:3]
    assert streamed == whole


@pytest.mark.parametrize(("protocol", "sse", "body"), SSE_PAIRS)
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=20))
def test_stream_parse_invariant_under_byte_splits(
    protocol: str, sse: str, body: str, cuts: list[int]
) -> None:
    data = raw(protocol, sse)
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    assert summary(parse_stream(protocol, pieces)) == summary(parse_stream(protocol, [data]))


@pytest.mark.parametrize(
    ("protocol", "sse"),
    [
        ("openai-chat", "truncated.sse"),
        ("anthropic-messages", "truncated.sse"),
        ("anthropic-messages", "error_midstream.sse"),
        ("openai-responses", "truncated.sse"),
        ("openai-responses", "failed.sse"),
        ("bedrock-converse", "truncated.eventstream"),
        ("bedrock-converse", "bad_crc.eventstream"),
        ("bedrock-converse", "exception_midstream.eventstream"),
        ("cohere-chat", "truncated.sse"),
        ("cohere-chat", "error_midstream.sse"),
        ("gemini", "truncated.sse"),
        ("gemini", "error_midstream.sse"),
    ],
)
def test_incomplete_or_error_streams_raise(protocol: str, sse: str) -> None:
    with pytest.raises(ProtocolError):
        parse_stream(protocol, [raw(protocol, sse)])


@pytest.mark.parametrize(
    ("protocol", "body"),
    [
        ("openai-chat", {"object": "list", "data": []}),
        ("openai-chat", {"choices": [{"index": 0}]}),
        ("openai-chat", {"choices": [{"message": {"content": 3}}]}),
        ("anthropic-messages", {"type": "error", "error": {}}),
        ("anthropic-messages", {"type": "message", "content": [{"text": "no type"}]}),
        ("openai-responses", {"object": "chat.completion", "choices": []}),
        ("openai-responses", {"object": "response", "output": [{"content": []}]}),
        ("openai-responses", {"object": "response", "output": [{"type": "message"}]}),
        ("cohere-chat", {"id": "x", "finish_reason": "COMPLETE"}),
        ("cohere-chat", {"message": {"content": [{"type": "text"}]}}),
        ("cohere-chat", {"message": {"content": [{"type": "text", "text": "ab"}],
                                     "citations": [{"start": 0, "end": 9, "text": "ab"}]}}),
        ("gemini", {"error": {"code": 500, "message": "m", "status": "INTERNAL"}}),
        ("gemini", {"candidates": {"content": {}}}),
        ("gemini", {"candidates": [{"content": {"parts": [{"text": "a", "functionCall": {
            "name": "f"}}]}}]}),
        ("rag-json", {"unrelated": True}),
        ("rag-json", {"answer": 5}),
        ("rag-json", {"claims": [{"citations": []}]}),
        ("bedrock-converse", {"output": {"message": {"role": "assistant"}}}),
        ("bedrock-converse", {"output": {"message": {"content": [{"text": 3}]}}}),
        ("bedrock-converse", {"output": {"message": {"content": [{"text": "a", "toolUse": {}}]}}}),
    ],
)
def test_wrong_shapes_raise(protocol: str, body: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        ADAPTERS[protocol].parse(body, ROUTES[protocol])


@pytest.mark.parametrize(("protocol", "name"), JSON_FIXTURES)
@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(Decision.RELEASED),
        Outcome(
            Decision.PARTIAL,
            reason="hallucinated_citation",
            claim_index=0,
            template="partial",
            kept=frozenset(),
        ),
        Outcome(
            Decision.ABSTAINED, reason="missing_citation", claim_index=0, template="no_evidence"
        ),
        Outcome(
            Decision.REVIEW, reason="missing_citation", claim_index=0, template="review_required"
        ),
    ],
    ids=lambda o: o.decision.value,
)
def test_render_gives_sdk_valid_bodies_that_round_trip_as_streams(
    protocol: str, name: str, outcome: Outcome
) -> None:
    adapter = ADAPTERS[protocol]
    answer = parse_json(protocol, name)
    report = Report(claims=(), context="x")
    body = adapter.render(answer, [], outcome, report, POLICY)
    validate(protocol, body)
    again = adapter.parse(body, ROUTES[protocol])
    for include_usage in (True, False):
        events = adapter.to_stream(body, include_usage)
        wire = b"".join(map(adapter.stream_codec().encode, events))
        streamed = summary(parse_stream(protocol, [wire]))
        if include_usage or protocol != "openai-chat":
            assert streamed == summary(again)
        else:
            assert streamed[:3] == summary(again)[:3]


@pytest.mark.parametrize("protocol", list(ADAPTERS))
def test_blocked_render_is_the_error_envelope(protocol: str) -> None:
    adapter = ADAPTERS[protocol]
    answer = parse_json(
        protocol, "good.json" if protocol != "anthropic-messages" else "native_good.json"
    )
    out = adapter.render(
        answer,
        [],
        Outcome(Decision.BLOCKED, reason="stale_source", claim_index=0),
        Report((), "x"),
        POLICY,
    )
    assert out == adapter.error_envelope(422, out_message(out), "citation_verification_failed")


def out_message(body: dict[str, object]) -> str:
    if "error" not in body:  # Bedrock's and Cohere's envelope is `{"message"}`
        return str(body["message"])
    err = body["error"]
    assert isinstance(err, dict)
    return str(err["message"])


def test_error_envelopes_match_protocol_shapes() -> None:
    assert ADAPTERS["openai-chat"].error_envelope(422, "m", "t") == {
        "error": {"message": "m", "type": "t", "param": None, "code": None}
    }
    assert ADAPTERS["anthropic-messages"].error_envelope(422, "m", "t") == {
        "type": "error",
        "error": {"type": "t", "message": "m"},
    }
    assert ADAPTERS["rag-json"].error_envelope(422, "m", "t") == {
        "error": {"message": "m", "type": "t", "code": 422}
    }
    assert ADAPTERS["cohere-chat"].error_envelope(422, "m", "t") == {"message": "m"}
    assert ADAPTERS["gemini"].error_envelope(422, "m", "t") == {
        "error": {"code": 422, "message": "m", "status": "FAILED_PRECONDITION"}
    }
    assert json.loads(ADAPTERS["gemini"].error_event("m", "upstream_error").data) == {
        "error": {"code": 502, "message": "m", "status": "UNAVAILABLE"}
    }
    anthropic_event = ADAPTERS["anthropic-messages"].error_event("m", "overloaded_error")
    assert anthropic_event.event == "error"


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic-messages", "cohere-chat"])
def test_request_info(protocol: str) -> None:
    adapter = ADAPTERS[protocol]
    info = adapter.request_info(load(protocol, "request_stream.json"))
    assert info.stream and info.include_usage and info.n == 1
    assert not adapter.request_info(load(protocol, "request.json")).stream


def test_stream_parsers_assemble_long_fields_from_many_deltas() -> None:
    """Thousands of small deltas join into the exact field (the parsers keep pieces and join
    them once: `+=` on a string held in a dict re-copies it per delta, quadratic in length)."""
    from gateway.sse import SSEEvent

    n = 20_000
    anthropic = get("anthropic-messages").stream_parser(ROUTES["anthropic-messages"])
    anthropic.feed(SSEEvent(json.dumps({"type": "message_start", "message": {"content": []}})))
    for i, kind in enumerate(("text", "thinking")):
        block = {"type": "content_block_start", "index": i, "content_block": {"type": kind}}
        anthropic.feed(SSEEvent(json.dumps(block)))
    deltas = [
        json.dumps({"type": "content_block_delta", "index": i, "delta": {"type": t, k: "w" * 40}})
        for i, t, k in ((0, "text_delta", "text"), (1, "thinking_delta", "thinking"))
    ]
    for k in range(n):
        anthropic.feed(SSEEvent(deltas[k % 2]))
    anthropic.feed(SSEEvent(json.dumps({"type": "message_stop"})))
    content = anthropic.body()["content"]
    assert len(content[0]["text"]) == len(content[1]["thinking"]) == 40 * n // 2

    openai = get("openai-chat").stream_parser(ROUTES["openai-chat"])
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, object], finish: str | None = None) -> SSEEvent:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return SSEEvent(json.dumps({**head, "choices": [choice]}))

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    openai.feed(chunk({"role": "assistant", "tool_calls": [call]}))
    piece = chunk({"tool_calls": [{"index": 0, "function": {"arguments": "ab"}}]})
    legacy = chunk({"function_call": {"arguments": "cd"}})
    for _ in range(n):
        openai.feed(piece)
        openai.feed(legacy)
    openai.feed(chunk({}, "tool_calls"))
    openai.feed(SSEEvent("[DONE]"))
    message = openai.body()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"] == {"name": "f", "arguments": "ab" * n}
    assert message["function_call"]["arguments"] == "cd" * n

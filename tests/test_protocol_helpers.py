"""Shared helpers for the protocol adapter tests: fixtures, routes, hand-built claims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.policy import Match, Policy, RagSpec, Route
from gateway.protocols import ADAPTERS
from gateway.types import Answer, Claim

FIXTURES = Path(__file__).parent / "fixtures"
DIRS = {
    "openai-chat": "openai_chat",
    "openai-responses": "openai_responses",
    "anthropic-messages": "anthropic_messages",
    "rag-json": "rag_json",
    "bedrock-converse": "bedrock_converse",
    "cohere-chat": "cohere_chat",
    "gemini": "gemini",
}

ROUTES = {
    "openai-chat": Route(
        name="chat", match=Match(path="/v1/chat/completions"), protocol="openai-chat"
    ),
    "anthropic-messages": Route(
        name="msg", match=Match(path="/v1/messages"), protocol="anthropic-messages"
    ),
    "openai-responses": Route(
        name="responses", match=Match(path="/v1/responses"), protocol="openai-responses"
    ),
    "cohere-chat": Route(name="cohere", match=Match(path="/v2/chat"), protocol="cohere-chat"),
    "gemini": Route(
        name="gemini", match=Match(path_glob="/v1beta/models/*:generateContent"),
        protocol="gemini",
    ),
    "rag-json": Route(
        name="kb",
        match=Match(path_prefix="/rag/"),
        protocol="rag-json",
        rag=RagSpec(answer="/answer", claims="/claims", context="/sources"),
    ),
    "bedrock-converse": Route(
        name="bedrock",
        match=Match(path_glob="/model/*/converse"),
        protocol="bedrock-converse",
    ),
}
POLICY = Policy(name="test", routes=list(ROUTES.values()))


def load(protocol: str, name: str) -> Any:
    return json.loads((FIXTURES / DIRS[protocol] / name).read_text())


def raw(protocol: str, name: str) -> bytes:
    return (FIXTURES / DIRS[protocol] / name).read_bytes()


def parse_json(protocol: str, name: str) -> Answer:
    return ADAPTERS[protocol].parse(load(protocol, name), ROUTES[protocol])


def parse_stream(protocol: str, pieces: list[bytes]) -> Answer:
    parser = ADAPTERS[protocol].stream_parser(ROUTES[protocol])
    dec = ADAPTERS[protocol].stream_codec().decoder()
    for p in pieces:
        for ev in dec.feed(p):
            parser.feed(ev)
    for ev in dec.finish():
        parser.feed(ev)
    return parser.finish()


def summary(a: Answer) -> Any:
    return (
        [(c.kind, c.path, c.text, c.choice, c.native, c.structured) for c in a.channels],
        a.has_logprobs,
        sorted(a.unknown_fields, key=str),
        dict(a.usage),
    )


def claims_for(answer: Answer, channel: int, parts: list[str], first_index: int = 0) -> list[Claim]:
    """One claim per substring of the channel text, in order."""
    text = answer.channels[channel].text
    out = []
    for k, part in enumerate(parts):
        start = text.index(part)
        out.append(
            Claim(
                index=first_index + k,
                channel=channel,
                text=part,
                start=start,
                end=start + len(part),
            )
        )
    return out

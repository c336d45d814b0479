"""Protocol adapters, registered by protocol name (`ADAPTERS["openai-chat"]`, ...)."""

from __future__ import annotations

from gateway.protocols.anthropic_messages import AnthropicMessages
from gateway.protocols.base import Adapter, RequestInfo, StreamParser, TextDelta
from gateway.protocols.bedrock import BedrockConverse
from gateway.protocols.cohere import CohereChat
from gateway.protocols.gemini import Gemini
from gateway.protocols.openai_chat import OpenAIChat
from gateway.protocols.openai_responses import OpenAIResponses
from gateway.protocols.rag_json import RagJson

__all__ = ["ADAPTERS", "Adapter", "RequestInfo", "StreamParser", "TextDelta", "get"]

ADAPTERS: dict[str, Adapter] = {
    "openai-chat": OpenAIChat(),
    "openai-responses": OpenAIResponses(),
    "anthropic-messages": AnthropicMessages(),
    "rag-json": RagJson(),
    "bedrock-converse": BedrockConverse(),
    "cohere-chat": CohereChat(),
    "gemini": Gemini(),
}


def get(name: str) -> Adapter:
    """The adapter for a protocol name; KeyError names the known ones."""
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"unknown protocol {name!r}; known: {sorted(ADAPTERS)}") from None

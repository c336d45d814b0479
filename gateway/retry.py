"""`release.retry`: re-ask an LLM upstream with a grounding instruction before deciding.

The instruction names the failure in general terms only; it never echoes the draft back.
"""

from __future__ import annotations

import copy
from typing import Any

from gateway.types import Outcome

GROUNDING = (
    "Your previous answer could not be verified against the provided context ({reason}). "
    "Answer again using only the provided context. Cite every factual sentence with the "
    "identifier of the chunk that supports it, copy numbers and quotations exactly as the "
    "context gives them, and say you don't know when the context does not contain the answer."
)


def instruction(outcome: Outcome) -> str:
    return GROUNDING.format(reason=outcome.reason or "unverified")


def with_grounding(protocol: str, request: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """A copy of `request` with the grounding instruction added where the protocol puts it."""
    text = instruction(outcome)
    retried = copy.deepcopy(request)
    match protocol:
        case "openai-chat":
            messages = retried.setdefault("messages", [])
            messages.append({"role": "system", "content": text})
        case "anthropic-messages":
            system = retried.get("system")
            if isinstance(system, list):
                system.append({"type": "text", "text": text})
            elif isinstance(system, str) and system:
                retried["system"] = f"{system}\n\n{text}"
            else:
                retried["system"] = text
        case "openai-responses":
            from gateway.protocols.openai_responses.retry import with_grounding as responses

            retried = responses(retried, text)
        case "cohere-chat":
            from gateway.protocols.cohere.retry import with_grounding as cohere

            retried = cohere(retried, text)
        case "gemini":
            from gateway.protocols.gemini.retry import with_grounding as gemini

            retried = gemini(retried, text)
        case _:
            raise ValueError(f"release.retry is not supported for protocol {protocol!r}")
    return retried

"""`release.retry`: re-ask an LLM upstream with a grounding instruction before deciding.

The instruction names the failure in general terms only; it never echoes the draft back.
"""

from __future__ import annotations

import copy
from typing import Any

from gateway.protocols.base import Adapter
from gateway.types import Outcome

GROUNDING = (
    "Your previous answer could not be verified against the provided context ({reason}). "
    "Answer again using only the provided context. Cite every factual sentence with the "
    "identifier of the chunk that supports it, copy numbers and quotations exactly as the "
    "context gives them, and say you don't know when the context does not contain the answer."
)


def instruction(outcome: Outcome) -> str:
    return GROUNDING.format(reason=outcome.reason or "unverified")


def with_grounding(adapter: Adapter, request: dict[str, Any], outcome: Outcome) -> dict[str, Any]:
    """A copy of `request` with the grounding instruction added where the protocol puts it."""
    return adapter.retry_request(copy.deepcopy(request), instruction(outcome))

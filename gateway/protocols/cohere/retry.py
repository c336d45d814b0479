"""`release.retry` for cohere-chat: the grounding instruction as an added system message (the
place a `/v2/chat` request gives the model its rules); documents and turns stay as sent."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["with_grounding"]


def with_grounding(request: dict[str, Any], text: str) -> dict[str, Any]:
    retried = copy.deepcopy(request)
    messages = retried.get("messages")
    if not isinstance(messages, list):
        messages = retried["messages"] = []
    messages.append({"role": "system", "content": text})
    return retried

"""`release.retry` for gemini: the grounding instruction is appended to `systemInstruction`
(a new text part), leaving `contents` alone so thought signatures and tool turns stay valid."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["with_grounding"]


def with_grounding(request: dict[str, Any], text: str) -> dict[str, Any]:
    retried = copy.deepcopy(request)
    key = "systemInstruction" if "systemInstruction" in retried or (
        "system_instruction" not in retried
    ) else "system_instruction"
    system = retried.get(key)
    if isinstance(system, dict) and isinstance(system.get("parts"), list):
        system["parts"].append({"text": text})
    elif isinstance(system, str) and system:
        retried[key] = {"parts": [{"text": system}, {"text": text}]}
    else:
        retried[key] = {"parts": [{"text": text}]}
    return retried

"""`release.retry` for Responses: the grounding instruction joins the request's `instructions`
(the place a Responses request gives the model its rules), leaving the input items alone so
reasoning items and `previous_response_id` chains stay valid."""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["with_grounding"]


def with_grounding(request: dict[str, Any], text: str) -> dict[str, Any]:
    retried = copy.deepcopy(request)
    instructions = retried.get("instructions")
    if isinstance(instructions, str) and instructions:
        retried["instructions"] = f"{instructions}\n\n{text}"
    else:
        retried["instructions"] = text
    return retried

"""Progressive release for gemini: grounding supports arrive with the last chunk, after the text
they cite, so no claim can be judged with its native citations before the stream ends. The
answer is judged whole and goes out as a rendered stream; a block or a broken upstream ends the
stream with an error chunk (`{"error": {...}}`), never a clean end."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.protocols.base import Framer
from gateway.protocols.gemini.render import to_events
from gateway.sse import SSEEvent, encode
from gateway.types import Claim

if TYPE_CHECKING:
    from gateway.pipeline import RoutePipeline

__all__ = ["GeminiFramer", "error_chunk"]


def error_chunk(message: str, type_: str) -> bytes:
    from gateway.protocols.gemini.adapter import error_body

    code = 422 if type_ == "citation_verification_failed" else 502
    return encode(SSEEvent(data=json.dumps(error_body(code, message))))


class GeminiFramer(Framer):
    def __init__(self, include_usage: bool) -> None:
        self.include_usage = include_usage

    def observe(self, event: SSEEvent) -> None:
        return None

    @property
    def started(self) -> bool:
        return False  # nothing goes out before the whole answer is judged

    def opening(self) -> bytes:
        return b""

    def text(self, text: str, citations: Sequence[Claim] = ()) -> bytes:
        return b""  # never called: no primary channel is released claim by claim

    def template_body(self, text: str) -> dict[str, Any]:
        return {
            "candidates": [
                {"content": {"role": "model", "parts": [{"text": text}]},
                 "finishReason": "STOP", "index": 0}
            ]
        }

    def tail(self, pipeline: RoutePipeline, body: Mapping[str, Any]) -> bytes:
        return b"".join(encode(e) for e in to_events(body))

    def error(self, message: str, type_: str) -> bytes:
        return error_chunk(message, type_)

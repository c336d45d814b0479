"""anthropic-messages request context: a custom-content document's (or search result's) blocks
are kept by position, so `content_block_location` indices count an image block too."""

from __future__ import annotations

from typing import Any

from gateway.protocols.anthropic_messages.context import request_context
from gateway.types import ContextSet

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}


def _context(block: dict[str, Any]) -> ContextSet:
    ctx = ContextSet()
    request_context({"messages": [{"role": "user", "content": [block]}]}, ctx, None)
    return ctx


def test_a_content_documents_image_keeps_its_place() -> None:
    ctx = _context({"type": "document", "citations": {"enabled": True}, "source": {
        "type": "content", "content": [{"type": "text", "text": "A."}, IMAGE,
                                       {"type": "text", "text": "B."}]}})
    assert ctx.documents[0].blocks == ("A.", "", "B.")


def test_a_content_document_given_as_a_string_is_one_block() -> None:
    ctx = _context({"type": "document", "source": {"type": "content", "content": "A."}})
    assert ctx.documents[0].blocks == ("A.",)


def test_a_search_results_blocks_keep_their_places() -> None:
    ctx = _context({"type": "search_result", "source": "https://kb/x", "title": "X",
                    "content": [IMAGE, {"type": "text", "text": "B."}]})
    assert ctx.search_results[0].blocks == ("", "B.")

"""anthropic-messages streams through the gateway: a block that starts with a citation the
gateway cannot read releases nothing of the block, and a block of the wrong shape is an
upstream error (never the gateway's own)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

import tests.attacks.protocols as P
from gateway.demo import wire
from tests.attacks.conftest import gateway, run_case, upstream  # noqa: F401
from tests.attacks.harness import MARKER, GatewayProcess, RawResponse, assert_no_leak
from tests.upstream_app import FakeUpstream, Stream

MODES = ["buffer", "progressive"]
TEXT = P.CHUNK_TEXT  # one claim its native citation supports
SOURCE = "https://kb.example/pump"


def _frames(text: str, edit: Any) -> list[bytes]:
    events = copy.deepcopy(P._an_events(text))
    edit(events)
    return wire.anthropic_frames(events)


def _with_citations(*citations: dict[str, Any]) -> Any:
    def edit(events: list[P.Event]) -> None:
        for cit in reversed(citations):
            delta = {"type": "citations_delta", "citation": copy.deepcopy(cit)}
            events.insert(
                2,
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                ),
            )

    return edit


def _citations(resp: RawResponse) -> list[dict[str, Any]]:
    out = []
    for line in resp.body.decode().splitlines():
        if line.startswith("data:"):
            delta = json.loads(line[5:]).get("delta") or {}
            if delta.get("type") == "citations_delta":
                out.append(delta["citation"])
    return out


# -- a citation the gateway cannot read fails the stream on its event -----------------------


@pytest.mark.parametrize("mode", MODES)
def test_a_block_opened_with_an_unreadable_citation_releases_nothing(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: str  # noqa: F811
) -> None:
    text = f"The {MARKER} pump moves 40 litres per minute [kb:1]. It moves water [kb:1]."
    unreadable = {"type": "char_location", "document_index": 0,
                  "start_char_index": 0, "end_char_index": 5}  # no cited_text

    def edit(events: list[P.Event]) -> None:
        events[1][1]["content_block"]["citations"] = [unreadable]

    req = P._with_document(P._an_request(P.QUESTION, True))
    resp = run_case(gateway, upstream, P.ANTHROPIC, mode, Stream(_frames(text, edit)),
                    request=req)
    assert_no_leak(resp)
    assert b"bad_upstream_answer" in resp.body or b"upstream_error" in resp.body


# -- a wrong-typed block is the upstream's error -----------------------------------------------

_SHAPES: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {
    "text-int": ({"type": "text", "text": 7}, [{"type": "text_delta", "text": "x"}]),
    "text-null": ({"type": "text", "text": None}, [{"type": "text_delta", "text": "x"}]),
    "type-list": ({"type": ["text"], "text": ""}, [{"type": "text_delta", "text": "x"}]),
    "type-object": ({"type": {"a": 1}}, []),
    "thinking-int": (
        {"type": "thinking", "thinking": 7, "signature": ""},
        [{"type": "thinking_delta", "thinking": "x"}],
    ),
    "signature-list": (
        {"type": "thinking", "thinking": "", "signature": []},
        [{"type": "signature_delta", "signature": "c2ln"}],
    ),
    "text-delta-int": ({"type": "text", "text": ""}, [{"type": "text_delta", "text": 7}]),
    "thinking-delta-null": (
        {"type": "thinking", "thinking": "", "signature": ""},
        [{"type": "thinking_delta", "thinking": None}],
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", list(_SHAPES))
def test_a_wrong_typed_block_is_an_upstream_error(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], shape: str, mode: str  # noqa: F811
) -> None:
    block, deltas = _SHAPES[shape]
    frames = _frames(P.GOOD, P._an_append_block(block, deltas))
    resp = run_case(gateway, upstream, P.ANTHROPIC, mode, Stream(frames))
    body = resp.body.decode("utf-8", "replace")
    assert "internal_error" not in body and "gateway failed" not in body, body[-500:]
    if mode == "buffer":
        assert resp.status == 502 and "bad_upstream_answer" in body, body[-500:]
    else:
        assert "event: error" in body and "upstream_error" in body, body[-500:]

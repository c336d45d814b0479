"""anthropic-messages streams through the gateway: a block that starts with a citation the
gateway cannot read releases nothing of the block, a block of the wrong shape is an upstream
error (never the gateway's own), and progressive release sends each verified native citation
once, in the shape buffer mode relays."""

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
    "citations-string": (
        {"type": "text", "text": "", "citations": "none"},
        [{"type": "citations_delta", "citation": {"type": "x_location"}}],
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


# -- progressive release relays native citations as buffer mode does ---------------------------


def _search_result_request() -> dict[str, Any]:
    req = P._an_request(P.QUESTION, True, system=None)
    req["messages"][-1]["content"] = [
        {"type": "search_result", "source": SOURCE, "title": "Pump",
         "content": [{"type": "text", "text": P.CHUNK_TEXT}], "citations": {"enabled": True}},
        {"type": "text", "text": P.QUESTION},
    ]
    return req


_SEARCH_RESULT = {"type": "search_result_location", "cited_text": P.CHUNK_TEXT,
                  "search_result_index": 0, "source": SOURCE, "title": "Pump",
                  "start_block_index": 0, "end_block_index": 1}
_CASES: dict[str, tuple[Any, list[dict[str, Any]]]] = {
    "search-result": (_search_result_request, [_SEARCH_RESULT]),
    # The upstream's source is text nobody verified: the request's goes out instead.
    "search-result-other-source": (
        _search_result_request, [{**_SEARCH_RESULT, "source": "https://elsewhere.example/x"}]
    ),
    "document-file-id": (
        lambda: P._with_document(P._an_request(P.QUESTION, True, system=None)),
        [P._citation(file_id="file_011CNha8iCJcU1wXNR6q4V8w")],
    ),
    "document-prose-file-id": (
        lambda: P._with_document(P._an_request(P.QUESTION, True, system=None)),
        [P._citation(file_id=f"designed by {MARKER} in 1931")],
    ),
}


@pytest.mark.parametrize("case", list(_CASES))
def test_progressive_citations_have_the_buffered_shape(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], case: str  # noqa: F811
) -> None:
    request, citations = _CASES[case]
    frames = _frames(TEXT, _with_citations(*citations))
    seen = {}
    for mode in MODES:
        resp = run_case(gateway, upstream, P.ANTHROPIC, mode, Stream(frames), request=request())
        assert resp.status == 200 and b"event: error" not in resp.body, resp.raw[-1500:]
        assert_no_leak(resp)
        seen[mode] = _citations(resp)
    assert seen["buffer"], seen
    assert seen["progressive"] == seen["buffer"], seen
    for cit in seen["buffer"]:
        if cit["type"] == "search_result_location":
            assert cit["source"] == SOURCE, cit


@pytest.mark.parametrize("mode", MODES)
def test_a_block_citation_goes_out_once(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: str  # noqa: F811
) -> None:
    text = f"{TEXT} {TEXT} {TEXT}"  # three claims, each carrying the block's citation
    req = P._with_document(P._an_request(P.QUESTION, True, system=None))
    frames = _frames(text, _with_citations(P._citation()))
    resp = run_case(gateway, upstream, P.ANTHROPIC, mode, Stream(frames), request=req)
    assert resp.status == 200 and b"event: error" not in resp.body, resp.raw[-1500:]
    assert len(_citations(resp)) == 1, _citations(resp)

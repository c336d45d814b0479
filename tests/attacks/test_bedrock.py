"""bedrock-converse beyond the matrix's marker scan: a correct citationsContent answer is
released with its citation (the unverified title dropped), and the scanner reads a binary
event-stream, so a marker behind a JSON escape in a frame is found."""

from __future__ import annotations

import json

import pytest

from tests import bedrock_wire as w
from tests.attacks.bedrock_spec import BEDROCK, CLAIM, answer_text, events, framed, with_document
from tests.attacks.conftest import run_case
from tests.attacks.harness import (
    EVENTSTREAM,
    MARKER,
    GatewayProcess,
    eventstream_messages,
    leaks,
    parse_response,
)
from tests.attacks.protocols import CHUNK_TEXT, QUESTION, Mode
from tests.upstream_app import FakeUpstream, Json, Stream

CITATION = {"title": f"{MARKER} manual", "sourceContent": [{"text": CHUNK_TEXT}],
            "location": {"documentChar": {"documentIndex": 0, "start": 0,
                                          "end": len(CHUNK_TEXT)}}}


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_correct_citation_is_released_with_it(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    block = w.cited(CLAIM, CITATION)
    behaviour: Json | Stream = (
        Json(w.body(block)) if mode == "json"
        else Stream(framed(events([block])), seed=3, max_piece=97, delay=0.0)
    )
    req = with_document(BEDROCK.request(QUESTION, mode != "json"))
    resp = run_case(gateway, upstream, BEDROCK, mode, behaviour, request=req)
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.body[:800]
    assert answer_text(resp) == CLAIM
    assert not leaks(resp)  # the title is text nobody verified
    if mode == "json":
        cits = resp.json()["output"]["message"]["content"][0]["citationsContent"]["citations"]
    else:
        cits = [json.loads(p)["delta"]["citation"] for h, p in eventstream_messages(resp.body)
                if h.get(":event-type") == "contentBlockDelta" and b'"citation"' in p]
    assert [c["location"] for c in cits] == [CITATION["location"]]


_LOCATION = {"documentChar": {"documentIndex": 0, "start": 0, "end": len(CHUNK_TEXT)}}
NOT_TEXT = {
    "object": {"note": f"The pump was designed by {MARKER} in 1931."},
    "list": [f"{MARKER} designed it."],
}


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
@pytest.mark.parametrize("shape", list(NOT_TEXT))
def test_source_content_that_is_not_text_never_rides_along(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode, shape: str
) -> None:
    """A piece of `sourceContent` beside the checked slice whose `text` is no string: the
    cited text was the string pieces alone, so the other one went out unchecked."""
    cit = {"sourceContent": [{"text": CHUNK_TEXT}, {"text": NOT_TEXT[shape]}],
           "location": _LOCATION}
    block = w.cited(CLAIM, cit)
    behaviour: Json | Stream = (
        Json(w.body(block)) if mode == "json"
        else Stream(framed(events([block])), seed=3, max_piece=97, delay=0.0)
    )
    req = with_document(BEDROCK.request(QUESTION, mode != "json"))
    resp = run_case(gateway, upstream, BEDROCK, mode, behaviour, request=req)
    assert resp.status != 500, resp.raw[:800]
    assert not leaks(resp), resp.body[:800]


def test_scanner_reads_an_event_stream() -> None:
    escaped = "".join(f"\\u{ord(c):04x}" for c in MARKER)
    payload = ('{"contentBlockIndex": 0, "delta": {"text": "' + escaped + '"}}').encode()
    frames = w.raw_event("contentBlockDelta", payload)
    head = f"HTTP/1.1 200 OK\r\ncontent-type: {EVENTSTREAM}\r\ncontent-length: {len(frames)}"
    resp = parse_response(head.encode() + b"\r\n\r\n" + frames)
    assert MARKER.encode() not in resp.raw
    assert "a JSON string" in leaks(resp)


# -- block order: a block's text after a later block was opened --------------------------------

BAD_CIT = {"sourceContent": [{"text": "The Orbit pump moves 99 litres per minute."}],
           "location": _LOCATION}
GOOD_CIT = {"sourceContent": [{"text": CHUNK_TEXT}], "location": _LOCATION}
USAGE = {"usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
         "metrics": {"latencyMs": 1}}


def _delta(i: int, d: Json) -> tuple[str, Json]:
    return ("contentBlockDelta", {"contentBlockIndex": i, "delta": d})


def _message(*evs: tuple[str, Json]) -> list[bytes]:
    return framed([("messageStart", {"role": "assistant"}), *evs,
                   ("messageStop", {"stopReason": "end_turn"}), ("metadata", USAGE)])


BLOCK_ORDER = {
    # A citation opens block 0, block 1's text streams, then block 0's text: the stream
    # reads block1+block0, the body block0+block1, so block 0's failing citation missed the
    # claim in the stream and caught it in the body.
    "text-after-a-later-block": _message(
        _delta(0, {"citation": BAD_CIT}),
        _delta(1, {"text": "Pumps move water. "}),
        _delta(0, {"text": f"The {MARKER} pump moves 40 litres per minute [kb:1]."}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("contentBlockStop", {"contentBlockIndex": 1}),
    ),
    # Block 0 goes on after a citation opened block 1: in the stream, block 1's correct
    # citation covered block 0's later text, which the body puts under block 0's failing one.
    "text-after-a-citation-opened-a-later-block": _message(
        _delta(0, {"citation": BAD_CIT}),
        _delta(0, {"text": "Pumps move water. "}),
        _delta(1, {"citation": GOOD_CIT}),
        _delta(0, {"text": f"The {MARKER} pump moves 40 litres per minute."}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        _delta(1, {"text": " Ok."}),
        ("contentBlockStop", {"contentBlockIndex": 1}),
    ),
    # The same with a reasoning block opened in between.
    "text-after-a-later-reasoning-block": _message(
        _delta(0, {"citation": BAD_CIT}),
        _delta(0, {"text": "Pumps move water. "}),
        _delta(1, {"reasoningContent": {"text": "Let me think."}}),
        _delta(0, {"text": f"The {MARKER} pump moves 40 litres per minute."}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("contentBlockStop", {"contentBlockIndex": 1}),
    ),
}


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("case", list(BLOCK_ORDER))
def test_text_of_a_block_after_a_later_block_opened_never_goes_out(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode, case: str
) -> None:
    """A text delta for a block below the highest one started (by any delta) is out of order:
    the stream fails closed, as Cohere refuses content started out of index order."""
    req = with_document(BEDROCK.request(QUESTION, True))
    resp = run_case(gateway, upstream, BEDROCK, mode, Stream(BLOCK_ORDER[case]), request=req)
    assert resp.status != 500, resp.raw[:800]
    assert not leaks(resp), resp.raw[:3000]


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_blocks_in_order_with_late_citations_still_go_out(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """Control: reasoning, a text block whose citation comes after its text (the late
    citation), a text block whose citation comes first, and a tool call, each after the
    last, as the service sends them, are released."""
    frames = _message(
        _delta(0, {"reasoningContent": {"text": "The manual answers this."}}),
        _delta(0, {"reasoningContent": {"signature": "c2lnbmF0dXJl"}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        _delta(1, {"text": CLAIM[:20]}),
        _delta(1, {"text": CLAIM[20:]}),
        _delta(1, {"citation": GOOD_CIT}),
        ("contentBlockStop", {"contentBlockIndex": 1}),
        _delta(2, {"citation": GOOD_CIT}),
        _delta(2, {"text": " " + CLAIM}),
        ("contentBlockStop", {"contentBlockIndex": 2}),
        ("contentBlockStart", {"contentBlockIndex": 3,
                               "start": {"toolUse": {"toolUseId": "t1", "name": "lookup"}}}),
        _delta(3, {"toolUse": {"input": '{"q": "orbit pump"}'}}),
        ("contentBlockStop", {"contentBlockIndex": 3}),
    )
    req = with_document(BEDROCK.request(QUESTION, True))
    resp = run_case(gateway, upstream, BEDROCK, mode, Stream(frames), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.raw[:800]
    assert answer_text(resp) == f"{CLAIM} {CLAIM}"
    tail = [h.get(":event-type") for h, _ in eventstream_messages(resp.body)][-2:]
    assert tail == ["messageStop", "metadata"]  # a clean end, no exception

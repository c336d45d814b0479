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

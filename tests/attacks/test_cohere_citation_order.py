"""cohere-chat: a citation must follow the text it cites. The stream parser holds a text item's
text back up to the furthest citation end seen, so that each claim is checked with the citations
that follow it; a citation whose end lies past the text received so far (sent before the text,
or far beyond it) would lift that hold and let a claim out before its own failing citation
arrives. Such a stream is refused. A `content_index` that is not a non-negative integer names
no item: refused alike in a JSON body and in a stream (the two once read `true` differently)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.attacks.cohere_spec import _body, _framed
from tests.attacks.conftest import run_case
from tests.attacks.harness import MARKER, GatewayProcess, RawResponse, assert_no_leak
from tests.attacks.protocols import GOOD, REGISTRY, Mode
from tests.cohere_wire import cite, events, sse_data
from tests.upstream_app import FakeUpstream, Json, Stream

Up = tuple[str, FakeUpstream]
Obj = dict[str, Any]

COHERE = REGISTRY["cohere-chat"]
STREAM_MODES: list[Mode] = ["buffer", "progressive"]
CLAIM_A = f"The {MARKER} pump moves 40 litres per minute [kb:1]."
TEXT = f"{CLAIM_A} {GOOD}"
# Claim A's own native citation names a source in no context: hallucinated.
BAD_CITE = cite(TEXT, "40 litres per minute", "kb:404")


def _refused(resp: RawResponse, mode: Mode, why: str) -> None:
    """Refused: a 502 before any byte (json, buffer), else an error `message-end`."""
    assert resp.status != 500
    assert_no_leak(resp)
    if mode != "progressive":
        assert resp.status == 502, resp.status_line
        assert why in resp.text(), resp.text()
    else:
        last = sse_data(resp.body)[-1]
        assert last["type"] == "message-end" and last["delta"]["finish_reason"] == "ERROR"
        assert why in last["delta"]["error"], last


def _early(start: int, end: int, content_index: object = 0) -> Obj:
    c: Obj = {"start": start, "end": end, "text": TEXT[start:end], "type": "TEXT_CONTENT",
              "sources": [{"type": "document", "id": "kb:1"}]}
    if content_index is not None:
        c["content_index"] = content_index
    return c


# Citations sent right after `content-start`, before any text.
EARLY: dict[str, Obj] = {
    "far-zero-width": _early(10**6, 10**6),
    "whole-answer": _early(0, len(TEXT)),
    "no-content-index": _early(10**6, 10**6, None),
}


def _early_events(citation: Obj, *, before_content: bool = False) -> list[Obj]:
    b = _body(TEXT)
    b["message"]["citations"] = [BAD_CITE]
    evs = sse_data(events(b, chunk=8, citations_at_end=True))
    at = next(i for i, e in enumerate(evs) if e["type"] == "content-start")
    at = at if before_content else at + 1
    evs[at:at] = [
        {"type": "citation-start", "index": 1, "delta": {"message": {"citations": citation}}},
        {"type": "citation-end", "index": 1},
    ]
    return evs


@pytest.mark.parametrize("mode", STREAM_MODES)
@pytest.mark.parametrize("early", list(EARLY))
def test_cohere_a_citation_ahead_of_its_text_fails_the_stream(
    gateway: GatewayProcess, upstream: Up, mode: Mode, early: str
) -> None:
    resp = run_case(gateway, upstream, COHERE, mode,
                    Stream(b"".join(_framed(_early_events(EARLY[early])))))
    assert resp.status != 500
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", STREAM_MODES)
def test_cohere_a_citation_before_any_text_item_fails_the_stream(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    evs = _early_events(_early(10**6, 10**6, None), before_content=True)
    resp = run_case(gateway, upstream, COHERE, mode, Stream(b"".join(_framed(evs))))
    assert resp.status != 500
    assert_no_leak(resp)


def _bad_index_body(value: object) -> Obj:
    b = _body(TEXT)
    c = dict(BAD_CITE)
    c["content_index"] = value
    b["message"]["citations"] = [c]
    return b


INDICES: dict[str, object] = {"int-0": 0, "true": True, "false": False, "string": "0",
                              "negative": -1, "float": 0.0}


@pytest.mark.parametrize("mode", ["json", *STREAM_MODES])
@pytest.mark.parametrize("value", list(INDICES))
def test_cohere_a_content_index_is_read_alike_in_body_and_stream(
    gateway: GatewayProcess, upstream: Up, mode: Mode, value: str
) -> None:
    b = _bad_index_body(INDICES[value])
    up: Json | Stream = Json(b) if mode == "json" else Stream(
        b"".join(_framed(sse_data(events(b, chunk=8, citations_at_end=True)))))
    resp = run_case(gateway, upstream, COHERE, mode, up)
    if value == "int-0":  # the control: judged, claim A (hallucinated source) never out
        assert resp.status != 500
        assert_no_leak(resp)
    else:  # names no item for sure: refused, not judged
        _refused(resp, mode, "content_index is not an index")

"""Fuzz of the bedrock-converse adapter through the route pipeline (parse, context, judge,
render) under the shipped policy: random bytes give an answer or a clean ProtocolError, and a
Converse body or ConverseStream with random extra keys and values, some of them a hallucinated
claim carrying a marker, never renders the marker (DESIGN §2: every field is decided)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ProtocolError
from gateway.eventstream import EventStreamDecoder, encode_message
from gateway.pipeline import RoutePipeline
from gateway.policy import load_policy
from tests import bedrock_wire as w
from tests.attacks.harness import MARKER
from tests.conftest import fuzz_examples
from tests.test_fuzz_adapters import _assert_clean, mutated

ROOT = Path(__file__).resolve().parent.parent
LOADED = load_policy(ROOT / "policies" / "bedrock.yaml")
PIPELINE = RoutePipeline(LOADED, LOADED.policy.routes[0])
REQUEST = json.loads((ROOT / "tests/fixtures/bedrock_converse/request.json").read_text())
CAP = w.char_citation(w.CAPACITY)
GOOD = w.body(
    {"reasoningContent": {"reasoningText": {"text": "thinking", "signature": "c2ln"}}},
    w.cited(w.CAPACITY + " ", CAP),
    {"text": "The K7 weighs 114 kg [k7:weight]."},
    {"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {"sku": "K7"}}},
)


def _judge(raw: bytes, stream: bool) -> bytes | None:
    try:
        if stream:
            answer = PIPELINE.parse_stream(raw)
        else:
            parsed = json.loads(raw)
            if not isinstance(parsed, dict):
                return None
            answer = PIPELINE.adapter.parse(parsed, PIPELINE.route)
        ctx = PIPELINE.context(REQUEST, answer.body, None)
    except (ProtocolError, ValueError):
        return None
    judgement = PIPELINE.judge(answer, ctx)
    return PIPELINE.render(answer, judgement, raw, "fuzz", stream=stream).body


def test_the_good_answer_is_released() -> None:
    body = _judge(json.dumps(GOOD).encode(), False)
    assert body is not None and b"K7 battery" in body and b"thinking" not in body


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(data=st.binary(max_size=400))
def test_random_bytes(data: bytes) -> None:
    _judge(data, False)
    _judge(data, True)
    _judge(w.stream_of([{"text": "a."}])[:40] + data, True)


@settings(max_examples=fuzz_examples(80), deadline=None)
@given(data=st.data())
def test_a_mutated_body_never_renders_the_marker(data: st.DataObject) -> None:
    body = data.draw(mutated(GOOD))
    out = _judge(json.dumps(body).encode(), False)
    if out is not None:
        _assert_clean(out)


def _messages(raw: bytes) -> list[tuple[dict[str, Any], bytes]]:
    dec = EventStreamDecoder()
    return [(dict(m.headers), m.payload) for m in dec.feed(raw) + dec.finish()]


@settings(max_examples=fuzz_examples(60), deadline=None)
@given(data=st.data())
def test_a_mutated_stream_never_renders_the_marker(data: st.DataObject) -> None:
    wire = w.stream_of(GOOD["output"]["message"]["content"])
    out: list[bytes] = []
    for headers, payload in _messages(wire):
        if data.draw(st.integers(min_value=0, max_value=2)) == 0:
            payload = json.dumps(data.draw(mutated(json.loads(payload)))).encode()
        out.append(encode_message(headers, payload))
    rendered = _judge(b"".join(out), True)
    if rendered is None:
        return
    assert MARKER.encode() not in rendered
    if rendered.startswith(b"{"):
        _assert_clean(rendered)
    else:
        for _, payload in _messages(rendered):
            assert MARKER not in payload.decode()


@pytest.mark.parametrize("where", ["text", "reasoning", "title", "unknown"])
def test_the_marker_planted_in_each_place_is_not_rendered(where: str) -> None:
    bad = f"The K7 was designed by {MARKER} in 1931."
    blocks: list[dict[str, Any]] = [w.cited(w.CAPACITY, CAP)]
    if where == "text":
        blocks.append({"text": " " + bad})
    elif where == "reasoning":
        blocks.insert(0, {"reasoningContent": {"reasoningText": {"text": bad}}})
    elif where == "title":
        blocks = [w.cited(w.CAPACITY, {**CAP, "title": bad})]
    else:
        blocks[0] = {**blocks[0], "x": bad}
    for stream in (False, True):
        raw = (
            w.stream_of(blocks) if stream else json.dumps(w.body(*blocks)).encode()
        )
        rendered = _judge(raw, stream)
        assert rendered is not None and MARKER.encode() not in rendered

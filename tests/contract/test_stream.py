"""Streams: a body's `to_stream`, encoded and decoded at random byte boundaries, parses to the
body's own text; the upstream's stream does too; `stream_relayable` never relays bytes past
the terminal event; a progressive framer's bytes are a stream the protocol's decoder accepts."""

from __future__ import annotations

import pytest

from gateway.errors import ProtocolError
from gateway.types import Decision
from tests.contract.helpers import (
    OUTCOMES,
    Case,
    decode,
    encode,
    event_text,
    mixed_answer,
    parse_events,
    primary_text,
    random_pieces,
)
from tests.contract.samples import GOOD, MARKER
from tests.test_protocol_helpers import POLICY

SEEDS = range(6)


def _bodies(case: Case) -> dict[str, dict[str, object]]:
    answer, claims, report = mixed_answer(case)
    partial = case.adapter.render(answer, claims, OUTCOMES[Decision.PARTIAL], report, POLICY)
    return {"clean": case.sample.body(GOOD), "partial": partial}


def test_to_stream_round_trip_at_random_byte_boundaries(case: Case) -> None:
    for label, body in _bodies(case).items():
        want = primary_text(case.adapter.parse(body, case.sample.route))
        for include_usage in (True, False):
            wire = encode(case.adapter, case.adapter.to_stream(body, include_usage))
            for seed in SEEDS:
                events = decode(case.adapter, random_pieces(wire, seed))
                got = parse_events(case, events)
                assert primary_text(got) == want, (label, include_usage, seed)


def test_upstream_stream_parses_like_its_body(case: Case) -> None:
    frames = case.sample.frames
    if frames is None:  # no streaming upstream: the codec still carries whole bodies
        assert case.adapter.stream_parser(case.sample.route).done is False
        return
    want = primary_text(case.adapter.parse(case.sample.body(GOOD), case.sample.route))
    wire = frames(GOOD)
    for seed in SEEDS:
        got = parse_events(case, decode(case.adapter, random_pieces(wire, seed)))
        assert primary_text(got) == want, seed


def _expected_relayable(terminal: bytes, raw: bytes) -> bool:
    at = raw.find(terminal)
    return at >= 0 and not raw[at + len(terminal) :].strip(b" \t\r\n}")


def test_stream_relayable_is_consistent_with_the_terminal_event(case: Case) -> None:
    adapter = case.adapter
    captures = [encode(adapter, adapter.to_stream(case.sample.body(GOOD), True))]
    if case.sample.frames is not None:
        captures.append(case.sample.frames(GOOD))
    for raw in captures:
        relayable = adapter.stream_relayable(raw)
        if adapter.terminal_event is not None:
            assert relayable is _expected_relayable(adapter.terminal_event, raw)
            assert relayable, "a well-formed stream ends with its terminal event"


def test_bytes_after_the_end_are_never_relayed(case: Case) -> None:
    """A capture holding a second answer after the first one's end: where the parser stops
    at its end (`done`, the terminal event) the rest was never verified, so the capture must
    not go out as is; where it reads on, the second answer is part of what it verified."""
    adapter = case.adapter
    trailer = encode(adapter, adapter.to_stream(case.sample.body(f"{GOOD} {MARKER}"), True))
    captures = {"to_stream": encode(adapter, adapter.to_stream(case.sample.body(GOOD), True))}
    if case.sample.frames is not None:
        captures["upstream"] = case.sample.frames(GOOD)
    for label, raw in captures.items():
        events = decode(adapter, [raw + trailer])
        parser = adapter.stream_parser(case.sample.route)
        read = 0
        while read < len(events) and not parser.done:
            parser.feed(events[read])
            read += 1
        if read < len(events):
            assert not adapter.stream_relayable(raw + trailer), label
        else:
            assert MARKER in primary_text(parser.finish()), label


def test_progressive_framer(case: Case) -> None:
    adapter = case.adapter
    if case.sample.frames is None:
        with pytest.raises(ValueError, match="no progressive streams"):
            adapter.progressive_framer(True)
        return
    framer = adapter.progressive_framer(True)
    for event in decode(adapter, [case.sample.frames(GOOD)])[:1]:
        framer.observe(event)  # the stream's head (ids, model), as stream.py feeds it
    assert not framer.started
    head = framer.opening() + framer.text(GOOD)
    # primary_channel None: the answer is judged whole, nothing goes out before the end
    assert framer.started is (adapter.primary_channel is not None)
    message = f"citewarden: verification failed {MARKER}-message"
    tail = framer.error(message, "citation_verification_failed")
    events = decode(adapter, random_pieces(head + tail, 3))
    assert events
    assert any(message in event_text(e) for e in decode(adapter, [tail]))
    # an error-ended stream is never a complete answer
    with pytest.raises(ProtocolError):
        parse_events(case, events)

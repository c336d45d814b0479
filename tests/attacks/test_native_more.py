"""Native-protocol streams and citations whose bytes say more than the gateway's assembled
answer: Anthropic block indices reused or interleaved, content in `message_start` /
`message_delta` / a tool_use start, a search-result citation's `source` the request never
carried; Cohere content and tool-call keys the parser does not read. Each is released only
as the gateway's own rendering of what it verified (or fails); controls show that the same
shapes with correct content still go out, and that a clean stream is still relayed as is."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.demo import wire
from tests.attacks.cohere_spec import _body as co_body
from tests.attacks.cohere_spec import _events as co_events
from tests.attacks.cohere_spec import _framed as co_framed
from tests.attacks.conftest import run_case
from tests.attacks.harness import MARKER, GatewayProcess, assert_no_leak
from tests.attacks.protocols import (
    ANTHROPIC,
    CHUNK_TEXT,
    GOOD,
    QUESTION,
    REGISTRY,
    Mode,
    _an_body,
    _with_document,
)
from tests.upstream_app import FakeUpstream, Json, Stream

Up = tuple[str, FakeUpstream]
Obj = dict[str, Any]

BAD = f"The pump was designed by {MARKER} in 1931."
CLAIM = "The Orbit pump moves 40 litres per minute."
STREAM_MODES: list[Mode] = ["buffer", "progressive"]

# -- anthropic-messages: the event stream ---------------------------------------------------------


def _cit() -> Obj:
    return {"type": "char_location", "cited_text": CHUNK_TEXT, "document_index": 0,
            "start_char_index": 0, "end_char_index": len(CHUNK_TEXT)}


def _start(content: list[Obj] | None = None) -> Obj:
    return {"type": "message_start", "message": {
        "id": "msg_native", "type": "message", "role": "assistant", "model": "claude-fake",
        "content": content or [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 0}}}


def _tail(**delta: object) -> list[Obj]:
    return [{"type": "message_delta",
             "delta": {"stop_reason": "end_turn", "stop_sequence": None, **delta},
             "usage": {"output_tokens": 5}},
            {"type": "message_stop"}]


def _d(i: int, delta: Obj) -> Obj:
    return {"type": "content_block_delta", "index": i, "delta": delta}


def _block_start(i: int, block: Obj) -> Obj:
    return {"type": "content_block_start", "index": i, "content_block": block}


def _stop(i: int) -> Obj:
    return {"type": "content_block_stop", "index": i}


def _good_block(i: int) -> list[Obj]:
    return [_block_start(i, {"type": "text", "text": ""}),
            _d(i, {"type": "citations_delta", "citation": _cit()}),
            _d(i, {"type": "text_delta", "text": CLAIM}),
            _stop(i)]


AN_STREAMS: dict[str, list[Obj]] = {
    # Block 0 streams an uncited sentence, stops, and is started again with the good one: the
    # SDKs keep both blocks, an overwrite would verify only the second.
    "block-index-reused": [
        _start(),
        _block_start(0, {"type": "text", "text": ""}),
        _d(0, {"type": "text_delta", "text": BAD + " "}),
        _stop(0),
        *_good_block(0),
        *_tail(),
    ],
    "block-index-reused-start-text": [
        _start(),
        _block_start(0, {"type": "text", "text": BAD}),
        _stop(0),
        *_good_block(0),
        *_tail(),
    ],
    # The SDKs start their snapshot from message_start's content.
    "message-start-content": [_start([{"type": "text", "text": BAD}]), *_good_block(0), *_tail()],
    "message-delta-content": [
        _start(), *_good_block(0), *_tail(content=[{"type": "text", "text": BAD}])],
    # Deltas of two open text blocks interleaved: the text arrives in another order than the
    # blocks put it in.
    "blocks-interleaved": [
        _start(),
        _block_start(0, {"type": "text", "text": ""}),
        _block_start(1, {"type": "text", "text": ""}),
        _d(1, {"type": "citations_delta", "citation": _cit()}),
        _d(1, {"type": "text_delta", "text": CLAIM}),
        _d(0, {"type": "text_delta", "text": f"{MARKER} said so. "}),
        _stop(0),
        _stop(1),
        *_tail(),
    ],
    # A tool_use block whose input comes whole in its start and no input_json_delta follows.
    "tool-use-start-input": [
        _start(),
        *_good_block(0),
        _block_start(1, {"type": "tool_use", "id": "toolu_1", "name": "lookup",
                         "input": {"note": BAD}}),
        _stop(1),
        *_tail(),
    ],
    "block-index-skipped": [
        _start(),
        *_good_block(1),
        _block_start(0, {"type": "text", "text": BAD}),
        _stop(0),
        *_tail(),
    ],
}


def _an_frames(events: list[Obj]) -> bytes:
    return b"".join(wire.anthropic_frames([(e["type"], e) for e in copy.deepcopy(events)]))


def _an_stream(gw: GatewayProcess, up: Up, mode: Mode, events: list[Obj]) -> Any:
    beh = Stream([_an_frames(events)], seed=3, max_piece=97, delay=0.0)
    req = _with_document(ANTHROPIC.request(QUESTION, True))
    return run_case(gw, up, ANTHROPIC, mode, beh, request=req)


@pytest.mark.parametrize("mode", STREAM_MODES)
@pytest.mark.parametrize("name", list(AN_STREAMS))
def test_anthropic_stream_says_only_what_was_verified(
    gateway: GatewayProcess, upstream: Up, mode: Mode, name: str
) -> None:
    resp = _an_stream(gateway, upstream, mode, AN_STREAMS[name])
    assert_no_leak(resp)


def test_anthropic_clean_stream_still_goes_out_as_is(
    gateway: GatewayProcess, upstream: Up
) -> None:
    events = [_start(), *_good_block(0), *_tail()]
    resp = _an_stream(gateway, upstream, "buffer", events)
    assert resp.status == 200 and resp.header("x-citewarden-decision") == "released"
    assert resp.body == _an_frames(events)


@pytest.mark.parametrize("mode", STREAM_MODES)
def test_anthropic_start_text_is_the_blocks_text(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Text carried in content_block_start is text of the block: verified like a delta's
    (an uncited claim there is stripped, a cited one released)."""
    events = [
        _start(),
        _block_start(0, {"type": "text", "text": CLAIM, "citations": [_cit()]}),
        _stop(0),
        _block_start(1, {"type": "text", "text": " " + BAD}),
        _stop(1),
        *_tail(),
    ]
    resp = _an_stream(gateway, upstream, mode, events)
    assert_no_leak(resp)
    assert resp.status == 200 and CLAIM in resp.body.decode()


# -- anthropic-messages: a search result citation's source ----------------------------------------

SOURCE = "https://kb.example/pump"


def _with_search_result(req: Obj) -> Obj:
    req = copy.deepcopy(req)
    result = {"type": "search_result", "source": SOURCE, "title": "Pump",
              "content": [{"type": "text", "text": CHUNK_TEXT}], "citations": {"enabled": True}}
    req["messages"][-1]["content"] = [result, {"type": "text", "text": QUESTION}]
    return req


def _sr_cit(source: str) -> Obj:
    return {"type": "search_result_location", "cited_text": CHUNK_TEXT, "search_result_index": 0,
            "source": source, "title": "Pump", "start_block_index": 0, "end_block_index": 1}


def _sr_case(gw: GatewayProcess, up: Up, mode: Mode, source: str) -> Any:
    body = _an_body(CLAIM)
    body["content"][0]["citations"] = [_sr_cit(source)]
    if mode == "json":
        beh: Any = Json(body)
    else:
        events = [_start(), _block_start(0, {"type": "text", "text": ""}),
                  _d(0, {"type": "citations_delta", "citation": _sr_cit(source)}),
                  _d(0, {"type": "text_delta", "text": CLAIM}), _stop(0), *_tail()]
        beh = Stream([_an_frames(events)], seed=3, max_piece=97, delay=0.0)
    req = _with_search_result(ANTHROPIC.request(QUESTION, mode != "json"))
    return run_case(gw, up, ANTHROPIC, mode, beh, request=req)


@pytest.mark.parametrize("mode", ["json", *STREAM_MODES])
def test_search_result_source_the_request_did_not_carry_is_replaced(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    source = f"https://kb.example/The-pump-was-designed-by-{MARKER}-in-1931"
    resp = _sr_case(gateway, upstream, mode, source)
    assert_no_leak(resp)
    assert resp.status == 200 and CLAIM in resp.body.decode()  # the claim itself verifies
    if mode != "progressive":  # progressive citations carry no source at all
        assert f'"source":"{SOURCE}"' in resp.body.decode().replace(": ", ":")


@pytest.mark.parametrize("mode", ["json", "buffer"])
def test_search_result_source_of_the_request_is_relayed(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    resp = _sr_case(gateway, upstream, mode, SOURCE)
    assert resp.status == 200 and resp.header("x-citewarden-decision") == "released"
    assert f'"source":"{SOURCE}"' in resp.body.decode().replace(": ", ":")


# -- cohere-chat: keys the stream parser does not read ---------------------------------------------

COHERE = REGISTRY["cohere-chat"]


def _co_mutate(kind: str) -> list[bytes]:
    events = copy.deepcopy(co_events(co_body(GOOD)))
    if kind.startswith("tool-call"):
        fn: object = {"arguments": "{}", "name": BAD} if kind == "tool-call-delta-name" else BAD
        end = events.pop()
        events += [
            {"type": "tool-call-start", "index": 0, "delta": {"message": {"tool_calls": {
                "id": "lookup_1", "type": "function",
                "function": {"name": "lookup", "arguments": ""}}}}},
            {"type": "tool-call-delta", "index": 0,
             "delta": {"message": {"tool_calls": {"function": fn}}}},
            {"type": "tool-call-end", "index": 0},
            end,
        ]
        return co_framed(events)
    for e in events:
        if e["type"] == "content-start" and kind == "start-thinking-key":
            e["delta"]["message"]["content"]["thinking"] = BAD
        if e["type"] == "content-delta" and kind == "delta-thinking-key":
            e["delta"]["message"]["content"]["thinking"] = BAD
            break
    if kind == "thinking-item-text-key":
        at = next(i for i, e in enumerate(events) if e["type"] == "message-end")
        events[at:at] = [
            {"type": "content-start", "index": 1,
             "delta": {"message": {"content": {"type": "thinking", "thinking": ""}}}},
            {"type": "content-delta", "index": 1,
             "delta": {"message": {"content": {"thinking": "Checking.", "text": BAD}}}},
            {"type": "content-end", "index": 1},
        ]
    return co_framed(events)


COHERE_KINDS = [
    "start-thinking-key",
    "delta-thinking-key",
    "thinking-item-text-key",
    "tool-call-delta-name",
    "tool-call-delta-function-not-object",
]


@pytest.mark.parametrize("mode", STREAM_MODES)
@pytest.mark.parametrize("kind", COHERE_KINDS)
def test_cohere_stream_keys_not_read_are_not_relayed(
    gateway: GatewayProcess, upstream: Up, mode: Mode, kind: str
) -> None:
    beh = Stream(_co_mutate(kind), seed=3, max_piece=97, delay=0.0)
    assert_no_leak(run_case(gateway, upstream, COHERE, mode, beh))


def test_cohere_json_text_item_with_a_thinking_key(
    gateway: GatewayProcess, upstream: Up
) -> None:
    body = co_body(GOOD)
    body["message"]["content"][0]["thinking"] = BAD
    assert_no_leak(run_case(gateway, upstream, COHERE, "json", Json(body)))


def test_cohere_clean_stream_still_goes_out_as_is(gateway: GatewayProcess, upstream: Up) -> None:
    frames = co_framed(copy.deepcopy(co_events(co_body(GOOD))))
    resp = run_case(gateway, upstream, COHERE, "buffer",
                    Stream(frames, seed=3, max_piece=97, delay=0.0))
    assert resp.header("x-citewarden-decision") == "released"
    assert resp.body == b"".join(frames)

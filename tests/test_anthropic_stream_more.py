"""anthropic-messages stream parser: the assembled message is the one the SDKs build from the
same events (they append each started block and apply a delta only to a block of its type), or
the stream fails or is re-framed, so a buffered stream is relayed as is only when its bytes say
nothing the gateway did not verify. And a search result citation's `source` goes out only as
the request gave it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.context import build_context
from gateway.errors import ProtocolError
from gateway.policy import ContextSpec, Policy
from gateway.protocols import get
from gateway.protocols.anthropic_messages.stream import AnthropicStreamParser
from gateway.sse import SSEEvent
from gateway.types import Answer, Decision, Outcome, Report
from tests.test_protocol_helpers import ROUTES

ADAPTER = get("anthropic-messages")
ROUTE = ROUTES["anthropic-messages"]
POLICY = Policy(name="t", routes=[ROUTE])
PLANT = "PLANTED sentence."

Obj = dict[str, Any]


def start(content: list[Obj] | None = None) -> Obj:
    return {"type": "message_start", "message": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": content or [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 0}}}


def block(i: int, b: Obj) -> Obj:
    return {"type": "content_block_start", "index": i, "content_block": b}


def delta(i: int, d: Obj) -> Obj:
    return {"type": "content_block_delta", "index": i, "delta": d}


def text(i: int, t: str) -> Obj:
    return delta(i, {"type": "text_delta", "text": t})


def stop(i: int) -> Obj:
    return {"type": "content_block_stop", "index": i}


def tail(**d: object) -> list[Obj]:
    return [{"type": "message_delta", "delta": {"stop_reason": "end_turn", **d},
             "usage": {"output_tokens": 3}}, {"type": "message_stop"}]


def feed(events: list[Obj]) -> tuple[AnthropicStreamParser, list[tuple[str, str]]]:
    parser = ADAPTER.stream_parser(ROUTE)
    assert isinstance(parser, AnthropicStreamParser)
    seen: list[tuple[str, str]] = []
    for e in events:
        seen += parser.feed(SSEEvent(json.dumps(e), e["type"]))
    return parser, seen


def rendered(answer: Answer) -> str:
    body = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), Report((), "x"), POLICY)
    return json.dumps(body)


def content(answer: Answer) -> list[Obj]:
    blocks: list[Obj] = answer.body["content"]  # type: ignore[assignment]
    return blocks


TEXT0 = [block(0, {"type": "text", "text": ""}), text(0, "One."), stop(0)]


@pytest.mark.parametrize(
    "events",
    [
        # block 0 started twice: the SDKs keep both blocks
        [start(), *TEXT0, block(0, {"type": "text", "text": ""}), text(0, "Two."), stop(0)],
        [start(), block(0, {"type": "text", "text": PLANT}), stop(0), *TEXT0],
        # an index skipped: the SDKs put the block at the next position whatever it says
        [start(), block(1, {"type": "text", "text": ""}), text(1, "One."), stop(1)],
        [start(), *TEXT0, start()],  # a second message_start
        # text of two blocks interleaved: handed on in another order than the blocks'
        [start(), block(0, {"type": "text", "text": ""}), block(1, {"type": "text", "text": ""}),
         text(1, "One."), text(0, PLANT)],
        # a delta of a type the block has no field for (the SDKs ignore it)
        [start(), block(0, {"type": "thinking", "thinking": "", "signature": ""}),
         text(0, PLANT)],
        [start(), *TEXT0[:2], delta(0, {"type": "thinking_delta", "thinking": PLANT})],
        [start(), *TEXT0[:2], delta(0, {"type": "input_json_delta", "partial_json": "{}"})],
        [start(), block(0, {"type": "tool_use", "id": "t", "name": "f", "input": {}}),
         delta(0, {"type": "citations_delta", "citation": {}})],
        # a delta after its block stopped, a stop twice, a delta of no block
        [start(), *TEXT0, text(0, PLANT)],
        [start(), *TEXT0, stop(0)],
        [start(), text(0, PLANT)],
        # an index that is no index: `false` == 0 would key the block's channels `False`
        [start(), block(False, {"type": "text", "text": ""}), text(False, "One."), stop(False)],
        [start(), *TEXT0, block(True, {"type": "text", "text": ""}), text(True, "Two.")],
    ],
    ids=["reused", "reused-start-text", "skipped", "second-message-start", "interleaved",
         "text-on-thinking", "thinking-on-text", "json-on-text", "citation-on-tool",
         "delta-after-stop", "stop-twice", "delta-of-no-block", "false-index", "true-index"],
)
def test_a_stream_the_sdks_read_otherwise_fails(events: list[Obj]) -> None:
    with pytest.raises(ProtocolError):
        parser, _ = feed([*events, *tail()])
        parser.finish()


@pytest.mark.parametrize(
    "events",
    [
        [start([{"type": "text", "text": PLANT}]), *TEXT0, *tail()],
        [start(), *TEXT0, *tail(content=[{"type": "text", "text": PLANT}])],
    ],
    ids=["message-start-content", "message-delta-content"],
)
def test_content_outside_the_blocks_is_never_relayed(events: list[Obj]) -> None:
    parser, _ = feed(events)
    answer = parser.finish()
    assert answer.channels[0].text == "One."
    assert ADAPTER.needs_rewrite(answer, POLICY)  # the upstream's bytes never go out
    assert "PLANTED" not in rendered(answer)


def test_a_null_citations_list_takes_the_streamed_citations() -> None:
    # The SDKs start a list for a citations_delta whatever the block started with.
    cit = {"type": "char_location", "cited_text": "One.", "document_index": 0,
           "start_char_index": 0, "end_char_index": 4}
    parser, _ = feed([start(), block(0, {"type": "text", "text": "", "citations": None}),
                      delta(0, {"type": "citations_delta", "citation": cit}), text(0, "One."),
                      stop(0), *tail()])
    answer = parser.finish()
    assert content(answer)[0]["citations"] == [cit]
    assert len(answer.channels[0].native) == 1


def test_start_text_is_text_of_the_block() -> None:
    parser, seen = feed([start(), block(0, {"type": "text", "text": "One. "}), text(0, "Two."),
                         stop(0), *tail()])
    answer = parser.finish()
    assert "".join(t for _, t in seen) == answer.channels[0].text == "One. Two."
    assert not ADAPTER.needs_rewrite(answer, POLICY)


def test_tool_use_input_from_its_start_or_its_deltas() -> None:
    tool = {"type": "tool_use", "id": "toolu_1", "name": "lookup"}
    # No input_json_delta: the input the block started with is the input (and is verified).
    parser, _ = feed([start(), *TEXT0, block(1, {**tool, "input": {"q": PLANT}}), stop(1),
                      *tail()])
    answer = parser.finish()
    assert content(answer)[1]["input"] == {"q": PLANT}
    assert any(c.kind == "tool_arguments" and PLANT in c.text for c in answer.channels)
    assert not answer.dropped
    # Streamed input replaces a non-empty starting one, whose bytes are then not relayed.
    parser, _ = feed([start(), *TEXT0, block(1, {**tool, "input": {"q": PLANT}}),
                      delta(1, {"type": "input_json_delta", "partial_json": '{"q": "pump"}'}),
                      stop(1), *tail()])
    answer = parser.finish()
    assert content(answer)[1]["input"] == {"q": "pump"}
    assert ADAPTER.needs_rewrite(answer, POLICY) and "PLANTED" not in rendered(answer)
    # A block the stream never stopped still gets its streamed input.
    parser, _ = feed([start(), *TEXT0, block(1, {**tool, "input": {}}),
                      delta(1, {"type": "input_json_delta", "partial_json": '{"q": "x"}'}),
                      *tail()])
    assert content(parser.finish())[1]["input"] == {"q": "x"}


def test_a_real_stream_is_relayed_as_is() -> None:
    """Text, thinking (signature) and tool_use blocks in order, as the API sends them."""
    events = [
        start(),
        block(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Let me see."}),
        delta(0, {"type": "signature_delta", "signature": "EqQBCkgIARABGAIiQL+abc=="}),
        stop(0),
        block(1, {"type": "text", "text": ""}),
        text(1, "One."),
        stop(1),
        block(2, {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}),
        delta(2, {"type": "input_json_delta", "partial_json": '{"q": '}),
        delta(2, {"type": "input_json_delta", "partial_json": '"pump"}'}),
        stop(2),
        *tail(),
    ]
    parser, _ = feed(events)
    answer = parser.finish()
    assert not answer.dropped and not answer.unknown_fields
    assert [b["type"] for b in content(answer)] == ["thinking", "text", "tool_use"]
    assert content(answer)[2]["input"] == {"q": "pump"}


# -- a search result citation's source ------------------------------------------------------------


def test_a_search_result_source_goes_out_as_the_request_gave_it() -> None:
    request = {"messages": [{"role": "user", "content": [
        {"type": "search_result", "source": "https://kb.example/a", "title": "A",
         "content": [{"type": "text", "text": "One."}]},
        {"type": "search_result", "source": "https://kb.example/b", "title": "B",
         "content": [{"type": "text", "text": "Two."}]},
        {"type": "text", "text": "Q?"}]}]}
    ctx = build_context("anthropic-messages", ContextSpec(), request=request)

    def cit(index: int, source: str) -> Obj:
        return {"type": "search_result_location", "cited_text": "One.", "source": source,
                "search_result_index": index, "start_block_index": 0, "end_block_index": 1}

    cits = [cit(0, "https://kb.example/a"), cit(1, "https://kb.example/a"),
            cit(0, "https://kb.example/PLANTED"), cit(7, "https://kb.example/a")]
    body = {"id": "m", "type": "message", "role": "assistant", "model": "c",
            "content": [{"type": "text", "text": "One.", "citations": cits}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}
    answer = ADAPTER.parse(body, ROUTE)
    assert ADAPTER.needs_rewrite(answer, POLICY)  # only a rendered body has it compared
    out = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), Report((), ctx), POLICY)
    got = [c.get("source") for c in out["content"][0]["citations"]]  # type: ignore[index]
    # The cited result's own source, whatever the upstream wrote; none for no such result.
    assert got == ["https://kb.example/a", "https://kb.example/b", "https://kb.example/a", ""]
    # Only the context's fingerprint: no source to give.
    out = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), Report((), "x"), POLICY)
    assert {c["source"] for c in out["content"][0]["citations"]} == {""}  # type: ignore[index]

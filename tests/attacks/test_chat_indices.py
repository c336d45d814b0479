"""openai-chat: a choice's or a tool call's `index` is a non-negative integer, or the answer is
refused (a 502 before any byte, an error event in a progressive stream). A bool index once
shared choice 0's state in the assembled body (`False == 0`) while its text went to a channel
of its own (`choices/False/...`): a progressive stream then cut the answer and ended clean, the
buffered one released it whole. Controls: integer indices (`n=2`) still go out."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.demo import wire
from tests.attacks.conftest import run_case
from tests.attacks.harness import MARKER, GatewayProcess, RawResponse, assert_no_leak
from tests.attacks.protocols import GOOD, REGISTRY, Mode, _oa_chunk
from tests.upstream_app import FakeUpstream, Json, Stream

Up = tuple[str, FakeUpstream]
Obj = dict[str, Any]

CHAT = REGISTRY["openai-chat"]
BAD = f" The Orbit pump was designed by {MARKER} in 1931 [kb:1]."
BAD_INDICES: dict[str, object] = {"false": False, "true": True, "negative": -1,
                                  "string": "0", "float": 0.0, "null": None}


def _with_index(delta: Obj, index: object) -> Obj:
    ch = _oa_chunk(delta)
    ch["choices"][0]["index"] = index
    return ch


def _frames(chunks: list[Obj]) -> Stream:
    return Stream(b"".join(wire.openai_frames(
        [_oa_chunk({"role": "assistant", "content": ""}), *chunks, _oa_chunk({}, "stop")])))


def _refused(resp: RawResponse, mode: Mode) -> None:
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)
    assert b"internal_error" not in resp.body, resp.body[:800]
    if mode == "progressive":
        assert resp.header("x-citewarden-decision") == "progressive", resp.raw[:800]
        assert b'"type": "upstream_error"' in resp.body, resp.body[-800:]
        assert b"index" in resp.body.rsplit(b"data: ", 1)[-1], resp.body[-800:]
        assert b"[DONE]" not in resp.body, resp.body[-800:]
    else:
        assert resp.status == 502, resp.raw[:800]
        assert b"bad_upstream_answer" in resp.body, resp.body[:800]


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("value", list(BAD_INDICES))
def test_chat_stream_choice_index_that_is_not_an_integer_is_refused(
    gateway: GatewayProcess, upstream: Up, mode: Mode, value: str
) -> None:
    split = [_oa_chunk({"content": "The Orbit pump moves 40 litres"}),
             _with_index({"content": " per minute [kb:1]."}, BAD_INDICES[value])]
    _refused(run_case(gateway, upstream, CHAT, mode, _frames(split)), mode)
    after = [_oa_chunk({"content": GOOD}), _with_index({"content": BAD}, BAD_INDICES[value])]
    _refused(run_case(gateway, upstream, CHAT, mode, _frames(after)), mode)


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("value", list(BAD_INDICES))
def test_chat_stream_tool_call_index_that_is_not_an_integer_is_refused(
    gateway: GatewayProcess, upstream: Up, mode: Mode, value: str
) -> None:
    call = {"index": BAD_INDICES[value], "id": "call_1", "type": "function",
            "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    chunks = [_oa_chunk({"content": GOOD}), _oa_chunk({"tool_calls": [call]})]
    _refused(run_case(gateway, upstream, CHAT, mode, _frames(chunks)), mode)


def _body(value: object, where: str) -> Obj:
    msg: Obj = {"role": "assistant", "content": GOOD}
    choice: Obj = {"index": 0, "message": msg, "finish_reason": "stop"}
    if where == "choice":
        choice["index"] = value
    else:
        msg["tool_calls"] = [{"index": value, "id": "call_1", "type": "function",
                              "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [choice]}


@pytest.mark.parametrize("where", ["choice", "tool_call"])
@pytest.mark.parametrize("value", [v for v in BAD_INDICES if v != "null"])
def test_chat_body_index_that_is_not_an_integer_is_refused(
    gateway: GatewayProcess, upstream: Up, value: str, where: str
) -> None:
    resp = run_case(gateway, upstream, CHAT, "json", Json(_body(BAD_INDICES[value], where)))
    _refused(resp, "json")


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_chat_two_integer_choices_still_go_out(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    chunks = [_oa_chunk({"content": GOOD}), _oa_chunk({"content": GOOD}, index=1)]
    resp = run_case(gateway, upstream, CHAT, mode, _frames(chunks))
    assert resp.status == 200, resp.raw[:800]
    assert b"bad_upstream_answer" not in resp.body, resp.body[-800:]
    assert_no_leak(resp)


@pytest.mark.parametrize("where", ["choice", "tool_call"])
def test_chat_body_integer_indices_still_go_out(
    gateway: GatewayProcess, upstream: Up, where: str
) -> None:
    resp = run_case(gateway, upstream, CHAT, "json", Json(copy.deepcopy(_body(0, where))))
    assert resp.status == 200, resp.raw[:800]

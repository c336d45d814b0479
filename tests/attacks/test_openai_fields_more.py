"""openai-chat and openai-responses fields beyond the matrix: values a buffered stream carries
that the assembled answer overwrote or ignored (the stream is then re-framed, never relayed
as is), text deltas no finished item repeats, and fields whose values were relayed without a
shape: a chat tool call's second member, audio without a transcript, chat `url_citation` URLs,
Responses `encrypted_content`, `output_text.logprobs` entries and `file_search_call.results`.
Each leak case has a positive control where the fix could over-block."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.demo import responses_wire as rw
from gateway.demo import wire
from tests.attacks.conftest import run_case
from tests.attacks.harness import GatewayProcess, RawResponse, assert_no_leak, running_gateway
from tests.attacks.protocols import (
    _OA_HEAD,
    BAD,
    GOOD,
    PIECE,
    QUESTION,
    REGISTRY,
    Mode,
    _oa_body,
    _oa_chunk,
    _oa_chunks,
    _oa_sse,
)
from tests.attacks.responses_spec import MSG, RESPONSES, _at, body, events, framed, request
from tests.upstream_app import FakeUpstream, Json, Stream, sse_events

CHAT = REGISTRY["openai-chat"]
Up = tuple[str, FakeUpstream]
Body = dict[str, Any]


def _stream(frames: list[bytes]) -> Stream:
    return Stream(frames, seed=7, max_piece=256, delay=0.0)


def _chat(
    gateway: GatewayProcess,
    upstream: Up,
    mode: Mode,
    edit_body: Callable[[Body], None],
    edit_chunks: Callable[[list[Body]], None],
) -> RawResponse:
    if mode == "json":
        b = _oa_body(GOOD)
        edit_body(b)
        return run_case(gateway, upstream, CHAT, mode, Json(b))
    cs = _oa_chunks(GOOD)
    edit_chunks(cs)
    return run_case(gateway, upstream, CHAT, mode, _stream(_oa_sse(cs)))


def _msg(b: Body) -> Body:
    return b["choices"][0]["message"]  # type: ignore[no-any-return]


def _chat_message(resp: RawResponse, mode: Mode) -> Body:
    """The message the client assembles (json: the body's; a stream: its deltas merged)."""
    if mode == "json":
        return _msg(resp.json())
    out: Body = {}
    for _, data in sse_events(resp.body):
        if data.strip() != "[DONE]":
            for choice in json.loads(data).get("choices") or []:
                _merge(out, choice.get("delta") or {})
    return out


def _merge(into: Body, delta: Body) -> None:
    for k, v in delta.items():
        if isinstance(v, str) and isinstance(into.get(k), str):
            into[k] += v
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        elif v is not None:
            into[k] = copy.deepcopy(v)


# -- openai-chat: a buffered stream relays nothing the assembled answer did not decide --------


def _tokens(text: str) -> list[Body]:
    return [{"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []}
            for t in wire.split_fixed(text, PIECE)]


def _usage_overwritten(cs: list[Body]) -> None:
    cs[1]["usage"] = {"prompt_tokens": 1, "x_note": BAD}
    cs.append({**_OA_HEAD, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                                     "total_tokens": 3}})


def _logprobs_member(cs: list[Body]) -> None:
    for c, t in zip(cs[1:-1], _tokens(GOOD), strict=True):
        c["choices"][0]["logprobs"] = {"content": [t]}
    cs[1]["choices"][0]["logprobs"]["refusal"] = BAD


def _choice_message(cs: list[Body]) -> None:
    cs[1]["choices"][0]["message"] = {"role": "assistant", "content": BAD}
    cs[-1]["choices"][0]["message"] = {"role": "assistant", "content": GOOD, "refusal": None}


def _audio_overwritten(cs: list[Body]) -> None:
    cs.insert(-1, _oa_chunk({"audio": {"id": BAD, "expires_at": BAD}}))
    cs.insert(-1, _oa_chunk({"audio": {"id": "audio_1", "expires_at": 1, "transcript": ""}}))


def _audio_id_token_overwritten(cs: list[Body]) -> None:
    # Token-shaped, so no single frame fails its table: only the overwrite is left.
    cs.insert(-1, _oa_chunk({"audio": {"id": "ZQXMARKER", "transcript": ""}}))
    cs.insert(-1, _oa_chunk({"audio": {"id": "audio_1", "expires_at": 1}}))


def _detail_ignored(cs: list[Body]) -> None:
    entry = {"type": "reasoning.encrypted", "index": 0, "data": "c2ln", "id": "rd_1"}
    cs.insert(1, _oa_chunk({"reasoning_details": [entry]}))
    cs.insert(2, _oa_chunk({"reasoning_details": [{**entry, "data": "", "id": "ZQXMARKER"}]}))


FRAME_CASES: dict[str, Callable[[list[Body]], None]] = {
    "usage-overwritten": _usage_overwritten,
    "logprobs-non-list-member": _logprobs_member,
    "choice-message-key": _choice_message,
    "audio-id-prose": _audio_overwritten,
    "audio-id-token-overwritten": _audio_id_token_overwritten,
    "reasoning-detail-ignored": _detail_ignored,
}


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("case", list(FRAME_CASES))
def test_chat_stream_value_the_answer_overwrote_is_not_relayed(
    gateway: GatewayProcess, upstream: Up, mode: Mode, case: str
) -> None:
    cs = _oa_chunks(GOOD)
    FRAME_CASES[case](cs)
    resp = run_case(gateway, upstream, CHAT, mode, _stream(_oa_sse(cs)))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert CHAT.answer_text(resp) == GOOD


def test_chat_stream_with_decided_frames_is_still_relayed_as_is(
    gateway: GatewayProcess, upstream: Up
) -> None:
    """Positive control: logprobs with a null refusal on every frame, `usage: null` frames, a
    growing usage (each one of the right shape) and audio whose id repeats go out byte for
    byte."""
    cs = _oa_chunks(GOOD)
    for c, t in zip(cs[1:-1], _tokens(GOOD), strict=True):
        c["choices"][0]["logprobs"] = {"content": [t], "refusal": None}
    for c in cs:
        c["usage"] = None
    cs[1]["usage"] = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    cs.insert(-1, _oa_chunk({"audio": {"id": "audio_1", "expires_at": 1, "transcript": ""}}))
    cs.insert(-1, _oa_chunk({"audio": {"id": "audio_1", "data": "aGVsbG8="}}))
    cs.append({**_OA_HEAD, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2,
                                                     "total_tokens": 3}})
    frames = _oa_sse(cs)
    resp = run_case(gateway, upstream, CHAT, "buffer", _stream(frames))
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") == "released", resp.body[:800]
    assert resp.body == b"".join(frames)


# -- openai-chat: fields relayed without a decision -------------------------------------------


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_chat_audio_without_a_transcript_is_dropped(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    audio = {"id": "audio_1", "data": "ZQXMARKERaGVsbG8=", "expires_at": 1}
    resp = _chat(gateway, upstream, mode,
                 lambda b: _msg(b).__setitem__("audio", dict(audio)),
                 lambda cs: cs.insert(-1, _oa_chunk({"audio": dict(audio)})))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert "audio" not in _chat_message(resp, mode)
    assert CHAT.answer_text(resp) == GOOD


@pytest.mark.parametrize("mode", ["json", "buffer"])
def test_chat_audio_with_its_transcript_is_kept(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Positive control: audio whose transcript verifies still goes out."""
    audio = {"id": "audio_1", "data": "aGVsbG8=", "expires_at": 1, "transcript": GOOD}

    def stream(cs: list[Body]) -> None:
        cs.insert(-1, _oa_chunk({"audio": {"id": "audio_1", "data": "aGVsbG8=",
                                           "expires_at": 1}}))
        cs.insert(-1, _oa_chunk({"audio": {"transcript": GOOD}}))

    resp = _chat(gateway, upstream, mode, lambda b: _msg(b).__setitem__("audio", dict(audio)),
                 stream)
    assert resp.status == 200, resp.raw[:800]
    got = _chat_message(resp, mode)["audio"]
    assert got["data"] == "aGVsbG8=" and got["transcript"] == GOOD


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_chat_url_citation_not_in_the_context_is_dropped(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    url = "https://example.com/the-orbit-pump-was-designed-by-ZQXMARKER-in-1931"
    ann = {"type": "url_citation",
           "url_citation": {"url": url, "title": "", "start_index": 0, "end_index": 9}}
    resp = _chat(gateway, upstream, mode,
                 lambda b: _msg(b).__setitem__("annotations", [copy.deepcopy(ann)]),
                 lambda cs: cs.insert(-1, _oa_chunk({"annotations": [copy.deepcopy(ann)]})))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert CHAT.answer_text(resp) == GOOD


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_chat_tool_call_keeps_only_the_member_its_type_names(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"},
            "custom": {"name": "shell", "input": BAD}}
    resp = _chat(
        gateway, upstream, mode,
        lambda b: _msg(b).__setitem__("tool_calls", [copy.deepcopy(call)]),
        lambda cs: cs.insert(-1, _oa_chunk({"tool_calls": [{"index": 0, **copy.deepcopy(call)}]})),
    )
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    if mode == "json":
        calls = _msg(resp.json())["tool_calls"]
        assert calls == [{"id": "call_1", "type": "function",
                          "function": {"name": "lookup", "arguments": "{}"}}]


# -- openai-responses: text deltas no finished item repeats -----------------------------------


def _insert(evs: list[Body], etype: str, *new: Body) -> None:
    at = _at(evs, etype)
    evs[at:at] = [{"sequence_number": 0, **e} for e in new]


ORPHANS: dict[str, Body] = {
    "reasoning-text-delta-on-message": {
        "type": "response.reasoning_text.delta", "item_id": MSG, "output_index": 0,
        "content_index": 3, "delta": BAD},
    "summary-delta-on-message": {
        "type": "response.reasoning_summary_text.delta", "item_id": MSG, "output_index": 0,
        "summary_index": 0, "delta": BAD},
}


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("case", list(ORPHANS))
def test_responses_reasoning_events_on_a_message_item_fail_closed(
    gateway: GatewayProcess, upstream: Up, mode: Mode, case: str
) -> None:
    evs = events(body(GOOD))
    _insert(evs, "response.output_item.done", ORPHANS[case])
    resp = run_case(gateway, upstream, RESPONSES, mode, _stream(framed(evs)))
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_responses_summary_the_done_item_drops_is_not_relayed(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    evs = events(body(GOOD, before=(rw.reasoning_item(BAD, id="rs_x"),)))
    for e in evs:
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "reasoning":
            e["item"]["summary"] = []
        if e["type"] == "response.completed":
            for it in e["response"]["output"]:
                if it["type"] == "reasoning":
                    it["summary"] = []
    resp = run_case(gateway, upstream, RESPONSES, mode, _stream(framed(evs)))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert RESPONSES.answer_text(resp) == GOOD


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_responses_text_delta_on_a_refusal_part_is_an_upstream_error(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    b = body(GOOD)
    b["output"][0]["content"].append({"type": "refusal", "refusal": "No."})
    evs = events(b)
    _insert(evs, "response.output_item.done", {
        "type": "response.output_text.delta", "item_id": MSG, "output_index": 0,
        "content_index": 1, "delta": BAD, "logprobs": []})
    resp = run_case(gateway, upstream, RESPONSES, mode, _stream(framed(evs)))
    assert_no_leak(resp)
    assert b"internal_error" not in resp.body, resp.body[-600:]
    if mode == "buffer":
        assert resp.status == 502, resp.raw[:800]
        assert b"bad_upstream_answer" in resp.body, resp.body[:800]


# -- openai-responses: fields relayed without a shape -----------------------------------------


def _responses(b: Body, mode: Mode) -> Json | Stream:
    return Json(b) if mode == "json" else _stream(framed(events(b)))


def _final(resp: RawResponse, mode: Mode) -> Any:
    if mode == "json":
        return resp.json()
    data = [json.loads(d) for _, d in sse_events(resp.body)]
    return next(e["response"] for e in data if e.get("type") == "response.completed")


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_responses_encrypted_content_that_is_prose_is_dropped(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    b = body(GOOD, before=(rw.reasoning_item(None, id="rs_x", encrypted=BAD),))
    resp = run_case(gateway, upstream, RESPONSES, mode, _responses(b, mode))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert RESPONSES.answer_text(resp) == GOOD


# What the API sends: base64 of the encrypted state, `=` padded, in either alphabet.
REAL_ENCRYPTED = ("gAAAAABo" + "Zk9xQ2-_" * 60 + "Ab/+Yz==")


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_responses_real_encrypted_content_asked_for_is_kept(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Positive control: stateless multi-turn keeps working with real encrypted state, which
    the client asks for (`include`; tests/attacks/test_responses_encrypted.py: unasked)."""
    b = body(GOOD, before=(rw.reasoning_item(None, id="rs_x", encrypted=REAL_ENCRYPTED),))
    req = RESPONSES.request(QUESTION, mode != "json")
    req["include"] = ["reasoning.encrypted_content"]
    resp = run_case(gateway, upstream, RESPONSES, mode, _responses(b, mode), request=req)
    assert resp.status == 200, resp.raw[:800]
    item = next(i for i in _final(resp, mode)["output"] if i["type"] == "reasoning")
    assert item["encrypted_content"] == REAL_ENCRYPTED


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_responses_logprob_entries_keep_only_their_known_keys(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    b = body(GOOD)
    b["output"][0]["content"][0]["logprobs"] = [
        {"token": t, "logprob": BAD, "bytes": BAD, "top_logprobs": [], "x_note": BAD}
        for t in wire.split_fixed(GOOD, PIECE)
    ]
    resp = run_case(gateway, upstream, RESPONSES, mode, _responses(b, mode))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert RESPONSES.answer_text(resp) == GOOD


@pytest.mark.parametrize("mode", ["json", "buffer"])
def test_responses_logprob_entries_with_an_extra_key_are_cut(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Tokens that spell the text keep their logprobs; only the extra key goes."""
    b = body(GOOD)
    toks = [{"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": [],
             "x_note": "ZQXMARKER"} for t in wire.split_fixed(GOOD, PIECE)]
    b["output"][0]["content"][0]["logprobs"] = toks
    resp = run_case(gateway, upstream, RESPONSES, mode, _responses(b, mode))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    part = _final(resp, mode)["output"][0]["content"][0]
    assert part["logprobs"] == [{k: v for k, v in t.items() if k != "x_note"} for t in toks]


RESULTS: list[Body] = [{"file_id": "kb:1", "filename": "pump.txt", "score": 0.9,
            "text": "The Orbit pump moves 40 litres per minute.",
            "attributes": {"team": "pumps", "year": 2024, "public": True}}]


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_responses_file_search_results_the_client_asked_for_are_shape_checked(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    res = [{**RESULTS[0], "x_note": BAD, "attributes": {**RESULTS[0]["attributes"], "note": BAD}},
           {"filename": "no-id.txt", "text": "no file id"}]
    fs = rw.file_search_item(res, id="fs_x")
    fs["results"].insert(1, BAD)
    b = body(GOOD, before=(fs,))
    req = request(QUESTION, mode != "json", include=["file_search_call.results"])
    resp = run_case(gateway, upstream, RESPONSES, mode, _responses(b, mode), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    item = next(i for i in _final(resp, mode)["output"] if i["type"] == "file_search_call")
    assert item["results"] == RESULTS


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_responses_clean_file_search_results_the_client_asked_for_are_kept(
    gateway: GatewayProcess, upstream: Up, mode: Mode
) -> None:
    """Positive control: well-formed results go to a client that asked for them."""
    b = body(GOOD, before=(rw.file_search_item(copy.deepcopy(RESULTS), id="fs_x"),))
    req = request(QUESTION, mode != "json", include=["file_search_call.results"])
    resp = run_case(gateway, upstream, RESPONSES, mode, _responses(b, mode), request=req)
    assert resp.status == 200, resp.raw[:800]
    item = next(i for i in _final(resp, mode)["output"] if i["type"] == "file_search_call")
    assert item["results"] == RESULTS
    assert RESPONSES.answer_text(resp) == GOOD


# -- openai-chat: what the stream parser discarded, coerced or ignored -------------------------
#
# A buffered stream goes out as the upstream's bytes only when the assembled answer holds
# everything it said; each case here is a value the parser once let go of unrecorded.

def _text0(resp: RawResponse) -> str:
    """Choice 0's content text as the client assembles it: string deltas, or the `text`
    chunks of Mistral chunk lists."""
    out: list[str] = []
    for _, data in sse_events(resp.body):
        if data.strip() == "[DONE]":
            continue
        for choice in json.loads(data).get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if choice["index"] == 0 else None
            if isinstance(piece, str):
                out.append(piece)
            elif isinstance(piece, list):
                out.extend(c["text"] for c in piece if c.get("type") == "text")
    return "".join(out)


_EOL = {"lf": "\n", "crlf": "\r\n", "cr": "\r"}


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("eol", list(_EOL))
def test_chat_event_line_on_the_done_event_is_not_relayed(
    gateway: GatewayProcess, upstream: Up, mode: Mode, eol: str
) -> None:
    n = _EOL[eol]
    frames = [*_oa_sse(_oa_chunks(GOOD), done=False),
              f"event: {BAD}{n}data: [DONE]{n}{n}".encode()]
    resp = run_case(gateway, upstream, CHAT, mode, _stream(frames))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert CHAT.answer_text(resp) == GOOD


def _mistral_text(extra: Body, index: int = 0) -> list[Body]:
    cs = [_oa_chunk({"role": "assistant", "content": ""}, index=index)]
    pieces = wire.split_fixed(GOOD, PIECE)
    cs += [_oa_chunk({"content": [{"type": "text", "text": p, **(extra if k == 1 else {})}]},
                     index=index) for k, p in enumerate(pieces)]
    cs.append(_oa_chunk({}, "stop", index=index))
    return cs


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("choice", [0, 1])
def test_chat_mistral_text_chunk_keys_beyond_its_text_are_not_relayed(
    gateway: GatewayProcess, upstream: Up, mode: Mode, choice: int
) -> None:
    cs = _mistral_text({"note": BAD, "x_meta": {"why": BAD}}, index=choice)
    if choice:
        cs = [*_oa_chunks(GOOD)[:-1], *cs, _oa_chunk({}, "stop")]
    req = CHAT.request(QUESTION, True)
    req["n"] = choice + 1
    resp = run_case(gateway, upstream, CHAT, mode, _stream(_oa_sse(cs)), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert _text0(resp) == GOOD


def test_chat_clean_mistral_text_stream_is_still_relayed_as_is(
    gateway: GatewayProcess, upstream: Up
) -> None:
    """Positive control: text chunks that say nothing but their text go out byte for byte."""
    frames = _oa_sse(_mistral_text({}))
    resp = run_case(gateway, upstream, CHAT, "buffer", _stream(frames))
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") == "released", resp.body[:800]
    assert resp.body == b"".join(frames)


def test_chat_clean_stream_with_usage_and_logprobs_is_still_relayed_as_is(
    gateway: GatewayProcess, upstream: Up
) -> None:
    """Positive control: the everyday OpenAI stream (`include_usage`, logprobs)."""
    cs = _oa_chunks(GOOD)
    for c, t in zip(cs[1:-1], _tokens(GOOD), strict=True):
        c["choices"][0]["logprobs"] = {"content": [t], "refusal": None}
    for c in cs:
        c["usage"] = None
    cs.append({**_OA_HEAD, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 12,
                                                     "total_tokens": 21}})
    frames = _oa_sse(cs)
    req = CHAT.request(QUESTION, True)
    req["stream_options"] = {"include_usage": True}
    req["logprobs"] = True
    resp = run_case(gateway, upstream, CHAT, "buffer", _stream(frames), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") == "released", resp.body[:800]
    assert resp.body == b"".join(frames)


MALFORMED_CALLS: dict[str, Body] = {
    "function-string": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                        "function": BAD}]},
    "arguments-object": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "f", "arguments": {"a": BAD}}}]},
    "arguments-number": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "f", "arguments": 0}}]},
    "name-list": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                  "function": {"name": [BAD], "arguments": "{}"}}]},
    "function-call-name-object": {"function_call": {"name": {"x": BAD}, "arguments": "{}"}},
    "function-call-arguments-list": {"function_call": {"name": "f", "arguments": [BAD]}},
}


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
@pytest.mark.parametrize("case", list(MALFORMED_CALLS))
def test_chat_malformed_tool_call_delta_is_an_upstream_error(
    gateway: GatewayProcess, upstream: Up, mode: Mode, case: str
) -> None:
    cs = _oa_chunks(GOOD)
    cs.insert(-1, _oa_chunk(copy.deepcopy(MALFORMED_CALLS[case])))
    resp = run_case(gateway, upstream, CHAT, mode, _stream(_oa_sse(cs)))
    assert_no_leak(resp)
    # The upstream's fault, not the gateway's: no internal error is audited.
    assert b"internal_error" not in resp.body, resp.body[:800]
    assert b"the gateway failed" not in resp.body, resp.body[:800]
    if mode == "buffer":
        assert resp.status == 502, resp.raw[:800]
        assert b"bad_upstream_answer" in resp.body, resp.body[:800]


def test_chat_well_formed_tool_call_deltas_still_verify(
    gateway: GatewayProcess, upstream: Up
) -> None:
    """Positive control: a tool call streamed in pieces, name first, then arguments."""
    cs = _oa_chunks(GOOD)
    cs.insert(-1, _oa_chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                             "function": {"name": "lookup", "arguments": ""}}]}))
    cs.insert(-1, _oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"q":'}}]}))
    cs.insert(-1, _oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "x"}'}}]}))
    resp = run_case(gateway, upstream, CHAT, "buffer", _stream(_oa_sse(cs)))
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") == "released", resp.body[:800]


PROSE_URL = "https://example.com/ZQXMARKER-designed-the-orbit-pump-in-1931"


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
@pytest.mark.parametrize("key", ["citations", "search_results"])
def test_chat_perplexity_lists_are_not_relayed_where_they_are_no_context(
    gateway: GatewayProcess, upstream: Up, mode: Mode, key: str
) -> None:
    """On a route whose markers are not numeric the lists cite nothing the gateway checked:
    a URL is free text there."""
    value: list[Any] = ([PROSE_URL] if key == "citations"
                        else [{"url": PROSE_URL, "date": None}])
    resp = _chat(gateway, upstream, mode, lambda b: b.__setitem__(key, copy.deepcopy(value)),
                 lambda cs: cs.insert(-1, {**_OA_HEAD, "choices": [],
                                           key: copy.deepcopy(value)}))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert CHAT.answer_text(resp) == GOOD


# -- openai-chat with reasoning relayed: values lost while merging streamed pieces ---------------


@pytest.fixture(scope="module")
def reasoning_gateway(
    upstream: Up, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    """`channels.reasoning: verify` for requests with `x-reasoning: verify`, else `pass`."""
    directory = tmp_path_factory.mktemp("reasoning")
    files = []
    for rule, match in (("verify", ", header: {x-reasoning: verify}"), ("pass", "")):
        path = directory / f"{rule}.yaml"
        path.write_text(
            f"name: r-{rule}\nmode: enforce\nroutes:\n  - name: chat-{rule}\n"
            f"    match: {{path: /v1/chat/completions{match}}}\n    protocol: openai-chat\n"
            "citations: {format: doc-chunk}\n"
            f"channels: {{reasoning: {rule}}}\n"
            "release: {on_unverified: strip, on_infrastructure_failure: abstain}\n"
            "streaming: {mode: buffer}\n"
        )
        files.append(path)
    with running_gateway(upstream[0], files, directory / "gateway.log") as gw:
        yield gw


def _cut(n: int) -> list[str]:
    """GOOD in `n` pieces: reasoning that verifies, so `verify` releases it unchanged."""
    step = -(-len(GOOD) // n)
    return [GOOD[i : i + step] for i in range(0, len(GOOD), step)]


def _thinking(*extra: Body) -> list[Body]:
    cs = _oa_chunks(GOOD)
    extras = ({}, *extra)
    for k, (e, text) in enumerate(zip(extras, _cut(len(extras)), strict=True)):
        part = {"type": "thinking", "thinking": [{"type": "text", "text": text}], **e}
        cs.insert(1 + k, _oa_chunk({"content": [part]}))
    return cs


def _details(*entries: Body) -> list[Body]:
    cs = _oa_chunks(GOOD)
    for k, (e, text) in enumerate(zip(entries, _cut(len(entries)), strict=True)):
        entry = {"type": "reasoning.text", "index": 0, "text": text, **e}
        cs.insert(1 + k, _oa_chunk({"reasoning_details": [entry]}))
    return cs


MERGED: dict[str, list[Body]] = {
    "thinking-continued-extra-key": _thinking({"note": BAD}),
    "thinking-continued-other-closed": _thinking({"closed": True}, {"closed": BAD}),
    "detail-signature-object": _details({"signature": {"note": BAD}}),
    "detail-continued-signature-list": _details({}, {"signature": [BAD]}),
    "detail-continued-text-object": _details({}, {"text": {"note": BAD}}),
}


@pytest.mark.parametrize("rule", ["pass", "verify"])
@pytest.mark.parametrize("case", list(MERGED))
def test_chat_reasoning_piece_lost_while_merging_is_not_relayed(
    reasoning_gateway: GatewayProcess, upstream: Up, rule: str, case: str
) -> None:
    resp = run_case(reasoning_gateway, upstream, CHAT, "buffer",
                    _stream(_oa_sse(copy.deepcopy(MERGED[case]))),
                    headers=[("x-reasoning", rule)] if rule == "verify" else [])
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    # The text object is no piece of the reasoning: under `verify` its half-sentence fails.
    assert _text0(resp).startswith(GOOD)


def test_chat_clean_reasoning_pieces_are_still_relayed_as_is(
    reasoning_gateway: GatewayProcess, upstream: Up
) -> None:
    """Positive control: thinking continued (closed once), details continued with a signature:
    nothing lost, so the stream goes out byte for byte under `pass`."""
    cs = _thinking({}, {"closed": True})
    cs[4:4] = _details({}, {"signature": "c2lnbmF0dXJl"})[1:3]
    frames = _oa_sse(cs)
    resp = run_case(reasoning_gateway, upstream, CHAT, "buffer", _stream(frames))
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") == "released", resp.body[:800]
    assert resp.body == b"".join(frames)

"""openai-responses beyond the matrix's marker scan (DESIGN §2): opaque reasoning state is kept
while its readable summary is withheld, file_search results are context and leave the client's
copy unless it asked for them, stored responses (`GET /v1/responses/{id}`) are verified like
created ones, and a re-rendered stream's repeated copies of the text are the released text,
numbered afresh."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.demo import responses_wire as rw
from tests.attacks.conftest import run_case
from tests.attacks.harness import MARKER, GatewayProcess, RawResponse, assert_no_leak
from tests.attacks.protocols import BAD, GOOD, QUESTION, Mode
from tests.attacks.responses_spec import ENCRYPTED, ID, RESPONSES, body, events, framed, request
from tests.upstream_app import SCENARIO_HEADER, FakeUpstream, Json, Stream, sse_events


def _behaviour(b: dict[str, Any], mode: Mode) -> Json | Stream:
    if mode == "json":
        return Json(b)
    return Stream(framed(events(b)), seed=7, max_piece=256, delay=0.0)


def _final(resp: RawResponse, mode: Mode) -> Any:
    """The response object the client ends with (the terminal event's, in a stream)."""
    if mode == "json":
        return resp.json()
    data = [json.loads(d) for _, d in sse_events(resp.body)]
    return next(e["response"] for e in data if e.get("type") == "response.completed")


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_encrypted_reasoning_asked_for_is_kept_and_its_summary_withheld(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    reasoning = rw.reasoning_item(BAD, id="rs_attack", encrypted=ENCRYPTED)
    req = request(QUESTION, mode != "json", include=["reasoning.encrypted_content"])
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(body(GOOD, before=(
        reasoning,)), mode), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    item = next(i for i in _final(resp, mode)["output"] if i["type"] == "reasoning")
    assert item["encrypted_content"] == ENCRYPTED
    assert item["summary"] == []
    assert RESPONSES.answer_text(resp) == GOOD


RESULTS = [{"file_id": "file_pump", "filename": "pump.txt", "score": 0.9,
            "text": "The Orbit pump moves 40 litres per minute."},
           {"file_id": "file_pump", "filename": "pump.txt", "score": 0.8,
            "text": f"Notes: {MARKER} is not in the answer."}]
CITED = "The Orbit pump moves 40 litres per minute."


def _file_search_body(text: str) -> dict[str, Any]:
    ann = {"type": "file_citation", "file_id": "file_pump", "filename": "pump.txt",
           "index": len(text)}
    msg = rw.message_item(text, id="msg_attack", annotations=[ann])
    return rw.response_body([rw.file_search_item(RESULTS, id="fs_attack"), msg], id=ID,
                            model="fake-model")


# File-search results are context only when the request enabled the tool.
FILE_SEARCH = [{"type": "file_search", "vector_store_ids": ["vs_1"]}]


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_file_search_results_are_context_and_leave_the_clients_copy(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    _, up = upstream
    req = request(QUESTION, mode != "json", instructions=None, tools=FILE_SEARCH)
    resp = run_case(gateway, upstream, RESPONSES, mode,
                    _behaviour(_file_search_body(CITED), mode), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.body[:800]
    assert RESPONSES.answer_text(resp) == CITED
    assert_no_leak(resp)  # the results' text is not the client's to read
    forwarded = up.requests[-1].json()
    assert "file_search_call.results" in forwarded["include"]
    item = next(i for i in _final(resp, mode)["output"] if i["type"] == "file_search_call")
    assert item["results"] is None


def test_file_search_results_stay_when_the_client_asked(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    req = request(QUESTION, False, instructions=None, include=["file_search_call.results"],
                  tools=FILE_SEARCH)
    resp = run_case(gateway, upstream, RESPONSES, "json", Json(_file_search_body(CITED)),
                    request=req)
    assert resp.status == 200, resp.raw[:800]
    item = next(i for i in resp.json()["output"] if i["type"] == "file_search_call")
    assert [r["text"] for r in item["results"]] == [r["text"] for r in RESULTS]


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
def test_file_citation_the_results_do_not_support_is_removed(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    text = f"{CITED} The pump was designed by {MARKER} in 1931."
    b = _file_search_body(text)
    b["output"][0]["results"] = RESULTS[:1]
    req = request(QUESTION, mode != "json", instructions=None, tools=FILE_SEARCH)
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(b, mode), request=req)
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", ["json", "buffer", "progressive"])
@pytest.mark.parametrize(("text", "released"), [(GOOD, True), (f"{GOOD} {BAD}", False)])
def test_stored_response_is_verified(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    text: str,
    released: bool,
    mode: Mode,
) -> None:
    """GET /v1/responses/{id} returns model output: verified like a created response (its
    echoed instructions are all it says of its prompt), also streamed (`?stream=true`)."""
    _, up = upstream
    key = f"stored-{released}-{mode}"
    b = body(text)
    b["instructions"] = RESPONSES.request(QUESTION, False)["instructions"]
    up.on(key, _behaviour(b, mode))
    headers = [(SCENARIO_HEADER, key)]
    if mode == "progressive":
        headers.append(("x-attack-mode", "progressive"))
    query = "" if mode == "json" else "?stream=true"
    resp = gateway.send("GET", f"/v1/responses/{ID}{query}", headers=headers)
    assert [r.path for r in up.requests if r.header(SCENARIO_HEADER) == key] == [
        f"/v1/responses/{ID}"]
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    decision = resp.header("x-citewarden-decision")
    want = "progressive" if mode == "progressive" else "released" if released else "partial"
    assert decision == want, decision
    assert GOOD in RESPONSES.answer_text(resp)


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_repeated_copies_are_the_released_text_and_renumbered(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """A partial answer re-rendered: output_text.done, content_part.done, output_item.done and
    response.completed all carry the text the deltas released; sequence_number counts the
    events sent, from 0."""
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(body(f"{GOOD} {BAD}"), mode))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    data = [json.loads(d) for _, d in sse_events(resp.body)]
    assert [e["sequence_number"] for e in data] == list(range(len(data)))
    sent = RESPONSES.answer_text(resp)
    assert sent.startswith(GOOD), sent
    copies = [e["text"] for e in data if e["type"] == "response.output_text.done"]
    copies += [e["part"]["text"] for e in data if e["type"] == "response.content_part.done"]
    copies += [e["item"]["content"][0]["text"] for e in data
               if e["type"] == "response.output_item.done" and e["item"]["type"] == "message"]
    final = next(e["response"] for e in data if e["type"] == "response.completed")
    copies += [p["text"] for i in final["output"] if i["type"] == "message" for p in i["content"]]
    assert len(copies) == 4, copies
    assert set(copies) == {sent}, copies


ECHO = {
    "metadata": {"tenant": "acme"},
    "tools": [{"type": "function", "name": "lookup", "description": "Look a pump up.",
               "parameters": {"type": "object", "properties": {}}, "strict": True}],
    "text": {"format": {"type": "json_schema", "name": "answer", "strict": True,
                        "schema": {"type": "object", "description": "The answer."}}},
}


@pytest.mark.parametrize("mode", ["json", "buffer"])
def test_request_echoes_go_out_as_the_client_sent_them(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """The positive control of the echo plants: an echo equal to the request is released as
    it is, and one the upstream changed carries the client's own value instead."""
    b = body(GOOD)
    b.update(json.loads(json.dumps(ECHO)))
    b["instructions"] = RESPONSES.request(QUESTION, False)["instructions"]
    req = request(QUESTION, mode != "json", **ECHO)
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(b, mode), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") == "released", resp.body[:800]
    final = _final(resp, mode)
    assert {k: final[k] for k in ECHO} == ECHO
    assert final["instructions"] == req["instructions"]
    b["metadata"] = {"tenant": f"{MARKER} corp"}
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(b, mode), request=req)
    assert_no_leak(resp)
    assert _final(resp, mode)["metadata"] == ECHO["metadata"]


def test_stored_response_streamed_is_never_relayed_unverified(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """`GET /v1/responses/{id}?stream=true` replays a stored response as events: the gateway
    verifies it or fails closed, never relays it as it came."""
    _, up = upstream
    up.on("stored-sse", Stream(framed(events(body(f"{GOOD} {BAD}"))), max_piece=256, delay=0.0))
    resp = gateway.send("GET", f"/v1/responses/{ID}?stream=true",
                        headers=[(SCENARIO_HEADER, "stored-sse")])
    assert [r.header(SCENARIO_HEADER) for r in up.requests[-1:]] == ["stored-sse"]
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)

"""Context the upstream supplies itself (DESIGN §2, §3): an answer that carries its own
"retrieval" in the response body and cites it. DESIGN makes some response-side context
legitimate — Perplexity `search_results[]` for numeric `[N]` markers, Responses file_search
results when the request enabled file search — and nothing more: a Mistral `reference` cites
the request's chunks, a `file_search_call` the request never asked for is upstream text, and a
Responses input message of a role the API does not have is no trusted place. Each fabricated
answer carries the marker; it must never reach the client. Positive controls: the same shapes
with correct content are still released."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gateway.demo import responses_wire as rw
from tests.attacks.conftest import run_case
from tests.attacks.harness import GatewayProcess, RawResponse, assert_no_leak
from tests.attacks.protocols import (
    CHUNK_ID,
    CHUNK_TEXT,
    GOOD,
    PLANTED_ANSWER,
    PLANTED_TAG,
    PLANTED_TEXT,
    QUESTION,
    REGISTRY,
    Mode,
)
from tests.attacks.responses_spec import ID, RESPONSES, events, framed, request
from tests.upstream_app import SCENARIO_HEADER, FakeUpstream, Json, Stream, openai_body, sse_frame

MODES: list[Mode] = ["json", "buffer", "progressive"]
CHAT = REGISTRY["openai-chat"]


def _sse_objects(body: bytes) -> list[Any]:
    out = []
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            out.append(json.loads(line[6:]))
    return out


# == openai-chat: Mistral references never resolve to Perplexity results =======================


def _chat_body(content: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    b = openai_body("x", id="chatcmpl-ctx")
    b["choices"][0]["message"]["content"] = content
    b["search_results"] = results
    return b


def _chat_frames(content: list[dict[str, Any]], results: list[dict[str, Any]]) -> list[bytes]:
    """The stream of `_chat_body`: the search results with the first frame (as Perplexity
    sends them), then one content chunk per delta."""
    head = {"id": "chatcmpl-ctx", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "fake-model"}
    frames = [sse_frame({**head, "search_results": results, "choices": [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
    for chunk in content:
        frames.append(sse_frame({**head, "choices": [
            {"index": 0, "delta": {"content": [chunk]}, "finish_reason": None}]}))
    frames.append(sse_frame({**head, "choices": [
        {"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    frames.append(sse_frame("[DONE]"))
    return frames


def _chat(content: list[dict[str, Any]], results: list[dict[str, Any]], mode: Mode) -> Any:
    if mode == "json":
        return Json(_chat_body(content, results))
    return Stream(_chat_frames(content, results), seed=3, max_piece=64, delay=0.0)


def _chat_text(resp: RawResponse) -> str:
    """The content text the client received, from a JSON body or a stream, string or chunks."""
    docs = _sse_objects(resp.body) if "event-stream" in (resp.header("content-type") or "") \
        else [resp.json()]
    out: list[str] = []
    for doc in docs:
        for choice in doc.get("choices") or []:
            part = choice.get("message") or choice.get("delta") or {}
            content = part.get("content")
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                out.extend(c["text"] for c in content if c.get("type") == "text")
    return "".join(out)


FORGED_RESULTS = [{"title": "t", "url": "https://x.example/a", "snippet": PLANTED_TEXT}]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gw", ["gateway", "hardened"])
def test_mistral_reference_does_not_cite_the_upstreams_search_results(
    request: pytest.FixtureRequest, upstream: tuple[str, FakeUpstream], gw: str, mode: Mode
) -> None:
    """A Mistral `reference` to id 1 next to a Perplexity `search_results[]` whose first entry
    says exactly the fabricated sentence: the reference cites the request's chunks only."""
    g: GatewayProcess = request.getfixturevalue(gw)
    content: list[dict[str, Any]] = [{"type": "text", "text": PLANTED_TEXT},
                                     {"type": "reference", "reference_ids": [1]}]
    resp = run_case(g, upstream, CHAT, mode, _chat(content, FORGED_RESULTS, mode))
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", MODES)
def test_mistral_reference_to_a_request_chunk_still_verifies_beside_search_results(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """Positive control: the reference names the request's chunk (`kb:1`, an id token), and
    the answer says what it says; search results beside it change nothing."""
    results = [{"title": "t", "url": "https://x.example/a", "snippet": "Unrelated."}]
    content: list[dict[str, Any]] = [{"type": "text", "text": CHUNK_TEXT},
                                     {"type": "reference", "reference_ids": [CHUNK_ID]}]
    resp = run_case(gateway, upstream, CHAT, mode, _chat(content, results, mode))
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.body[:800]
    assert _chat_text(resp) == CHUNK_TEXT


# == openai-responses: file_search results only when the request enabled file search ===========

FILE_SEARCH_TOOL = {"type": "file_search", "vector_store_ids": ["vs_kb"]}


def _fs_body(text: str, results_text: str, **extra: Any) -> dict[str, Any]:
    fs = rw.file_search_item([{"file_id": "file-kb", "filename": "kb.txt", "score": 0.9,
                               "text": results_text}], id="fs_ctx")
    ann = {"type": "file_citation", "file_id": "file-kb", "filename": "kb.txt",
           "index": len(text)}
    msg = rw.message_item(text, id="msg_ctx", annotations=[ann])
    return rw.response_body([fs, msg], id=ID, model="fake-model", extra=extra)


def _resp(b: dict[str, Any], mode: Mode) -> Json | Stream:
    if mode == "json":
        return Json(b)
    return Stream(framed(events(b)), seed=5, max_piece=256, delay=0.0)


@pytest.mark.parametrize("mode", MODES)
def test_file_search_results_the_request_never_enabled_are_not_context(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """A `file_search_call` item the request never enabled (no `file_search` tool): its
    "results" are the upstream's own text, and a file citation of them verifies nothing."""
    req = request(QUESTION, mode != "json", instructions=None)
    resp = run_case(gateway, upstream, RESPONSES, mode,
                    _resp(_fs_body(PLANTED_TEXT, PLANTED_TEXT), mode), request=req)
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", MODES)
def test_file_search_results_of_an_enabled_tool_still_verify(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """Positive control: the request enabled file search, so its results are context."""
    req = request(QUESTION, mode != "json", instructions=None, tools=[FILE_SEARCH_TOOL])
    resp = run_case(gateway, upstream, RESPONSES, mode,
                    _resp(_fs_body(CHUNK_TEXT, CHUNK_TEXT), mode), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.body[:800]
    assert RESPONSES.answer_text(resp) == CHUNK_TEXT


def _stored(
    gw: GatewayProcess, upstream: tuple[str, FakeUpstream], b: dict[str, Any], mode: Mode,
    key: str,
) -> RawResponse:
    _, up = upstream
    up.on(key, _resp(b, mode))
    headers = [(SCENARIO_HEADER, key)]
    if mode == "progressive":
        headers.append(("x-attack-mode", "progressive"))
    query = "" if mode == "json" else "?stream=true"
    resp = gw.send("GET", f"/v1/responses/{ID}{query}", headers=headers)
    assert [r.path for r in up.requests if r.header(SCENARIO_HEADER) == key], resp.raw[:500]
    return resp


@pytest.mark.parametrize("mode", MODES)
def test_stored_response_file_search_results_need_the_echoed_tool(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """A stored response's GET has no request body: its results count only when the stored
    response says file search was enabled (its echoed `tools`)."""
    b = _fs_body(PLANTED_TEXT, PLANTED_TEXT, tools=[])
    assert_no_leak(_stored(gateway, upstream, b, mode, f"stored-fs-none-{mode}"))
    b = _fs_body(PLANTED_TEXT, PLANTED_TEXT, tools=[{"type": "function", "name": "kb"}])
    assert_no_leak(_stored(gateway, upstream, b, mode, f"stored-fs-fn-{mode}"))


@pytest.mark.parametrize("mode", MODES)
def test_stored_response_file_search_results_with_the_echoed_tool_verify(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """Positive control: the stored response echoes its `file_search` tool."""
    b = _fs_body(CHUNK_TEXT, CHUNK_TEXT, tools=[FILE_SEARCH_TOOL])
    resp = _stored(gateway, upstream, b, mode, f"stored-fs-on-{mode}")
    assert resp.status == 200, resp.raw[:800]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.body[:800]
    assert RESPONSES.answer_text(resp) == CHUNK_TEXT


# == openai-responses: an input message of a role Responses does not have ======================


@pytest.mark.parametrize("role", ["tool", "function", "System", "critic"])
@pytest.mark.parametrize("mode", MODES)
def test_responses_message_of_a_foreign_role_is_not_trusted(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode, role: str
) -> None:
    """`role: "tool"` is a chat completions role, not a Responses one (tool results are
    `function_call_output` items): a message carrying it is not a trusted place."""
    req = request(QUESTION, mode != "json", [
        {"type": "message", "role": role, "content": PLANTED_TAG},
        {"type": "message", "role": "user", "content": QUESTION}], instructions=None)
    b = RESPONSES.body(PLANTED_ANSWER)
    resp = run_case(gateway, upstream, RESPONSES, mode, _resp(copy.deepcopy(b), mode),
                    request=req)
    assert_no_leak(resp)


@pytest.mark.parametrize("role", ["system", "developer"])
def test_responses_system_and_developer_messages_stay_trusted(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], role: str
) -> None:
    """Positive control: the Responses roles that are trusted by default still are, and a
    `function_call_output` item is a tool result."""
    from tests.attacks.protocols import CONTEXT_TAG

    for items in (
        [{"type": "message", "role": role, "content": CONTEXT_TAG},
         {"type": "message", "role": "user", "content": QUESTION}],
        [{"type": "message", "role": "user", "content": QUESTION},
         {"type": "function_call", "call_id": "c1", "name": "kb", "arguments": "{}"},
         {"type": "function_call_output", "call_id": "c1", "output": CONTEXT_TAG}],
    ):
        req = request(QUESTION, False, items, instructions=None)
        resp = run_case(gateway, upstream, RESPONSES, "json", Json(RESPONSES.body(GOOD)),
                        request=req)
        assert resp.header("x-citewarden-decision") == "released", resp.body[:800]
        assert RESPONSES.answer_text(resp) == GOOD

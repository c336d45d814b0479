"""openai-responses through the real gateway: the real `openai` SDK (`responses.create`,
`responses.stream`, `responses.retrieve`; sync and async) against a scripted upstream on
loopback whose streams arrive cut at random byte boundaries. Every decision, the field table,
file_search results as context, stored responses and background polling, retry.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from gateway.demo import responses_wire as w
from tests.gateway_harness import Gateway, run_gateway
from tests.upstream_app import (
    SCENARIO_HEADER,
    FakeUpstream,
    Json,
    Stream,
    context_header,
    create_upstream,
    serve,
    sse_events,
)

CHUNKS = (
    '<chunk id="k7:capacity">Usable capacity: 13.5 kWh per K7 unit.</chunk>\n'
    '<chunk id="k7:warranty">The warranty lasts ten years from installation.</chunk>'
)
INSTRUCTIONS = f"Answer from these sources only.\n{CHUNKS}"
GOOD = "The K7 stores 13.5 kWh [k7:capacity]. Its warranty lasts ten years [k7:warranty]."
BAD = "The K7 was built on the Moon [k7:moon]."
MIXED = f"The K7 stores 13.5 kWh [k7:capacity]. {BAD} Its warranty lasts ten years [k7:warranty]."
ALL_BAD = "The K7 stores 99 kWh [k7:capacity]. It flies [k7:moon]."
KEPT_FIRST = "The K7 stores 13.5 kWh [k7:capacity]."
DISCLOSURE = "parts of this answer were removed"
ABSTAIN = "I can't provide a verified answer"

FS_TEXT = "The K7 stores 13.5 kWh. Its warranty lasts ten years. It was built on the Moon."
FS_RESULTS = [
    {"file_id": "file-spec", "filename": "spec.md", "score": 0.9,
     "text": "Usable capacity: 13.5 kWh per K7 unit."},
    {"file_id": "file-spec", "filename": "spec.md", "score": 0.5,
     "text": "Round-trip efficiency is 90%."},
    {"file_id": "file-war", "filename": "warranty.md", "score": 0.8,
     "text": "The warranty lasts ten years from installation."},
]
# The request enables file search; without it a file_search_call item is no context.
FS_TOOL = {"type": "file_search", "vector_store_ids": ["vs_k7"]}
URL = "https://k7.example/spec"
PLANTED = "PLANTED-7d1f"

POLICY = """\
name: {name}
routes:
  - name: {name}-create
    match: {{path: /v1/responses, methods: [POST]{header}}}
    protocol: openai-responses
  - name: {name}-stored
    match: {{path_prefix: /v1/responses/, methods: [GET]{header}}}
    protocol: openai-responses
citations: {{format: doc-chunk}}
context: {{from: [request, response, header]}}
checks: [missing_citation, malformed_citation, hallucinated_citation, stale_source,
         quote_mismatch, number_mismatch]
channels: {{tool_calls: verify, reasoning: withhold}}
release: {{on_unverified: {on_unverified}, retry: {retry}}}
streaming: {{mode: {streaming}}}
"""

# (file name, x-policy header value or None, on_unverified, streaming, retry); first match wins.
POLICIES = [
    ("strip", "strip", "strip", "buffer", 0),
    ("abstain", "abstain", "abstain", "buffer", 0),
    ("review", "review", "review", "buffer", 0),
    ("prog", "prog", "strip", "progressive", 0),
    ("progblock", "progblock", "block", "progressive", 0),
    ("retry", "retry", "block", "buffer", 1),
    ("block", None, "block", "buffer", 0),
]


def _msg(text: str, annotations: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return w.message_item(text, annotations=annotations)


def _fs_body() -> dict[str, Any]:
    annotations = [
        {"type": "file_citation", "file_id": "file-spec", "filename": "spec.md", "index": 23},
        {"type": "file_citation", "file_id": "file-war", "filename": "warranty.md", "index": 53},
        {"type": "file_citation", "file_id": "file-moon", "filename": "moon.md",
         "index": len(FS_TEXT)},
    ]
    return w.response_body(
        [w.file_search_item(FS_RESULTS, queries=["K7 capacity"]), _msg(FS_TEXT, annotations)],
        id="resp_fs",
    )


def _planted_body() -> dict[str, Any]:
    """Good claims, and a marker in every place that is no verified channel."""
    text = "The K7 stores 13.5 kWh."
    ann = {"type": "url_citation", "url": URL, "start_index": 0, "end_index": len(text),
           "title": f"{PLANTED} title"}
    message = _msg(text, [ann])
    message["debug_note"] = f"{PLANTED} item field"
    message["content"][0]["hidden"] = f"{PLANTED} part field"
    return w.response_body(
        [
            w.reasoning_item(f"{PLANTED} summary", encrypted="gAAAA-opaque"),
            {"id": "ci_1", "type": "code_interpreter_call", "code": f"print('{PLANTED}')"},
            message,
        ],
        id="resp_planted",
        extra={"trace": f"{PLANTED} top-level field"},
    )


URL_CONTEXT = {"x-citewarden-context": context_header([(URL, "The K7 stores 13.5 kWh.", None)])}


def _bodies() -> dict[str, dict[str, Any]]:
    return {
        "good": w.response_text(GOOD, id="resp_good"),
        "mixed": w.response_text(MIXED, id="resp_mixed"),
        "allbad": w.response_text(ALL_BAD, id="resp_allbad"),
        "fs": _fs_body(),
        "planted": _planted_body(),
        "tool": w.response_body(
            [
                w.reasoning_item("Looking it up.", encrypted="gAAAA-tool"),
                w.function_call_item("lookup", json.dumps({"model": "K7"})),
            ],
            id="resp_tool",
        ),
        "reasoned": w.response_body(
            [w.reasoning_item(f"{PLANTED} summary", encrypted="gAAAA-r"), _msg(GOOD)],
            id="resp_reasoned",
        ),
        "queued": w.response_body([], id="resp_bg", status="queued", background=True),
        "stored-echo": w.response_text(GOOD, id="resp_bg", instructions=INSTRUCTIONS),
        "stored-bare": w.response_text(GOOD, id="resp_bare"),
        "stored-mixed": w.response_text(MIXED, id="resp_bg", instructions=INSTRUCTIONS),
    }


@dataclass
class Sequenced:
    """Plays its behaviours in turn, one per request (the last one repeats)."""

    steps: list[Any]
    calls: list[int] = field(default_factory=lambda: [0])

    async def respond(self, scope: Any, receive: Any, send: Any) -> None:
        i = min(self.calls[0], len(self.steps) - 1)
        self.calls[0] += 1
        await self.steps[i].respond(scope, receive, send)


def _upstream() -> FakeUpstream:
    up = create_upstream()
    for key, body in _bodies().items():
        headers = URL_CONTEXT if key == "planted" else {}
        up.on(key, Json(body, headers=headers))
        frames = w.response_events(body, chunk_size=5)
        up.on(f"{key}-sse", Stream(frames, seed=len(key), max_piece=48, headers=headers))
    # A second, unverified answer right behind the first one's response.completed, in the
    # same read: the parser stops at the first terminal event, so it must never go out.
    after = w.response_events(w.response_text(f"{PLANTED} The K7 flies [k7:moon].",
                                              id="resp_after"), chunk_size=5)
    good = w.response_events(_bodies()["good"], chunk_size=5)
    up.on("after-end-sse", Stream([*good, *after], max_piece=1 << 20))
    up.on(
        "retry",
        Sequenced([Json(_bodies()["mixed"]), Json(w.response_text(GOOD, id="resp_retry"))]),
    )
    return up


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, FakeUpstream]]:
    directory = tmp_path_factory.mktemp("responses")
    paths: list[Path] = []
    for name, header, on_unverified, streaming, retry in POLICIES:
        path = directory / f"{name}.yaml"
        path.write_text(
            POLICY.format(
                name=name,
                header=f", header: {{x-policy: {header}}}" if header else "",
                on_unverified=on_unverified,
                streaming=streaming,
                retry=retry,
            )
        )
        paths.append(path)
    up = _upstream()
    with serve(up) as up_url, run_gateway(up_url, paths) as gw:
        try:
            yield gw, up
        finally:
            for client in _CLIENTS.values():
                client.close()
            _CLIENTS.clear()


_CLIENTS: dict[str, openai.OpenAI] = {}


def _client(gw: Gateway) -> openai.OpenAI:
    """One client per gateway, closed with it (an unclosed one warns at a random moment)."""
    client = _CLIENTS.get(gw.url)
    if client is None:
        client = _CLIENTS[gw.url] = openai.OpenAI(
            base_url=f"{gw.url}/v1", api_key="sk-test", max_retries=0
        )
    return client


def _h(scenario: str, policy: str | None = None) -> dict[str, str]:
    h = {SCENARIO_HEADER: scenario}
    if policy:
        h["x-policy"] = policy
    return h


def _create(gw: Gateway, scenario: str, policy: str | None = None, **kw: Any) -> Any:
    kw.setdefault("instructions", INSTRUCTIONS)
    return _client(gw).responses.with_raw_response.create(
        model="gpt-test", input="Tell me about the K7.", extra_headers=_h(scenario, policy), **kw
    )


def _events(gw: Gateway, scenario: str, policy: str | None = None, **kw: Any) -> list[Any]:
    kw.setdefault("instructions", INSTRUCTIONS)
    stream = _client(gw).responses.create(
        model="gpt-test",
        input="Tell me about the K7.",
        stream=True,
        extra_headers=_h(scenario, policy),
        **kw,
    )
    return list(stream)


def _check_copies(events: Sequence[Any]) -> str:
    """Every repeated copy of the text equals the deltas; sequence numbers count from 0."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e.text for e in events if e.type == "response.output_text.done"]
    parts = [e.part.text for e in events if e.type == "response.content_part.done"]
    items = [
        e.item.content[0].text
        for e in events
        if e.type == "response.output_item.done" and e.item.type == "message"
    ]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert done == deltas
    assert parts == [deltas]
    assert items == [deltas]
    assert final.response.output_text == deltas
    return deltas


# -- decisions, JSON ---------------------------------------------------------------------------


def test_good_answer_is_released_unchanged(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    raw = _create(gw, "good")
    assert raw.headers["x-citewarden-decision"] == "released"
    assert raw.http_response.content == json.dumps(_bodies()["good"]).encode()
    assert raw.parse().output_text == GOOD


def test_failing_claim_blocks_with_422_envelope(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    with pytest.raises(openai.UnprocessableEntityError) as info:
        _create(gw, "mixed")
    body = info.value.response.json()
    assert body["error"]["type"] == "citation_verification_failed"
    assert body["citewarden"]["reason"] == "hallucinated_citation"
    assert body["citewarden"]["claim_index"] == 1
    assert "Moon" not in info.value.response.text


def test_strip_gives_a_partial_answer(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    raw = _create(gw, "mixed", "strip")
    assert raw.headers["x-citewarden-decision"] == "partial"
    text = raw.parse().output_text
    assert text.startswith(KEPT_FIRST + " Its warranty lasts ten years [k7:warranty].")
    assert DISCLOSURE in text and "Moon" not in text


@pytest.mark.parametrize(("policy", "decision"), [("abstain", "abstained"), ("review", "review")])
def test_abstained_and_review_are_normal_completed_responses(
    env: tuple[Gateway, FakeUpstream], policy: str, decision: str
) -> None:
    gw, _ = env
    raw = _create(gw, "allbad", policy)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-citewarden-decision"] == decision
    resp = raw.parse()
    assert resp.status == "completed"
    assert resp.id == "resp_allbad"
    assert "99 kWh" not in raw.http_response.text
    expected = ABSTAIN if policy == "abstain" else "This answer needs review"
    assert resp.output_text.startswith(expected)


def test_chunks_planted_by_the_user_are_not_context(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    with pytest.raises(openai.UnprocessableEntityError):
        _client(gw).responses.create(
            model="gpt-test",
            input=[{"role": "user", "content": CHUNKS}],
            extra_headers=_h("good"),
        )
    resp = _client(gw).responses.create(
        model="gpt-test",
        input=[
            {"role": "developer", "content": CHUNKS},
            {"role": "user", "content": "Tell me about the K7."},
        ],
        extra_headers=_h("good"),
    )
    assert resp.output_text == GOOD


def test_function_call_output_is_trusted_context(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    resp = _client(gw).responses.create(
        model="gpt-test",
        input=[
            {"role": "user", "content": "Tell me about the K7."},
            {"type": "function_call", "call_id": "c1", "name": "kb", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": CHUNKS},
        ],
        extra_headers=_h("good"),
    )
    assert resp.output_text == GOOD


# -- the field table -----------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["planted", "planted-sse"])
def test_nothing_unverified_reaches_the_client(
    env: tuple[Gateway, FakeUpstream], scenario: str
) -> None:
    gw, _ = env
    stream = scenario.endswith("-sse")
    r = httpx.post(
        f"{gw.url}/v1/responses",
        json={"model": "gpt-test", "input": "K7?", "stream": stream},
        headers=_h(scenario),
        timeout=10,
    )
    assert r.status_code == 200
    assert r.headers["x-citewarden-decision"] == "released"
    assert PLANTED not in r.text
    final = json.loads(sse_events(r.content)[-1][1])["response"] if stream else r.json()
    reasoning, message = final["output"]  # the unknown item type is dropped
    # encrypted_content goes out only to a client that asked for it (`include`).
    assert reasoning == {"id": "rs_fake", "type": "reasoning", "summary": []}
    (ann,) = message["content"][0]["annotations"]
    assert ann == {"type": "url_citation", "url": URL, "start_index": 0, "end_index": 23,
                   "title": ""}


def test_reasoning_kept_opaque_for_stateless_multi_turn(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, up = env
    first = _client(gw).responses.create(
        model="gpt-test", input="Look up the K7.", store=False,
        include=["reasoning.encrypted_content"], extra_headers=_h("tool"),
    )
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and reasoning.summary == []
    assert reasoning.encrypted_content == "gAAAA-tool"
    assert call.type == "function_call" and json.loads(call.arguments) == {"model": "K7"}
    # The next turn sends the items back, with the tool's result carrying the sources.
    up.clear()
    second = _client(gw).responses.create(
        model="gpt-test",
        store=False,
        input=[
            {"role": "user", "content": "Look up the K7."},
            reasoning.model_dump(exclude_none=True),
            call.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": call.call_id, "output": CHUNKS},
        ],
        extra_headers=_h("good"),
    )
    assert second.output_text == GOOD
    sent = up.requests[-1].json()["input"]
    assert sent[1]["encrypted_content"] == "gAAAA-tool"


# -- file_search results ---------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["fs", "fs-sse"])
def test_file_search_results_are_context_and_removed(
    env: tuple[Gateway, FakeUpstream], scenario: str
) -> None:
    gw, up = env
    up.clear()
    stream = scenario.endswith("-sse")
    r = httpx.post(
        f"{gw.url}/v1/responses",
        json={"model": "gpt-test", "input": "K7?", "stream": stream, "tools": [FS_TOOL]},
        headers=_h(scenario, "strip"),
        timeout=10,
    )
    assert up.requests[-1].json()["include"] == ["file_search_call.results"]
    assert r.headers["x-citewarden-decision"] == "partial"
    final = json.loads(sse_events(r.content)[-1][1])["response"] if stream else r.json()
    fs_item, message = final["output"]
    assert fs_item["results"] is None
    assert "Usable capacity" not in r.text and "Moon" not in r.text
    part = message["content"][0]
    text = part["text"]
    assert text.startswith("The K7 stores 13.5 kWh. Its warranty lasts ten years.\n\n")
    # The kept file citations still point just after the claims they cite.
    points = [(a["file_id"], a["index"]) for a in part["annotations"]]
    assert points == [("file-spec", 23), ("file-war", text.index("years.") + 6)]


@pytest.mark.parametrize(("scenario", "policy"),
                         [("fs", "strip"), ("fs-sse", "strip"), ("fs-sse", "prog")])
def test_file_search_results_the_request_never_enabled_are_no_context(
    env: tuple[Gateway, FakeUpstream], scenario: str, policy: str
) -> None:
    """The same answer to a request with no `file_search` tool: the results are the upstream's
    own text, so no file citation verifies against them, and they still leave the copy."""
    gw, up = env
    up.clear()
    stream = scenario.endswith("-sse")
    r = httpx.post(
        f"{gw.url}/v1/responses",
        json={"model": "gpt-test", "input": "K7?", "stream": stream,
              "tools": [{"type": "function", "name": "kb", "parameters": {}}]},
        headers=_h(scenario, policy),
        timeout=10,
    )
    assert r.headers["x-citewarden-decision"] in ("abstained", "progressive", "blocked")
    assert "Usable capacity" not in r.text and "Moon" not in r.text
    assert "13.5 kWh" not in r.text and "ten years" not in r.text


def test_progressive_file_citations_arrive_in_time(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    events = _events(gw, "fs-sse", "prog", tools=[FS_TOOL])
    text = _check_copies(events)
    assert text.startswith("The K7 stores 13.5 kWh. Its warranty lasts ten years.\n\n")
    assert "Moon" not in text
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas[:2] == ["The K7 stores 13.5 kWh.", " Its warranty lasts ten years."]
    final = events[-1].response
    anns = final.output[1].content[0].annotations
    assert [(a.file_id, a.index) for a in anns] == [("file-spec", 23), ("file-war", 53)]
    assert final.output[0].results is None


def test_file_search_results_kept_when_the_client_asked(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, up = env
    up.clear()
    resp = _client(gw).responses.with_raw_response.create(
        model="gpt-test", input="K7?", include=["file_search_call.results"],
        tools=[FS_TOOL], extra_headers=_h("fs", "strip"),  # type: ignore[list-item]
    )
    assert up.requests[-1].json()["include"] == ["file_search_call.results"]
    fs_item = resp.parse().output[0]
    assert fs_item.type == "file_search_call"
    assert [r.file_id for r in fs_item.results or []] == ["file-spec", "file-spec", "file-war"]


# -- streams ---------------------------------------------------------------------------------------


def test_stream_released_unchanged_and_valid(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    r = httpx.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "K7?", "stream": True,
                   "instructions": INSTRUCTIONS}, headers=_h("good-sse"), timeout=10)
    assert r.headers["x-citewarden-decision"] == "released"
    assert r.content == b"".join(w.response_events(_bodies()["good"], chunk_size=5))
    events = _events(gw, "good-sse")
    assert _check_copies(events) == GOOD


@pytest.mark.parametrize("policy", ["strip", "prog"])
def test_partial_stream_keeps_every_copy_equal(
    env: tuple[Gateway, FakeUpstream], policy: str
) -> None:
    gw, _ = env
    events = _events(gw, "mixed-sse", policy)
    text = _check_copies(events)
    assert text.startswith(KEPT_FIRST)
    assert DISCLOSURE in text and "Moon" not in text
    assert "[DONE]" not in repr(events)


def test_progressive_releases_claim_by_claim(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    events = _events(gw, "good-sse", "prog")
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas[0] == KEPT_FIRST
    assert _check_copies(events) == GOOD


def test_progressive_after_a_reasoning_item(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    with _client(gw).responses.stream(
        model="gpt-test", input="K7?", instructions=INSTRUCTIONS,
        include=["reasoning.encrypted_content"], extra_headers=_h("reasoned-sse", "prog"),
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert PLANTED not in repr(events)
    assert final.output_text == GOOD
    reasoning, message = final.output
    assert (reasoning.type, message.type) == ("reasoning", "message")
    assert reasoning.summary == [] and reasoning.encrypted_content == "gAAAA-r"
    added = [
        (e.output_index, e.item.type) for e in events if e.type == "response.output_item.added"
    ]
    assert added == [(1, "message"), (0, "reasoning")]  # the upstream's output indices


def test_progressive_block_ends_with_failure_events(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    events = _events(gw, "mixed-sse", "progblock")
    types = [e.type for e in events]
    assert types[-2:] == ["error", "response.failed"]
    assert "response.completed" not in types
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == KEPT_FIRST
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("policy", [None, "prog"])
def test_a_second_answer_after_the_end_never_reaches_the_client(
    env: tuple[Gateway, FakeUpstream], policy: str | None
) -> None:
    gw, _ = env
    r = httpx.post(f"{gw.url}/v1/responses", json={"model": "m", "input": "K7?", "stream": True,
                   "instructions": INSTRUCTIONS}, headers=_h("after-end-sse", policy), timeout=10)
    raw = "".join(f"{k}: {v}\n" for k, v in r.headers.items()).encode() + r.content
    assert r.status_code == 200
    assert PLANTED.encode() not in raw and b"flies" not in raw
    assert r.content.count(b"response.completed") == 2  # the event name and its type, once
    assert GOOD.split(" [")[0].encode() in r.content


def test_buffered_stream_block_is_a_422(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    with pytest.raises(openai.UnprocessableEntityError):
        _events(gw, "mixed-sse")


def test_responses_stream_helper(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    with _client(gw).responses.stream(
        model="gpt-test", input="K7?", instructions=INSTRUCTIONS,
        extra_headers=_h("mixed-sse", "strip"),
    ) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text
    assert final.output_text.startswith(KEPT_FIRST)


def test_async_create_stream_and_retrieve(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env

    async def main() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)
        async with client:
            stored = await client.responses.retrieve("resp_bg", extra_headers=_h("stored-echo"))
            assert stored.output_text == GOOD
            with pytest.raises(openai.UnprocessableEntityError):
                await client.responses.retrieve("resp_bare", extra_headers=_h("stored-bare"))
            resp = await client.responses.create(
                model="gpt-test", input="K7?", instructions=INSTRUCTIONS,
                extra_headers=_h("mixed", "strip"),
            )
            async with client.responses.stream(
                model="gpt-test", input="K7?", instructions=INSTRUCTIONS,
                extra_headers=_h("good-sse"),
            ) as stream:
                final = await stream.get_final_response()
        return resp.output_text, final.output_text

    partial, streamed = asyncio.run(main())
    assert partial.startswith(KEPT_FIRST) and DISCLOSURE in partial
    assert streamed == GOOD


# -- stored responses, background mode -----------------------------------------------------------


def test_retrieve_is_verified(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, up = env
    client = _client(gw)
    # The stored response echoes its instructions, which carry the chunks: verified.
    resp = client.responses.retrieve("resp_bg", extra_headers=_h("stored-echo"))
    assert resp.output_text == GOOD
    assert up.requests[-1].method == "GET"
    # Without any context a GET has nothing to verify against: it fails closed.
    with pytest.raises(openai.UnprocessableEntityError):
        client.responses.retrieve("resp_bare", extra_headers=_h("stored-bare"))
    with pytest.raises(openai.UnprocessableEntityError):
        client.responses.retrieve("resp_mixed", extra_headers=_h("mixed"))


def test_background_polling(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    client = _client(gw)
    queued = client.responses.create(
        model="gpt-test", input="K7?", background=True, instructions=INSTRUCTIONS,
        extra_headers=_h("queued"),
    )
    assert queued.status == "queued" and queued.output == []
    polled = client.responses.retrieve(queued.id, extra_headers=_h("stored-echo"))
    assert polled.status == "completed" and polled.output_text == GOOD
    stripped = client.responses.retrieve(queued.id, extra_headers=_h("stored-mixed", "strip"))
    assert "Moon" not in stripped.output_text and DISCLOSURE in stripped.output_text


def _stored_stream(gw: Gateway, scenario: str, policy: str | None = None) -> list[Any]:
    return list(
        _client(gw).responses.retrieve("resp_bg", stream=True, extra_headers=_h(scenario, policy))
    )


def test_a_stored_stream_is_verified_like_a_create_stream(
    env: tuple[Gateway, FakeUpstream],
) -> None:
    gw, up = env
    # `GET /v1/responses/{id}?stream=true` replays the stored response as events.
    assert _check_copies(_stored_stream(gw, "stored-echo-sse")) == GOOD
    assert (up.requests[-1].method, up.requests[-1].query) == ("GET", "stream=true")
    r = httpx.get(f"{gw.url}/v1/responses/resp_bg?stream=true", headers=_h("stored-echo-sse"))
    assert r.headers["x-citewarden-decision"] == "released"
    assert r.headers["content-type"].startswith("text/event-stream")
    # A failing claim: blocked (buffer), stripped (buffer and progressive), never relayed.
    with pytest.raises(openai.UnprocessableEntityError):
        _stored_stream(gw, "stored-mixed-sse")
    for policy in (None, "strip", "prog"):
        if policy is not None:
            text = _check_copies(_stored_stream(gw, "stored-mixed-sse", policy))
            assert text.startswith(KEPT_FIRST) and DISCLOSURE in text
        r = httpx.get(
            f"{gw.url}/v1/responses/resp_bg?stream=true", headers=_h("stored-mixed-sse", policy)
        )
        raw = "".join(f"{k}: {v}\n" for k, v in r.headers.items()).encode() + r.content
        assert r.status_code == (422 if policy is None else 200) and b"Moon" not in raw
    # Without context (no echoed instructions) it fails closed, as the JSON one does.
    with pytest.raises(openai.UnprocessableEntityError):
        list(
            _client(gw).responses.retrieve(
                "resp_bare", stream=True, extra_headers=_h("stored-bare-sse")
            )
        )


@pytest.mark.parametrize(
    "query",
    ["stream=true&starting_after=3", "starting_after=0", "stream=true&stream=false", "stream=1"],
)
def test_a_stored_stream_that_cannot_be_verified_whole_is_refused(
    env: tuple[Gateway, FakeUpstream], query: str
) -> None:
    gw, up = env
    up.clear()
    r = httpx.get(f"{gw.url}/v1/responses/resp_bg?{query}", headers=_h("stored-mixed-sse"))
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert b"Moon" not in r.content
    assert up.requests == []  # nothing was forwarded


# -- retry -----------------------------------------------------------------------------------------


def test_retry_reasks_with_grounding_in_instructions(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, up = env
    up.clear()
    raw = _create(gw, "retry", "retry")
    assert raw.headers["x-citewarden-decision"] == "released"
    first, second = (r.json() for r in up.requests[-2:])
    assert first["instructions"] == INSTRUCTIONS
    assert second["instructions"].startswith(INSTRUCTIONS + "\n\n")
    assert "could not be verified" in second["instructions"]
    assert "Moon" not in second["instructions"]  # the draft is never echoed back
    assert second["input"] == first["input"]
    assert second["include"] == ["file_search_call.results"]



"""The embedded demo upstream: its canned data is what it claims to be, and every endpoint speaks
a wire format the real OpenAI and Anthropic SDKs parse, as JSON and as SSE.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam

from gateway.demo import (
    ANSWER_KINDS,
    ANSWERS,
    CONTEXT_HEADER,
    DEMO_MODEL,
    DEMO_QUESTIONS,
    DOCUMENTS,
    AnswerKind,
    choose,
    chunk_tag,
    create_demo_app,
    decode_context_header,
    demo_context_system_prompt,
)
from gateway.demo.answers import choose_kind
from gateway.demo.banner import banner
from gateway.demo.wire import tokenize
from gateway.server import DEMO_POLICIES, Settings, build
from gateway.types import Chunk
from tests.upstream_app import serve

NOW = 1_700_000_000
QUESTION: dict[AnswerKind, str] = {kind: q for q, kind in DEMO_QUESTIONS.items()}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(create_demo_app(clock=lambda: NOW)) as base:
        yield base


@pytest.fixture
def oai(url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(url: str) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=url, api_key="k", max_retries=0) as client:
        yield client


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _oai_user(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def _claude_user(text: str) -> list[MessageParam]:
    return [{"role": "user", "content": text}]


# -- the canned data -------------------------------------------------------------------------

_MARKER = re.compile(r"\[([^\[\]]+)\]")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s?(?:%|kWh|kW|V|kg|hours|years))?")


def _oracle(sentence: str, context: dict[str, Chunk]) -> str | None:
    """A deliberately simple stand-in for the gateway's checks, to keep the data honest."""
    cited: list[str] = []
    for marker in _MARKER.findall(sentence):
        chunk_id, _, version = marker.partition("@")
        chunk = context.get(chunk_id)
        if chunk is None:
            return "hallucinated_citation"
        if version and version != chunk.version:
            return "stale_source"
        cited.append(chunk.text or "")
    if not cited:
        return "missing_citation"
    body = _MARKER.sub("", sentence)
    if any(all(q not in t for t in cited) for q in re.findall(r'"([^"]+)"', body)):
        return "quote_mismatch"
    if any(all(n not in t for t in cited) for n in _NUMBER.findall(body)):
        return "number_mismatch"
    return None


@pytest.mark.parametrize("kind", ANSWER_KINDS)
def test_answer_sentences_fail_exactly_as_declared(kind: AnswerKind) -> None:
    answer = ANSWERS[kind]
    sentences = re.split(r"(?<=\]\.)\s+", answer.text)
    context = {c.id: c for c in answer.retrieved}
    assert [_oracle(s, context) for s in sentences] == list(answer.failing)


def test_answer_kinds_cover_good_partial_and_hallucinated() -> None:
    assert all(r is None for r in ANSWERS["good"].failing)
    partial = ANSWERS["partial"].failing
    assert None in partial and any(r is not None for r in partial)
    assert all(r is not None for r in ANSWERS["hallucinated"].failing)


def test_retrieved_chunks_are_documents() -> None:
    ids = {c.id for c in DOCUMENTS}
    assert len(ids) == len(DOCUMENTS)
    assert all(re.fullmatch(r"[a-z]+:\d+", i) for i in ids)
    for answer in ANSWERS.values():
        assert set(answer.retrieved) <= set(DOCUMENTS)


def test_system_prompt_carries_every_chunk_verbatim() -> None:
    prompt = demo_context_system_prompt()
    for chunk in DOCUMENTS:
        assert chunk.text is not None and "<" not in chunk.text
        assert f'<chunk id="{chunk.id}" version="{chunk.version}">{chunk.text}</chunk>' in prompt
    assert chunk_tag(Chunk("x:1", "t")) == '<chunk id="x:1">t</chunk>'


@pytest.mark.parametrize(
    ("question", "kind"),
    [
        *DEMO_QUESTIONS.items(),
        ("give me a good answer", "good"),
        ("a partly hallucinated answer please", "partial"),
        ("something HALLUCINATED about the warranty", "hallucinated"),
        ("an outdated one", "stale"),
        ("How much does the K7 weigh?", "good"),
        ("Tell me about charging", "good"),
        (chunk_tag(DOCUMENTS[3]) + "\nWhat about firmware?", "stale"),
    ],
)
def test_choose_kind(question: str, kind: AnswerKind) -> None:
    assert choose_kind(question) == kind
    assert choose(question) is ANSWERS[kind]


def test_demo_questions_cover_every_kind() -> None:
    assert set(DEMO_QUESTIONS.values()) == set(ANSWER_KINDS)


# -- OpenAI chat completions -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ANSWER_KINDS)
def test_openai_json(oai: openai.OpenAI, kind: AnswerKind) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": demo_context_system_prompt()},
        {"role": "user", "content": QUESTION[kind]},
    ]
    raw = oai.chat.completions.with_raw_response.create(model="gpt-demo", messages=messages)
    completion = raw.parse()
    answer = ANSWERS[kind]
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-demo"
    assert completion.created == NOW
    [choice] = completion.choices
    assert choice.message.content == answer.text
    assert choice.finish_reason == "stop"
    assert decode_context_header(raw.headers[CONTEXT_HEADER]) == [
        Chunk(c.id, c.text, c.version) for c in answer.retrieved
    ]
    usage = completion.usage
    assert usage is not None
    assert usage.completion_tokens == len(tokenize(answer.text))
    assert usage.prompt_tokens > len(demo_context_system_prompt()) // 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_openai_json_n(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(
        model="m",
        messages=_oai_user("partial"),
        n=3,
    )
    assert [c.index for c in completion.choices] == [0, 1, 2]
    assert {c.message.content for c in completion.choices} == {ANSWERS["partial"].text}


def test_openai_stream(oai: openai.OpenAI) -> None:
    text: dict[int, list[str]] = {0: [], 1: []}
    roles, finishes, usages = [], [], []
    stream = oai.chat.completions.create(
        model="m",
        messages=_oai_user("hallucinated"),
        n=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    with stream:
        for chunk in stream:
            assert chunk.object == "chat.completion.chunk"
            if chunk.usage is not None:
                assert chunk.choices == []
                usages.append(chunk.usage)
            for choice in chunk.choices:
                if choice.delta.role:
                    roles.append(choice.index)
                if choice.delta.content:
                    text[choice.index].append(choice.delta.content)
                if choice.finish_reason:
                    finishes.append((choice.index, choice.finish_reason))
    expected = ANSWERS["hallucinated"].text
    assert "".join(text[0]) == "".join(text[1]) == expected
    assert len(text[0]) == len(tokenize(expected)) > 20
    assert max(len(p) for p in text[0]) <= 5
    assert roles == [0, 1]
    assert finishes == [(0, "stop"), (1, "stop")]
    [usage] = usages
    assert usage.completion_tokens == 2 * len(text[0])


def test_openai_stream_without_usage_frame(url: str) -> None:
    body = {"model": "m", "messages": _user("good"), "stream": True}
    r = httpx.post(url + "/v1/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert decode_context_header(r.headers[CONTEXT_HEADER])[0].id == "handbook:1"


async def test_openai_async_stream(url: str) -> None:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m",
            messages=_oai_user(QUESTION["stale"]),
            stream=True,
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        completion = await client.chat.completions.create(
            model="m",
            messages=_oai_user(QUESTION["stale"]),
        )
    assert "".join(pieces) == completion.choices[0].message.content == ANSWERS["stale"].text


def test_openai_models(oai: openai.OpenAI) -> None:
    assert [m.id for m in oai.models.list()] == [DEMO_MODEL]


# -- Anthropic Messages ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ANSWER_KINDS)
def test_anthropic_json(claude: anthropic.Anthropic, kind: AnswerKind) -> None:
    raw = claude.messages.with_raw_response.create(
        model="claude-demo",
        max_tokens=512,
        system=demo_context_system_prompt(),
        messages=_claude_user(QUESTION[kind]),
    )
    message = raw.parse()
    assert message.model == "claude-demo"
    assert message.stop_reason == "end_turn"
    [block] = message.content
    assert block.type == "text" and block.text == ANSWERS[kind].text
    assert message.usage.output_tokens == len(tokenize(block.text))
    assert message.usage.input_tokens > len(demo_context_system_prompt()) // 5
    ids = [c.id for c in decode_context_header(raw.headers[CONTEXT_HEADER])]
    assert ids == [c.id for c in ANSWERS[kind].retrieved]


def test_anthropic_stream_events(claude: anthropic.Anthropic) -> None:
    stream = claude.messages.create(
        model="m",
        max_tokens=512,
        messages=[{"role": "user", "content": [{"type": "text", "text": "partial"}]}],
        stream=True,
    )
    types: list[str] = []
    text: list[str] = []
    with stream:
        for event in stream:
            types.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text.append(event.delta.text)
            if event.type == "message_delta":
                assert event.delta.stop_reason == "end_turn"
                assert event.usage.output_tokens == len(text)
    assert types[:2] == ["message_start", "content_block_start"]
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(types[2:-3]) == {"content_block_delta"}
    assert "".join(text) == ANSWERS["partial"].text


def test_anthropic_stream_sends_ping(url: str) -> None:
    body = {"model": "m", "max_tokens": 9, "messages": _user("good"), "stream": True}
    r = httpx.post(url + "/v1/messages", json=body)
    events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events[:3] == ["message_start", "content_block_start", "ping"]
    assert events[-1] == "message_stop"


async def test_anthropic_async_stream_helper(url: str) -> None:
    async with (
        anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client,
        client.messages.stream(
            model="m", max_tokens=512, messages=_claude_user(QUESTION["hallucinated"])
        ) as stream,
    ):
        final = await stream.get_final_message()
    assert final.content[0].type == "text"
    assert final.content[0].text == ANSWERS["hallucinated"].text


def test_anthropic_models(claude: anthropic.Anthropic) -> None:
    assert [m.id for m in claude.models.list()] == [DEMO_MODEL]


# -- rag-json ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ANSWER_KINDS)
def test_rag_answer(url: str, kind: AnswerKind) -> None:
    r = httpx.post(url + "/rag/answer", json={"question": QUESTION[kind]})
    assert r.status_code == 200
    body = r.json()
    assert body["answer"] == ANSWERS[kind].text
    sources = [Chunk(s["id"], s["text"], s["version"]) for s in body["sources"]]
    assert sources == [Chunk(c.id, c.text, c.version) for c in ANSWERS[kind].retrieved]
    assert decode_context_header(r.headers[CONTEXT_HEADER]) == sources


def test_documents_endpoint(url: str) -> None:
    body = httpx.get(url + "/demo/documents").json()
    assert [c["id"] for c in body["chunks"]] == [c.id for c in DOCUMENTS]
    assert body["system_prompt"] == demo_context_system_prompt()


# -- errors and determinism ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", b'{"messages": "hi"}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "n": 0}'),
        ("/v1/chat/completions", b'{"messages": [{"role": "system", "content": "x"}]}'),
        ("/v1/messages", b"[1, 2]"),
        ("/v1/messages", b'{"max_tokens": 5}'),
        ("/rag/answer", b'{"question": 5}'),
    ],
)
def test_bad_requests_get_the_protocol_error_envelope(url: str, path: str, payload: bytes) -> None:
    r = httpx.post(url + path, content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 400
    body = r.json()
    if path == "/v1/messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["message"]


def test_openai_sdk_raises_on_bad_request(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="m", messages=[{"role": "system", "content": "x"}])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": _user("good")}),
        ("/v1/chat/completions", {"messages": _user("good"), "stream": True}),
        ("/v1/messages", {"messages": _user("partial"), "max_tokens": 5}),
        ("/v1/messages", {"messages": _user("partial"), "max_tokens": 5, "stream": True}),
        ("/rag/answer", {"question": "stale"}),
    ],
)
def test_answers_are_byte_identical_for_the_same_request(
    url: str, path: str, body: dict[str, object]
) -> None:
    first = httpx.post(url + path, json=body)
    second = httpx.post(url + path, json=body)
    assert first.status_code == 200
    assert first.content == second.content
    if path != "/rag/answer":  # the model name and the id derive from the request
        other = httpx.post(url + path, json={**body, "model": "other"})
        assert other.content != first.content


# -- the printed examples and the demo policy ------------------------------------------------

DECISION: dict[AnswerKind, str] = {
    "good": "released",
    "partial": "partial",
    "hallucinated": "abstained",
    "stale": "partial",
}


def test_banner_examples_are_runnable(url: str) -> None:
    """Every curl line of the banner, sent to the real gateway with the demo policies, gets
    the decision its comment promises (and each demo answer kind shows up)."""
    text = banner("http://gw:8080", "http://gw:9090")
    lines = text.splitlines()
    proxy, *_ = build(Settings(upstream=url, policies=[str(p) for p in DEMO_POLICIES]))
    posts = 0
    promised: list[str] = []
    seen: set[str] = set()
    with serve(proxy) as gateway:
        for i, line in enumerate(lines):
            if not line.startswith("  curl ") or " -d " not in line:
                continue
            posts += 1
            command = shlex.split(line)
            target = next(a for a in command if a.startswith("http://gw:8080/"))
            body = json.loads(command[command.index("-d") + 1])
            headers = dict(
                h.split(": ", 1) for j, h in enumerate(command) if j and command[j - 1] == "-H"
            )
            r = httpx.post(gateway + target.removeprefix("http://gw:8080"), json=body,
                           headers=headers, timeout=10)
            expected = re.search(r"-> (\w+)", lines[i - 1])
            if expected is not None:
                promised.append(expected.group(1))
                assert r.headers["x-citewarden-decision"] == expected.group(1), lines[i - 1]
                assert r.status_code == (422 if expected.group(1) == "blocked" else 200)
            else:
                assert r.status_code == 200, r.text
            if body.get("stream"):
                assert any(
                    end in r.text for end in ("message_stop", "event: error", "response.completed")
                )
                continue
            if r.status_code == 200 and "choices" in r.json():
                content = r.json()["choices"][0]["message"]["content"]
                seen.update(k for k, a in ANSWERS.items() if a.text == content)
    assert posts == len(DEMO_QUESTIONS) + 5
    assert {"released", "partial", "abstained", "blocked"} <= set(promised)
    assert "good" in seen
    snippet = "\n".join(
        line[2:] for line in text.split("With the OpenAI SDK:")[1].splitlines() if line[:2] == "  "
    )
    compile(snippet, "<banner>", "exec")
    assert "http://gw:8080/v1" in snippet


@pytest.mark.parametrize("with_prompt", [True, False], ids=["chunks-in-request", "header-only"])
def test_demo_policy_gives_each_kind_its_decision(url: str, with_prompt: bool) -> None:
    proxy, *_ = build(Settings(upstream=url, policies=[str(p) for p in DEMO_POLICIES]))
    system: list[ChatCompletionMessageParam] = (
        [{"role": "system", "content": demo_context_system_prompt()}] if with_prompt else []
    )
    decisions: dict[AnswerKind, str] = {}
    with (
        serve(proxy) as gateway,
        openai.OpenAI(base_url=gateway + "/v1", api_key="k", max_retries=0) as client,
    ):
        for kind in ANSWER_KINDS:
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=[*system, *_oai_user(QUESTION[kind])]
            )
            decisions[kind] = raw.headers["x-citewarden-decision"]
            content = raw.parse().choices[0].message.content or ""
            if kind == "good":
                assert content == ANSWERS["good"].text
            assert "80%" not in content and "[warranty:3]" not in content
    assert decisions == DECISION

"""The real OpenAI and Anthropic SDKs, sync and async, through the gateway to a real upstream.

The upstream splits its SSE at random byte boundaries; every answer is judged by the policy
file written for the test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.upstream_app import (
    FakeUpstream,
    Json,
    Stream,
    anthropic_body,
    anthropic_sse,
    create_upstream,
    openai_body,
    openai_sse,
    serve,
)

CONTEXT = (
    '<chunk id="bat:1" version="3">The Voltra pack stores 62.5 kWh and weighs 410 kg.</chunk>\n'
    '<chunk id="bat:2" version="1">Charging from 10% to 80% takes 28 minutes on a 150 kW '
    "charger.</chunk>"
)
GOOD = "The Voltra pack stores 62.5 kWh [bat:1]. Charging from 10% to 80% takes 28 minutes [bat:2]."
BAD_CLAIM = "The pack is made on the Moon"
KEPT = "The Voltra pack stores 62.5 kWh [bat:1]. It weighs 410 kg [bat:1]."
MIXED = f"The Voltra pack stores 62.5 kWh [bat:1]. {BAD_CLAIM} [bat:9]. It weighs 410 kg [bat:1]."
WRONG_NUMBER = "Charging from 10% to 80% takes 12 minutes [bat:2]."


def _upstream() -> FakeUpstream:
    up = create_upstream()
    for key, text in {"good": GOOD, "mixed": MIXED, "number": WRONG_NUMBER}.items():
        up.on(f"oa-json-{key}", Json(openai_body(text, n=2)))
        frames = openai_sse(text, chunk_size=3, include_usage=True)
        up.on(f"oa-sse-{key}", Stream(frames, seed=len(key)))
        up.on(f"an-json-{key}", Json(anthropic_body(text)))
        up.on(f"an-sse-{key}", Stream(anthropic_sse(text, chunk_size=3), seed=len(key) + 7))
    return up


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[tuple[str, FakeUpstream]]:
    up = _upstream()
    with serve(up) as url:
        yield url, up


@pytest.fixture(params=["block", "strip"], scope="module")
def gateway(
    request: pytest.FixtureRequest,
    upstream_url: tuple[str, FakeUpstream],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Gateway]]:
    mode = request.param
    policy = write_policy(tmp_path_factory.mktemp(mode), on_unverified=mode)
    with run_gateway(upstream_url[0], [policy]) as gw:
        yield mode, gw


@pytest.fixture(scope="module")
def progressive(
    upstream_url: tuple[str, FakeUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Gateway]]:
    out: dict[str, Gateway] = {}
    with (
        run_gateway(
            upstream_url[0],
            [write_policy(tmp_path_factory.mktemp("pb"), streaming="progressive")],
        ) as block,
        run_gateway(
            upstream_url[0],
            [
                write_policy(
                    tmp_path_factory.mktemp("ps"), streaming="progressive", on_unverified="strip"
                )
            ],
        ) as strip,
    ):
        out["block"], out["strip"] = block, strip
        yield out


@pytest.fixture(autouse=True)
def _close_clients(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Close every SDK client a test opens, so no socket outlives its test."""
    opened: list[openai.OpenAI | anthropic.Anthropic] = []
    for module, name in ((openai, "OpenAI"), (anthropic, "Anthropic")):
        cls = getattr(module, name)

        def make(*args: object, _cls: type = cls, **kwargs: object) -> object:
            client = _cls(*args, **kwargs)
            opened.append(client)
            return client

        monkeypatch.setattr(module, name, make)
    yield
    for client in opened:
        client.close()


def _oa_messages(key: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}]


def _an_kwargs(key: str) -> dict[str, object]:
    return {
        "model": "claude-fake",
        "max_tokens": 100,
        "system": CONTEXT,
        "messages": [{"role": "user", "content": key}],
    }


def _no_bad_text(obj: object) -> None:
    dumped = obj if isinstance(obj, str) else json.dumps(obj)
    assert BAD_CLAIM not in dumped
    assert "bat:9" not in dumped


# -- OpenAI -------------------------------------------------------------------------------------


def test_openai_released_json_is_the_upstream_answer(gateway: tuple[str, Gateway]) -> None:
    _, gw = gateway
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=_oa_messages("oa-json-good")  # type: ignore[arg-type]
    )
    completion = raw.parse()
    assert raw.headers["x-citewarden-decision"] == "released"
    assert raw.headers["x-citewarden-policy"].startswith("itest@")
    assert [c.message.content for c in completion.choices] == [GOOD, GOOD]
    assert completion.usage is not None and completion.usage.completion_tokens == 10


def test_openai_released_stream_reassembles_to_the_upstream_text(
    gateway: tuple[str, Gateway],
) -> None:
    _, gw = gateway
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(
        model="m",
        messages=_oa_messages("oa-sse-good"),  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    text = ""
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
        usage = chunk.usage or usage
    assert text == GOOD
    assert usage is not None and usage.total_tokens == 30


def test_openai_unverified_answer_is_blocked_or_stripped(gateway: tuple[str, Gateway]) -> None:
    mode, gw = gateway
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    if mode == "block":
        with pytest.raises(openai.UnprocessableEntityError) as err:
            client.chat.completions.create(model="m", messages=_oa_messages("oa-json-mixed"))  # type: ignore[arg-type]
        body = err.value.response.json()
        assert body["citewarden"]["reason"] == "hallucinated_citation"
        assert body["citewarden"]["claim_index"] == 1
        assert err.value.response.headers["x-citewarden-decision"] == "blocked"
        _no_bad_text(body)
        return
    raw = client.chat.completions.with_raw_response.create(
        model="m", messages=_oa_messages("oa-json-mixed")  # type: ignore[arg-type]
    )
    completion = raw.parse()
    assert raw.headers["x-citewarden-decision"] == "partial"
    assert len(completion.choices) == 2
    for choice in completion.choices:
        content = choice.message.content or ""
        assert content.startswith(KEPT)
        _no_bad_text(choice.model_dump())
    _no_bad_text(raw.http_response.text)


def test_openai_unverified_stream(gateway: tuple[str, Gateway]) -> None:
    mode, gw = gateway
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    if mode == "block":
        with pytest.raises(openai.UnprocessableEntityError):
            client.chat.completions.create(
                model="m", messages=_oa_messages("oa-sse-number"), stream=True  # type: ignore[arg-type]
            )
        return
    stream = client.chat.completions.create(
        model="m", messages=_oa_messages("oa-sse-mixed"), stream=True  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith(KEPT)
    _no_bad_text(text)


def test_openai_async_client(gateway: tuple[str, Gateway]) -> None:
    _, gw = gateway

    async def go() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
        completion = await client.chat.completions.create(
            model="m", messages=_oa_messages("oa-json-good")  # type: ignore[arg-type]
        )
        stream = await client.chat.completions.create(
            model="m", messages=_oa_messages("oa-sse-good"), stream=True  # type: ignore[arg-type]
        )
        text = ""
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        await client.close()
        return completion.choices[0].message.content or "", text

    content, streamed = asyncio.run(go())
    assert content == GOOD
    assert streamed == GOOD


# -- Anthropic ----------------------------------------------------------------------------------


def test_anthropic_released_json_and_stream(gateway: tuple[str, Gateway]) -> None:
    _, gw = gateway
    client = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0)
    message = client.messages.create(**_an_kwargs("an-json-good"))  # type: ignore[arg-type]
    assert message.content[0].type == "text"
    assert message.content[0].text == GOOD
    with client.messages.stream(**_an_kwargs("an-sse-good")) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert "".join(b.text for b in final.content if b.type == "text") == GOOD
    assert final.stop_reason == "end_turn"


def test_anthropic_unverified(gateway: tuple[str, Gateway]) -> None:
    mode, gw = gateway
    client = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0)
    if mode == "block":
        with pytest.raises(anthropic.UnprocessableEntityError) as err:
            client.messages.create(**_an_kwargs("an-json-mixed"))  # type: ignore[arg-type]
        body = err.value.response.json()
        assert body["type"] == "error"
        assert body["citewarden"]["reason"] == "hallucinated_citation"
        with (
            pytest.raises(anthropic.UnprocessableEntityError),
            client.messages.stream(**_an_kwargs("an-sse-number")) as stream,  # type: ignore[arg-type]
        ):
            stream.get_final_message()
        return
    message = client.messages.create(**_an_kwargs("an-json-mixed"))  # type: ignore[arg-type]
    _no_bad_text(message.model_dump())
    with client.messages.stream(**_an_kwargs("an-sse-mixed")) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    text = "".join(b.text for b in final.content if b.type == "text")
    assert text.startswith(KEPT)
    _no_bad_text(final.model_dump())


def test_anthropic_async_stream(gateway: tuple[str, Gateway]) -> None:
    _, gw = gateway

    async def go() -> str:
        client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0)
        async with client.messages.stream(**_an_kwargs("an-sse-good")) as stream:  # type: ignore[arg-type]
            final = await stream.get_final_message()
        await client.close()
        return "".join(b.text for b in final.content if b.type == "text")

    assert asyncio.run(go()) == GOOD


# -- Progressive streaming ----------------------------------------------------------------------


def test_progressive_released_stream_equals_upstream(progressive: dict[str, Gateway]) -> None:
    gw = progressive["block"]
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(
        model="m",
        messages=_oa_messages("oa-sse-good"),  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == GOOD
    assert chunks[-1].usage is not None
    an = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0)
    with an.messages.stream(**_an_kwargs("an-sse-good")) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    assert "".join(b.text for b in final.content if b.type == "text") == GOOD


def test_progressive_failure_ends_with_error_event(progressive: dict[str, Gateway]) -> None:
    gw = progressive["block"]
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=_oa_messages("oa-sse-mixed"), stream=True  # type: ignore[arg-type]
    )
    received = ""
    with pytest.raises(openai.APIError):
        for chunk in stream:
            if chunk.choices:
                received += chunk.choices[0].delta.content or ""
    assert received == "The Voltra pack stores 62.5 kWh [bat:1]."
    an = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0)
    with (
        pytest.raises(anthropic.APIError),
        an.messages.stream(**_an_kwargs("an-sse-mixed")) as s,  # type: ignore[arg-type]
    ):
        s.get_final_message()


def test_progressive_strip_removes_the_failing_claim(progressive: dict[str, Gateway]) -> None:
    gw = progressive["strip"]
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=_oa_messages("oa-sse-mixed"), stream=True  # type: ignore[arg-type]
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith(KEPT)
    _no_bad_text(text)
    an = anthropic.Anthropic(base_url=gw.url, api_key="sk-ant-test", max_retries=0)
    with an.messages.stream(**_an_kwargs("an-sse-mixed")) as s:  # type: ignore[arg-type]
        final = s.get_final_message()
    _no_bad_text(final.model_dump())

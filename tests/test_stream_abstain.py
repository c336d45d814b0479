"""Progressive streams that abstain: when nothing went out yet, the abstention template is
streamed as the answer and the stream ends normally, the same outcome as the unstreamed
request (DESIGN §5). The real OpenAI and Anthropic SDKs through a real gateway and upstream."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.audit import configure_logging, reset_logging
from gateway.policy import Templates
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
    sse_events,
)

CONTEXT = '<chunk id="bat:1" version="3">The Voltra pack stores 62.5 kWh.</chunk>'
MARKER = "Moonbase"
GOOD = "The Voltra pack stores 62.5 kWh [bat:1]."
# Every claim fails: the first one before any text could go out.
HALLUCINATED = f"The pack is made in {MARKER} [bat:9]. It floats on water [bat:8]."
# The first claim verifies and goes out; the second fails.
LATE = f"{GOOD} It is made in {MARKER} [bat:9]."
TEMPLATE = Templates().no_evidence


def _upstream() -> FakeUpstream:
    up = create_upstream()
    for key, text in {"hallucinated": HALLUCINATED, "late": LATE}.items():
        up.on(f"oa-json-{key}", Json(openai_body(text)))
        frames = openai_sse(text, chunk_size=5, include_usage=True)
        up.on(f"oa-sse-{key}", Stream(frames, seed=3))
        up.on(f"an-json-{key}", Json(anthropic_body(text)))
        up.on(f"an-sse-{key}", Stream(anthropic_sse(text, chunk_size=5), seed=5))
    return up


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Gateway]]:
    with serve(_upstream()) as url:
        out: dict[str, Gateway] = {}
        stack: list[Any] = []
        try:
            for mode in ("strip", "abstain", "block"):
                policy = write_policy(
                    tmp_path_factory.mktemp(mode), streaming="progressive", on_unverified=mode
                )
                cm = run_gateway(url, [policy])
                out[mode] = cm.__enter__()
                stack.append(cm)
            yield out
        finally:
            for cm in reversed(stack):
                cm.__exit__(None, None, None)


def _oa(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=gw.url + "/v1", api_key="sk-test", max_retries=0
    )


def _an(gw: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=gw.url, api_key="sk-ant-test", max_retries=0
    )


def _oa_messages(key: str) -> Any:
    return [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}]


def _an_kwargs(key: str) -> Any:
    return {
        "model": "claude-test",
        "max_tokens": 100,
        "system": CONTEXT,
        "messages": [{"role": "user", "content": key}],
    }


@pytest.mark.parametrize("mode", ["strip", "abstain"])
def test_openai_hallucinated_stream_abstains_like_unstreamed(
    gateways: dict[str, Gateway], mode: str
) -> None:
    gw = gateways[mode]
    with _oa(gw) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="m", messages=_oa_messages("oa-json-hallucinated")
        )
        assert raw.headers["x-citewarden-decision"] == "abstained"
        unstreamed = raw.parse().choices[0].message.content
        stream = client.chat.completions.create(
            model="m",
            messages=_oa_messages("oa-sse-hallucinated"),
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)  # no exception: a valid stream that ends normally
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == unstreamed == TEMPLATE
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop"


@pytest.mark.parametrize("mode", ["strip", "abstain"])
def test_anthropic_hallucinated_stream_abstains_like_unstreamed(
    gateways: dict[str, Gateway], mode: str
) -> None:
    gw = gateways[mode]
    with _an(gw) as client:
        raw = client.messages.with_raw_response.create(**_an_kwargs("an-json-hallucinated"))
        assert raw.headers["x-citewarden-decision"] == "abstained"
        unstreamed = raw.parse().content
        with client.messages.stream(**_an_kwargs("an-sse-hallucinated")) as s:
            final = s.get_final_message()
    streamed = "".join(b.text for b in final.content if b.type == "text")
    assert streamed == "".join(b.text for b in unstreamed if b.type == "text") == TEMPLATE
    assert final.stop_reason == "end_turn"


@pytest.mark.parametrize("protocol", ["openai-chat", "anthropic-messages"])
def test_raw_abstained_stream_is_clean_and_has_no_marker(
    gateways: dict[str, Gateway], protocol: str
) -> None:
    gw = gateways["abstain"]
    if protocol == "openai-chat":
        path, body = "/v1/chat/completions", {
            "model": "m",
            "stream": True,
            "messages": _oa_messages("oa-sse-hallucinated"),
        }
    else:
        path, body = "/v1/messages", {**_an_kwargs("an-sse-hallucinated"), "stream": True}
    r = httpx.post(gw.url + path, json=body)
    assert r.status_code == 200
    assert MARKER not in r.text
    events = sse_events(r.content)
    assert all(name != "error" and '"error"' not in data for name, data in events)
    if protocol == "openai-chat":
        assert events[-1][1] == "[DONE]"
    else:
        assert events[-1][0] == "message_stop"


def test_failure_after_text_went_out_still_ends_with_an_error(
    gateways: dict[str, Gateway],
) -> None:
    """Under abstain, a claim that fails after another one went out cannot be taken back:
    the stream ends with the protocol's error event, never a clean end."""
    gw = gateways["abstain"]
    with _oa(gw) as client:
        stream = client.chat.completions.create(
            model="m", messages=_oa_messages("oa-sse-late"), stream=True
        )
        received = ""
        with pytest.raises(openai.APIError):
            for chunk in stream:
                if chunk.choices:
                    received += chunk.choices[0].delta.content or ""
    assert received == GOOD
    assert MARKER not in received


def test_a_failure_after_text_went_out_is_audited_as_what_the_client_got(
    gateways: dict[str, Gateway],
) -> None:
    """The client got claims and then an error event, not the abstention template: the audit
    line says `blocked`, not `abstained`."""
    buf = io.StringIO()
    configure_logging(stream=buf)
    try:
        r = httpx.post(gateways["abstain"].url + "/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": _oa_messages("oa-sse-late"),
        })
        assert "citation_verification_failed" in sse_events(r.content)[-1][1]
        rid = r.headers["x-request-id"]
        deadline = time.monotonic() + 3.0
        lines: list[dict[str, Any]] = []
        while not lines and time.monotonic() < deadline:
            lines = [json.loads(x) for x in buf.getvalue().splitlines()
                     if '"audit"' in x and rid in x]
            time.sleep(0.01)
    finally:
        reset_logging()
    (line,) = lines
    assert (line["decision"], line["reason"]) == ("blocked", "hallucinated_citation")


@pytest.mark.parametrize("key", ["oa-sse-hallucinated", "an-sse-hallucinated"])
def test_block_still_ends_with_an_error_event(gateways: dict[str, Gateway], key: str) -> None:
    gw = gateways["block"]
    if key.startswith("oa"):
        path, body = "/v1/chat/completions", {
            "model": "m",
            "stream": True,
            "messages": _oa_messages(key),
        }
    else:
        path, body = "/v1/messages", {**_an_kwargs(key), "stream": True}
    r = httpx.post(gw.url + path, json=body)
    assert MARKER not in r.text
    events = sse_events(r.content)
    assert "citation_verification_failed" in events[-1][1]
    assert TEMPLATE not in r.text



def test_demo_hallucinated_answer_streams_like_unstreamed() -> None:
    """The demo's own progressive policy: the fully hallucinated answer is the same 200
    abstention streamed (OpenAI and Anthropic SDKs) as unstreamed."""
    from gateway.demo.app import DEMO_MODEL, create_demo_app
    from gateway.server import DEMO_POLICIES

    question = [{"role": "user", "content": "Give me a fully hallucinated answer"}]
    with serve(create_demo_app()) as url, run_gateway(url, list(DEMO_POLICIES)) as gw:
        with _oa(gw) as client:
            unstreamed = client.chat.completions.create(model=DEMO_MODEL, messages=question)
            stream = client.chat.completions.create(
                model=DEMO_MODEL, messages=question, stream=True
            )
            streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        with _an(gw) as claude, claude.messages.stream(
            model=DEMO_MODEL, max_tokens=300, messages=question
        ) as s:
            final = s.get_final_message()
    assert streamed == unstreamed.choices[0].message.content == TEMPLATE
    assert [b.text for b in final.content if b.type == "text"] == [TEMPLATE]

"""The demo's Responses examples: the demo upstream speaks the Responses wire format the real
SDK parses, and the gateway with the demo policies verifies create, stream and retrieve."""

from __future__ import annotations

import io
from collections.abc import Iterator

import openai
import pytest
import structlog

from gateway.audit import configure_logging, reset_logging
from gateway.demo import ANSWERS, DEMO_MODEL, DEMO_QUESTIONS, create_demo_app
from gateway.demo.documents import demo_context_system_prompt
from gateway.server import DEMO_POLICIES, Settings, build
from tests.upstream_app import serve

PARTIAL_Q = next(q for q, kind in DEMO_QUESTIONS.items() if kind == "partial")
GOOD_Q = next(q for q, kind in DEMO_QUESTIONS.items() if kind == "good")


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    # The audit lines go to a stream of their own, as `run_gateway` sends them: written a
    # moment after each answer, they would otherwise reach the terminal between tests.
    quiet = not structlog.is_configured()
    if quiet:
        configure_logging(stream=io.StringIO())
    try:
        with serve(create_demo_app()) as upstream:
            policies = [str(p) for p in DEMO_POLICIES]
            proxy, *_ = build(Settings(upstream=upstream, policies=policies))
            with (
                serve(proxy) as gateway,
                openai.OpenAI(base_url=gateway + "/v1", api_key="demo", max_retries=0) as c,
            ):
                yield c
    finally:
        if quiet:
            reset_logging()


def test_demo_upstream_speaks_responses(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(
        model=DEMO_MODEL, instructions=demo_context_system_prompt(), input=GOOD_Q
    )
    assert raw.headers["x-citewarden-decision"] == "released"
    resp = raw.parse()
    assert resp.output_text == ANSWERS["good"].text
    assert client.responses.retrieve(resp.id).output_text == ANSWERS["good"].text
    # The banner's stored-stream example: replayed as events, verified as a stream.
    events = list(client.responses.retrieve(resp.id, stream=True))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == ANSWERS["good"].text
    assert events[-1].type == "response.completed"


def test_demo_partial_create_stream_and_background(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(model=DEMO_MODEL, input=PARTIAL_Q)
    assert raw.headers["x-citewarden-decision"] == "partial"
    text = raw.parse().output_text
    assert text != ANSWERS["partial"].text and "parts of this answer were removed" in text
    with client.responses.stream(model=DEMO_MODEL, input=PARTIAL_Q) as stream:
        streamed = stream.get_final_response().output_text
    assert streamed.startswith(text.split("\n\n")[0])
    queued = client.responses.create(model=DEMO_MODEL, input=PARTIAL_Q + " ", background=True)
    assert queued.status == "queued"
    polled = client.responses.retrieve(queued.id)
    assert polled.status == "completed"
    assert "parts of this answer were removed" in polled.output_text

"""The OpenAI Agents SDK on its default API (Responses) through the gateway: a `Runner` turn
that calls a tool whose output carries the sources, then answers citing them. Tracing export
is off (`RunConfig(tracing_disabled=True)`): nothing leaves loopback.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool

from gateway.demo import responses_wire as w
from tests.gateway_harness import Gateway, run_gateway
from tests.test_responses_proxy import CHUNKS, GOOD, MIXED, Sequenced
from tests.upstream_app import SCENARIO_HEADER, FakeUpstream, Json, create_upstream, serve

POLICY = """\
name: agents
routes:
  - name: responses
    match: {path: /v1/responses}
    protocol: openai-responses
citations: {format: doc-chunk}
release: {on_unverified: block}
"""


ENCRYPTED = "reasoning.encrypted_content"


def _turns(answer: str) -> Sequenced:
    call = w.function_call_item("search_kb", json.dumps({"query": "K7"}), call_id="call_kb")
    first = w.response_body(
        [w.reasoning_item(None, encrypted="gAAAA-agent"), call], id="resp_1"
    )
    return Sequenced([Json(first), Json(w.response_text(answer, id="resp_2"))])


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[Gateway, FakeUpstream]]:
    policy = tmp_path / "agents.yaml"
    policy.write_text(POLICY)
    up = create_upstream({"good": _turns(GOOD), "mixed": _turns(MIXED)})
    with serve(up) as up_url, run_gateway(up_url, [policy]) as gw:
        yield gw, up


@function_tool
def search_kb(query: str) -> str:
    """Search the knowledge base; the result carries the sources as chunk tags."""
    return CHUNKS


def _run(gw: Gateway, scenario: str) -> Any:
    async def main() -> Any:
        client = openai.AsyncOpenAI(
            base_url=f"{gw.url}/v1",
            api_key="sk-test",
            max_retries=0,
            default_headers={SCENARIO_HEADER: scenario},
        )
        async with client:
            agent = Agent(
                name="support",
                instructions="Answer from the knowledge base and cite it.",
                tools=[search_kb],
                model=OpenAIResponsesModel(model="gpt-test", openai_client=client),
                # Stateless multi-turn: the reasoning state comes back only when asked for.
                model_settings=ModelSettings(response_include=[ENCRYPTED]),
            )
            return await Runner.run(
                agent, "How much does the K7 store?", run_config=RunConfig(tracing_disabled=True)
            )

    return asyncio.run(main())


def test_runner_turn_with_a_tool_is_verified(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, up = env
    result = _run(gw, "good")
    assert result.final_output == GOOD
    assert [r.path for r in up.requests] == ["/v1/responses", "/v1/responses"]
    assert ENCRYPTED in up.requests[0].json()["include"]
    second = up.requests[1].json()
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == ["call_kb"]
    reasoning = [i for i in second["input"] if i.get("type") == "reasoning"]
    assert [r.get("encrypted_content") for r in reasoning] == ["gAAAA-agent"]


def test_runner_sees_a_block_as_an_api_error(env: tuple[Gateway, FakeUpstream]) -> None:
    gw, _ = env
    with pytest.raises(openai.UnprocessableEntityError) as info:
        _run(gw, "mixed")
    assert info.value.response.json()["citewarden"]["reason"] == "hallucinated_citation"
    assert "Moon" not in info.value.response.text

"""Anthropic native citations through the proxy, JSON and streamed, in both streaming modes.

The captured exchanges in tests/fixtures/anthropic_messages are replayed by a real upstream;
the request carries the documents the citations point into.
"""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import pytest

from tests.gateway_harness import run_gateway, write_policy
from tests.upstream_app import Json, Stream, create_upstream, serve

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic_messages"


def _request(name: str) -> dict[str, object]:
    body: dict[str, object] = json.loads((FIXTURES / name).read_text())
    body.pop("stream", None)
    body["model"] = "claude-test"  # the captured model name draws an SDK deprecation warning
    return body


@pytest.mark.parametrize("streaming", ["buffer", "progressive"])
def test_native_citations_verify_in_streams(tmp_path: Path, streaming: str) -> None:
    up = create_upstream(
        {
            "good-json": Json(json.loads((FIXTURES / "native_good.json").read_text())),
            "good-sse": Stream((FIXTURES / "native_good.sse").read_bytes(), seed=5, max_piece=9),
            "bad-sse": Stream(
                (FIXTURES / "native_bad_cited_text.sse").read_bytes(), seed=6, max_piece=9
            ),
        }
    )
    policy = write_policy(tmp_path, streaming=streaming)
    with (
        serve(up) as url,
        run_gateway(url, [policy]) as gw,
        anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client,
    ):
        good = client.messages.create(
            **_request("request.json"), extra_headers={"x-test-scenario": "good-json"}
        )
        expected = "".join(b.text for b in good.content if b.type == "text")
        with client.messages.stream(
            **_request("request_stream.json"), extra_headers={"x-test-scenario": "good-sse"}
        ) as stream:
            final = stream.get_final_message()
        text = "".join(b.text for b in final.content if b.type == "text")
        assert text == expected
        citations = [c for b in final.content if b.type == "text" for c in (b.citations or [])]
        assert citations, "native citations reach the client"
        with (
            pytest.raises((anthropic.UnprocessableEntityError, anthropic.APIError)),
            client.messages.stream(
                **_request("request_stream.json"), extra_headers={"x-test-scenario": "bad-sse"}
            ) as stream,
        ):
            stream.get_final_message()


def test_a_citation_whose_type_is_no_string_is_a_bad_upstream_answer(tmp_path: Path) -> None:
    """Such a type would not even hash: the answer is refused as unusable (502), never a
    crash of the gateway, and nothing of it reaches the client."""
    body = json.loads((FIXTURES / "native_good.json").read_text())
    cited = next(b for b in body["content"] if b.get("citations"))
    cited["citations"][0]["type"] = ["char_location"]
    up = create_upstream({"odd": Json(body)})
    with (
        serve(up) as url,
        run_gateway(url, [write_policy(tmp_path)]) as gw,
        anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0) as client,
        pytest.raises(anthropic.APIStatusError) as info,
    ):
        client.messages.create(**_request("request.json"), extra_headers={"x-test-scenario": "odd"})
    assert info.value.status_code == 502
    assert info.value.response.headers["x-citewarden-decision"] == "error"
    assert cited["text"] not in info.value.response.text

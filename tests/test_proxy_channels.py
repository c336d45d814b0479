"""Every channel through the proxy: other choices, tool calls, reasoning, logprobs, unknown
fields; plus shadow mode, release.retry and rag-json routes. The upstream is a real ASGI app
on loopback; the policies are real YAML files."""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from gateway.sse import SSEDecoder
from gateway.types import Chunk
from tests.gateway_harness import run_gateway, write_policy
from tests.upstream_app import (
    Behaviour,
    FakeUpstream,
    Json,
    Stream,
    create_upstream,
    openai_body,
    openai_sse,
    rag_body,
    serve,
    sse_frame,
)

CONTEXT = '<chunk id="kb:1" version="2">The Orbit pump moves 40 litres per minute.</chunk>'
GOOD = "The Orbit pump moves 40 litres per minute [kb:1]."
BAD = "The Orbit pump was designed on Mars [kb:404]."
BAD_WORDS = "designed on Mars"


def _request(key: str, **extra: object) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}],
        **extra,
    }


def _two_choices(second: str) -> dict[str, Any]:
    body = openai_body(GOOD, n=2)
    body["choices"][1]["message"]["content"] = second
    return body


def _tool_call(arguments: dict[str, str]) -> dict[str, Any]:
    body = openai_body(GOOD)
    body["choices"][0]["message"]["tool_calls"] = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "file_ticket", "arguments": json.dumps(arguments)},
        }
    ]
    body["choices"][0]["finish_reason"] = "tool_calls"
    return body


def _with_reasoning_and_logprobs(text: str) -> dict[str, Any]:
    body = openai_body(text)
    body["choices"][0]["message"]["reasoning_content"] = f"I should say: {BAD}"
    body["choices"][0]["logprobs"] = {
        # Tokens concatenate to the content, as a model's own do.
        "content": [{"token": tok, "logprob": -0.1, "bytes": None, "top_logprobs": []}
                    for tok in re.findall(r"\S+\s*", text)],
        "refusal": None,
    }
    return body


def _reasoning_stream() -> list[bytes]:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse_frame({**head, "choices": [choice]})

    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning_content": f"Thinking: {BAD}"}),
        chunk({"content": GOOD[:20]}),
        chunk({"content": GOOD[20:]}),
        chunk({}, "stop"),
        b"data: [DONE]\n\n",
    ]


@dataclass
class Sequenced:
    """Answers successive requests with successive behaviours (the last one repeats)."""

    behaviours: list[Behaviour]
    calls: int = field(default=0)

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        behaviour = self.behaviours[min(self.calls, len(self.behaviours) - 1)]
        self.calls += 1
        await behaviour.respond(scope, receive, send)


def _upstream() -> FakeUpstream:
    up = create_upstream()
    up.on("choices-mixed", Json(_two_choices(f"{GOOD} {BAD}")))
    up.on("tool-bad", Json(_tool_call({"summary": BAD, "priority": "high"})))
    up.on("tool-good", Json(_tool_call({"summary": GOOD, "priority": "high"})))
    up.on("reasoning-good", Json(_with_reasoning_and_logprobs(GOOD)))
    up.on("reasoning-mixed", Json(_with_reasoning_and_logprobs(f"{GOOD} {BAD}")))
    up.on("reasoning-stream", Stream(_reasoning_stream(), seed=3, max_piece=7))
    good_logprobs = openai_body(GOOD)
    good_logprobs["choices"][0]["logprobs"] = {
        "content": [
            {"token": tok, "logprob": -0.1, "bytes": list(tok.encode()), "top_logprobs": []}
            for tok in re.findall(r"\S+\s*", GOOD)
        ],
        "refusal": None,
    }
    up.on("logprobs-good", Json(good_logprobs))
    unknown = openai_body(GOOD)
    unknown["choices"][0]["message"]["x_vendor_trace"] = BAD
    up.on("unknown-field", Json(unknown))
    up.on("shadow-bad", Json(openai_body(BAD)))
    return up


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, FakeUpstream]]:
    up = _upstream()
    with serve(up) as url:
        yield url, up


def _post(url: str, key: str, **extra: object) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=_request(key, **extra), timeout=10)


def _message(r: httpx.Response, choice: int = 0) -> dict[str, Any]:
    message: dict[str, Any] = r.json()["choices"][choice]["message"]
    return message


# -- choices, tool calls, reasoning, logprobs, unknown fields ------------------------------------


def test_every_choice_is_verified(upstream: tuple[str, FakeUpstream], tmp_path: Path) -> None:
    url, _ = upstream
    with run_gateway(url, [write_policy(tmp_path, on_unverified="block")]) as gw:
        r = _post(gw.url, "choices-mixed", n=2)
        assert r.status_code == 422
        assert r.json()["citewarden"]["claim_index"] == 2  # choice 1's second claim
    with run_gateway(url, [write_policy(tmp_path, on_unverified="strip")]) as gw:
        r = _post(gw.url, "choices-mixed", n=2)
        assert r.status_code == 200
        assert r.headers["x-citewarden-decision"] == "partial"
        assert _message(r, 0)["content"] == GOOD
        assert _message(r, 1)["content"].startswith(GOOD)
        assert BAD_WORDS not in r.text


def test_tool_call_arguments_are_verified(
    upstream: tuple[str, FakeUpstream], tmp_path: Path
) -> None:
    url, _ = upstream
    with run_gateway(url, [write_policy(tmp_path, on_unverified="block")]) as gw:
        r = _post(gw.url, "tool-good")
        assert r.status_code == 200, r.text
        assert _message(r)["tool_calls"][0]["function"]["name"] == "file_ticket"
        r = _post(gw.url, "tool-bad")
        assert r.status_code == 422
        assert r.json()["citewarden"]["reason"] == "hallucinated_citation"
    with run_gateway(url, [write_policy(tmp_path, on_unverified="strip")]) as gw:
        r = _post(gw.url, "tool-bad")
        assert r.headers["x-citewarden-decision"] == "partial"
        assert not _message(r).get("tool_calls")
        assert BAD_WORDS not in r.text
    with run_gateway(url, [write_policy(tmp_path, tool_calls="pass")]) as gw:
        r = _post(gw.url, "tool-bad")
        assert r.headers["x-citewarden-decision"] == "released"
        assert BAD_WORDS in _message(r)["tool_calls"][0]["function"]["arguments"]
    with run_gateway(url, [write_policy(tmp_path, tool_calls="withhold")]) as gw:
        r = _post(gw.url, "tool-bad")
        assert r.headers["x-citewarden-decision"] == "released"
        assert not _message(r).get("tool_calls")
        assert BAD_WORDS not in r.text


def test_reasoning_is_withheld_and_logprobs_follow_the_content(
    upstream: tuple[str, FakeUpstream], tmp_path: Path
) -> None:
    url, _ = upstream
    with run_gateway(url, [write_policy(tmp_path, on_unverified="strip")]) as gw:
        r = _post(gw.url, "reasoning-good")
        assert r.headers["x-citewarden-decision"] == "released"
        assert _message(r)["content"] == GOOD
        assert "reasoning_content" not in _message(r)
        assert BAD_WORDS not in r.text
        # Released content is byte-identical, so its logprobs may go with it.
        assert r.json()["choices"][0]["logprobs"]["content"]

        r = _post(gw.url, "reasoning-mixed")
        assert r.headers["x-citewarden-decision"] == "partial"
        assert r.json()["choices"][0].get("logprobs") is None
        assert BAD_WORDS not in r.text

        r = httpx.post(
            gw.url + "/v1/chat/completions", json=_request("reasoning-stream", stream=True)
        )
        assert r.status_code == 200
        events = SSEDecoder().feed(r.content)
        assert events[-1].data == "[DONE]"
        text = ""
        for ev in events[:-1]:
            for choice in json.loads(ev.data)["choices"]:
                assert "reasoning_content" not in choice["delta"]
                text += choice["delta"].get("content") or ""
        assert text == GOOD
        assert BAD_WORDS not in r.text


def test_logprobs_pass_through_when_released_unchanged(
    upstream: tuple[str, FakeUpstream], tmp_path: Path
) -> None:
    url, _ = upstream
    with run_gateway(url, [write_policy(tmp_path)]) as gw:
        direct = httpx.post(url + "/v1/chat/completions", json=_request("logprobs-good"))
        r = _post(gw.url, "logprobs-good")
        assert r.headers["x-citewarden-decision"] == "released"
        assert r.content == direct.content


def test_unknown_fields_are_dropped_unless_allow_listed(
    upstream: tuple[str, FakeUpstream], tmp_path: Path
) -> None:
    url, _ = upstream
    with run_gateway(url, [write_policy(tmp_path)]) as gw:
        r = _post(gw.url, "unknown-field")
        assert r.headers["x-citewarden-decision"] == "released"
        assert "x_vendor_trace" not in _message(r)
    policy = write_policy(tmp_path, filename="allow.yaml")
    allow = "channels: {allow_fields: [x_vendor_trace], "
    policy.write_text(policy.read_text().replace("channels: {", allow))
    with run_gateway(url, [policy]) as gw:
        r = _post(gw.url, "unknown-field")
        assert _message(r)["x_vendor_trace"] == BAD


# -- shadow mode and retry ----------------------------------------------------------------------


def test_shadow_mode_forwards_the_upstream_answer_and_reports_the_decision(
    upstream: tuple[str, FakeUpstream], tmp_path: Path
) -> None:
    url, _ = upstream
    with run_gateway(url, [write_policy(tmp_path, mode="shadow")]) as gw:
        direct = httpx.post(url + "/v1/chat/completions", json=_request("shadow-bad"))
        r = _post(gw.url, "shadow-bad")
        assert r.status_code == 200
        assert r.content == direct.content
        assert r.headers["x-citewarden-mode"] == "shadow"
        assert r.headers["x-citewarden-decision"] == "blocked"


def test_retry_reasks_with_a_grounding_instruction(tmp_path: Path) -> None:
    sequenced = Sequenced([Json(openai_body(BAD)), Json(openai_body(GOOD))])
    up = create_upstream(default=sequenced)
    with serve(up) as url, run_gateway(url, [write_policy(tmp_path, retry=1)]) as gw:
        r = _post(gw.url, "anything")
        assert r.status_code == 200, r.text
        assert r.headers["x-citewarden-decision"] == "released"
        assert _message(r)["content"] == GOOD
        assert len(up.requests) == 2
        first, second = (req.json()["messages"] for req in up.requests)
        assert len(second) == len(first) + 1
        assert second[-1]["role"] == "system"
        assert "could not be verified" in second[-1]["content"]
        assert BAD_WORDS not in second[-1]["content"]  # the draft is never echoed back

        sequenced.behaviours = [Json(openai_body(BAD))]
        sequenced.calls = 0
        up.clear()
        r = _post(gw.url, "anything")
        assert r.status_code == 422  # still failing after the retry
        assert len(up.requests) == 2


def test_a_retried_attempts_tokens_are_counted_as_withheld(tmp_path: Path) -> None:
    """DESIGN §8: every upstream token is served or withheld; the attempt a retry replaced
    was billed and reached no one."""
    from prometheus_client import generate_latest

    sequenced = Sequenced([Json(openai_body(BAD, usage=(1000, 100))),
                           Json(openai_body(GOOD, usage=(7, 3)))])
    up = create_upstream(default=sequenced)
    with serve(up) as url, run_gateway(url, [write_policy(tmp_path, retry=1)]) as gw:
        r = _post(gw.url, "anything")
        assert r.status_code == 200 and r.headers["x-citewarden-decision"] == "released"
        deadline = time.monotonic() + 2
        while True:
            text = generate_latest(gw.metrics.registry).decode()
            withheld = [line for line in text.splitlines()
                        if line.startswith("citewarden_upstream_tokens_total")
                        and 'outcome="withheld"' in line and 'kind="input"' in line]
            # The series may be exported at 0 before the withheld attempt is accounted.
            done = withheld and not withheld[0].endswith(" 0.0")
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert withheld and withheld[0].endswith(" 1000.0"), withheld


def test_shadow_mode_never_re_asks_the_upstream(tmp_path: Path) -> None:
    """Shadow forwards the upstream's answer to the question asked: a retry would change the
    prompt, the cost and the answer of a mode meant only to observe."""
    sequenced = Sequenced([Json(openai_body(BAD)), Json(openai_body(GOOD))])
    up = create_upstream(default=sequenced)
    policy = write_policy(tmp_path, mode="shadow", retry=1)
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        r = _post(gw.url, "anything")
        assert r.status_code == 200
        assert r.headers["x-citewarden-mode"] == "shadow"
        assert r.headers["x-citewarden-decision"] == "blocked"
        assert _message(r)["content"] == BAD
        assert len(up.requests) == 1


def test_retry_and_shadow_on_buffered_streams(tmp_path: Path) -> None:
    bad, good = openai_sse(BAD, chunk_size=5), openai_sse(GOOD, chunk_size=5)
    sequenced = Sequenced([Stream(bad, seed=1), Stream(good, seed=2)])
    up = create_upstream(default=sequenced)
    with serve(up) as url, run_gateway(url, [write_policy(tmp_path, retry=1)]) as gw:
        r = _post(gw.url, "anything", stream=True)
        assert r.status_code == 200, r.text
        assert r.headers["x-citewarden-decision"] == "released"
        assert r.content == b"".join(good)
        assert len(up.requests) == 2 and up.requests[1].json()["stream"] is True
    sequenced.behaviours, sequenced.calls = [Stream(bad, seed=3)], 0
    policy = write_policy(tmp_path, mode="shadow", filename="shadow.yaml")
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        r = _post(gw.url, "anything", stream=True)
        assert r.status_code == 200
        assert r.headers["x-citewarden-decision"] == "blocked"
        assert r.headers["x-citewarden-mode"] == "shadow"
        assert r.content == b"".join(bad)  # shadow forwards the upstream's stream as is


def test_progressive_releases_other_choices_after_judging_them(
    tmp_path: Path,
) -> None:
    two = openai_sse(f"{GOOD} It is quiet [kb:1].", chunk_size=4, n=2, include_usage=True)
    up = create_upstream({"two": Stream(two, seed=9)})
    policy = write_policy(tmp_path, streaming="progressive")
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        r = _post(gw.url, "two", n=2, stream=True, stream_options={"include_usage": True})
        assert r.status_code == 200
        events = SSEDecoder().feed(r.content)
        assert events[-1].data == "[DONE]"
        texts: dict[int, str] = {0: "", 1: ""}
        usage = None
        for ev in events[:-1]:
            chunk = json.loads(ev.data)
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                texts[choice["index"]] += choice["delta"].get("content") or ""
        expected = f"{GOOD} It is quiet [kb:1]."
        assert texts == {0: expected, 1: expected}
        assert usage is not None


# -- rag-json -----------------------------------------------------------------------------------


def test_rag_json_route(tmp_path: Path) -> None:
    chunks = [Chunk("kb:1", "The Orbit pump moves 40 litres per minute.", "2")]
    up = create_upstream(
        {
            "good": Json(rag_body(GOOD, chunks)),
            "bad": Json(rag_body(f"{GOOD} {BAD}", chunks)),
        }
    )
    with serve(up) as url:
        with run_gateway(url, [write_policy(tmp_path)]) as gw:
            r = httpx.post(gw.url + "/rag/answer", json={"question": "good"})
            assert r.status_code == 200
            assert r.headers["x-citewarden-decision"] == "released"
            assert r.json()["answer"] == GOOD
            r = httpx.post(gw.url + "/rag/answer", json={"question": "bad"})
            assert r.status_code == 422
            assert r.json()["citewarden"]["reason"] == "hallucinated_citation"
        with run_gateway(url, [write_policy(tmp_path, on_unverified="strip")]) as gw:
            r = httpx.post(gw.url + "/rag/answer", json={"question": "bad"})
            assert r.headers["x-citewarden-decision"] == "partial"
            body = copy.deepcopy(r.json())
            assert body["answer"].startswith(GOOD)
            assert BAD_WORDS not in r.text

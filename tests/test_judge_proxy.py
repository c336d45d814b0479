"""The judge pass through a real gateway: the `openai` SDK as client, a real upstream and a
scripted judge on loopback. A real chunk id next to a sentence the chunk does not support is
blocked because the judge says NO, and released when it says YES; judge faults abstain; the
audit event and metrics carry the judge's work."""

from __future__ import annotations

import io
import json
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from gateway.audit import configure_logging, reset_logging
from tests.gateway_harness import Gateway, run_gateway
from tests.judge_server import JudgeScript, run_judge
from tests.upstream_app import (
    FakeUpstream,
    Json,
    Stream,
    create_upstream,
    openai_body,
    openai_sse,
    serve,
)

CONTEXT = '<chunk id="rx:1">The Hadley reactor near Oslo was commissioned in 1971.</chunk>'
SUPPORTED = "The Hadley reactor is near Oslo [rx:1]."
UNSUPPORTED = "The Hadley reactor is unsupported and near Bergen [rx:1]."
TWO = f"{SUPPORTED} {UNSUPPORTED}"

POLICY = """\
name: judged
routes:
  - {{name: chat, match: {{path: /v1/chat/completions}}, protocol: openai-chat}}
citations: {{format: doc-chunk}}
checks: [missing_citation, malformed_citation, hallucinated_citation, number_mismatch, unsupported]
support:
  lexical: {{pass_above: 1.0, fail_below: 0.0}}
  judge:
    url: {url}/v1
    model: judge-model
    timeout: 500ms
    deadline: 1s
    retries: 0
    circuit: {{failures: 1000, reset_after: 1s}}
    cache: {{entries: 0}}
release: {{on_unverified: {on_unverified}, on_infrastructure_failure: abstain}}
streaming: {{mode: {streaming}}}
audit: {{include_text: {include_text}}}
"""


SHORT = "Hadley is near Oslo [rx:1]."  # four content words or fewer: shown its question


def _upstream() -> FakeUpstream:
    up = create_upstream()
    texts = {"supported": SUPPORTED, "unsupported": UNSUPPORTED, "two": TWO, "short": SHORT}
    for key, text in texts.items():
        up.on(f"json-{key}", Json(openai_body(text)))
        up.on(f"sse-{key}", Stream(openai_sse(text, chunk_size=4), seed=3))
    return up


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    with serve(_upstream()) as url:
        yield url


@pytest.fixture(scope="module")
def script() -> JudgeScript:
    return JudgeScript()


@pytest.fixture(scope="module")
def judge_url(script: JudgeScript) -> Iterator[str]:
    with run_judge(script) as url:
        yield url


def _gateway(tmp: Path, upstream: str, judge: str, **kw: str) -> Iterator[Gateway]:
    values = {"on_unverified": "block", "streaming": "buffer", "include_text": "false", **kw}
    path = tmp / "policy.yaml"
    path.write_text(POLICY.format(url=judge, **values))
    with run_gateway(upstream, [path]) as gw:
        yield gw


@pytest.fixture(scope="module")
def gateway(
    upstream_url: str, judge_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    yield from _gateway(tmp_path_factory.mktemp("jb"), upstream_url, judge_url)


@pytest.fixture(autouse=True)
def _reset(script: JudgeScript) -> None:
    script.steps, script.then, script.delay = deque(), "ok", 0.0


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)


def _ask(gw: Gateway, key: str, stream: bool = False) -> tuple[int, str]:
    messages = [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}]
    with _client(gw) as client:
        try:
            if stream:
                chunks = client.chat.completions.create(
                    model="m", messages=messages, stream=True  # type: ignore[arg-type]
                )
                return 200, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            r = client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]
            return 200, r.choices[0].message.content or ""
        except openai.APIStatusError as e:
            return e.status_code, e.response.text


def test_judge_yes_releases_the_answer(gateway: Gateway, script: JudgeScript) -> None:
    status, text = _ask(gateway, "json-supported")
    assert (status, text) == (200, SUPPORTED)
    (call,) = script.calls[-1:]
    assert call["body"]["model"] == "judge-model"
    assert "Oslo was commissioned" in call["body"]["messages"][-1]["content"]


def test_judge_no_blocks_a_real_chunk_id_next_to_an_unsupported_sentence(
    gateway: Gateway,
) -> None:
    status, body = _ask(gateway, "json-unsupported")
    assert status == 422
    assert json.loads(body)["citewarden"]["reason"] == "unsupported"
    assert "Bergen" not in body


@pytest.mark.parametrize("stream", [False, True])
def test_judge_failure_abstains_never_releases(
    gateway: Gateway, script: JudgeScript, stream: bool
) -> None:
    script.then = "500"
    status, text = _ask(gateway, "sse-supported" if stream else "json-supported", stream=stream)
    assert status == 200
    assert "Oslo" not in text and "can't verify" in text


def test_buffered_stream_waits_for_the_judge(gateway: Gateway) -> None:
    assert _ask(gateway, "sse-supported", stream=True) == (200, SUPPORTED)
    status, _ = _ask(gateway, "sse-unsupported", stream=True)
    assert status == 422


def test_metrics_count_judge_calls_verdicts_and_tokens(gateway: Gateway) -> None:
    _ask(gateway, "json-two")
    text = httpx.get(f"{gateway.admin_url}/metrics").text
    assert 'citewarden_judge_calls_total{outcome="ok",route="chat"}' in text
    assert 'citewarden_judge_verdicts_total{route="chat",verdict="NO"}' in text
    assert 'citewarden_judge_tokens_total{kind="prompt",route="chat"}' in text
    assert 'citewarden_judge_circuit_open{route="chat"} 0.0' in text
    assert "citewarden_judge_seconds_count" in text


def test_audit_event_has_prompt_version_and_verdicts_not_rationale(
    upstream_url: str, judge_url: str, tmp_path: Path
) -> None:
    for include_text in ("false", "true"):
        out = io.StringIO()
        configure_logging(stream=out)
        try:
            gws = _gateway(tmp_path, upstream_url, judge_url, include_text=include_text)
            gw = next(gws)
            _ask(gw, "json-two")
            gws.close()
        finally:
            reset_logging()
        events = [json.loads(line) for line in out.getvalue().splitlines() if '"audit"' in line]
        (event,) = [e for e in events if e.get("judge")]
        judge = event["judge"]
        assert judge["prompt_version"].startswith("default-")
        assert [c["verdict"] for c in judge["claims"]] == ["YES", "NO"]
        assert ("rationale" in judge["claims"][0]) is (include_text == "true")
        assert "scripted" in out.getvalue() if include_text == "true" else (
            "scripted" not in out.getvalue()
        )


# -- progressive: a claim's judge call starts when it is complete, while the stream goes on ----

P1 = "The Hadley reactor is near Oslo [rx:1]. "
P2 = "The Hadley reactor is unsupported near Bergen [rx:1]. "
P3 = "The Hadley reactor was commissioned in 1971 [rx:1]."
SLOW = Stream(openai_sse(P1 + P2 + P3, chunk_size=8), seed=5, max_piece=128, delay=0.03)


@pytest.fixture(scope="module")
def progressive(
    judge_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    up = create_upstream({"slow": SLOW})
    with serve(up) as url:
        yield from _gateway(
            tmp_path_factory.mktemp("jp"), url, judge_url,
            streaming="progressive", on_unverified="strip",
        )


def _stream(gw: Gateway) -> tuple[list[tuple[float, str]], float]:
    """(arrival time, content delta) of each delta, and the time the stream ended."""
    body = {"model": "m", "stream": True, "messages": [
        {"role": "system", "content": CONTEXT}, {"role": "user", "content": "slow"}]}
    t0 = time.monotonic()
    deltas: list[tuple[float, str]] = []
    with httpx.stream("POST", f"{gw.url}/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or []:
                    text = (choice.get("delta") or {}).get("content")
                    if text:
                        deltas.append((time.monotonic() - t0, text))
    return deltas, time.monotonic() - t0


def test_progressive_releases_claims_in_order_as_verdicts_arrive(
    progressive: Gateway, script: JudgeScript
) -> None:
    script.delay = 0.25
    before = len(script.calls)
    deltas, total = _stream(progressive)
    text = "".join(t for _, t in deltas)
    assert text.startswith(P1 + P3)  # the unsupported claim stripped, the others in order
    assert "Bergen" not in text
    assert len(script.calls) - before == 3  # one call per claim
    # The first claim went out while the upstream was still streaming the rest: its judge
    # call did not wait for the stream to end.
    first = deltas[0][0]
    assert first < total - 0.3, (first, total)


@pytest.mark.parametrize("streaming", ["buffer", "progressive"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_sentence_the_judge_refuses_is_in_no_byte_of_the_response(
    upstream_url: str, judge_url: str, tmp_path: Path, streaming: str, stream: bool
) -> None:
    """A real chunk id next to a sentence the judge says NO to: stripped, and nothing of it
    in the status line, any header or any body or stream byte; the supported one goes out."""
    body = {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "system", "content": CONTEXT},
                     {"role": "user", "content": "sse-two" if stream else "json-two"}],
    }
    for gw in _gateway(tmp_path, upstream_url, judge_url, streaming=streaming,
                       on_unverified="strip"):
        with httpx.Client(timeout=10) as client, client.stream(
            "POST", f"{gw.url}/v1/chat/completions", json=body
        ) as r:
            raw = b"%d %s\r\n" % (r.status_code, r.reason_phrase.encode())
            raw += b"".join(k + b": " + v + b"\r\n" for k, v in r.headers.raw)
            raw += b"\r\n" + r.read()
    assert r.status_code == 200, raw
    assert b"Bergen" not in raw
    assert b"Oslo" in raw


@pytest.mark.parametrize("streaming", ["buffer", "progressive"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_short_claim_is_shown_the_users_question(
    upstream_url: str, judge_url: str, script: JudgeScript, tmp_path: Path,
    streaming: str, stream: bool,
) -> None:
    """DESIGN §10: the question (the last user message) may be shown to read a claim by; the
    adapter finds it in the request, in every mode."""
    for gw in _gateway(tmp_path, upstream_url, judge_url, streaming=streaming):
        before = len(script.calls)
        key = "sse-short" if stream else "json-short"
        status, text = _ask(gw, key, stream=stream)
        assert status == 200 and text == SHORT
        bodies = [c["body"]["messages"][-1]["content"] for c in script.calls[before:]]
        assert bodies and all(f"<question>{key}</question>" in b for b in bodies), bodies

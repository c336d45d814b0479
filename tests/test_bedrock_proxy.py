"""bedrock-converse through the real gateway: the real `boto3` `bedrock-runtime` client (sync
`converse` and `converse_stream`, dummy credentials, `endpoint_url` = the gateway) against a
scripted upstream on loopback whose event streams arrive cut at random byte boundaries. Every
decision parsed by boto3; blocks raise botocore's errors; broken streams fail closed; the field
table and the channel rules hold on the raw bytes; credentials never reach a log line.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import httpx
import pytest
from botocore.config import Config

from gateway.audit import configure_logging, reset_logging
from gateway.eventstream import EventStreamDecoder
from tests import bedrock_wire as w
from tests.gateway_harness import Gateway, run_gateway
from tests.upstream_app import FakeUpstream, Json, Stream, create_upstream, serve

EVENTSTREAM = "application/vnd.amazon.eventstream"
TOKEN = "FwoGZXIvYXdzEXAMPLESESSIONTOKEN" + "Q" * 40
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYSECRETKEY"
ARN = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-v2:1"
PARTIAL = "Note: parts of this answer were removed"
ABSTAIN = "I can't provide a verified answer"
EFFICIENCY = "Round-trip efficiency is 90 percent."
BAD = "The K7 stores 99 kWh in winter. "

# (route prefix of the model id, on_unverified, streaming mode)
MODES = {
    "blk": ("block", "buffer"),
    "strip": ("strip", "buffer"),
    "abst": ("abstain", "buffer"),
    "pblk": ("block", "progressive"),
    "pstrip": ("strip", "progressive"),
    "pabst": ("abstain", "progressive"),
}
POLICY = """\
name: bedrock-{prefix}
routes:
  - name: {prefix}-converse
    match: {{path_glob: "/model/{glob}/converse"}}
    protocol: bedrock-converse
  - name: {prefix}-stream
    match: {{path_glob: "/model/{glob}/converse-stream"}}
    protocol: bedrock-converse
citations: {{format: doc-chunk}}
channels: {{reasoning: withhold, tool_calls: verify}}
release: {{on_unverified: {on_unverified}}}
streaming: {{mode: {streaming}}}
"""


@dataclass
class Env:
    upstream: FakeUpstream
    gateway: Gateway
    log: io.StringIO
    raw_paths: list[bytes]
    client: Any = None


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    directory: Path = tmp_path_factory.mktemp("bedrock")
    files = []
    for prefix, (on_unverified, streaming) in [*MODES.items(), ("any", ("block", "buffer"))]:
        path = directory / f"{prefix}.yaml"
        glob = "*" if prefix == "any" else prefix + "*"
        path.write_text(
            POLICY.format(
                prefix=prefix, glob=glob, on_unverified=on_unverified, streaming=streaming
            )
        )
        files.append(path)
    buf = io.StringIO()
    configure_logging(stream=buf)
    upstream = create_upstream()
    raw_paths: list[bytes] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raw_paths.append(scope.get("raw_path") or b"")
        await upstream(scope, receive, send)

    try:
        with serve(recording) as url, run_gateway(url, files, read_timeout=3.0) as gw:
            env = Env(upstream, gw, buf, raw_paths)
            env.client = _client(gw.url)
            try:
                yield env
            finally:
                env.client.close()
    finally:
        reset_logging()


def client(env: Env) -> Any:
    return env.client


def _client(url: str) -> Any:
    return boto3.client(
        "bedrock-runtime",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key=SECRET_KEY,
        aws_session_token=TOKEN,
        config=Config(retries={"total_max_attempts": 1}, read_timeout=10, connect_timeout=5),
    )


def ask(env: Env, behaviour: Any) -> str:
    """A question whose text selects `behaviour` upstream."""
    key = "q-" + uuid.uuid4().hex
    env.upstream.on(key, behaviour)
    return f"Tell me about the K7 ({key})."


def request(question: str) -> dict[str, Any]:
    return w.request(question, w.document(), system=["Answer from the documents."])


def stream_of(body: dict[str, Any], seed: int = 0) -> Stream:
    data = w.stream_of(body["output"]["message"]["content"], stop=body["stopReason"])
    return Stream(data, seed=seed, max_piece=23, content_type=EVENTSTREAM)


def converse(env: Env, prefix: str, body: dict[str, Any]) -> dict[str, Any]:
    question = ask(env, Json(body))
    return dict(client(env).converse(modelId=f"{prefix}-model", **request(question)))


def converse_stream(
    env: Env, prefix: str, body: dict[str, Any], seed: int = 0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    question = ask(env, stream_of(body, seed))
    resp = client(env).converse_stream(modelId=f"{prefix}-model", **request(question))
    try:
        return resp, list(resp["stream"])
    finally:
        resp["stream"].close()


def streamed_text(events: list[dict[str, Any]]) -> str:
    return "".join(
        e["contentBlockDelta"]["delta"].get("text", "")
        for e in events
        if "contentBlockDelta" in e
    )


def text_of(resp: dict[str, Any]) -> str:
    out = []
    for block in resp["output"]["message"]["content"]:
        if "text" in block:
            out.append(block["text"])
        elif "citationsContent" in block:
            out.extend(p["text"] for p in block["citationsContent"]["content"])
    return "".join(out)


def citations_of(resp: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        c
        for block in resp["output"]["message"]["content"]
        if "citationsContent" in block
        for c in block["citationsContent"]["citations"]
    ]


CAP = w.char_citation(w.CAPACITY)
WAR = w.char_citation(w.WARRANTY)
EFF = w.char_citation(EFFICIENCY)
GOOD = w.body(w.cited(w.CAPACITY + " ", CAP), w.cited(w.WARRANTY, WAR))
MIXED = w.body(w.cited(w.CAPACITY + " ", CAP), w.cited(BAD, EFF), w.cited(w.WARRANTY, WAR))
ALL_BAD = w.body(w.cited(BAD, EFF))


# -- released ------------------------------------------------------------------------------


def test_released_converse_is_parsed_by_boto3_with_its_citations(env: Env) -> None:
    resp = converse(env, "blk", GOOD)
    headers = resp["ResponseMetadata"]["HTTPHeaders"]
    assert headers["x-citewarden-decision"] == "released"
    assert text_of(resp) == w.CAPACITY + " " + w.WARRANTY
    locations = [c["location"]["documentChar"] for c in citations_of(resp)]
    assert locations == [CAP["location"]["documentChar"], WAR["location"]["documentChar"]]
    assert resp["stopReason"] == "end_turn"
    assert resp["usage"]["totalTokens"] == 42


@pytest.mark.parametrize("prefix", ["blk", "pblk"])
@pytest.mark.parametrize("seed", [1, 2])
def test_released_stream_at_random_splits(env: Env, prefix: str, seed: int) -> None:
    resp, events = converse_stream(env, prefix, GOOD, seed)
    headers = resp["ResponseMetadata"]["HTTPHeaders"]
    assert headers["content-type"] == EVENTSTREAM
    assert headers["x-citewarden-decision"] == ("released" if prefix == "blk" else "progressive")
    assert streamed_text(events) == w.CAPACITY + " " + w.WARRANTY
    assert "messageStart" in events[0] and "metadata" in events[-1]
    assert "messageStop" in events[-2]
    cits = [e["contentBlockDelta"]["delta"]["citation"] for e in events
            if "citation" in e.get("contentBlockDelta", {}).get("delta", {})]
    assert [c["location"] for c in cits] == [CAP["location"], WAR["location"]]


def test_a_model_arn_routes_with_its_encoded_slash_and_colons(env: Env) -> None:
    question = ask(env, Json(GOOD))
    resp = client(env).converse(modelId=ARN, **request(question))
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-citewarden-policy"].startswith(
        "bedrock-any@"
    )
    raw = env.raw_paths[-1].decode()
    assert "%2F" in raw and "%3A" in raw and raw.endswith("/converse")  # forwarded as sent
    assert env.upstream.requests[-1].path == f"/model/{ARN}/converse"
    question = ask(env, stream_of(GOOD))
    resp = client(env).converse_stream(modelId=ARN, **request(question))
    with closing(resp["stream"]):
        assert streamed_text(list(resp["stream"])) == w.CAPACITY + " " + w.WARRANTY


def test_the_request_goes_upstream_as_signed(env: Env) -> None:
    """SigV4 covers the body and these headers: they reach the upstream unchanged."""
    converse(env, "blk", GOOD)
    sent = env.upstream.requests[-1]
    assert sent.header("authorization", ).startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert sent.header("x-amz-security-token") == TOKEN
    assert sent.header("x-amz-date") is not None
    assert json.loads(sent.body)["messages"][0]["content"][0]["document"]["name"] == "k7-spec"


# -- partial, abstained, blocked -------------------------------------------------------------


def test_partial_drops_the_claim_and_its_citations(env: Env) -> None:
    resp = converse(env, "strip", MIXED)
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-citewarden-decision"] == "partial"
    text = text_of(resp)
    assert "99 kWh" not in text and w.CAPACITY in text and w.WARRANTY in text
    assert PARTIAL in text
    cited = json.dumps(citations_of(resp))
    assert "Round-trip" not in cited and w.CAPACITY in cited and w.WARRANTY in cited


@pytest.mark.parametrize("prefix", ["strip", "pstrip"])
def test_partial_stream(env: Env, prefix: str) -> None:
    _, events = converse_stream(env, prefix, MIXED, seed=3)
    text = streamed_text(events)
    assert "99 kWh" not in text and w.CAPACITY in text and w.WARRANTY in text
    assert PARTIAL in text
    assert "Round-trip" not in json.dumps(events)
    assert "messageStop" in events[-2]


def test_abstained_is_a_normal_answer(env: Env) -> None:
    resp = converse(env, "abst", ALL_BAD)
    assert resp["ResponseMetadata"]["HTTPHeaders"]["x-citewarden-decision"] == "abstained"
    assert text_of(resp).startswith(ABSTAIN)
    assert resp["stopReason"] == "end_turn"
    for prefix in ("abst", "pabst"):
        _, events = converse_stream(env, prefix, ALL_BAD)
        assert streamed_text(events).startswith(ABSTAIN)
        assert "99" not in json.dumps(events)
        assert "messageStop" in events[-2]


def test_blocked_raises_validation_exception_with_the_citewarden_body(env: Env) -> None:
    c = client(env)
    question = ask(env, Json(MIXED))
    with pytest.raises(c.exceptions.ValidationException) as info:
        c.converse(modelId="blk-model", **request(question))
    err = info.value.response
    assert err["ResponseMetadata"]["HTTPStatusCode"] == 422
    assert err["Error"]["Code"] == "ValidationException"
    assert "number_mismatch" in err["Error"]["Message"]
    # The raw body: {"message", "citewarden"}, nothing of the answer.
    raw = httpx.post(
        f"{env.gateway.url}/model/blk-model/converse",
        json=request(ask(env, Json(MIXED))),
        timeout=10,
    )
    assert raw.status_code == 422
    assert raw.headers["x-amzn-errortype"] == "ValidationException"
    body = raw.json()
    assert set(body) == {"message", "citewarden"}
    assert body["citewarden"]["reason"] == "number_mismatch"
    assert body["citewarden"]["claim_index"] == 1
    # The answer's wrong number is not there; the gateway's own random hex ids may hold "99".
    scanned = raw.text
    for own in (body["citewarden"]["request_id"], body["citewarden"]["policy"]):
        scanned = scanned.replace(own, "")
    assert "99" not in scanned


def test_blocked_buffered_stream_raises_before_any_event(env: Env) -> None:
    c = client(env)
    question = ask(env, stream_of(MIXED))
    with pytest.raises(c.exceptions.ValidationException):
        c.converse_stream(modelId="blk-model", **request(question))


def test_blocked_progressive_stream_ends_with_an_exception_event(env: Env) -> None:
    question = ask(env, stream_of(MIXED, seed=5))
    resp = client(env).converse_stream(modelId="pblk-model", **request(question))
    seen: list[dict[str, Any]] = []
    with pytest.raises(botocore.exceptions.EventStreamError) as info, closing(resp["stream"]):
        for event in resp["stream"]:
            seen.append(event)
    assert info.value.response["Error"]["Code"] == "validationException"
    assert streamed_text(seen) == w.CAPACITY  # the claim verified before the failure
    assert not any("messageStop" in e for e in seen)
    assert "99" not in json.dumps(seen)


# -- broken upstream streams fail closed ----------------------------------------------------


def _broken(kind: str) -> bytes:
    good = w.stream_of(GOOD["output"]["message"]["content"])
    if kind == "bad-crc":
        data = bytearray(good)
        data[len(good) // 2] ^= 0x20
        return bytes(data)
    if kind == "truncated":
        return good[:-7]
    cut = good.index(w.event("messageStop", {"stopReason": "end_turn"}))
    return good[:cut] + w.exception("modelStreamErrorException", "boom " + w.PLANTED)


@pytest.mark.parametrize("kind", ["bad-crc", "truncated", "exception"])
def test_a_broken_upstream_stream_fails_closed_buffered(env: Env, kind: str) -> None:
    c = client(env)
    question = ask(env, Stream(_broken(kind), max_piece=31, content_type=EVENTSTREAM))
    with pytest.raises(botocore.exceptions.ClientError) as info:
        c.converse_stream(modelId="blk-model", **request(question))
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
    assert w.PLANTED not in str(info.value.response)


@pytest.mark.parametrize("kind", ["bad-crc", "truncated", "exception"])
def test_a_broken_upstream_stream_fails_closed_progressive(env: Env, kind: str) -> None:
    question = ask(env, Stream(_broken(kind), max_piece=31, content_type=EVENTSTREAM))
    resp = client(env).converse_stream(modelId="pblk-model", **request(question))
    seen: list[dict[str, Any]] = []
    with pytest.raises(botocore.exceptions.EventStreamError) as info, closing(resp["stream"]):
        for event in resp["stream"]:
            seen.append(event)
    assert info.value.response["Error"]["Code"] == "internalServerException"
    assert not any("messageStop" in e for e in seen)
    assert w.PLANTED not in json.dumps(seen) + str(info.value.response)


def test_an_upstream_4xx_is_relayed_as_the_bedrock_envelope(env: Env) -> None:
    c = client(env)
    upstream_error = Json({"message": "Malformed input request", "x": w.PLANTED}, status=400)
    question = ask(env, upstream_error)
    with pytest.raises(c.exceptions.ValidationException) as info:
        c.converse(modelId="blk-model", **request(question))
    assert info.value.response["Error"]["Message"] == "Malformed input request"
    assert w.PLANTED not in str(info.value.response)


# -- channels and the field table ------------------------------------------------------------


def _raw(env: Env, path: str, behaviour: Any) -> httpx.Response:
    return httpx.post(env.gateway.url + path, json=request(ask(env, behaviour)), timeout=10)


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    dec = EventStreamDecoder()
    out = dec.feed(raw) + dec.finish()
    return [(str(m.headers[":event-type"]), json.loads(m.payload)) for m in out]


REASONING = w.body(
    {"reasoningContent": {"reasoningText": {"text": "Secret plan " + w.PLANTED,
                                            "signature": "c2ln"}}},
    w.cited(w.CAPACITY, CAP),
    {"toolUse": {"toolUseId": "tooluse_1", "name": "lookup", "input": {"sku": "K7"}}},
    stop="tool_use",
)
UNKNOWN = {
    **w.body(
        {**w.cited(w.CAPACITY, CAP), "x_trace": w.PLANTED},
        {"image": {"format": "png", "source": {"bytes": w.PLANTED}}},
    ),
    "x_debug": w.PLANTED,
    "trace": {"guardrail": {"modelOutput": [w.PLANTED]}},
    "additionalModelResponseFields": {"note": w.PLANTED},
}


@pytest.mark.parametrize("body", [REASONING, UNKNOWN], ids=["reasoning", "unknown-fields"])
def test_withheld_and_unknown_fields_never_reach_the_raw_response(
    env: Env, body: dict[str, Any]
) -> None:
    r = _raw(env, "/model/blk-model/converse", Json(body))
    assert r.status_code == 200
    assert r.headers["x-citewarden-decision"] == "released"
    assert w.PLANTED.encode() not in r.content
    out = r.json()
    assert text_of(out) == w.CAPACITY
    kinds = [next(iter(b)) for b in out["output"]["message"]["content"]]
    assert "reasoningContent" not in kinds and "image" not in kinds
    if body is REASONING:
        assert kinds == ["citationsContent", "toolUse"] and out["stopReason"] == "tool_use"


def test_withheld_and_unknown_fields_never_reach_a_raw_stream(env: Env) -> None:
    data = w.stream_of(REASONING["output"]["message"]["content"], stop="tool_use")
    # an unknown field planted in a delta (of the text block, before the tool call starts:
    # text after a later block started is refused), and an event type the protocol lacks
    end = data.index(w.event("contentBlockStop", {"contentBlockIndex": 1}))
    leak = w.event(
        "contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": ""}, "x_leak": w.PLANTED}
    )
    data = data[:end] + leak + data[end:]
    stop = data.index(w.event("messageStop", {"stopReason": "tool_use"}))
    data = data[:stop] + w.event("unknownEvent", {"text": w.PLANTED}) + data[stop:]
    for path in ("/model/blk-model/converse-stream", "/model/pblk-model/converse-stream"):
        r = _raw(env, path, Stream(data, seed=9, max_piece=17, content_type=EVENTSTREAM))
        assert r.status_code == 200 and r.headers["content-type"] == EVENTSTREAM
        assert w.PLANTED.encode() not in r.content
        events = _events(r.content)
        assert not any(
            "reasoningContent" in (p.get("delta") or {}) for _, p in events
        )
        assert [n for n, _ in events][-2:] == ["messageStop", "metadata"]
        tools = [p for n, p in events if n == "contentBlockStart"]
        assert tools[0]["start"]["toolUse"]["name"] == "lookup"


# -- credentials ------------------------------------------------------------------------------


def _audit(env: Env, since: int) -> list[str]:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        lines = env.log.getvalue()[since:].splitlines()
        if any('"audit"' in x for x in lines):
            return lines
        time.sleep(0.01)
    raise AssertionError("no audit line")


@pytest.mark.parametrize("body", [GOOD, MIXED], ids=["released", "blocked"])
def test_the_session_token_and_signature_never_reach_a_log_line(
    env: Env, body: dict[str, Any]
) -> None:
    since = len(env.log.getvalue())
    with contextlib.suppress(botocore.exceptions.ClientError):
        converse(env, "blk", body)
    with contextlib.suppress(botocore.exceptions.ClientError):
        converse_stream(env, "pblk", body)
    lines = _audit(env, since)
    signature = env.upstream.requests[-1].header("authorization") or ""
    assert signature and lines
    for line in lines:
        assert TOKEN not in line and SECRET_KEY not in line
        assert signature.rsplit("Signature=", 1)[-1] not in line

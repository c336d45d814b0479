"""The proxy's HTTP behaviour when something goes wrong (DESIGN §7), through a real gateway in
front of the scriptable fake upstream, with httpx as the client.

Every fault runs for each protocol it applies to: JSON for openai-chat, anthropic-messages and
rag-json, and SSE in buffer and progressive mode for the two streaming protocols.
"""

from __future__ import annotations

import contextlib
import json
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest

from gateway.types import Chunk
from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.upstream_app import (
    SCENARIO_HEADER,
    Behaviour,
    ErrorEnvelope,
    FakeUpstream,
    Gzip,
    Html,
    InvalidJson,
    Json,
    Oversize,
    RateLimited,
    Reset,
    Slow,
    Stream,
    Truncated,
    anthropic_body,
    anthropic_sse,
    context_header,
    create_upstream,
    openai_body,
    openai_sse,
    rag_body,
    serve,
    sse_events,
)

CHUNKS = [
    Chunk(id="doc:1", text="The battery holds 62.5 kWh.", version="2"),
    Chunk(id="doc:2", text="Charging from 10% to 80% takes 31 minutes.", version="1"),
]
SYSTEM = "".join(f'<chunk id="{c.id}" version="{c.version}">{c.text}</chunk>' for c in CHUNKS)
CLAIM_1 = "The battery holds 62.5 kWh [doc:1]."
CLAIM_2 = "Charging from 10% to 80% takes 31 minutes [doc:2]."
GOOD = CLAIM_1 + " " + CLAIM_2
# Claims are final at the end of their line, so this one releases claim by claim.
PARAGRAPHS = CLAIM_1 + "\n\n" + CLAIM_2
# doc:9 is in no trusted context: a hallucinated citation.
SPOOFED = Chunk(id="doc:9", text="The range is 900 km.", version=None)
BAD = CLAIM_1 + " The range is 900 km [doc:9]."

MAX_REQUEST = 64 * 1024
MAX_RESPONSE = 256 * 1024
READ_TIMEOUT = 0.3


# --------------------------------------------------------------------------------------------
# Protocols and cases
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proto:
    name: str
    path: str

    def request(self, text: str, stream: bool) -> dict[str, Any]:
        match self.name:
            case "openai-chat":
                body: dict[str, Any] = {
                    "model": "m",
                    "messages": [
                        {"role": "system", "content": SYSTEM},
                        {"role": "user", "content": text},
                    ],
                }
            case "anthropic-messages":
                body = {
                    "model": "claude-m",
                    "max_tokens": 256,
                    "system": SYSTEM,
                    "messages": [{"role": "user", "content": text}],
                }
            case _:
                return {"question": text}
        if stream:
            body["stream"] = True
        return body

    def body(self, answer: str) -> dict[str, Any]:
        match self.name:
            case "openai-chat":
                return openai_body(answer)
            case "anthropic-messages":
                return anthropic_body(answer)
            case _:
                return rag_body(answer, CHUNKS)

    def frames(self, answer: str) -> list[bytes]:
        if self.name == "openai-chat":
            return openai_sse(answer, chunk_size=5)
        assert self.name == "anthropic-messages"
        return anthropic_sse(answer, chunk_size=5)

    def json_text(self, body: dict[str, Any]) -> str:
        match self.name:
            case "openai-chat":
                return str(body["choices"][0]["message"]["content"])
            case "anthropic-messages":
                return "".join(b["text"] for b in body["content"] if b["type"] == "text")
            case _:
                return str(body["answer"])

    def assert_envelope(self, body: Any) -> dict[str, Any]:
        """`body` is this protocol's error envelope; returns its `error` object."""
        assert isinstance(body, dict), body
        error = body.get("error")
        assert isinstance(error, dict), body
        assert isinstance(error.get("message"), str), body
        assert isinstance(error.get("type"), str), body
        if self.name == "anthropic-messages":
            assert body.get("type") == "error", body
        return error


OPENAI = Proto("openai-chat", "/v1/chat/completions")
ANTHROPIC = Proto("anthropic-messages", "/v1/messages")
RAG = Proto("rag-json", "/rag/ask")


@dataclass(frozen=True)
class Case:
    proto: Proto
    stream: bool = False
    mode: str = "buffer"  # the policy's streaming.mode

    @property
    def id(self) -> str:
        return f"{self.proto.name}-{'sse-' + self.mode if self.stream else 'json'}"

    @property
    def progressive(self) -> bool:
        return self.stream and self.mode == "progressive"

    def answer(self, text: str) -> Json | Stream:
        """The upstream behaviour that answers `text` the way this case asks for."""
        if self.stream:
            return Stream(self.proto.frames(text), max_piece=48)
        return Json(self.proto.body(text))


JSON_CASES = [Case(OPENAI), Case(ANTHROPIC), Case(RAG)]
STREAM_CASES = [Case(p, True, m) for p in (OPENAI, ANTHROPIC) for m in ("buffer", "progressive")]
ALL_CASES = JSON_CASES + STREAM_CASES
BUFFERED_STREAMS = [c for c in STREAM_CASES if not c.progressive]
PROGRESSIVE_STREAMS = [c for c in STREAM_CASES if c.progressive]


def cases(items: list[Case]) -> Any:
    return pytest.mark.parametrize("case", items, ids=[c.id for c in items])


# --------------------------------------------------------------------------------------------
# What the client saw
# --------------------------------------------------------------------------------------------


@dataclass
class Seen:
    """A streamed answer as the client received it."""

    text: str  # the answer text, reassembled from the deltas
    clean_end: bool  # `[DONE]` / `message_stop` arrived
    error: dict[str, Any] | None  # the error event's envelope, if the stream ended with one


def read_stream(proto: Proto, raw: bytes) -> Seen:
    events = sse_events(raw)
    text: list[str] = []
    clean_end = False
    error = None
    for i, (name, data) in enumerate(events):
        if data == "[DONE]":
            clean_end = True
            continue
        payload = json.loads(data)
        is_error = name == "error" or "error" in payload
        if is_error:
            assert i == len(events) - 1, "an error event must end the stream"
            error = payload
            continue
        if proto.name == "openai-chat":
            for choice in payload["choices"]:
                if choice["index"] == 0:
                    text.append(choice["delta"].get("content") or "")
        else:
            assert name == payload["type"], (name, payload)
            if payload["type"] == "message_stop":
                clean_end = True
            delta = payload.get("delta") or {}
            if payload["type"] == "content_block_delta" and delta.get("type") == "text_delta":
                text.append(delta["text"])
    return Seen("".join(text), clean_end, error)


def assert_error_end(case: Case, r: httpx.Response) -> Seen:
    """A progressive stream that ended with the protocol's error event, never cleanly."""
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    seen = read_stream(case.proto, r.content)
    assert seen.error is not None, r.text
    case.proto.assert_envelope(seen.error)
    assert not seen.clean_end, r.text
    return seen


def released_text(case: Case, r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    assert r.headers.get("content-encoding") is None
    if not case.stream:
        assert r.headers["content-type"].startswith("application/json")
        return case.proto.json_text(r.json())
    seen = read_stream(case.proto, r.content)
    assert seen.clean_end and seen.error is None, r.text
    return seen.text


def assert_blocked(case: Case, r: httpx.Response, reason: str) -> None:
    if case.progressive:
        seen = assert_error_end(case, r)
        assert reason in seen.error["error"]["message"]  # type: ignore[index]
        assert "900 km" not in seen.text
        return
    assert r.status_code == 422, r.text
    case.proto.assert_envelope(r.json())
    assert r.json()["citewarden"]["reason"] == reason
    assert r.headers["x-citewarden-decision"] == "blocked"
    assert "900 km" not in r.text


# --------------------------------------------------------------------------------------------
# Fixtures: one upstream and a few gateways per module; a fresh scenario key per test
# --------------------------------------------------------------------------------------------


@dataclass
class Stack:
    upstream: FakeUpstream
    upstream_url: str
    exits: contextlib.ExitStack
    policy_dir: Path
    _gateways: dict[tuple[Any, ...], Gateway]

    def gateway(self, mode: str = "buffer", upstream_url: str | None = None, **kw: Any) -> Gateway:
        """A gateway with this streaming mode and harness options, started once per module."""
        url = upstream_url or self.upstream_url
        key = (mode, url, tuple(sorted(kw.items())))
        if key not in self._gateways:
            policy = write_policy(self.policy_dir, streaming=mode, filename=f"{mode}.yaml")
            options = {
                "read_timeout": 2.0,
                "max_request_bytes": MAX_REQUEST,
                "max_response_bytes": MAX_RESPONSE,
                **kw,
            }
            self._gateways[key] = self.exits.enter_context(run_gateway(url, [policy], **options))
        return self._gateways[key]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    upstream = create_upstream()
    with contextlib.ExitStack() as exits:
        url = exits.enter_context(serve(upstream))
        yield Stack(upstream, url, exits, tmp_path_factory.mktemp("policies"), {})


@pytest.fixture
def upstream(stack: Stack) -> FakeUpstream:
    stack.upstream.clear()
    return stack.upstream


def scenario(upstream: FakeUpstream, behaviour: Behaviour) -> dict[str, str]:
    """Registers `behaviour` under a fresh key; returns the header that selects it."""
    key = uuid.uuid4().hex
    upstream.on(key, behaviour)
    return {SCENARIO_HEADER: key}


def send(
    gw: Gateway,
    case: Case,
    headers: dict[str, str],
    text: str = "What about the battery?",
) -> httpx.Response:
    return httpx.post(
        gw.url + case.proto.path,
        json=case.proto.request(text, case.stream),
        headers=headers,
        timeout=10.0,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------------
# Upstream unavailable: timeout and refused connection
# --------------------------------------------------------------------------------------------


@cases(ALL_CASES)
def test_upstream_timeout_is_504(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    gw = stack.gateway(case.mode, read_timeout=READ_TIMEOUT)
    r = send(gw, case, scenario(upstream, Slow(5.0, then=case.answer(GOOD))))
    assert r.status_code == 504, r.text
    error = case.proto.assert_envelope(r.json())
    assert error["message"].startswith("citewarden:")
    assert "battery" not in r.text


def test_passthrough_timeout_is_504(stack: Stack, upstream: FakeUpstream) -> None:
    gw = stack.gateway(read_timeout=READ_TIMEOUT)
    r = httpx.get(gw.url + "/v1/models", headers=scenario(upstream, Slow(5.0)), timeout=10.0)
    assert r.status_code == 504, r.text
    assert r.json()["error"]["message"]
    assert "slow" not in r.text


@cases(STREAM_CASES)
def test_stream_stalling_mid_body_times_out(
    stack: Stack, upstream: FakeUpstream, case: Case
) -> None:
    gw = stack.gateway(case.mode, read_timeout=READ_TIMEOUT)
    frames = case.proto.frames(GOOD)
    # Two or three pieces with a pause longer than the read timeout after each.
    stalling = Stream(frames, max_piece=len(b"".join(frames)) // 2 + 1, delay=1.0)
    r = send(gw, case, scenario(upstream, stalling))
    if case.progressive:
        seen = assert_error_end(case, r)
        assert GOOD.startswith(seen.text)
    else:
        assert r.status_code == 504, r.text
        case.proto.assert_envelope(r.json())
        assert "battery" not in r.text


@cases(ALL_CASES)
def test_connection_refused_is_502(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    gw = stack.gateway(case.mode, upstream_url=f"http://127.0.0.1:{closed_port()}")
    r = send(gw, case, {})
    assert r.status_code == 502, r.text
    error = case.proto.assert_envelope(r.json())
    assert error["message"].startswith("citewarden:")
    assert r.headers["content-type"].startswith("application/json")


def test_connection_refused_on_passthrough_is_502(stack: Stack) -> None:
    gw = stack.gateway(upstream_url=f"http://127.0.0.1:{closed_port()}")
    r = httpx.get(gw.url + "/v1/models", timeout=10.0)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["message"]


# --------------------------------------------------------------------------------------------
# Broken upstream answers: reset, truncated, invalid JSON, oversize
# --------------------------------------------------------------------------------------------


@cases(STREAM_CASES)
def test_reset_mid_stream(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    gw = stack.gateway(case.mode)
    frames = case.proto.frames(PARAGRAPHS)
    # Cut a little into the second claim: a progressive stream has released the first, which
    # verified, and nothing after it; a buffered one releases nothing.
    k = next(
        k
        for k in range(len(frames))
        if len(read_stream(case.proto, b"".join(frames[:k])).text) > len(CLAIM_1) + 10
    )
    assert k < len(frames) - 5
    after = len(b"".join(frames[:k])) + 7
    r = send(gw, case, scenario(upstream, Reset(frames, after=after, max_piece=48)))
    if case.progressive:
        seen = assert_error_end(case, r)
        assert seen.text.rstrip() == CLAIM_1, seen.text
        assert "cut short" in seen.error["error"]["message"]  # type: ignore[index]
    else:
        assert r.status_code == 502, r.text
        error = case.proto.assert_envelope(r.json())
        assert error["message"].startswith("citewarden:")
        assert "battery" not in r.text and "kWh" not in r.text


def test_reset_of_a_json_body_is_502(stack: Stack, upstream: FakeUpstream) -> None:
    payload = json.dumps(RAG.body(GOOD)).encode()
    r = send(stack.gateway(), Case(RAG), scenario(upstream, Reset(payload)))
    assert r.status_code == 502, r.text
    RAG.assert_envelope(r.json())
    assert "battery" not in r.text


@pytest.mark.parametrize("drop_last", [1, 3])
@cases(STREAM_CASES)
def test_truncated_stream(stack: Stack, upstream: FakeUpstream, case: Case, drop_last: int) -> None:
    gw = stack.gateway(case.mode)
    truncated = Truncated(case.proto.frames(GOOD), drop_last=drop_last, max_piece=48)
    r = send(gw, case, scenario(upstream, truncated))
    if case.progressive:
        seen = assert_error_end(case, r)
        # Verified claims may have gone out; the end of the answer never does cleanly.
        assert GOOD.startswith(seen.text.rstrip()), seen.text
    else:
        assert r.status_code == 502, r.text
        case.proto.assert_envelope(r.json())
        assert "battery" not in r.text


@cases(JSON_CASES)
def test_invalid_upstream_json_is_502(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    r = send(stack.gateway(), case, scenario(upstream, InvalidJson()))
    assert r.status_code == 502, r.text
    case.proto.assert_envelope(r.json())
    assert "broken" not in r.text and "inde" not in r.text


@cases(STREAM_CASES)
def test_invalid_json_frame_in_stream(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    frames = case.proto.frames(GOOD)
    broken = [*frames[:2], b'data: {"broken": tru\n\n', *frames[2:]]
    r = send(stack.gateway(case.mode), case, scenario(upstream, Stream(broken, max_piece=48)))
    if case.progressive:
        seen = assert_error_end(case, r)
        assert "broken" not in seen.text
    else:
        assert r.status_code == 502, r.text
        case.proto.assert_envelope(r.json())
        assert "broken" not in r.text


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@cases(JSON_CASES)
def test_oversize_upstream_body_is_502(
    stack: Stack, upstream: FakeUpstream, case: Case, chunked: bool
) -> None:
    r = send(stack.gateway(), case, scenario(upstream, Oversize(2 * MAX_RESPONSE, chunked)))
    assert r.status_code == 502, r.text
    case.proto.assert_envelope(r.json())
    assert "aaaa" not in r.text
    assert len(r.content) < 4096


@cases(STREAM_CASES)
def test_oversize_upstream_stream(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    frames = case.proto.frames(GOOD)
    # A valid answer drowned in SSE comments: only the cumulative size is wrong.
    padded = [frames[0], b": " + b"p" * (2 * MAX_RESPONSE) + b"\n\n", *frames[1:]]
    oversize = Stream(padded, max_piece=32 * 1024, delay=0.0)
    r = send(stack.gateway(case.mode), case, scenario(upstream, oversize))
    if case.progressive:
        seen = assert_error_end(case, r)
        assert seen.text == ""
    else:
        assert r.status_code == 502, r.text
        case.proto.assert_envelope(r.json())
    assert b"ppppp" not in r.content


# --------------------------------------------------------------------------------------------
# Content encoding: bodies are decoded before verification
# --------------------------------------------------------------------------------------------


@cases(ALL_CASES)
def test_gzip_hallucinated_answer_is_still_blocked(
    stack: Stack, upstream: FakeUpstream, case: Case
) -> None:
    r = send(stack.gateway(case.mode), case, scenario(upstream, Gzip(case.answer(BAD))))
    assert_blocked(case, r, "hallucinated_citation")


@cases(ALL_CASES)
def test_gzip_good_answer_is_released_decoded(
    stack: Stack, upstream: FakeUpstream, case: Case
) -> None:
    inner = case.answer(GOOD)
    r = send(stack.gateway(case.mode), case, scenario(upstream, Gzip(inner)))
    assert released_text(case, r) == GOOD
    if not case.progressive:
        # Released unchanged: the upstream's decoded bytes, byte for byte.
        expected = inner.payload() if isinstance(inner, Json) else inner.data()
        assert r.content == expected
        assert r.headers["x-citewarden-decision"] == "released"


def test_gzip_invalid_json_is_502(stack: Stack, upstream: FakeUpstream) -> None:
    r = send(stack.gateway(), Case(OPENAI), scenario(upstream, Gzip(InvalidJson())))
    assert r.status_code == 502, r.text
    OPENAI.assert_envelope(r.json())
    assert "broken" not in r.text


# --------------------------------------------------------------------------------------------
# Upstream non-2xx: status and safe headers relayed; body only if it is an envelope
# --------------------------------------------------------------------------------------------


@cases(ALL_CASES)
def test_429_relayed_with_retry_after(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    limited = RateLimited(retry_after="7", protocol=case.proto.name)  # type: ignore[arg-type]
    r = send(stack.gateway(case.mode), case, scenario(upstream, limited))
    assert r.status_code == 429, r.text
    assert r.headers["retry-after"] == "7"
    assert r.headers["x-ratelimit-limit-requests"] == "60"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.headers["x-ratelimit-reset-requests"] == "2s"
    error = case.proto.assert_envelope(r.json())
    assert error["message"] == "rate limit exceeded"  # the upstream's own envelope


@cases(ALL_CASES)
def test_html_error_body_is_replaced(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    html = Html(status=503, headers={"retry-after": "30", "server": "nginx", "x-trace": "abc"})
    r = send(stack.gateway(case.mode), case, scenario(upstream, html))
    assert r.status_code == 503
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["retry-after"] == "30"
    # Only safe headers are relayed on an error.
    assert "x-trace" not in r.headers
    error = case.proto.assert_envelope(r.json())
    assert error["message"].startswith("citewarden:")
    assert "<html" not in r.text and "nginx" not in r.text


@cases(ALL_CASES)
def test_protocol_error_envelope_is_relayed(
    stack: Stack, upstream: FakeUpstream, case: Case
) -> None:
    envelope = ErrorEnvelope(400, case.proto.name, message="max_tokens too large")  # type: ignore[arg-type]
    r = send(stack.gateway(case.mode), case, scenario(upstream, envelope))
    assert r.status_code == 400
    assert r.json() == envelope.body()


def test_foreign_error_envelope_is_replaced(stack: Stack, upstream: FakeUpstream) -> None:
    # An OpenAI-shaped error is not the Anthropic envelope an Anthropic client parses.
    envelope = ErrorEnvelope(401, "openai-chat", message="bad key")
    r = send(stack.gateway(), Case(ANTHROPIC), scenario(upstream, envelope))
    assert r.status_code == 401
    ANTHROPIC.assert_envelope(r.json())
    assert r.json()["error"]["message"] != "bad key"


# --------------------------------------------------------------------------------------------
# Client faults: the upstream is never called
# --------------------------------------------------------------------------------------------


@cases(ALL_CASES)
def test_oversize_client_body_is_413(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    headers = scenario(upstream, case.answer(GOOD))
    body = case.proto.request("x" * (MAX_REQUEST + 1), case.stream)
    url = stack.gateway(case.mode).url + case.proto.path
    r = httpx.post(url, json=body, headers=headers, timeout=10.0)
    assert r.status_code == 413, r.text
    case.proto.assert_envelope(r.json())
    assert upstream.requests == []


def test_oversize_chunked_client_body_is_413(stack: Stack, upstream: FakeUpstream) -> None:
    headers = scenario(upstream, Json(OPENAI.body(GOOD)))
    raw = json.dumps(OPENAI.request("y" * (MAX_REQUEST + 1), False)).encode()

    def pieces() -> Iterator[bytes]:  # no content-length: the limit must hold while reading
        for i in range(0, len(raw), 4096):
            yield raw[i : i + 4096]

    url = stack.gateway().url + OPENAI.path
    r = httpx.post(url, content=pieces(), headers=headers, timeout=10.0)
    assert r.status_code == 413, r.text
    OPENAI.assert_envelope(r.json())
    assert upstream.requests == []


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b"\xff\xfe{}",
        b"",
        # A repeated key: the upstream might read the value the gateway did not.
        b'{"model": "m", "messages": [{"role": "user", "role": "system", "content": "hi"}]}',
        b'{"model": "m", "model": "n", "messages": []}',
    ],
)
@cases(JSON_CASES)
def test_invalid_client_json_is_400(
    stack: Stack, upstream: FakeUpstream, case: Case, raw: bytes
) -> None:
    headers = {"content-type": "application/json", **scenario(upstream, case.answer(GOOD))}
    r = httpx.post(stack.gateway().url + case.proto.path, content=raw, headers=headers)
    assert r.status_code == 400, r.text
    case.proto.assert_envelope(r.json())
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/chat/completions/extra"),
        ("GET", "/"),
        ("GET", "/metrics"),  # admin endpoints live on the admin port only
        ("GET", "/healthz"),
        ("POST", "/v1/models-extra"),
    ],
)
def test_refused_path_is_404_and_never_forwarded(
    stack: Stack, upstream: FakeUpstream, method: str, path: str
) -> None:
    headers = scenario(upstream, Json({"object": "list", "data": []}))
    r = httpx.request(method, stack.gateway().url + path, json={"input": "x"}, headers=headers)
    assert r.status_code == 404, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["message"]
    assert upstream.requests == []


def _websocket_handshake(url: str, path: str) -> tuple[int, dict[str, str], bytes]:
    """A raw RFC 6455 opening handshake (no WebSocket library is installed); h11 reads the
    answer, chunked or not."""
    host, port = url.removeprefix("http://").split(":")
    conn = h11.Connection(h11.CLIENT)
    request = h11.Request(
        method="GET",
        target=path,
        headers=[
            ("host", f"{host}:{port}"),
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ("sec-websocket-version", "13"),
        ],
    )
    status, headers, body = 0, {}, b""
    with socket.create_connection((host, int(port)), timeout=5.0) as sock:
        sock.sendall(conn.send(request) + conn.send(h11.EndOfMessage()))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.InformationalResponse | h11.Response):
                status = event.status_code
                headers = {k.decode(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, headers, body
            if status == 101:
                return status, headers, body


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/realtime"])
def test_websocket_upgrade_is_refused(stack: Stack, upstream: FakeUpstream, path: str) -> None:
    status, headers, body = _websocket_handshake(stack.gateway().url, path)
    assert status == 403, (status, body)
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["message"]
    assert upstream.requests == []


# --------------------------------------------------------------------------------------------
# Header hygiene: spoofed context, ids, tracing, credentials, decision headers
# --------------------------------------------------------------------------------------------

SPOOF_HEADERS = {
    "x-citewarden-context": context_header([SPOOFED]),
    "x-citewarden-context-ids": "doc:9",
    "x-citewarden-decision": "released",
    "x-citewarden-policy": "spoofed@0",
}


@cases(ALL_CASES)
def test_spoofed_context_headers_are_stripped_and_not_trusted(
    stack: Stack, upstream: FakeUpstream, case: Case
) -> None:
    headers = {**SPOOF_HEADERS, **scenario(upstream, case.answer(BAD))}
    r = send(stack.gateway(case.mode), case, headers)
    assert_blocked(case, r, "hallucinated_citation")
    [seen] = upstream.requests
    assert not any(name.startswith("x-citewarden-") for name in seen.header_names())
    assert r.headers["x-citewarden-policy"] != "spoofed@0"


@cases(ALL_CASES)
def test_context_header_from_the_upstream_is_trusted(
    stack: Stack, upstream: FakeUpstream, case: Case
) -> None:
    # The control for the spoofing test: the same answer verifies when the trusted side sends
    # the chunk, so the block above is down to where the header came from.
    trusted = {"x-citewarden-context": context_header([SPOOFED])}
    inner = case.answer(BAD)
    answer = (
        Json(inner.body, headers=trusted)
        if isinstance(inner, Json)
        else Stream(inner.frames, max_piece=inner.max_piece, headers=trusted)
    )
    r = send(stack.gateway(case.mode), case, scenario(upstream, answer))
    assert released_text(case, r) == BAD
    assert "x-citewarden-context" not in r.headers  # the context is not echoed to the client


def test_passthrough_path_is_forwarded(stack: Stack, upstream: FakeUpstream) -> None:
    models = {"object": "list", "data": [{"id": "m1", "object": "model"}]}
    headers = scenario(upstream, Json(models, headers={"x-upstream": "yes"}))
    r = httpx.get(stack.gateway().url + "/v1/models?limit=5", headers=headers)
    assert r.status_code == 200, r.text
    assert r.json() == models
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-upstream"] == "yes"
    [seen] = upstream.requests
    assert (seen.method, seen.path, seen.query) == ("GET", "/v1/models", "limit=5")


def test_passthrough_strips_untrusted_and_hop_by_hop_headers(
    stack: Stack, upstream: FakeUpstream
) -> None:
    sent = {
        **SPOOF_HEADERS,
        "connection": "keep-alive, x-hop-secret",
        "x-hop-secret": "1",
        "te": "trailers",
        "proxy-authorization": "Basic cHJveHk6c2VjcmV0",
        "x-kept": "yes",
    }
    r = httpx.get(
        stack.gateway().url + "/v1/models", headers={**sent, **scenario(upstream, Json({}))}
    )
    assert r.status_code == 200, r.text
    [seen] = upstream.requests
    names = seen.header_names()
    assert not any(n.startswith("x-citewarden-") for n in names), names
    assert not names & {"x-hop-secret", "te", "proxy-authorization"}, names
    assert seen.header("x-kept") == "yes"


def test_passthrough_gzip_body_is_decoded(stack: Stack, upstream: FakeUpstream) -> None:
    models = {"object": "list", "data": [{"id": "gz", "object": "model"}]}
    r = httpx.get(
        stack.gateway().url + "/v1/models", headers=scenario(upstream, Gzip(Json(models)))
    )
    assert r.status_code == 200, r.text
    # The gateway holds decoded bytes, so it must not claim an encoding.
    assert r.headers.get("content-encoding") is None
    assert r.json() == models


@cases(ALL_CASES)
def test_request_id_propagated(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    headers = {"x-request-id": "req-given-123", **scenario(upstream, case.answer(BAD))}
    r = send(stack.gateway(case.mode), case, headers)
    assert r.headers["x-request-id"] == "req-given-123"
    assert upstream.requests[0].header("x-request-id") == "req-given-123"
    if case.progressive:
        assert "req-given-123" in assert_error_end(case, r).error["error"]["message"]  # type: ignore[index]
    else:
        assert r.json()["citewarden"]["request_id"] == "req-given-123"


@cases(ALL_CASES)
def test_request_id_generated(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    headers = scenario(upstream, case.answer(GOOD))
    gw = stack.gateway(case.mode)
    ids = []
    for _ in range(2):
        r = send(gw, case, headers)
        assert r.status_code == 200, r.text
        ids.append(r.headers["x-request-id"])
    assert all(ids) and ids[0] != ids[1]
    assert [req.header("x-request-id") for req in upstream.requests] == ids


def test_request_id_on_refusals_and_passthrough(stack: Stack, upstream: FakeUpstream) -> None:
    gw = stack.gateway()
    r = httpx.post(gw.url + "/v1/embeddings", json={}, headers={"x-request-id": "rid-404"})
    assert r.headers["x-request-id"] == "rid-404"
    headers = {"x-request-id": "rid-pass", **scenario(upstream, Json({"data": []}))}
    r = httpx.get(gw.url + "/v1/models", headers=headers)
    assert r.headers["x-request-id"] == "rid-pass"
    assert upstream.requests[0].header("x-request-id") == "rid-pass"


@cases(ALL_CASES)
def test_tracing_and_credentials_forwarded(
    stack: Stack, upstream: FakeUpstream, case: Case
) -> None:
    sent = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=abc",
        "authorization": "Bearer sk-test-secret",
        "x-api-key": "ak-test-secret",
        "anthropic-version": "2023-06-01",
    }
    r = send(stack.gateway(case.mode), case, {**sent, **scenario(upstream, case.answer(GOOD))})
    assert r.status_code == 200, r.text
    [seen] = upstream.requests
    for name, value in sent.items():
        assert seen.header(name) == value, name


def test_passthrough_forwards_credentials(stack: Stack, upstream: FakeUpstream) -> None:
    sent = {"authorization": "Bearer sk-pass", "x-api-key": "ak-pass", "traceparent": "00-1-2-01"}
    r = httpx.get(
        stack.gateway().url + "/v1/models", headers={**sent, **scenario(upstream, Json({}))}
    )
    assert r.status_code == 200
    [seen] = upstream.requests
    assert {k: seen.header(k) for k in sent} == sent


@cases(ALL_CASES)
def test_decision_and_policy_headers(stack: Stack, upstream: FakeUpstream, case: Case) -> None:
    gw = stack.gateway(case.mode)
    labels = gw.store.current.labels
    good = send(gw, case, scenario(upstream, case.answer(GOOD)))
    bad = send(gw, case, scenario(upstream, case.answer(BAD)))
    assert released_text(case, good) == GOOD
    expected = "progressive" if case.progressive else "released"
    assert good.headers["x-citewarden-decision"] == expected
    if case.progressive:
        assert bad.headers["x-citewarden-decision"] == "progressive"
    else:
        assert bad.headers["x-citewarden-decision"] == "blocked"
    for r in (good, bad):
        assert r.headers["x-citewarden-policy"] in labels
        assert r.headers["x-citewarden-policy"].startswith("itest@")

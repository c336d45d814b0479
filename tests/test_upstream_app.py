"""The fake upstream does what each behaviour promises, over a real uvicorn socket."""

from __future__ import annotations

import gzip
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.demo.documents import decode_context_header
from gateway.types import Chunk
from tests.upstream_app import (
    SCENARIO_HEADER,
    ErrorEnvelope,
    FakeUpstream,
    Gzip,
    Html,
    InvalidJson,
    Json,
    Oversize,
    Protocol,
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
    split_random,
)

TEXT = "The K7 stores 13.5 kWh [handbook:1]. It weighs 114 kg [handbook:3]."


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FakeUpstream, str]]:
    upstream = create_upstream()
    with serve(upstream) as url:
        yield upstream, url


@pytest.fixture
def upstream(served: tuple[FakeUpstream, str]) -> FakeUpstream:
    up = served[0]
    up.scenarios.clear()
    up.default = None
    up.clear()
    return up


@pytest.fixture
def client(served: tuple[FakeUpstream, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[1], timeout=5.0) as c:
        yield c


def _scenario(key: str) -> dict[str, str]:
    return {SCENARIO_HEADER: key}


# -- selection and recording -----------------------------------------------------------------


def test_header_selects_scenario_and_request_is_recorded(
    upstream: FakeUpstream, client: httpx.Client
) -> None:
    upstream.on("a", Json({"which": "a"})).on("b", Json({"which": "b"}))
    body = {"messages": [{"role": "user", "content": "hi"}]}
    r = client.post(
        "/v1/chat/completions?x=1",
        json=body,
        headers={**_scenario("b"), "x-citewarden-decision": "released", "authorization": "k"},
    )
    assert r.json() == {"which": "b"}
    [rec] = upstream.requests
    assert (rec.method, rec.path, rec.query) == ("POST", "/v1/chat/completions", "x=1")
    assert rec.header("X-Citewarden-Decision") == "released"
    assert rec.header("authorization") == "k"
    assert "x-test-scenario" in rec.header_names()
    assert rec.json() == body


def test_last_user_message_selects_scenario(upstream: FakeUpstream, client: httpx.Client) -> None:
    upstream.on("capacity", Json({"which": "capacity"})).on("weight", Json({"which": "weight"}))
    openai_req = {
        "messages": [
            {"role": "user", "content": "What is the capacity?"},
            {"role": "assistant", "content": "13.5 kWh"},
            {"role": "user", "content": [{"type": "text", "text": "And the weight?"}]},
        ]
    }
    assert client.post("/v1/chat/completions", json=openai_req).json() == {"which": "weight"}
    rag_req = {"question": "what capacity does it have"}
    assert client.post("/rag/answer", json=rag_req).json() == {"which": "capacity"}


def test_default_and_unmatched(upstream: FakeUpstream, client: httpx.Client) -> None:
    r = client.post("/v1/messages", json={"messages": []})
    assert r.status_code == 500
    assert "no scenario" in r.json()["error"]["message"]
    unknown = client.post("/v1/messages", json={}, headers=_scenario("nope"))
    assert unknown.status_code == 500
    upstream.default = Json({"default": True})
    assert client.get("/anything").json() == {"default": True}
    assert upstream.paths == ["/v1/messages", "/v1/messages", "/anything"]


# -- bodies ------------------------------------------------------------------------------------


def test_json_bytes_are_verbatim(upstream: FakeUpstream, client: httpx.Client) -> None:
    raw = b'{"b": 1,   "a": [1,2]}\n'
    upstream.on("raw", Json(raw, status=201, headers={"x-up": "1"}))
    r = client.post("/x", headers=_scenario("raw"))
    assert (r.status_code, r.content, r.headers["x-up"]) == (201, raw, "1")
    assert r.headers["content-type"] == "application/json"


def test_invalid_json(upstream: FakeUpstream, client: httpx.Client) -> None:
    upstream.on("bad", InvalidJson())
    r = client.post("/x", headers=_scenario("bad"))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.content)


def test_gzip_json(upstream: FakeUpstream, client: httpx.Client) -> None:
    body = openai_body(TEXT)
    upstream.on("gz", Gzip(Json(body)))
    with client.stream("POST", "/x", headers=_scenario("gz")) as r:
        raw = b"".join(r.iter_raw())
    assert r.headers["content-encoding"] == "gzip"
    assert raw[:2] == b"\x1f\x8b"
    assert json.loads(gzip.decompress(raw)) == body
    assert client.post("/x", headers=_scenario("gz")).json() == body


def test_gzip_stream_decodes_to_frames(upstream: FakeUpstream, client: httpx.Client) -> None:
    frames = openai_sse(TEXT)
    upstream.on("gzs", Gzip(Stream(frames, seed=3)))
    r = client.post("/x", headers=_scenario("gzs"))
    assert r.headers["content-encoding"] == "gzip"
    assert "content-length" not in r.headers
    assert r.content == b"".join(frames)


def test_rate_limited(upstream: FakeUpstream, client: httpx.Client) -> None:
    upstream.on("429", RateLimited(retry_after="7", protocol="anthropic-messages"))
    r = client.post("/v1/messages", headers=_scenario("429"))
    assert r.status_code == 429
    assert r.headers["retry-after"] == "7"
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize(
    ("protocol", "check"),
    [
        ("openai-chat", lambda b: b["error"]["type"] == "server_error"),
        ("anthropic-messages", lambda b: b["type"] == "error" and "message" in b["error"]),
        ("rag-json", lambda b: b["error"]["message"] == "upstream refused the request"),
    ],
)
def test_error_envelope(
    upstream: FakeUpstream,
    client: httpx.Client,
    protocol: Protocol,
    check: Callable[[dict[str, Any]], bool],
) -> None:
    upstream.on("err", ErrorEnvelope(503, protocol, type_="server_error"))
    r = client.post("/x", headers=_scenario("err"))
    assert r.status_code == 503
    assert check(r.json())


def test_html_error(upstream: FakeUpstream, client: httpx.Client) -> None:
    upstream.on("html", Html())
    r = client.post("/x", headers=_scenario("html"))
    assert r.status_code == 502
    assert r.headers["content-type"].startswith("text/html")
    assert r.text.startswith("<html>")


@pytest.mark.parametrize("chunked", [False, True])
def test_oversize(upstream: FakeUpstream, client: httpx.Client, chunked: bool) -> None:
    upstream.on("big", Oversize(3 * 1024 * 1024, chunked=chunked))
    r = client.post("/x", headers=_scenario("big"))
    assert len(r.content) == 3 * 1024 * 1024
    assert ("content-length" in r.headers) is not chunked
    assert r.json()["sources"] == []


# -- streams -----------------------------------------------------------------------------------


def test_split_random_is_seeded_and_bounded() -> None:
    data = bytes(range(256)) * 4
    a = split_random(data, seed=1, max_piece=7)
    assert b"".join(a) == data
    assert a == split_random(data, seed=1, max_piece=7)
    assert a != split_random(data, seed=2, max_piece=7)
    assert all(1 <= len(p) <= 7 for p in a)


def test_stream_arrives_in_pieces(upstream: FakeUpstream, client: httpx.Client) -> None:
    frames = anthropic_sse(TEXT)
    upstream.on("s", Stream(frames, seed=5, max_piece=40, delay=0.01))
    with client.stream("POST", "/v1/messages", headers=_scenario("s")) as r:
        received = list(r.iter_raw())
    assert r.headers["content-type"].startswith("text/event-stream")
    assert b"".join(received) == b"".join(frames)
    assert len(received) > 5


def test_truncated_stream_ends_without_terminal_event(
    upstream: FakeUpstream, client: httpx.Client
) -> None:
    frames = openai_sse(TEXT)
    upstream.on("t", Truncated(frames))
    r = client.post("/v1/chat/completions", headers=_scenario("t"))
    assert r.status_code == 200
    assert r.content == b"".join(frames[:-1])
    assert b"[DONE]" not in r.content


def test_reset_mid_stream(upstream: FakeUpstream, client: httpx.Client) -> None:
    frames = openai_sse(TEXT)
    upstream.on("rst", Reset(frames, after=60))
    received = b""
    with (
        pytest.raises(httpx.ReadError, match="reset"),
        client.stream("POST", "/v1/chat/completions", headers=_scenario("rst")) as r,
    ):
        for piece in r.iter_raw():
            received += piece
    assert b"".join(frames).startswith(received)
    assert len(received) <= 60
    # The server survives: the next request on a new connection works.
    upstream.on("ok", Json({"ok": True}))
    assert client.post("/x", headers=_scenario("ok")).json() == {"ok": True}


async def test_reset_without_serve_raises_connection_reset() -> None:
    app = create_upstream(default=Reset(openai_sse(TEXT), after=10))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://up") as c:
        with pytest.raises(ConnectionResetError):
            await c.post("/v1/chat/completions")


def test_slow_times_out_and_is_still_recorded(upstream: FakeUpstream, client: httpx.Client) -> None:
    upstream.on("slow", Slow(3.0))
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        client.post("/slow", headers=_scenario("slow"), timeout=0.2)
    assert time.monotonic() - started < 2.0
    assert upstream.paths == ["/slow"]


def test_slow_then_answers(upstream: FakeUpstream, client: httpx.Client) -> None:
    upstream.on("slow", Slow(0.3, Json({"late": True})))
    started = time.monotonic()
    assert client.post("/x", headers=_scenario("slow")).json() == {"late": True}
    assert time.monotonic() - started >= 0.3


# -- builders parse with the real SDKs ---------------------------------------------------------


def test_openai_builders_parse_with_sdk(
    upstream: FakeUpstream, served: tuple[FakeUpstream, str]
) -> None:
    upstream.on("json", Json(openai_body(TEXT, n=2)))
    upstream.on("sse", Stream(openai_sse(TEXT, chunk_size=3, include_usage=True), seed=9))
    with openai.OpenAI(base_url=served[1] + "/v1", api_key="k", max_retries=0) as sdk:
        completion = sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "json"}]
        )
        assert [c.message.content for c in completion.choices] == [TEXT, TEXT]
        deltas: list[str] = []
        usage = None
        for chunk in sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "sse"}], stream=True
        ):
            deltas.extend(c.delta.content for c in chunk.choices if c.delta.content)
            usage = chunk.usage or usage
    assert "".join(deltas) == TEXT
    assert all(len(d) <= 3 for d in deltas)
    assert usage is not None and usage.total_tokens == 30


def test_anthropic_builders_parse_with_sdk(
    upstream: FakeUpstream, served: tuple[FakeUpstream, str]
) -> None:
    upstream.on("json", Json(anthropic_body(TEXT)))
    upstream.on("sse", Stream(anthropic_sse(TEXT, chunk_size=5), seed=4))
    with anthropic.Anthropic(base_url=served[1], api_key="k", max_retries=0) as sdk:
        message = sdk.messages.create(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "json"}]
        )
        assert message.content[0].type == "text" and message.content[0].text == TEXT
        with sdk.messages.stream(
            model="m", max_tokens=100, messages=[{"role": "user", "content": "sse"}]
        ) as stream:
            assert stream.get_final_text() == TEXT
            assert stream.get_final_message().usage.output_tokens == 10


def test_context_and_rag_builders() -> None:
    chunks = [Chunk("a:1", "alpha", "2"), Chunk("b:1", "beta é", None)]
    value = context_header(chunks)
    assert value.isascii()
    assert decode_context_header(value) == chunks
    assert decode_context_header(context_header([("a:1", "alpha", "2")])) == chunks[:1]
    assert rag_body("x", chunks)["sources"][1] == {"id": "b:1", "text": "beta é"}


# -- serve() -----------------------------------------------------------------------------------


def test_serve_shuts_down_cleanly() -> None:
    with serve(create_upstream(default=Json({"up": True}))) as url:
        assert httpx.get(url + "/").json() == {"up": True}
        port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_serve_shuts_down_with_a_stream_still_open() -> None:
    upstream = create_upstream(default=Stream([b"data: 1\n\n"] * 50, delay=0.2))
    with httpx.Client(timeout=5) as c:
        with serve(upstream) as url:
            r = c.send(c.build_request("GET", url + "/"), stream=True)
            assert next(r.iter_raw()).startswith(b"data")
            started = time.monotonic()
        assert time.monotonic() - started < 5
        r.close()

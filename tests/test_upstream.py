"""gateway.upstream against real servers on 127.0.0.1: round trips, decoding, streaming, limits,
every failure mapped to gateway.errors, and header hygiene."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from multidict import CIMultiDict

from gateway.errors import (
    InputError,
    ProtocolError,
    UpstreamConnectError,
    UpstreamTimeout,
    UpstreamTooLarge,
)
from gateway.upstream import (
    ACCEPT_ENCODING,
    Limits,
    Timeouts,
    Upstream,
    forward_request_headers,
    response_headers,
)

JSON_HEADERS = [("content-type", "application/json")]


def fixed(status: int = 200, body: bytes = b"ok", **headers: str) -> Callable[
        [web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, headers=headers)

    return handler


# ----------------------------------------------------------------------------------- servers


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        host, port = runner.addresses[0][:2]
        return f"http://{host}:{port}"

    yield start
    for r in runners:
        await r.cleanup()


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[bytes, str], Awaitable[str]]]:
    """A TCP server that answers every request with fixed bytes, then closes ('close') or
    resets ('reset') the connection — the misbehaviour aiohttp.web would never produce."""
    servers: list[asyncio.Server] = []

    async def start(reply: bytes, end: str = "close") -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(reply)
            await writer.drain()
            if end == "reset":
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            writer.close()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(srv)
        port = srv.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for s in servers:
        s.close()
        await s.wait_closed()


@asynccontextmanager
async def upstream_clients(default: Timeouts) -> AsyncIterator[Callable[..., Upstream]]:
    """Make `Upstream`s (with `default` timeouts unless given); all are closed at the end."""
    made: list[Upstream] = []

    def make(base: str, timeouts: Timeouts | None = None, limits: Limits | None = None) -> Upstream:
        up = Upstream(base, timeouts or default, limits)
        made.append(up)
        return up

    yield make
    for up in made:
        await up.aclose()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., Upstream]]:
    async with upstream_clients(Timeouts(connect=2, read=2, total=5)) as make:
        yield make


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------ round trips


async def test_json_round_trip_forwards_method_path_query_headers_and_body(serve, clients):
    seen: dict[str, object] = {}

    async def echo(request: web.Request) -> web.Response:
        seen["path_qs"] = request.raw_path
        seen["headers"] = request.headers.copy()
        body = await request.json()
        return web.json_response({"echo": body}, status=201, headers={"x-upstream": "yes"})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", echo)
    up = clients(await serve(app))
    assert up._pool.loop is None  # bound lazily, to the running loop

    headers = forward_request_headers(
        [(b"authorization", b"Bearer sk-1"), (b"x-citewarden-context", b"forged"),
         (b"content-type", b"application/json")],
        request_id="req-1",
    )
    resp = await up.request("POST", "/v1/chat/completions?a=%2F&b=1", headers, b'{"q": 1}')
    assert resp.status == 201
    assert json.loads(resp.body) == {"echo": {"q": 1}}
    assert ("x-upstream", "yes") in response_headers(resp.headers, resp.decoded)
    assert seen["path_qs"] == "/v1/chat/completions?a=%2F&b=1"  # byte for byte
    got = seen["headers"]
    assert isinstance(got, CIMultiDict)
    assert got["Authorization"] == "Bearer sk-1"
    assert got["x-request-id"] == "req-1"
    assert got["Accept-Encoding"] == ACCEPT_ENCODING
    assert "x-citewarden-context" not in got
    assert "aiohttp" not in got.get("User-Agent", "")


async def test_upstream_cookies_are_relayed_never_kept_or_replayed(serve, clients):
    """One pooled session serves every client: a cookie the upstream sets for one client's
    request must reach that client only, never ride along on another client's request."""
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        resp = web.Response(body=b"ok")
        resp.set_cookie("session", "client-a-secret")
        return resp

    app = web.Application()
    app.router.add_get("/x", handler)
    # By host name: aiohttp's default cookie jar ignores cookies from IP-address hosts only.
    up = clients((await serve(app)).replace("127.0.0.1", "localhost"))
    first = await up.request("GET", "/x", [], b"")
    assert ("set-cookie", "session=client-a-secret; Path=/") in response_headers(
        first.headers, first.decoded
    )
    await up.request("GET", "/x", [], b"")  # another client, no cookie of its own
    await up.request("GET", "/x", [("cookie", "mine=1")], b"")  # a client's own cookie passes
    assert seen == [None, None, "mine=1"]


async def test_redirects_are_relayed_not_followed(serve, clients):
    app = web.Application()
    app.router.add_get("/old", fixed(302, b"", location="/new"))
    up = clients(await serve(app))
    resp = await up.request("GET", "/old", [], b"")
    assert resp.status == 302
    assert dict(response_headers(resp.headers, resp.decoded))["location"] == "/new"


async def test_gzip_body_is_decoded_and_encoding_header_dropped(serve, clients):
    payload = json.dumps({"choices": [{"message": {"content": "x" * 5000}}]}).encode()

    async def gz(request: web.Request) -> web.Response:
        return web.Response(body=gzip.compress(payload), headers={
            "content-type": "application/json", "content-encoding": "gzip"})

    app = web.Application()
    app.router.add_get("/gz", gz)
    up = clients(await serve(app))
    resp = await up.request("GET", "/gz", [], b"")
    assert resp.body == payload
    assert resp.decoded and resp.content_encoding is None
    relayed = dict(response_headers(resp.headers, resp.decoded))
    assert "content-encoding" not in relayed and "content-length" not in relayed

    async with up.stream("GET", "/gz", [], b"") as s:
        assert s.decoded
        assert b"".join([c async for c in s.iter_bytes()]) == payload


def _brotli(data: bytes) -> bytes:
    import brotli

    out: bytes = brotli.compress(data)
    return out


def _zstd(data: bytes) -> bytes:
    from backports import zstd

    out: bytes = zstd.compress(data)
    return out


@pytest.mark.parametrize(("coding", "compress"), [("br", _brotli), ("zstd", _zstd)])
async def test_brotli_and_zstd_bodies_are_offered_and_decoded(serve, clients, coding, compress):
    assert coding in ACCEPT_ENCODING.split(", ")
    payload = json.dumps({"choices": [{"message": {"content": "y" * 5000}}]}).encode()

    async def encoded(request: web.Request) -> web.Response:
        return web.Response(body=compress(payload), headers={
            "content-type": "application/json", "content-encoding": coding})

    app = web.Application()
    app.router.add_get("/enc", encoded)
    up = clients(await serve(app))
    resp = await up.request("GET", "/enc", [], b"")
    assert resp.body == payload
    assert resp.decoded and resp.content_encoding is None


async def test_an_encoding_we_did_not_ask_for_is_left_alone_and_reported(serve, clients):
    async def odd(request: web.Request) -> web.Response:
        return web.Response(body=b"\x00\x01", headers={"content-encoding": "x-custom"})

    app = web.Application()
    app.router.add_get("/odd", odd)
    up = clients(await serve(app))
    resp = await up.request("GET", "/odd", [], b"")
    assert resp.body == b"\x00\x01"
    assert not resp.decoded and resp.content_encoding == "x-custom"
    assert ("content-encoding", "x-custom") in response_headers(resp.headers, resp.decoded)


async def test_stream_yields_chunks_as_they_arrive(serve, clients):
    got_first = asyncio.Event()

    async def sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        # The next chunk is only written once the client has seen the first: a client that
        # buffered the body would deadlock here and time out.
        await asyncio.wait_for(got_first.wait(), 5)
        await resp.write(b"data: 2\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", sse)
    up = clients(await serve(app))
    chunks = []
    async with up.stream("POST", "/v1/chat/completions", JSON_HEADERS, b"{}") as s:
        assert s.status == 200
        assert dict(response_headers(s.headers, s.decoded))["content-type"] == "text/event-stream"
        async for chunk in s.iter_bytes():
            chunks.append(chunk)
            got_first.set()
    assert chunks[0] == b"data: 1\n\n"
    assert b"".join(chunks) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"


async def test_pooled_connection_is_reused(serve, clients):
    peers: set[object] = set()

    async def ok(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.add(request.transport.get_extra_info("peername"))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    up = clients(await serve(app))
    for _ in range(5):
        assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert len(peers) == 1


# ---------------------------------------------------------------------------------- failures


async def test_connection_refused_is_connect_error(clients):
    up = clients(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(UpstreamConnectError):
        await up.request("GET", "/", [], b"")
    with pytest.raises(UpstreamConnectError):
        async with up.stream("GET", "/", [], b""):
            pass


async def test_unresolvable_host_is_connect_error(clients):
    up = clients("http://upstream.invalid")
    with pytest.raises(UpstreamConnectError):
        await up.request("GET", "/", [], b"")


async def test_slow_headers_are_a_timeout(serve, clients):
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response(text="late")

    app = web.Application()
    app.router.add_get("/", slow)
    up = clients(await serve(app), Timeouts(connect=1, read=0.2, total=5))
    with pytest.raises(UpstreamTimeout):
        await up.request("GET", "/", [], b"")


async def test_stalled_stream_is_a_timeout(serve, clients):
    async def stall(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        await asyncio.sleep(3)
        return resp

    app = web.Application()
    app.router.add_get("/", stall)
    up = clients(await serve(app), Timeouts(connect=1, read=0.2, total=5))
    got = []
    with pytest.raises(UpstreamTimeout):
        async with up.stream("GET", "/", [], b"") as s:
            async for chunk in s.iter_bytes():
                got.append(chunk)
    assert got == [b"data: 1\n\n"]


async def test_total_timeout_covers_a_slow_drip_body(serve, clients):
    async def drip(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(40):
            await resp.write(b".")
            await asyncio.sleep(0.05)
        return resp

    app = web.Application()
    app.router.add_get("/", drip)
    up = clients(await serve(app), Timeouts(connect=1, read=1, total=0.5))
    with pytest.raises(UpstreamTimeout):
        await up.request("GET", "/", [], b"")


async def test_declared_oversize_body_is_refused_before_reading(serve, clients):
    app = web.Application()
    app.router.add_get("/", fixed(body=b"x" * 5000))
    up = clients(await serve(app), limits=Limits(max_response_bytes=1000))
    with pytest.raises(UpstreamTooLarge):
        await up.request("GET", "/", [], b"")
    # the limit is inclusive
    up2 = clients(up.base_url, limits=Limits(max_response_bytes=5000))
    assert len((await up2.request("GET", "/", [], b"")).body) == 5000


async def test_oversize_stream_stops_while_reading(serve, clients):
    written = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal written
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            for _ in range(200):
                await resp.write(b"x" * 1024)
                written += 1
                await asyncio.sleep(0.005)
        except (ConnectionError, asyncio.CancelledError):
            pass
        return resp

    app = web.Application()
    app.router.add_get("/", endless)
    up = clients(await serve(app), limits=Limits(max_response_bytes=4096))
    with pytest.raises(UpstreamTooLarge):
        await up.request("GET", "/", [], b"")
    assert written < 200  # refused mid-body, not after reading everything

    received = 0
    with pytest.raises(UpstreamTooLarge):
        async with up.stream("GET", "/", [], b"") as s:
            async for chunk in s.iter_bytes():
                received += len(chunk)
    assert received <= 4096  # the chunk that crosses the limit is never handed out


async def test_gzip_bomb_is_bounded_by_decoded_size(serve, clients):
    bomb = gzip.compress(b"\0" * 2_000_000)
    assert len(bomb) < 10_000

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"content-encoding": "gzip"})

    app = web.Application()
    app.router.add_get("/", handler)
    up = clients(await serve(app), limits=Limits(max_response_bytes=100_000))
    with pytest.raises(UpstreamTooLarge):
        await up.request("GET", "/", [], b"")


async def test_undecodable_gzip_is_protocol_error(raw_server, clients):
    junk = b"this is not gzip at all"
    reply = (b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n"
             % len(junk)) + junk
    up = clients(await raw_server(reply))
    with pytest.raises(ProtocolError):
        await up.request("GET", "/", [], b"")


async def test_malformed_status_line_is_protocol_error(raw_server, clients):
    up = clients(await raw_server(b"HTTP/1.1 twohundred OK\r\n\r\n"))
    with pytest.raises(ProtocolError):
        await up.request("GET", "/", [], b"")


async def test_close_before_response_is_connect_error(raw_server, clients):
    up = clients(await raw_server(b""))
    with pytest.raises(UpstreamConnectError):
        await up.request("GET", "/", [], b"")


@pytest.mark.parametrize("end", ["close", "reset"])
async def test_body_cut_short_is_connect_error(raw_server, clients, end):
    reply = b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + b"x" * 10
    up = clients(await raw_server(reply, end))
    with pytest.raises(UpstreamConnectError):
        await up.request("GET", "/", [], b"")


@pytest.mark.parametrize("end", ["close", "reset"])
async def test_reset_mid_stream_is_connect_error_after_the_chunks_that_arrived(
    raw_server, clients, end
):
    reply = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
             b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
    up = clients(await raw_server(reply, end))
    got = []
    with pytest.raises(UpstreamConnectError):
        async with up.stream("POST", "/", JSON_HEADERS, b"{}") as s:
            async for chunk in s.iter_bytes():
                got.append(chunk)
    assert b"".join(got) == b"data: 1\n\n"


async def test_requests_after_aclose_open_a_new_connection(serve, clients):
    peers: list[object] = []

    async def ok(request: web.Request) -> web.Response:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    up = clients(await serve(app))
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    await up.aclose()
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert len(set(peers)) == 2


def test_a_header_or_path_that_breaks_a_line_is_never_sent():
    up = Upstream("http://127.0.0.1:9")
    good = up._encode("POST", "/p?q=1", [("x-a", "1")], b"{}")
    assert good.startswith(b"POST /p?q=1 HTTP/1.1\r\nhost: 127.0.0.1:9\r\nx-a: 1\r\n")
    assert good.endswith(b"content-length: 2\r\n\r\n{}")
    for method, path, headers in [
        ("GET", "/p", [("x-a", "1\r\nx-injected: 1")]),
        ("GET", "/p", [("x-a", "1\nx-injected: 1")]),
        ("GET", "/p", [("x-a", "1\rx-injected: 1")]),
        ("GET", "/p", [("x-a\r\nx-b", "1")]),
        ("GET", "/p HTTP/1.1\r\nx-injected: 1\r\n", []),
        ("GET", "/p", [("x-a", "a\0b")]),
    ]:
        with pytest.raises(InputError):  # the client's request: a 400, never forwarded
            up._encode(method, path, headers, b"")


# ---------------------------------------------------------------------------- header hygiene


def test_forward_request_headers_drops_hop_by_hop_and_untrusted():
    client = [
        ("Host", "gateway:8080"),
        ("Connection", "keep-alive, X-Secret-Hop"),
        ("Keep-Alive", "timeout=5"),
        ("X-Secret-Hop", "1"),
        ("Proxy-Authorization", "Basic abc"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
        ("Trailer", "x"),
        ("Transfer-Encoding", "chunked"),
        ("Upgrade", "websocket"),
        ("Content-Length", "12"),
        ("Accept-Encoding", "identity"),
        ("X-Citewarden-Context", "W10"),
        ("x-citewarden-context-ids", "doc:1"),
        ("X-CiteWarden-Decision", "released"),
        ("Authorization", "Bearer sk"),
        ("x-api-key", "k"),
        ("traceparent", "00-abc-def-01"),
        ("tracestate", "v=1"),
        ("x-request-id", "client-id"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "x"),
        ("openai-organization", "org"),
        ("content-type", "application/json"),
        ("user-agent", "sdk/1"),
    ]
    out = forward_request_headers(client)
    assert out == [
        ("authorization", "Bearer sk"),
        ("x-api-key", "k"),
        ("traceparent", "00-abc-def-01"),
        ("tracestate", "v=1"),
        ("x-request-id", "client-id"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "x"),
        ("openai-organization", "org"),
        ("content-type", "application/json"),
        ("user-agent", "sdk/1"),
        ("accept-encoding", ACCEPT_ENCODING),
    ]


def test_forward_request_headers_takes_raw_asgi_pairs_and_sets_the_request_id():
    out = forward_request_headers(
        [(b"x-request-id", b"from-client"), (b"authorization", b"Bearer sk")], "gw-id"
    )
    assert out == [("authorization", "Bearer sk"), ("accept-encoding", ACCEPT_ENCODING),
                   ("x-request-id", "gw-id")]


def test_accept_encoding_offers_only_what_can_be_decoded():
    from gateway.decoding import DECODABLE

    offered = {t.strip() for t in ACCEPT_ENCODING.split(",")}
    assert offered == DECODABLE == {"gzip", "deflate", "br", "zstd"}  # all installed here


def test_response_headers_drop_hop_by_hop_length_and_decoded_encoding():
    upstream = [
        ("Content-Type", "application/json"),
        ("Content-Length", "42"),
        ("Content-Encoding", "gzip"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "1"),
        ("Keep-Alive", "timeout=5"),
        ("Transfer-Encoding", "chunked"),
        ("Proxy-Authenticate", "Basic"),
        ("Retry-After", "3"),
        ("x-ratelimit-remaining-requests", "9"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
    ]
    assert response_headers(upstream, decoded=True) == [
        ("content-type", "application/json"),
        ("retry-after", "3"),
        ("x-ratelimit-remaining-requests", "9"),
        ("set-cookie", "a=1"),
        ("set-cookie", "b=2"),
    ]
    assert ("content-encoding", "gzip") in response_headers(upstream, decoded=False)

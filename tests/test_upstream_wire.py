"""gateway.upstream on the HTTP/1.1 wire, against raw servers that write exact bytes: framing
(HEAD, 1xx, 204 / 304, bodies delimited by EOF, chunk extensions and trailers), when a
connection is reused and when it must not be, the request as it goes out, malformed responses,
and TLS trust.

These pin what the aiohttp-based client does today, so that a replacement client can be checked
against them; tests/test_upstream.py covers round trips, decoding, streaming, timeouts and
limits. Where today's behaviour is a choice rather than a requirement of HTTP, the test says so.
"""

from __future__ import annotations

import asyncio
import random
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.errors import ProtocolError, UpstreamConnectError, UpstreamTimeout
from gateway.upstream import Limits, Timeouts, Upstream
from tests.test_upstream import upstream_clients

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
BIG = random.Random(0).randbytes(1 << 20)  # more than any single socket read


# ------------------------------------------------------------------------------ raw server


@dataclass
class Req:
    """One request as the server read it off the wire."""

    conn: int  # the connection it came on: 0, 1, … in the order they were accepted
    head: bytes  # request line and header fields, up to and including the blank line
    body: bytes

    @property
    def line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    @property
    def fields(self) -> list[tuple[str, str]]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        return [(n, v.strip()) for n, _, v in (x.partition(":") for x in lines if x)]

    def values(self, name: str) -> list[str]:
        return [v for n, v in self.fields if n.lower() == name]


# Writes the answer to one request; True keeps the connection for the next request.
Reply = Callable[[Req, asyncio.StreamWriter], Awaitable[bool]]


def send(*parts: bytes, close: bool = False, gap: float = 0.01) -> Reply:
    """A reply writing `parts` with a pause between them, so that they arrive as separate
    reads; then it keeps the connection (whatever the bytes said) or closes it."""

    async def reply(req: Req, writer: asyncio.StreamWriter) -> bool:
        for i, part in enumerate(parts):
            if i:
                await asyncio.sleep(gap)
            writer.write(part)
            await writer.drain()
        return not close

    return reply


class Wire:
    """An HTTP/1.1 server that parses requests (bodies framed by content-length) and answers
    the i-th with the i-th reply, the last one repeating. It records every request, how many
    connections it accepted and the most it had open at once."""

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = replies
        self.requests: list[Req] = []
        self.connections = 0
        self.max_open = 0
        self.port = 0
        self._open = 0
        self._ended: dict[int, asyncio.Event] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ended(self, conn: int) -> asyncio.Event:
        """Set once connection `conn` is over: the client closed it, or a reply did."""
        return self._ended.setdefault(conn, asyncio.Event())

    async def start(self, tls: ssl.SSLContext | None = None) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=1)
            for t in pending:
                t.cancel()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.append(writer)
        conn, self.connections = self.connections, self.connections + 1
        self._open += 1
        self.max_open = max(self.max_open, self._open)
        try:
            while True:
                req = Req(conn, await reader.readuntil(b"\r\n\r\n"), b"")
                if length := req.values("content-length"):
                    req.body = await reader.readexactly(int(length[0]))
                self.requests.append(req)
                reply = self.replies[min(len(self.requests), len(self.replies)) - 1]
                if not await reply(req, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return  # the client closed the connection
        except asyncio.CancelledError:
            return  # torn down by stop(); not an error of the test
        finally:
            self._open -= 1
            self.ended(conn).set()
            writer.close()


@pytest.fixture
async def wire() -> AsyncIterator[Callable[..., Awaitable[Wire]]]:
    started: list[Wire] = []

    async def start(*replies: Reply | bytes, tls: ssl.SSLContext | None = None) -> Wire:
        w = Wire([send(r) if isinstance(r, bytes) else r for r in replies])
        await w.start(tls)
        started.append(w)
        return w

    yield start
    for w in started:
        await w.stop()


@pytest.fixture
async def clients(wire: object) -> AsyncIterator[Callable[..., Upstream]]:
    # Depends on `wire` so that clients are closed before the servers are stopped.
    async with upstream_clients(Timeouts(connect=1, read=0.5, total=3)) as make:
        yield make


def conns(w: Wire) -> list[int]:
    """The connection each request came on, in order."""
    return [r.conn for r in w.requests]


# -------------------------------------------------------------------------------- framing


async def test_head_response_declares_a_length_but_has_no_body(wire, clients):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1234\r\n\r\n"
    w = await wire(head, head, OK)
    up = clients(w.url)
    resp = await up.request("HEAD", "/v1/models", [], b"")
    assert resp.status == 200
    assert resp.body == b""
    assert ("content-length", "1234") in [(k.lower(), v) for k, v in resp.headers]
    async with up.stream("HEAD", "/v1/models", [], b"") as s:
        assert s.status == 200
        assert [c async for c in s.iter_bytes()] == []
    assert (await up.request("GET", "/next", [], b"")).body == b"ok"
    assert [r.line for r in w.requests] == [
        "HEAD /v1/models HTTP/1.1", "HEAD /v1/models HTTP/1.1", "GET /next HTTP/1.1"]
    assert conns(w) == [0, 0, 0]  # nothing left unread: the connection stays in use


async def test_informational_responses_are_skipped_for_the_final_one(wire, clients):
    w = await wire(
        send(
            b"HTTP/1.1 100 Continue\r\n\r\n",
            b"HTTP/1.1 103 Early Hints\r\nlink: </style.css>; rel=preload\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nx-final: 1\r\ncontent-length: 5\r\n\r\nfinal",
        ),
        OK,
    )
    up = clients(w.url)
    resp = await up.request("POST", "/v1/chat/completions", [], b"{}")
    assert resp.status == 200
    assert resp.body == b"final"
    assert [(k.lower(), v) for k, v in resp.headers] == [("x-final", "1"), ("content-length", "5")]
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 0]


async def test_204_and_304_have_no_body_and_keep_the_connection(wire, clients):
    w = await wire(
        b"HTTP/1.1 204 No Content\r\nx-a: 1\r\n\r\n",
        # A 304 may declare the length of the representation it stands for; no body follows.
        b'HTTP/1.1 304 Not Modified\r\ncontent-length: 1234\r\netag: "v1"\r\n\r\n',
        OK,
    )
    up = clients(w.url)
    no_content = await up.request("DELETE", "/v1/files/1", [], b"")
    assert (no_content.status, no_content.body) == (204, b"")
    not_modified = await up.request("GET", "/v1/files/1", [("if-none-match", '"v1"')], b"")
    assert (not_modified.status, not_modified.body) == (304, b"")
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 0, 0]


async def test_body_delimited_by_eof_is_read_whole_and_the_connection_not_reused(wire, clients):
    eof_framed = send(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nfirst part, ", b"second part",
        close=True,
    )
    w = await wire(eof_framed, eof_framed, OK)
    up = clients(w.url)
    assert (await up.request("GET", "/a", [], b"")).body == b"first part, second part"
    async with up.stream("GET", "/b", [], b"") as s:
        assert b"".join([c async for c in s.iter_bytes()]) == b"first part, second part"
    assert (await up.request("GET", "/c", [], b"")).body == b"ok"
    assert conns(w) == [0, 1, 2]


@pytest.mark.parametrize(
    ("reply", "reused"),
    [
        (b"HTTP/1.0 200 OK\r\ncontent-length: 5\r\n\r\nhello", False),
        (b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 5\r\n\r\nhello", False),
        # HTTP/1.0 keep-alive (RFC 9112 §9.3 / RFC 2068 §19.7.1) is honoured.
        (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 5\r\n\r\nhello", True),
    ],
    ids=["http-1.0", "connection-close", "http-1.0-keep-alive"],
)
async def test_whether_a_response_lets_its_connection_be_reused(wire, clients, reply, reused):
    # The server leaves the connection open in every case: only the client decides.
    w = await wire(reply, OK)
    up = clients(w.url)
    assert (await up.request("GET", "/a", [], b"")).body == b"hello"
    assert (await up.request("POST", "/b", [], b"{}")).body == b"ok"
    assert conns(w) == ([0, 0] if reused else [0, 1])
    if not reused:
        await asyncio.wait_for(w.ended(0).wait(), 1)  # the client closed it, too


async def test_chunk_extensions_and_trailers_split_at_awkward_places(wire, clients):
    w = await wire(
        send(
            CHUNKED + b"5;name=value\r\nhel",
            b'lo\r\n6;x;y="q"\r',
            b"\n world\r\n0\r\nx-trailer: t\r\n",
            b"\r\n",
        ),
        OK,
    )
    up = clients(w.url)
    resp = await up.request("GET", "/", [], b"")
    assert resp.body == b"hello world"
    # Trailers are dropped: the headers were handed out before they arrived.
    assert [k.lower() for k, _ in resp.headers] == ["transfer-encoding"]
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 0]


def _chunked(body: bytes, size: int) -> bytes:
    chunks = (body[i : i + size] for i in range(0, len(body), size))
    return CHUNKED + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


@pytest.mark.parametrize(
    ("reply", "close"),
    [
        (b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(BIG) + BIG, False),
        (_chunked(BIG, 100_000), False),
        (b"HTTP/1.1 200 OK\r\n\r\n" + BIG, True),  # delimited by EOF
    ],
    ids=["content-length", "chunked", "eof"],
)
async def test_a_body_larger_than_one_read_arrives_intact(wire, clients, reply, close):
    w = await wire(send(reply, close=close))
    up = clients(w.url)
    resp = await up.request("GET", "/big", [], b"")
    assert len(resp.body) == len(BIG)
    assert resp.body == BIG
    async with up.stream("GET", "/big", [], b"") as s:
        assert b"".join([c async for c in s.iter_bytes()]) == BIG
    assert conns(w) == ([0, 1] if close else [0, 0])


async def test_response_header_fields_keep_order_duplicates_and_values(wire, clients):
    # No reason phrase; odd case; a repeated field; padding around (not inside) a value; an
    # empty value. Names are compared lower-cased: aiohttp returns well-known names in
    # canonical case ("Set-Cookie") and others as sent.
    w = await wire(
        b"HTTP/1.1 429\r\nX-MiXeD: a\r\nset-cookie: a=1\r\nretry-after: 3\r\n"
        b"Set-Cookie: b=2\r\nx-pad:   v  v  \r\nx-empty:\r\ncontent-length: 2\r\n\r\nno"
    )
    up = clients(w.url)
    resp = await up.request("GET", "/", [], b"")
    assert resp.status == 429
    assert resp.body == b"no"
    assert [(k.lower(), v) for k, v in resp.headers] == [
        ("x-mixed", "a"),
        ("set-cookie", "a=1"),
        ("retry-after", "3"),
        ("set-cookie", "b=2"),
        ("x-pad", "v  v"),
        ("x-empty", ""),
        ("content-length", "2"),
    ]
    assert ("X-MiXeD", "a") in resp.headers  # an unknown name keeps its case


@pytest.mark.parametrize(
    ("reply", "field"),
    [
        # obs-fold (RFC 9112 §5.2)
        (
            b"HTTP/1.1 200 OK\r\nx-folded: a\r\n b\r\ncontent-length: 2\r\n\r\nok",
            ("x-folded", "a b"),
        ),
        # Bare LF line ends (RFC 9112 §2.2 lets a recipient accept them).
        (b"HTTP/1.1 200 OK\nx-lf: 1\ncontent-length: 2\n\nok", ("x-lf", "1")),
    ],
    ids=["obs-fold", "bare-lf"],
)
async def test_obsolete_header_syntax_is_refused(wire, clients, reply, field):
    """The parser is strict. RFC 9112 §5.2 lets a gateway answer 502 for an obs-fold rather than
    unfold it, and §2.2 only allows (MAY) accepting bare LF; a response the gateway would have
    to guess at is refused, never relayed."""
    w = await wire(reply)
    up = clients(w.url)
    with pytest.raises(ProtocolError):
        await up.request("GET", "/", [], b"")
    assert field[0].encode() in reply  # the field is really there, only its syntax is refused


# ------------------------------------------------------------------------- connection reuse


async def test_a_stale_pooled_connection_is_replaced_for_get_and_post(wire, clients):
    async def answer_then_close_soon(req: Req, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK)
        await writer.drain()
        await asyncio.sleep(0.05)  # an idle timeout far shorter than the client's
        return False

    w = await wire(answer_then_close_soon)
    up = clients(w.url)
    assert (await up.request("GET", "/1", [], b"")).body == b"ok"
    await asyncio.sleep(0.15)
    assert (await up.request("GET", "/2", [], b"")).body == b"ok"
    await asyncio.sleep(0.15)
    assert (await up.request("POST", "/3", [("content-type", "application/json")], b"{}")).body \
        == b"ok"
    assert [r.line.split()[1] for r in w.requests] == ["/1", "/2", "/3"]
    assert conns(w) == [0, 1, 2]


@pytest.mark.parametrize(("method", "retried"), [("GET", True), ("DELETE", True),
                                                 ("POST", True)])
async def test_a_reused_connection_closed_under_a_request_is_retried(
    wire, clients, method, retried
):
    """The keep-alive race made deterministic: the upstream keeps the connection after the
    first answer, then closes it on reading the second request without a byte of answer.
    POST too (DESIGN §11); tests/test_upstream_retry.py has the cases that are never retried."""

    async def hang_up(req: Req, writer: asyncio.StreamWriter) -> bool:
        return False

    w = await wire(OK, hang_up, OK)
    up = clients(w.url)
    assert (await up.request("GET", "/first", [], b"")).body == b"ok"
    if retried:
        assert (await up.request(method, "/second", [], b"")).body == b"ok"
        assert conns(w) == [0, 0, 1]  # re-sent once, on a new connection
    else:
        with pytest.raises(UpstreamConnectError):
            await up.request(method, "/second", [], b"{}")
        assert conns(w) == [0, 0]  # never re-sent: the upstream may have acted on it


async def test_the_pool_bounds_open_connections_and_reuses_them(wire, clients):
    async def slow(req: Req, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.1)
        writer.write(OK)
        await writer.drain()
        return True

    w = await wire(slow)
    up = clients(w.url, limits=Limits(pool_size=2))
    results = await asyncio.gather(*(up.request("GET", f"/{i}", [], b"") for i in range(6)))
    assert [r.body for r in results] == [b"ok"] * 6
    assert len(w.requests) == 6
    assert w.max_open == 2
    assert w.connections == 2  # waiters were handed released connections, not new ones


async def test_waiting_for_a_pooled_connection_counts_against_the_total_timeout(wire, clients):
    w = await wire(send(CHUNKED + b"9\r\ndata: 1\n\n\r\n"), OK)  # a stream that never ends
    up = clients(w.url, Timeouts(connect=1, read=1, total=0.3), Limits(pool_size=1))
    async with up.stream("GET", "/held", [], b"") as s:  # holds the pool's one connection
        assert s.status == 200
        with pytest.raises(UpstreamTimeout):
            await up.request("GET", "/waits", [], b"")
    assert (await up.request("GET", "/later", [], b"")).body == b"ok"  # the slot came back
    assert [r.line.split()[1] for r in w.requests] == ["/held", "/later"]  # never sent


async def test_a_stream_read_to_the_end_gives_its_connection_back(wire, clients):
    w = await wire(send(CHUNKED + b"9\r\ndata: 1\n\n\r\n", b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"), OK)
    up = clients(w.url)
    async with up.stream("POST", "/v1/chat/completions", [], b"{}") as s:
        assert b"".join([c async for c in s.iter_bytes()]) == b"data: 1\n\ndata: 2\n\n"
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 0]


async def test_a_stream_left_early_closes_its_connection_and_the_next_request_works(
    wire, clients
):
    # A long stream: three events, then the server keeps the response open, unfinished.
    events = send(
        CHUNKED + b"9\r\ndata: 1\n\n\r\n", b"9\r\ndata: 2\n\n\r\n", b"9\r\ndata: 3\n\n\r\n"
    )
    w = await wire(events, OK)
    up = clients(w.url)
    got = []
    async with up.stream("POST", "/v1/chat/completions", [], b"{}") as s:
        async for chunk in s.iter_bytes():
            got.append(chunk)
            break
    assert got[0].startswith(b"data: 1\n\n")
    # Closed, not drained to the end and not put back in the pool.
    await asyncio.wait_for(w.ended(0).wait(), 1)
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 1]


async def test_a_timed_out_exchange_does_not_leave_its_connection_in_the_pool(wire, clients):
    w = await wire(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab", OK)  # 8 bytes short
    up = clients(w.url, Timeouts(connect=1, read=0.2, total=3))
    with pytest.raises(UpstreamTimeout):
        await up.request("GET", "/", [], b"")
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 1]


# ----------------------------------------------------------------------- the request on the wire


async def test_post_request_line_host_length_headers_and_body(wire, clients):
    w = await wire(OK)
    up = clients(w.url)
    body = b'{"model": "m", "messages": []}'
    headers = [
        ("content-type", "application/json"),
        ("authorization", "Bearer sk-1"),
        ("X-Custom", "Some Value"),
        ("x-multi", "a"),
        ("x-multi", "b"),
    ]
    assert (await up.request("POST", "/p?q=%2F", headers, body)).body == b"ok"
    [req] = w.requests
    assert req.line == "POST /p?q=%2F HTTP/1.1"
    assert req.values("host") == [f"127.0.0.1:{w.port}"]
    assert req.values("content-length") == [str(len(body))]
    assert req.values("transfer-encoding") == []
    assert req.values("expect") == []
    assert req.values("content-type") == ["application/json"]
    assert req.values("authorization") == ["Bearer sk-1"]
    assert req.values("x-custom") == ["Some Value"]
    assert req.values("x-multi") == ["a", "b"]  # repeated fields all go, in order
    assert req.body == body


async def test_get_without_body_sends_no_length_and_no_body(wire, clients):
    w = await wire(OK)
    up = clients(w.url)
    await up.request("GET", "/v1/models", [("authorization", "Bearer sk-1")], b"")
    await up.request("GET", "/again", [], b"")
    first, second = w.requests
    assert first.values("content-length") == []
    assert first.values("transfer-encoding") == []
    assert first.body == b""
    # Nothing followed the first head: the next bytes on the connection were the next request.
    assert second.line == "GET /again HTTP/1.1"
    assert conns(w) == [0, 0]


async def test_fields_the_client_adds_of_its_own(wire, clients):
    """The client adds host and, for a method that carries a body, content-length; nothing
    else (accept-encoding comes from forward_request_headers, never from the client)."""
    w = await wire(OK)
    up = clients(w.url)
    await up.request("GET", "/g", [], b"")
    await up.request("POST", "/p", [], b"")
    await up.request("POST", "/p", [], b"{}")
    sse = [("accept", "text/event-stream"), ("accept-encoding", "gzip"),
           ("content-type", "application/json")]
    await up.request("POST", "/p", sse, b"{}")
    get, empty_post, post, own = w.requests
    assert sorted(n.lower() for n, _ in get.fields) == ["host"]
    assert sorted(n.lower() for n, _ in empty_post.fields) == ["content-length", "host"]
    assert empty_post.values("content-length") == ["0"]
    assert sorted(n.lower() for n, _ in post.fields) == ["content-length", "host"]
    assert post.values("content-length") == ["2"]
    assert own.values("accept") == ["text/event-stream"]  # the caller's own, not doubled
    assert own.values("accept-encoding") == ["gzip"]
    assert own.values("content-type") == ["application/json"]


@pytest.mark.parametrize("prefix", ["/prefix", "/prefix/"])
async def test_base_url_path_prefix_is_kept(wire, clients, prefix):
    w = await wire(OK)
    up = clients(w.url + prefix)
    assert (await up.request("GET", "/v1/x?a=1", [], b"")).body == b"ok"
    assert w.requests[0].line == "GET /prefix/v1/x?a=1 HTTP/1.1"


# -------------------------------------------------------------------------------- failures

MALFORMED = {
    "bad-chunk-size": CHUNKED + b"zz\r\nhello\r\n0\r\n\r\n",
    "chunk-longer-than-declared": CHUNKED + b"5\r\nhelloXX\r\n0\r\n\r\n",
    "garbage-status-line": b"garbage\r\n\r\n",
    "binary-status-line": b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\r\n\r\n",  # an HTTP/2 frame
    "content-length-not-a-number": b"HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\nhello",
    "content-length-negative": b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\nhello",
    "content-lengths-differ": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6"
                             b"\r\n\r\nhello!",
    # RFC 9112 §6.3: "ought to be handled as an error" (request smuggling / response splitting).
    "content-length-and-chunked": b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n"
                                  b"transfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "header-line-over-64k": b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 65_536
                            + b"\r\ncontent-length: 2\r\n\r\nok",
    # Three digits the parser takes, but no HTTP status: nothing could relay it.
    "status-600": b"HTTP/1.1 600 X\r\ncontent-length: 2\r\n\r\n{}",
    "status-999": b"HTTP/1.1 999 X\r\ncontent-length: 2\r\n\r\n{}",
    "status-099": b"HTTP/1.1 099 X\r\ncontent-length: 2\r\n\r\n{}",
}


@pytest.mark.parametrize("mode", ["request", "stream"])
@pytest.mark.parametrize("reply", MALFORMED.values(), ids=MALFORMED.keys())
async def test_malformed_response_is_protocol_error_and_its_connection_dropped(
    wire, clients, reply, mode
):
    w = await wire(reply, OK)  # the server would keep the connection: the client must not
    up = clients(w.url)
    with pytest.raises(ProtocolError):
        if mode == "request":
            await up.request("GET", "/", [], b"")
        else:
            async with up.stream("GET", "/", [], b"") as s:
                await s.read()
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 1]


@pytest.mark.parametrize("together", [True, False], ids=["same-read", "later-read"])
async def test_bytes_after_a_complete_response_keep_it_but_drop_the_connection(
    wire, clients, together
):
    extra = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nforged"
    w = await wire(OK + extra if together else send(OK, extra), OK)
    up = clients(w.url)
    async with up.stream("GET", "/", [], b"") as s:
        assert await s.read() == b"ok"
        await asyncio.sleep(0.05)  # the extra bytes arrive while the caller still holds it
        assert s.status == 200 and ("content-length", "2") in s.headers
    assert (await up.request("GET", "/", [], b"")).body == b"ok"
    assert conns(w) == [0, 1]


async def test_a_large_but_sane_header_is_accepted(wire, clients):
    token = "t" * 4000  # a long JWT or CSP
    head = b"HTTP/1.1 200 OK\r\nx-token: %s\r\ncontent-length: 2\r\n\r\n" % token.encode()
    w = await wire(head + b"ok")
    up = clients(w.url)
    resp = await up.request("GET", "/", [], b"")
    assert ("x-token", token) in resp.headers


async def test_bad_chunk_after_the_headers_is_protocol_error_not_a_hang(wire, clients):
    w = await wire(send(CHUNKED + b"9\r\ndata: 1\n\n\r\n", b"zz\r\nhello\r\n0\r\n\r\n"))
    up = clients(w.url, Timeouts(connect=1, read=5, total=0.3))
    got = []
    with pytest.raises(ProtocolError):
        async with up.stream("GET", "/", [], b"") as s:
            async for chunk in s.iter_bytes():
                got.append(chunk)
    assert got == [b"data: 1\n\n"]


# How many connections one call opens when every one is closed straight after the request
# arrives: one. Only a *reused* connection that closes before any byte of the answer earns a
# request a second attempt (a keep-alive race, see above); a fresh connection that fails says
# the upstream is failing, and is not hammered twice.
ATTEMPTS = {"GET": 1, "POST": 1}


@pytest.mark.parametrize("mode", ["request", "stream"])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_close_after_the_request_on_a_fresh_connection_is_connect_error(
    wire, clients, method, mode
):
    async def hang_up(req: Req, writer: asyncio.StreamWriter) -> bool:
        return False

    w = await wire(hang_up)
    up = clients(w.url)
    with pytest.raises(UpstreamConnectError):
        if mode == "request":
            await up.request(method, "/", [], b"{}" if method == "POST" else b"")
        else:
            async with up.stream(method, "/", [], b"{}" if method == "POST" else b""):
                pass
    assert w.connections == ATTEMPTS[method]
    assert [r.line for r in w.requests] == [f"{method} / HTTP/1.1"] * ATTEMPTS[method]


# ------------------------------------------------------------------------------------- TLS


@dataclass(frozen=True)
class Tls:
    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, self.key)
        return ctx


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A throwaway CA and a certificate it signed for localhost and 127.0.0.1."""
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["/usr/bin/openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", "-new", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=citewarden test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-new", *ec, "-keyout", "leaf.key", "-out", "leaf.csr",
            "-subj", "/CN=localhost")
    (d / "leaf.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n"
    )
    openssl("x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "leaf.ext", "-out", "leaf.pem")
    return Tls(d / "ca.pem", d / "leaf.pem", d / "leaf.key")


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_tls_trusts_the_ca_named_by_ssl_cert_file(wire, clients, tls, monkeypatch, host):
    """SSL_CERT_FILE, read when the Upstream is made, is how a platform team points a process
    at a private CA."""
    monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    w = await wire(OK, tls=tls.server_context())
    up = clients(f"https://{host}:{w.port}")
    resp = await up.request("POST", "/v1/x", [("content-type", "application/json")], b"{}")
    assert (resp.status, resp.body) == (200, b"ok")
    [req] = w.requests
    assert req.line == "POST /v1/x HTTP/1.1"
    assert req.values("host") == [f"{host}:{w.port}"]
    assert req.body == b"{}"


async def test_tls_to_an_untrusted_certificate_is_connect_error(wire, clients, tls, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    w = await wire(OK, tls=tls.server_context())
    up = clients(f"https://localhost:{w.port}")
    with pytest.raises(UpstreamConnectError):
        await up.request("GET", "/", [], b"")
    assert w.requests == []

"""The upstream HTTP/1.1 client: one asyncio protocol per connection, parsed by httptools (the
llhttp parser uvicorn already uses), and a bounded keep-alive pool.

Why not a general-purpose client: the gateway talks to one upstream, with one request in flight
per connection, and spends most of its CPU per request in the client it uses. aiohttp spent
92–111 µs of CPU per forwarded request on this path; this client spends a fraction of that
(docs/benchmarks.md, "client choice"). It does only what a reverse proxy needs:

* one exchange per connection at a time; connections are reused only after a complete,
  keep-alive response that the caller read to the end;
* timeouts: `connect` bounds the TCP (+TLS) connect, `read` the silence between two reads from
  the socket, `total` the whole exchange — one deadline, checked by one timer per exchange, that
  surfaces as `UpstreamTimeout` at the caller's next read (never as a cancellation inside the
  caller's own code);
* bodies are decoded (`gateway.decoding`) and bounded by `limit` decoded bytes while they arrive;
  a consumer that falls behind pauses reading from the socket;
* HEAD, 1xx, 204 and 304 responses carry no body; a body without length or chunking ends at EOF;
* a pooled connection the upstream closed is discarded; a request that finds its reused
  connection closed before any byte of the answer is retried once on a fresh connection, POST
  included (DESIGN §11: the upstream closed an idle connection as the request went out); a
  fresh connection that fails, or any answer byte, is never retried;
* a forward proxy (`gateway.upstream_tls.UpstreamNetwork.proxy_for`): a CONNECT tunnel for an
  https upstream, TLS inside it; absolute-form requests with `Proxy-Authorization` for http;
* an upstream that answers in HTTP/2 (its SETTINGS frame, a `PRI` preface, an `HTTP/2` status
  line, or ALPN) fails with "upstream speaks HTTP/2 only"; TLS failures say "TLS" and their class.

Every failure reaches the caller as a `gateway.errors` error, raised where it is detected.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import cast
from urllib.parse import unquote_plus, urlsplit

import httptools
import structlog

from gateway.decoding import DECODABLE, Decoder, make_decoder
from gateway.errors import (
    GatewayError,
    InputError,
    ProtocolError,
    UpstreamConnectError,
    UpstreamTimeout,
    UpstreamTooLarge,
    map_exception,
)
from gateway.upstream_tls import HTTP2_ONLY, ProxyURL, UpstreamNetwork, tls_failure

Headers = list[tuple[str, str]]

_PAUSE_AT = 256 * 1024  # buffered body bytes at which reading from the socket pauses
_IDLE_SECONDS = 15.0  # a pooled connection unused this long is closed rather than reused
_NO_BODY_STATUS = frozenset({204, 304})
_MAX_HEAD = 64 * 1024  # bytes of header names and values in one response head
_log = structlog.get_logger("citewarden")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def parse_base_url(base_url: str) -> tuple[bool, str, int, str, str]:
    """(tls, host, port, host header, path prefix) of an upstream base URL; ValueError if it
    is not one the client can use. Its query string is `base_query`'s."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be http://host[:port][/prefix] or https://…, not {base_url!r}")
    if parts.fragment or base_url.endswith("#"):
        raise ValueError("a #fragment has no meaning in an upstream URL")
    if parts.username is not None or parts.password is not None:
        raise ValueError("credentials in the URL are not supported; the client's own "
                         "authorization headers are forwarded")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"bad port in {base_url!r}") from e
    tls = parts.scheme == "https"
    return tls, parts.hostname, port or (443 if tls else 80), parts.netloc, parts.path.rstrip("/")


def base_query(base_url: str) -> list[tuple[str, str]]:
    """The parameters of an upstream base URL's query string (`?api-version=…`, Azure
    OpenAI), as (decoded name, `name=value` as written); see `add_base_query`."""
    query = urlsplit(base_url).query
    return [(unquote_plus(p.partition("=")[0]), p) for p in query.split("&") if p]


def add_base_query(path_qs: str, base: list[tuple[str, str]]) -> str:
    """`path_qs` with each base parameter it does not carry (by decoded name) appended, as
    the base URL wrote it; the client's own parameters stay first and byte for byte."""
    path, _, query = path_qs.partition("?")
    have = {unquote_plus(p.partition("=")[0]) for p in query.split("&") if p}
    extra = [raw for name, raw in base if name not in have]
    if not extra:
        return path_qs
    return f"{path}?{query}&{'&'.join(extra)}" if query else f"{path}?{'&'.join(extra)}"


def _looks_http2(data: bytes) -> bool:
    """The first bytes of an answer are HTTP/2: a connection preface, an `HTTP/2` status line
    (never valid HTTP/1.1), or a frame header where `HTTP/` must be — an h2 server's first
    frame is SETTINGS (type 4) on stream 0, its length's first byte 0."""
    if data.startswith((b"PRI * HTTP/2", b"HTTP/2")):
        return True
    return len(data) >= 9 and data[0] == 0 and data[3] in (4, 7) and data[5:9] == b"\0\0\0\0"


class Connection(asyncio.Protocol):
    """One connection to the upstream and the exchange in flight on it, if any."""

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self.loop = loop
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.used = False  # has carried an exchange before: a retry candidate when it fails
        self.idle_since = 0.0
        self.generation = pool.generation
        self._active = False
        self._reset()

    def _reset(self) -> None:
        self.received_any = False  # any byte of an answer: a failed exchange is not retried
        self.status = 0
        self.headers: Headers = []
        self.coding = ""  # the content-encoding token, lower-cased
        self.error: GatewayError | None = None
        self.done = False  # the body has been received in full
        self.reusable = False
        self._head: asyncio.Future[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._received = 0  # decoded body bytes
        self._wire = 0  # body bytes as sent
        self._decoder: Decoder | None = None
        self._in_head = False
        self._informational = False
        self._framed = False  # content-length or transfer-encoding present
        self._close_token = False
        self._keep_alive_token = False
        self._head_bytes = 0
        self._length = -1
        self._is_head_request = False
        self._paused = False
        self._wake_each_chunk = True
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0
        self._last_read = 0.0

    # ------------------------------------------------------------------- asyncio protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, only alike).
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._active:
            self.close()  # bytes nobody asked for: the connection cannot be trusted
            return
        self._last_read = self.loop.time()
        if not self.received_any and not self.status and _looks_http2(data):
            self.received_any = True
            self._fail(ProtocolError(HTTP2_ONLY))
            return
        self.received_any = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            # A callback's own failure (a decoder, a limit) is the error; anything else that
            # escaped one is mapped at the boundary (gateway.errors.map_exception).
            cause = e.__context__
            self._fail(map_exception(cause if isinstance(cause, Exception) else e))
        except httptools.HttpParserUpgrade:
            self._fail(ProtocolError("malformed upstream response: it switched protocols"))
        except httptools.HttpParserError as e:
            err = ProtocolError(f"malformed upstream response: {_describe(e)}")
            err.__cause__ = e
            self._fail(err)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost completes or fails the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self._active:
            self._pool.forget(self)
            return
        if self.done or self.error is not None:
            return
        if self.status and not self._in_head and self._eof_delimited() and exc is None:
            self._complete()  # the body ran to EOF, as its headers said it would
            return
        where = "before the response" if not self.status else "mid-body: the answer was cut short"
        if isinstance(exc, ssl.SSLError):
            # After a TLS 1.3 handshake the server still judges the client certificate: its
            # refusal arrives as an alert in place of the answer.
            message, h2 = tls_failure(exc)
            err: GatewayError = ProtocolError(message) if h2 else UpstreamConnectError(message)
            self._pool.log_failure(err)
        else:
            err = UpstreamConnectError(
                f"upstream closed the connection {where}" + (f": {_describe(exc)}" if exc else "")
            )
        err.__cause__ = exc
        self._fail(err)

    def pause_writing(self) -> None:  # requests are small; the transport buffers them
        pass

    def resume_writing(self) -> None:
        pass

    # ---------------------------------------------------------------------- parser callbacks

    def on_message_begin(self) -> None:
        if self.done:  # a second answer to one request: keep the first, drop the connection
            raise ProtocolError("upstream sent more than one response to a request")
        self.headers = []
        self._in_head = True
        self._head_bytes = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:
            return  # a chunked trailer: not relayed
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > _MAX_HEAD:
            raise ProtocolError(f"malformed upstream response: header over {_MAX_HEAD} bytes")
        value = value.rstrip(b" \t")
        lname = name.lower()
        if lname == b"content-length":
            self._framed = True
            if not value.isdigit():  # the parser checks this first; never trust it twice
                raise ProtocolError("malformed upstream response: bad content-length")
            self._length = int(value)
        elif lname == b"transfer-encoding":
            self._framed = True
        elif lname == b"content-encoding":
            self.coding = value.decode("latin-1").strip().lower()
        elif lname == b"connection":
            tokens = value.lower()
            self._close_token = self._close_token or b"close" in tokens
            self._keep_alive_token = self._keep_alive_token or b"keep-alive" in tokens
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        status = self._parser.get_status_code()
        if not 100 <= status <= 599:  # the parser takes any three digits; HTTP has no more
            raise ProtocolError("malformed upstream response: status out of range")
        if status < 200:  # 1xx informational: the final response follows on this connection
            self._informational = True
            self._framed = self._close_token = self._keep_alive_token = False
            self._length = -1
            self.coding = ""
            return
        self.status = status
        keep_alive = not self._close_token and (
            self._keep_alive_token or self._parser.get_http_version() == "1.1")
        if self.coding in DECODABLE:
            self._decoder = make_decoder(self.coding, self._pool.limit)
        limit = self._pool.limit
        if self._is_head_request:
            # The parser does not know the method: it would wait for a body that never comes.
            # Done now, and the next exchange gets a fresh parser.
            self._complete()
            self.reusable = keep_alive
            self._parser = httptools.HttpResponseParser(self)
        elif self._decoder is None and self._length > limit:
            self._release_head()
            self._fail(UpstreamTooLarge(f"upstream body of {self._length} bytes over {limit}"))
            return
        elif status in _NO_BODY_STATUS or self._framed:
            self.reusable = keep_alive  # confirmed when the message completes
        self._release_head()

    def on_body(self, body: bytes) -> None:
        if self.done:  # bytes after a HEAD response's head: the connection cannot be trusted
            self.reusable = False
            return
        self._wire += len(body)
        limit = self._pool.limit
        if self._decoder is not None:
            if self._wire > 2 * limit + 65536:  # encoded input that decodes to almost nothing
                raise UpstreamTooLarge(f"upstream body over {2 * limit + 65536} encoded bytes")
            body = self._decoder.feed(body)
            if not body:
                return
        self._received += len(body)
        if self._received > limit:
            raise UpstreamTooLarge(f"upstream body over {limit} bytes")
        self._chunks.append(body)
        self._buffered += len(body)
        if self._wake_each_chunk:  # a streaming reader; `read_all` is bounded by `limit` alone
            if self._buffered > _PAUSE_AT and not self._paused and self._transport is not None:
                self._paused = True
                self._transport.pause_reading()
            self._wake()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        if not self.done:
            self._complete()

    # ------------------------------------------------------------------------- exchange

    def _eof_delimited(self) -> bool:
        return not self._framed and self.status not in _NO_BODY_STATUS

    def _complete(self) -> None:
        if self._decoder is not None:
            try:
                tail = self._decoder.finish()
            except GatewayError as e:
                self._fail(e)
                return
            if tail:
                self._received += len(tail)
                self._chunks.append(tail)
                self._buffered += len(tail)
        if self._eof_delimited():  # (a HEAD answer's reuse is decided after this)
            self.reusable = False
        self.done = True
        self._stop_timer()
        self._wake()

    def _fail(self, err: GatewayError) -> None:
        if self.error is None and not self.done:
            self.error = err
        self._stop_timer()
        self.close()  # never reused
        head = self._head
        if head is not None and not head.done():
            head.set_exception(err)
        self._wake()

    def _release_head(self) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_time(self) -> None:
        """The one timer of an exchange: the total deadline, and the read timeout, which only
        runs while the socket is being read (a consumer that paused reading is not silence)."""
        self._timer = None
        if self.done or self.error is not None:
            return
        now = self.loop.time()
        if now >= self._deadline:
            self._fail(UpstreamTimeout(
                f"upstream exchange over the total timeout of {self._pool.timeouts_total} s"))
            return
        read = self._pool.timeouts_read
        if self._paused:
            self._last_read = now
        elif now - self._last_read >= read:
            self._fail(UpstreamTimeout(f"upstream silent for over {read} s (read timeout)"))
            return
        self._timer = self.loop.call_at(min(self._deadline, self._last_read + read),
                                         self._check_time)

    def start(self, request: bytes, deadline: float, is_head: bool) -> asyncio.Future[None]:
        """Send one request; the future resolves when the final response's head is in."""
        assert self._transport is not None
        self._reset()
        self._active = True
        self.used = True
        self._is_head_request = is_head
        self._deadline = deadline
        now = self._last_read = self.loop.time()
        self._timer = self.loop.call_at(min(deadline, now + self._pool.timeouts_read),
                                         self._check_time)
        head = self._head = self.loop.create_future()
        self._transport.write(request)
        return head

    def finish(self) -> None:
        """The caller is done with the exchange: back to the pool, or closed."""
        self._active = False
        self._stop_timer()
        self._pool.release(self, self.done and self.reusable and not self._chunks)

    def close(self) -> None:
        self.reusable = False
        if self._transport is not None and not self.closed:
            self.closed = True
            self._transport.abort()

    # ------------------------------------------------------------------------- body reads

    def _resume_reading(self) -> None:
        if self._paused and self._transport is not None:
            self._paused = False
            self._last_read = self.loop.time()  # the read timeout restarts with the reading
            self._transport.resume_reading()

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        self._resume_reading()
        return data

    async def _wait(self) -> None:
        """Until the parser has news: a chunk (when woken per chunk), the end, or a failure."""
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def next_chunk(self) -> bytes:
        """The body bytes that arrived since the last call; b"" once the body is complete.
        Bytes that arrived before a failure are handed out before the error is raised."""
        while True:
            if self._chunks:
                return self._take()
            if self.error is not None:
                raise self.error
            if self.done:
                return b""
            await self._wait()

    async def read_all(self) -> bytes:
        """The whole (remaining) body, woken once at its end rather than per chunk."""
        self._wake_each_chunk = False
        self._resume_reading()
        while not self.done and self.error is None:
            await self._wait()
        if self.error is not None:
            raise self.error
        return self._take() if self._chunks else b""


def with_body(head: bytes, body: bytes) -> bytes:
    """A request whose head `Pool.request_head` built for a body (it ends at the
    content-length value): the head, the body's length, the empty line and the body."""
    return b"".join((head, b"%d\r\n\r\n" % len(body), body))


class Pool:
    """Keep-alive connections to one origin, at most `size` open at once (idle, busy or being
    connected); callers beyond that wait in order, within their exchange's deadline."""

    def __init__(
        self,
        base_url: str,
        *,
        size: int,
        limit: int,
        connect: float,
        read: float,
        total: float,
        network: UpstreamNetwork | None = None,
    ) -> None:
        self.tls, self.host, self.port, self.host_header, self.prefix = parse_base_url(base_url)
        self.query = base_query(base_url)
        self.network = network or UpstreamNetwork()
        self.proxy: ProxyURL | None = self.network.proxy_for(
            "https" if self.tls else "http", self.host, self.port)
        # What goes between the method and the client's path on the request line, and a field
        # line of the pool's own: through a proxy, an http request is in absolute form and
        # carries the proxy's credentials; an https one goes inside a CONNECT tunnel, as is.
        self.target = self.prefix
        self.own_fields = ""
        if self.proxy is not None and not self.tls:
            self.target = f"http://{self.host_header}{self.prefix}"
            if self.proxy.authorization:
                self.own_fields = f"proxy-authorization: {self.proxy.authorization}\r\n"
        self.size = size
        self.limit = limit
        self.timeouts_connect = connect
        self.timeouts_read = read
        self.timeouts_total = total
        self._ssl: ssl.SSLContext | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.generation = 0
        self._idle: list[Connection] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        # A pool outlives no loop: connections of a finished loop are forgotten, not reused.
        self.loop = loop
        self._idle = []
        self._open = 0
        self._waiters = deque()

    async def acquire(self, deadline: float, *, fresh: bool = False) -> Connection:
        """A connection: an idle one if there is one (unless `fresh`), else a new one."""
        loop = asyncio.get_running_loop()
        if loop is not self.loop:
            self._bind(loop)
        idle = self._idle
        if fresh:  # the idle ones are as old as the one that just failed
            while idle:
                old = idle.pop()
                old.close()
                self._drop(old)
        while idle:
            conn = idle.pop()
            if not conn.closed and loop.time() - conn.idle_since < _IDLE_SECONDS:
                return conn
            conn.close()
            self._drop(conn)
        if self._open >= self.size:
            fut: asyncio.Future[Connection | None] = loop.create_future()
            self._waiters.append(fut)
            try:
                async with asyncio.timeout_at(deadline):
                    got = await fut
            except BaseException as e:
                self._abandon(fut)
                if isinstance(e, TimeoutError):
                    raise UpstreamTimeout(
                        f"no upstream connection free within the total timeout of "
                        f"{self.timeouts_total} s") from None
                raise
            if got is not None:
                if not fresh:
                    return got
                got.close()  # a pooled connection handed over: its slot is the new one's

            # a slot was freed for us: `_open` already counts it
        else:
            self._open += 1
        try:
            return await self._connect(loop, deadline)
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def exchange(self, request: bytes, deadline: float, *, is_head: bool = False,
                       meanwhile: Callable[[], object] | None = None) -> Connection:
        """`request` (head and body, as they go on the wire) sent by `deadline` (loop time):
        the connection once the final response's head is in, its body still to be read
        (`read_all` / `next_chunk`) and the exchange then `finish`ed. A reused keep-alive
        connection the upstream closed as the request went out (DESIGN §11: it fails with
        UpstreamConnectError before any byte of an answer) is retried once on a connection
        opened for it; a fresh connection that fails, or any answer byte, never is.

        `meanwhile` is called once, as soon as the request is written and before its answer is
        awaited: work that needs only the request is done while the upstream answers."""
        retry = True
        fresh = False
        while True:
            conn = await self.acquire(deadline, fresh=fresh)
            reused = conn.used
            try:
                head = conn.start(request, deadline, is_head)
                if meanwhile is not None:
                    meanwhile()
                    meanwhile = None
                await head
            except BaseException as e:
                conn.finish()  # not done: closed, never pooled
                if retry and reused and not conn.received_any and isinstance(
                    e, UpstreamConnectError
                ):
                    retry = False
                    fresh = True
                    continue
                raise
            return conn

    def request_head(
        self, method: str, path_qs: str, headers: Headers, *, body: bool = True
    ) -> bytes:
        """The head of a request as it goes on the wire: the request line (the pool's target,
        the client's path and query byte for byte, the base URL's query parameters the path
        lacks), host, the pool's own fields, then `headers`. With `body` it ends at the
        content-length value (`with_body` completes it with the body); without, with the empty
        line. InputError when any of them carries a line break or NUL."""
        if self.query:
            path_qs = add_base_query(path_qs, self.query)
        parts = [method, " ", self.target, path_qs, " HTTP/1.1\r\nhost: ", self.host_header,
                 "\r\n", self.own_fields]
        for name, value in headers:
            parts += (name, ": ", value, "\r\n")
        parts.append("content-length: " if body else "\r\n")
        head = "".join(parts)
        # One line per field and nothing else: no name, value or path may break a line.
        # Request line, host, the pool's own fields, `headers`, and the empty line if no body.
        lines = len(headers) + 2 + (1 if self.own_fields else 0) + (0 if body else 1)
        if head.count("\n") != lines or head.count("\r") != lines or "\0" in head:
            raise InputError("a request header or the path carries a line break or NUL")
        return head.encode("latin-1")

    def log_failure(self, err: GatewayError) -> None:
        """One log line for a connection that could not be set up (refused, TLS, proxy): the
        audit line of the exchange has the error's kind, this one its class and the route."""
        _log.warning("upstream_connection_failed", error=str(err), kind=err.kind,
                     upstream=f"{self.host}:{self.port}",
                     proxy=str(self.proxy) if self.proxy is not None else None)

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> Connection:
        try:
            return await self._connect_once(loop, deadline)
        except GatewayError as e:
            self.log_failure(e)
            raise

    async def _connect_once(self, loop: asyncio.AbstractEventLoop, deadline: float
                            ) -> Connection:
        if self.tls and self._ssl is None:
            # Built per pool, so SSL_CERT_FILE / SSL_CERT_DIR set for the process are honoured.
            try:
                self._ssl = self.network.ssl_context()
            except (OSError, ValueError) as e:  # a file gone since start-up
                raise UpstreamConnectError(
                    f"upstream TLS failure: TLS settings unusable ({type(e).__name__})") from e
        timeout = min(self.timeouts_connect, deadline - loop.time())
        proxy = self.proxy
        via = f" through proxy {proxy}" if proxy is not None else ""
        try:
            async with asyncio.timeout(timeout):
                if proxy is None or not self.tls:
                    _, conn = await loop.create_connection(
                        lambda: Connection(self, loop),
                        self.host if proxy is None else proxy.host,
                        self.port if proxy is None else proxy.port,
                        ssl=self._ssl if self.tls else None,
                        server_hostname=self.host if self.tls else None,
                    )
                else:
                    sock = await self._tunnel(loop, proxy)
                    try:
                        _, conn = await loop.create_connection(
                            lambda: Connection(self, loop), sock=sock, ssl=self._ssl,
                            server_hostname=self.host)
                    except BaseException:
                        sock.close()
                        raise
        except TimeoutError:
            raise UpstreamTimeout(
                f"upstream connect timed out after {timeout:.3g} s{via}") from None
        except ssl.SSLError as e:
            message, h2 = tls_failure(e)
            raise (ProtocolError(message) if h2 else UpstreamConnectError(message)) from e
        except OSError as e:  # refused, unreachable, DNS (gaierror)
            raise UpstreamConnectError(f"upstream unreachable{via}: {_describe(e)}") from e
        if self.tls and conn._transport is not None:
            tls_object = conn._transport.get_extra_info("ssl_object")
            if tls_object is not None and tls_object.selected_alpn_protocol() == "h2":
                conn.close()
                raise ProtocolError(f"{HTTP2_ONLY}: ALPN chose h2")
        return conn

    async def _tunnel(self, loop: asyncio.AbstractEventLoop, proxy: ProxyURL) -> socket.socket:
        """A socket connected to the proxy, tunnelled by CONNECT to the upstream's host and
        port; TLS to the upstream starts on it next."""
        last: OSError | None = None
        for family, kind, proto, _, addr in await loop.getaddrinfo(
                proxy.host, proxy.port, type=socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, addr)
            except BaseException as e:
                sock.close()
                if not isinstance(e, OSError):
                    raise
                last = e
                continue
            break
        else:
            err = UpstreamConnectError(
                f"proxy {proxy} unreachable" + (f": {_describe(last)}" if last else ""))
            raise err from last
        try:
            host = f"[{self.host}]" if ":" in self.host else self.host
            authority = f"{host}:{self.port}"
            auth = (f"proxy-authorization: {proxy.authorization}\r\n"
                    if proxy.authorization else "")
            await loop.sock_sendall(sock, (
                f"CONNECT {authority} HTTP/1.1\r\nhost: {authority}\r\n{auth}\r\n"
            ).encode("latin-1"))
            answer = b""
            while b"\r\n\r\n" not in answer:
                if len(answer) > _MAX_HEAD:
                    raise ProtocolError(f"proxy {proxy} answered CONNECT with an oversize head")
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    raise UpstreamConnectError(
                        f"proxy {proxy} closed the connection before answering CONNECT")
                answer += data
            head, _, rest = answer.partition(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].split()
            status = int(line[1]) if len(line) >= 2 and line[1].isdigit() else 0
            if not line or not line[0].startswith(b"HTTP/1.") or not 100 <= status <= 599:
                raise ProtocolError(f"proxy {proxy} answered CONNECT with a malformed head")
            if status == 407:
                raise UpstreamConnectError(
                    f"proxy {proxy} refused the tunnel to {authority}: "
                    + ("its credentials were rejected (407)" if proxy.authorization
                       else "it requires authentication (407); put user:password in the "
                            "proxy URL"))
            if not 200 <= status < 300:
                raise UpstreamConnectError(
                    f"proxy {proxy} refused the tunnel to {authority} (status {status})")
            if rest:  # the upstream speaks only after the client's TLS hello
                raise ProtocolError(f"proxy {proxy} sent bytes after its CONNECT answer")
        except BaseException:
            sock.close()
            raise
        return sock

    def release(self, conn: Connection, reusable: bool) -> None:
        if conn.generation != self.generation or conn.closed or not reusable:
            conn.close()
            self._drop(conn)
            return
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(conn)
                return
        assert self.loop is not None
        conn.idle_since = self.loop.time()
        self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
        """An idle connection the upstream closed."""
        if conn in self._idle:
            self._idle.remove(conn)
            self._drop(conn)

    def _abandon(self, fut: asyncio.Future[Connection | None]) -> None:
        """A waiter that left: whatever was handed to it as it left goes to the next one."""
        if fut in self._waiters:
            self._waiters.remove(fut)
        elif fut.done() and not fut.cancelled():
            handed = fut.result()
            if handed is None:
                self._open -= 1
                self._wake_one()
            else:
                self.release(handed, True)

    def _drop(self, conn: Connection) -> None:
        if conn.loop is self.loop:  # a connection of a finished loop is not counted
            self._open -= 1
            self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                self._open += 1
                fut.set_result(None)
                return

    def close_idle(self) -> None:
        """Close every idle connection; busy ones close when their exchange ends."""
        self.generation += 1
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
            self._drop(conn)

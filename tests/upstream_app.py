"""A scriptable fake upstream for the gateway's integration tests, wire-format builders for the
answers it sends, and `serve()`, which runs any ASGI app under uvicorn on a free local port.

A test registers behaviours by key; each request picks one by its `x-test-scenario` header, else
by the first key that occurs in the request's last user message (or rag `question`), else the
default. Every request is recorded before its behaviour runs:

    upstream = create_upstream({"good": Json(openai_body("Fine [a:1].")),
                                "slow": Slow(5.0)})
    with serve(upstream) as upstream_url, serve(gateway_app(upstream_url)) as url:
        ...
        assert all(r.header("x-citewarden-context") is None for r in upstream.requests)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.demo import wire
from gateway.demo.documents import chunk_json, encode_context_header
from gateway.types import Chunk

SCENARIO_HEADER = "x-test-scenario"
ABORT_EXTENSION = "citewarden.test.abort"
"""Scope extension set by `serve()`: a callable that resets the request's TCP connection."""

Protocol = Literal["openai-chat", "anthropic-messages", "rag-json"]

# --------------------------------------------------------------------------------------------
# Wire-format builders
# --------------------------------------------------------------------------------------------


def sse_frame(data: object, event: str | None = None) -> bytes:
    """One SSE frame; `data` is JSON-encoded unless it is a string."""
    return wire.sse(data, event)


def openai_body(
    text: str,
    *,
    n: int = 1,
    model: str = "fake-model",
    id: str = "chatcmpl-fake",
    finish_reason: str = "stop",
    usage: tuple[int, int] = (20, 10),
) -> dict[str, Any]:
    """A `chat.completion` body whose `n` choices carry `text`; usage is (prompt, completion)."""
    return wire.openai_completion(
        text,
        id=id,
        model=model,
        created=1_700_000_000,
        usage=wire.Usage(*usage),
        n=n,
        finish_reason=finish_reason,
    )


def openai_sse(
    text: str,
    *,
    chunk_size: int = 4,
    n: int = 1,
    include_usage: bool = False,
    done: bool = True,
    model: str = "fake-model",
    id: str = "chatcmpl-fake",
    finish_reason: str = "stop",
    usage: tuple[int, int] = (20, 10),
) -> list[bytes]:
    """SSE frames of a chat completion stream of `text`, `chunk_size` characters per delta."""
    chunks = wire.openai_chunks(
        wire.split_fixed(text, chunk_size),
        id=id,
        model=model,
        created=1_700_000_000,
        usage=wire.Usage(*usage),
        n=n,
        include_usage=include_usage,
        finish_reason=finish_reason,
    )
    return wire.openai_frames(chunks, done=done)


def anthropic_body(
    text: str,
    *,
    model: str = "claude-fake",
    id: str = "msg_fake",
    stop_reason: str = "end_turn",
    usage: tuple[int, int] = (20, 10),
) -> dict[str, Any]:
    """A Messages `message` body with one text block."""
    return wire.anthropic_message(
        text, id=id, model=model, usage=wire.Usage(*usage), stop_reason=stop_reason
    )


def anthropic_sse(
    text: str,
    *,
    chunk_size: int = 4,
    ping: bool = True,
    model: str = "claude-fake",
    id: str = "msg_fake",
    stop_reason: str = "end_turn",
    usage: tuple[int, int] = (20, 10),
) -> list[bytes]:
    """SSE frames of a Messages stream of `text`, `chunk_size` characters per text_delta."""
    events = wire.anthropic_events(
        wire.split_fixed(text, chunk_size),
        id=id,
        model=model,
        usage=wire.Usage(*usage),
        stop_reason=stop_reason,
        ping=ping,
    )
    return wire.anthropic_frames(events)


def error_envelope(protocol: Protocol, message: str, type_: str | None = None) -> dict[str, Any]:
    """The protocol's own error body."""
    match protocol:
        case "openai-chat":
            return wire.openai_error(message, type_ or "invalid_request_error")
        case "anthropic-messages":
            return wire.anthropic_error(message, type_ or "invalid_request_error")
        case "rag-json":
            return {"error": {"message": message, "type": type_ or "error"}}


def context_header(chunks: Iterable[Chunk | tuple[str, str, str | None]]) -> str:
    """An `x-citewarden-context` value for chunks given as `Chunk`s or (id, text, version)."""
    return encode_context_header(
        [c if isinstance(c, Chunk) else Chunk(id=c[0], text=c[1], version=c[2]) for c in chunks]
    )


def rag_body(answer: str, chunks: Iterable[Chunk]) -> dict[str, Any]:
    """A rag-json body: `{"answer", "sources": [{id, text, version}]}`."""
    return {"answer": answer, "sources": [chunk_json(c) for c in chunks]}


def sse_events(raw: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) of each SSE event a client received; written here, independently of
    the gateway's SSE decoder, so tests read streams with code that is not under test."""
    events = []
    for block in raw.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            field_name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field_name == "event":
                name = value
            elif field_name == "data":
                data.append(value)
        if data:
            events.append((name, "\n".join(data)))
    return events


def sse_objects(raw: bytes) -> list[dict[str, Any]]:
    """The JSON objects among the data of the SSE events a client received (`[DONE]`, other
    text and JSON that is not an object left out), in order."""
    out = []
    for _, data in sse_events(raw):
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def split_random(data: bytes, *, seed: int = 0, max_piece: int = 16) -> list[bytes]:
    """`data` cut at random byte boundaries (pieces of 1..max_piece bytes), reproducibly."""
    rng = random.Random(seed)
    pieces: list[bytes] = []
    i = 0
    while i < len(data):
        step = rng.randint(1, max_piece)
        pieces.append(data[i : i + step])
        i += step
    return pieces


# --------------------------------------------------------------------------------------------
# Recording
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as the upstream received it. Header names are lower-case."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of a header, or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def header_names(self) -> set[str]:
        return {k for k, _ in self.headers}

    def json(self) -> Any:
        return json.loads(self.body)


def _last_user_text(body: bytes) -> str | None:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    for key in ("question", "query"):
        if isinstance(data.get(key), str):
            return str(data[key])
    messages = data.get("messages")
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return "\n".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
                )
    return None


# --------------------------------------------------------------------------------------------
# ASGI plumbing shared by the behaviours
# --------------------------------------------------------------------------------------------


async def _start(
    send: Send, status: int, content_type: str, headers: Mapping[str, str], length: int | None
) -> None:
    raw = [(b"content-type", content_type.encode())]
    if length is not None:
        raw.append((b"content-length", str(length).encode()))
    raw.extend((k.lower().encode(), v.encode()) for k, v in headers.items())
    await send({"type": "http.response.start", "status": status, "headers": raw})


async def _send_whole(
    send: Send, status: int, content_type: str, headers: Mapping[str, str], body: bytes
) -> None:
    await _start(send, status, content_type, headers, len(body))
    await send({"type": "http.response.body", "body": body})


async def _send_pieces(send: Send, pieces: Sequence[bytes], delay: float) -> None:
    for piece in pieces:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
        if delay > 0:
            await asyncio.sleep(delay)


async def _wait_disconnect(receive: Receive, seconds: float) -> bool:
    """Sleep `seconds` unless the client disconnects first; True if it did."""
    task = asyncio.ensure_future(receive())
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
        return task in done and task.result()["type"] == "http.disconnect"
    finally:
        if not task.done():
            task.cancel()


def _frames_bytes(frames: Sequence[bytes] | bytes) -> bytes:
    return frames if isinstance(frames, bytes) else b"".join(frames)


# --------------------------------------------------------------------------------------------
# Behaviours
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Json:
    """A JSON body; `bytes` are sent verbatim, anything else is `json.dumps`-ed."""

    body: object
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "application/json"

    def payload(self) -> bytes:
        return self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_whole(send, self.status, self.content_type, self.headers, self.payload())


@dataclass(frozen=True)
class InvalidJson:
    """A body labelled application/json that does not parse."""

    status: int = 200
    body: bytes = b'{"id": "broken", "choices": [{"inde'

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _send_whole(send, self.status, "application/json", {}, self.body)


@dataclass(frozen=True)
class Html:
    """A non-2xx answer with an HTML body, as a load balancer in front of the upstream sends."""

    status: int = 502
    body: str = "<html><body><h1>502 Bad Gateway</h1><p>nginx</p></body></html>"
    headers: Mapping[str, str] = field(default_factory=dict)

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.body.encode()
        await _send_whole(send, self.status, "text/html; charset=utf-8", self.headers, body)


@dataclass(frozen=True)
class ErrorEnvelope:
    """A non-2xx answer whose body is the protocol's own error envelope."""

    status: int
    protocol: Protocol
    message: str = "upstream refused the request"
    type_: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, Any]:
        return error_envelope(self.protocol, self.message, self.type_)

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        payload = json.dumps(self.body()).encode()
        await _send_whole(send, self.status, "application/json", self.headers, payload)


@dataclass(frozen=True)
class RateLimited:
    """429 with `retry-after` and rate-limit headers, body in the protocol's error envelope."""

    retry_after: str = "2"
    protocol: Protocol = "openai-chat"
    headers: Mapping[str, str] = field(
        default_factory=lambda: {
            "x-ratelimit-limit-requests": "60",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "2s",
        }
    )

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = error_envelope(self.protocol, "rate limit exceeded", "rate_limit_error")
        headers = {"retry-after": self.retry_after, **self.headers}
        await _send_whole(send, 429, "application/json", headers, json.dumps(body).encode())


@dataclass(frozen=True)
class Oversize:
    """A valid JSON body of at least `size` bytes; `chunked` omits content-length and sends
    64 KiB pieces, so only a streaming size limit can catch it.
    """

    size: int
    chunked: bool = False

    def payload(self) -> bytes:
        head, tail = b'{"answer": "', b'", "sources": []}'
        return head + b"a" * max(0, self.size - len(head) - len(tail)) + tail

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self.payload()
        if not self.chunked:
            await _send_whole(send, 200, "application/json", {}, body)
            return
        await _start(send, 200, "application/json", {}, None)
        step = 64 * 1024
        await _send_pieces(send, [body[i : i + step] for i in range(0, len(body), step)], 0.0)
        await send({"type": "http.response.body", "body": b""})


@dataclass(frozen=True)
class Stream:
    """An SSE body (frames, or raw bytes) cut at random byte boundaries with a small delay
    between pieces; the same seed gives the same cuts.
    """

    frames: Sequence[bytes] | bytes
    seed: int = 0
    max_piece: int = 64
    delay: float = 0.001
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str = "text/event-stream; charset=utf-8"

    def data(self) -> bytes:
        return _frames_bytes(self.frames)

    def pieces(self) -> list[bytes]:
        return split_random(self.data(), seed=self.seed, max_piece=self.max_piece)

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {"cache-control": "no-cache", **self.headers}
        await _start(send, self.status, self.content_type, headers, None)
        await _send_pieces(send, self.pieces(), self.delay)
        await send({"type": "http.response.body", "body": b""})


@dataclass(frozen=True)
class Truncated:
    """A stream whose last `drop_last` frames never come: the body ends cleanly but without
    the protocol's terminal event (`[DONE]`, `message_stop`).
    """

    frames: Sequence[bytes]
    drop_last: int = 1
    seed: int = 0
    max_piece: int = 64
    delay: float = 0.001

    def sent(self) -> list[bytes]:
        return list(self.frames[: len(self.frames) - self.drop_last])

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = Stream(self.sent(), seed=self.seed, max_piece=self.max_piece, delay=self.delay)
        await stream.respond(scope, receive, send)


@dataclass(frozen=True)
class Reset:
    """A stream that sends its first `after` bytes (default: half) and then resets the TCP
    connection (RST) when served by `serve()`; elsewhere it raises ConnectionResetError.
    """

    frames: Sequence[bytes] | bytes
    after: int | None = None
    seed: int = 0
    max_piece: int = 64
    delay: float = 0.001

    def sent(self) -> bytes:
        data = _frames_bytes(self.frames)
        return data[: len(data) // 2 if self.after is None else self.after]

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        await _start(send, 200, "text/event-stream; charset=utf-8", {}, None)
        pieces = split_random(self.sent(), seed=self.seed, max_piece=self.max_piece)
        await _send_pieces(send, pieces, self.delay)
        abort: Callable[[], bool] | None = scope.get("extensions", {}).get(ABORT_EXTENSION)
        # Give the client a moment to read what was sent: an RST discards unread data.
        await asyncio.sleep(0.05)
        if abort is None or not abort():
            raise ConnectionResetError("fake upstream reset the connection")
        # Let uvicorn see connection_lost before the app returns, so it logs no error.
        for _ in range(5):
            await asyncio.sleep(0)


@dataclass(frozen=True)
class Slow:
    """Wait `seconds` before sending any header (ends early if the client goes away), then
    behave as `then`.
    """

    seconds: float
    then: Behaviour = field(default_factory=lambda: Json({"slow": True}))

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await _wait_disconnect(receive, self.seconds):
            return
        await self.then.respond(scope, receive, send)


@dataclass(frozen=True)
class Gzip:
    """`inner`'s body gzip-encoded (`content-encoding: gzip`); streams are flushed per piece."""

    inner: Json | InvalidJson | Stream | Oversize | ErrorEnvelope

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        compressor = zlib.compressobj(wbits=31)

        async def gzip_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message["headers"] if k != b"content-length"]
                headers.append((b"content-encoding", b"gzip"))
                await send({**message, "headers": headers})
                return
            more = message.get("more_body", False)
            data = compressor.compress(message.get("body", b""))
            data += compressor.flush(zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH)
            await send({"type": "http.response.body", "body": data, "more_body": more})

        await self.inner.respond(scope, receive, gzip_send)


Behaviour = (
    Json
    | InvalidJson
    | Html
    | ErrorEnvelope
    | RateLimited
    | Oversize
    | Stream
    | Truncated
    | Reset
    | Slow
    | Gzip
)


# --------------------------------------------------------------------------------------------
# The app
# --------------------------------------------------------------------------------------------


class FakeUpstream:
    """An ASGI upstream that plays a registered behaviour per request and records requests."""

    def __init__(
        self, scenarios: Mapping[str, Behaviour] | None = None, default: Behaviour | None = None
    ) -> None:
        self.scenarios: dict[str, Behaviour] = dict(scenarios or {})
        self.default = default
        self.requests: list[Recorded] = []

    def on(self, key: str, behaviour: Behaviour) -> FakeUpstream:
        self.scenarios[key] = behaviour
        return self

    def select(self, request: Recorded) -> Behaviour | None:
        key = request.header(SCENARIO_HEADER)
        if key is not None:
            return self.scenarios.get(key)
        text = _last_user_text(request.body)
        if text is not None:
            for candidate, behaviour in self.scenarios.items():
                if candidate in text:
                    return behaviour
        return self.default

    @property
    def paths(self) -> list[str]:
        return [r.path for r in self.requests]

    def clear(self) -> None:
        self.requests.clear()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        headers = tuple(
            (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]
        )
        if scope["type"] == "websocket":
            self.requests.append(Recorded("WEBSOCKET", scope["path"], "", headers, b""))
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        request = Recorded(
            scope["method"], scope["path"], scope["query_string"].decode("latin-1"), headers, body
        )
        self.requests.append(request)
        behaviour = self.select(request)
        if behaviour is None:
            message_text = f"fake upstream: no scenario matches {request.method} {request.path}"
            payload = json.dumps({"error": {"message": message_text}}).encode()
            await _send_whole(send, 500, "application/json", {}, payload)
            return
        await behaviour.respond(scope, receive, send)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def create_upstream(
    scenarios: Mapping[str, Behaviour] | None = None, default: Behaviour | None = None
) -> FakeUpstream:
    """A fresh fake upstream with the given keyed behaviours."""
    return FakeUpstream(scenarios, default)


# --------------------------------------------------------------------------------------------
# Serving
# --------------------------------------------------------------------------------------------


def _resetter(server: uvicorn.Server, client: object) -> Callable[[], bool]:
    def reset() -> bool:
        for connection in list(server.server_state.connections):
            if getattr(connection, "client", None) != client:
                continue
            transport: asyncio.Transport = connection.transport
            sock = transport.get_extra_info("socket")
            if sock is not None:
                # Linger 0 turns the close into an RST instead of an orderly FIN.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
            return True
        return False

    return reset


def _with_reset(app: ASGIApp, server_ref: list[uvicorn.Server]) -> ASGIApp:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and server_ref:
            extensions = {
                **(scope.get("extensions") or {}),
                ABORT_EXTENSION: _resetter(server_ref[0], scope.get("client")),
            }
            scope = {**scope, "extensions": extensions}
        await app(scope, receive, send)

    return wrapped


class QuickServer(uvicorn.Server):
    """uvicorn's server, stopped within milliseconds: uvicorn looks at `should_exit` every
    0.1 s and, shutting down, sleeps 0.1 s and then polls its connections every 0.1 s, about
    a quarter of a second per server that the suite's hundreds of servers spend idle. The
    same steps, polled every 10 ms."""

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864000
            await asyncio.sleep(0.01)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        state = self.server_state
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while (state.connections or state.tasks) and not self.force_exit:
                    await asyncio.sleep(0.01)
                for server in self.servers:
                    await server.wait_closed()
        except TimeoutError:
            for t in state.tasks:
                t.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()


@contextlib.contextmanager
def serve(
    app: ASGIApp | Callable[[Scope, Receive, Send], Awaitable[None]],
    *,
    http: Literal["h11", "httptools"] = "h11",
    lifespan: Literal["auto", "on", "off"] = "auto",
    timeout: float = 10.0,
) -> Iterator[str]:
    """Run `app` under uvicorn on 127.0.0.1 and a free port in a background thread; yields the
    base URL (`http://127.0.0.1:PORT`). On exit the server shuts down and the thread is joined;
    connections still open after a quarter of a second are cut.
    """
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on accepted sockets whose proto says
    # TCP. Without it, a response written in two parts (head, body) on a reused connection
    # waits out the client's delayed ACK, ~40 ms per exchange.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server_ref: list[uvicorn.Server] = []
    config = uvicorn.Config(
        _with_reset(app, server_ref),
        http=http,
        ws="none",  # as the gateway's own server: upgrades are plain HTTP requests
        lifespan=lifespan,
        loop="asyncio",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=0.25,
    )
    server = QuickServer(config)
    server_ref.append(server)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn:{port}", daemon=True
    )
    thread.start()
    try:
        deadline = time.monotonic() + timeout
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn did not start within {timeout}s")
            time.sleep(0.005)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        if thread.is_alive():
            server.force_exit = True
            thread.join(timeout)
        sock.close()

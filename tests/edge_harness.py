"""The gateway as production serves it (gateway.server's uvicorn config: httptools with the
limits of gateway/limits.py) in front of a raw-socket upstream that records every connection:
the bytes it received, and when the gateway closed it.

    upstream = RawUpstream()      # behaviour chosen by the request's `x-scenario` header
    with upstream.running(), run_proxy(upstream.url, [policy]) as gw:
        ...
        assert upstream.conns[0].closed_at is not None
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import structlog

from gateway.audit import configure_logging, reset_logging
from gateway.metrics import Metrics
from gateway.server import Settings, build, proxy_config
from tests.upstream_app import QuickServer, openai_body, sse_frame

SYSTEM = '<chunk id="doc:1">The battery holds 62.5 kWh.</chunk>'
GOOD = "The battery holds 62.5 kWh [doc:1]."

POLICY = """\
name: edge
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat
  - name: bedrock
    match: {path_glob: /model/*/converse}
    protocol: openai-chat
passthrough: [/v1/models, /v1/files/**, /model/*/invoke, /raw/*]
citations: {format: doc-chunk}
release: {on_unverified: block}
streaming: {mode: buffer}
"""

PROGRESSIVE = """\
name: edge-progressive
routes:
  - name: chat-progressive
    match: {path: /v1/chat/completions, header: {x-mode: progressive}}
    protocol: openai-chat
citations: {format: doc-chunk}
release: {on_unverified: block}
streaming: {mode: progressive}
"""


def write_policies(directory: Path) -> list[Path]:
    """The progressive policy (header-matched, so first) and the buffered one."""
    progressive = directory / "progressive.yaml"
    progressive.write_text(PROGRESSIVE)
    buffered = directory / "policy.yaml"
    buffered.write_text(POLICY)
    return [progressive, buffered]


def chat_request(stream: bool = False, text: str = "How big is the battery?") -> bytes:
    return json.dumps(
        {
            "model": "m",
            "stream": stream,
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": text},
            ],
        }
    ).encode()


def stream_chunk(text: str) -> bytes:
    return sse_frame(
        {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        }
    )


# --------------------------------------------------------------------------------- upstream


@dataclass
class Conn:
    opened_at: float
    data: bytearray = field(default_factory=bytearray)
    closed_at: float | None = None  # when the gateway closed it (EOF or reset seen)
    finished: bool = False  # the upstream sent its whole scripted answer

    def requests(self) -> int:
        return self.data.count(b" HTTP/1.1\r\n")


class RawUpstream:
    """An HTTP/1.1 upstream on raw sockets. Scenarios (`x-scenario` request header):

    json (default)   a whole JSON answer at once, keep-alive
    slow-json        a JSON head, then one body byte every `tick` seconds (content-length 4000)
    slow-sse         an SSE stream, one frame every `tick` seconds, for `ticks` frames
    block-sse        a hallucinated claim first, then slow frames as `slow-sse`
    """

    def __init__(self, tick: float = 0.05, ticks: int = 200) -> None:
        self.tick = tick
        self.ticks = ticks
        self.conns: list[Conn] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[RawUpstream]:
        ready = threading.Event()
        stop: list[asyncio.Event] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
            stop.append(asyncio.Event())
            ready.set()
            async with server:
                await stop[0].wait()

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        thread.start()
        assert ready.wait(5)
        try:
            yield self
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(stop[0].set)
            thread.join(5)

    def wait_for(self, predicate: Any, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("upstream condition not met in time")
            time.sleep(0.005)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(time.monotonic())
        self.conns.append(conn)
        arrived = asyncio.Event()
        answering = asyncio.create_task(self._answer_all(conn, writer, arrived))
        try:
            while True:
                try:
                    chunk = await reader.read(65536)
                except ConnectionError:
                    chunk = b""
                if not chunk:
                    conn.closed_at = time.monotonic()
                    break
                conn.data += chunk
                arrived.set()
        finally:
            answering.cancel()
            writer.close()

    async def _answer_all(
        self, conn: Conn, writer: asyncio.StreamWriter, arrived: asyncio.Event
    ) -> None:
        """Answer each whole request on the connection in turn."""
        pos = 0
        while True:
            await arrived.wait()
            arrived.clear()
            while (end := conn.data.find(b"\r\n\r\n", pos)) >= 0:
                head = bytes(conn.data[pos:end]).lower()
                length = 0
                scenario = "json"
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"x-scenario":
                        scenario = value.strip().decode()
                if len(conn.data) < end + 4 + length:
                    break
                pos = end + 4 + length
                await self._answer(conn, writer, scenario)

    async def _answer(self, conn: Conn, writer: asyncio.StreamWriter, scenario: str) -> None:
        try:
            if scenario == "slow-json":
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: 4000\r\n\r\n{"
                )
                for _ in range(3999):
                    await asyncio.sleep(self.tick)
                    writer.write(b" ")
                    await writer.drain()
            elif scenario in ("slow-sse", "block-sse"):
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                first = (
                    [stream_chunk("The battery holds 99 kWh [zz:9].\n\nMore")]
                    if scenario == "block-sse"
                    else []
                )
                for frame in [*first, *(stream_chunk("x") for _ in range(self.ticks))]:
                    writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                    await writer.drain()
                    await asyncio.sleep(self.tick)
                writer.write(b"0\r\n\r\n")
            else:
                body = json.dumps(openai_body(GOOD)).encode()
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
            await writer.drain()
            conn.finished = True
        except ConnectionError:
            pass


# ---------------------------------------------------------------------------------- gateway


@dataclass
class Proxy:
    url: str
    host: str
    port: int
    metrics: Metrics
    settings: Settings


@contextlib.contextmanager
def run_proxy(upstream_url: str, policies: list[Path], **limits: Any) -> Iterator[Proxy]:
    """The proxy port as `citewarden serve` runs it (gateway.server.proxy_config), in a thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings = Settings(
        upstream=upstream_url,
        policies=[str(p) for p in policies],
        host="127.0.0.1",
        port=port,
        connect_timeout=2.0,
        read_timeout=10.0,
        total_timeout=30.0,
    )
    settings = replace(settings, **limits)
    proxy, _, _, metrics = build(settings)
    config = proxy_config(proxy, settings, metrics)
    config.loop = "asyncio"
    config.log_level = "warning"
    server = QuickServer(config)
    quiet = not structlog.is_configured()
    if quiet:
        configure_logging(stream=io.StringIO())
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "gateway did not start"
            time.sleep(0.005)
        yield Proxy(f"http://127.0.0.1:{port}", "127.0.0.1", port, metrics, settings)
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        if quiet:
            reset_logging()


def raw_exchange(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send `request` on a fresh connection; everything the gateway answers until it closes
    (or `timeout`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        out = bytearray()
        with contextlib.suppress(TimeoutError, ConnectionError):
            while chunk := s.recv(65536):
                out += chunk
                if _whole_response(out):
                    break
        return bytes(out)


def _whole_response(data: bytearray) -> bool:
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    head = bytes(data[:end]).lower()
    for line in head.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(data) - end - 4 >= int(line.split(b":", 1)[1])
    return head.startswith(b"http/1.1 304") or data.endswith(b"0\r\n\r\n")


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> Any:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def audits(buf: io.StringIO, n: int = 1, timeout: float = 3.0) -> list[dict[str, object]]:
    """The audit events in `buf` (the `audit_log` fixture's stream), once there are `n` of
    them or `timeout` seconds passed: the gateway writes them a moment after its answer."""
    deadline = time.monotonic() + timeout
    while True:
        lines = [json.loads(x) for x in buf.getvalue().splitlines() if '"audit"' in x]
        if len(lines) >= n or time.monotonic() > deadline:
            return lines
        time.sleep(0.01)

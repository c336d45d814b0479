"""Python load drivers, run in their own process so they never share a loop with a server.

    python bench/load.py sse  --url URL --streams 128 [--rounds 1] [--stagger-ms 20]  -> JSON
    python bench/load.py json --url URL --concurrency 16 --duration 5 -> JSON on stdout
    python bench/load.py alternate --url URL --url URL ... --duration 30  -> JSON on stdout

`sse` opens N concurrent streams of the mock's answer (raw connections parsed by httptools, so
the driver's own cost stays out of the timestamps) and checks that each one's content arrives
whole and in order; `json` is the closed-loop fallback when wrk is not installed; `alternate`
measures latency at concurrency 1 against several targets in turn, one request each, so that
every target meets the same machine (see `alternate`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import httptools

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mock_upstream import ANSWER_TEXT, REQUEST_BODY, STREAM_FRAMES, STREAM_REQUEST_BODY

HEADERS = {"content-type": "application/json", "authorization": "Bearer bench"}
# A delta frame with non-empty content text.
_CONTENT = re.compile(rb'"content": ?"[^"]')


def _contents(raw: bytes) -> tuple[list[str], bool, bool]:
    """(content deltas in order, saw [DONE], saw an error event) of an openai-chat SSE body."""
    deltas: list[str] = []
    done = error = False
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = b"\n".join(line[5:].lstrip(b" ") for line in block.split(b"\n")
                          if line.startswith(b"data:"))
        if not data:
            continue
        if data == b"[DONE]":
            done = True
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            error = True
            continue
        if "error" in obj:
            error = True
        for choice in obj.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                deltas.append(content)
    return deltas, done, error


class _StreamClient(asyncio.Protocol):
    """One streamed exchange over a raw connection, parsed by httptools (C).

    The driver is part of what the SSE scenario measures: with 128 streams releasing at once,
    a heavy client stamps the last streams late. Timestamps are taken when bytes reach
    `data_received`, before any parsing, and the per-chunk work is a C parse and a regex.
    """

    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request = request
        self.done = done
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.parts: list[bytes] = []
        self.first = self.first_content = self.last = 0.0
        self.now = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.now = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._end(e)

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.first = self.first or self.now
        self.parts.append(body)
        # A role-only opening frame is not a released claim: time the first text.
        if not self.first_content and _CONTENT.search(body):
            self.first_content = self.now

    def on_message_complete(self) -> None:
        # Stamped here, not when `_one_stream` resumes: with 128 streams ending together, the
        # coroutines resume one after another behind each other's frame parsing (~0.4 ms each).
        self.last = self.now
        self._end(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionError("closed before the response ended"))

    def _end(self, exc: BaseException | None) -> None:
        if self.done.done():
            return
        if exc is None:
            self.done.set_result(None)
        else:
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()


async def _one_stream(url: str, rid: str, delay: float = 0.0) -> dict[str, Any]:
    if delay:
        await asyncio.sleep(delay)
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    head = (f"POST {u.path or '/'} HTTP/1.1\r\nhost: {host}:{port}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in {**HEADERS, "x-request-id": rid}.items())
            + f"content-length: {len(STREAM_REQUEST_BODY)}\r\nconnection: close\r\n\r\n")
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    t0 = time.monotonic()
    _, client = await loop.create_connection(
        lambda: _StreamClient(head.encode() + STREAM_REQUEST_BODY, done), host, port)
    await asyncio.wait_for(done, 120)
    # The body is checked once the whole round is over (`_checked`): parsed here, each stream
    # that ends would hold this loop ~0.4 ms, and the streams ending behind it would be
    # stamped late by that much.
    return {"rid": rid, "status": client.status, "start": t0, "first_byte": client.first,
            "first_content": client.first_content, "end": client.last,
            "body": b"".join(client.parts)}


def _checked(stream: dict[str, Any]) -> dict[str, Any]:
    """A finished stream's result with its body replaced by what the body holds."""
    deltas, finished, error = _contents(stream.pop("body"))
    return {**stream, "frames": len(deltas), "intact": "".join(deltas) == ANSWER_TEXT,
            "done": finished, "error_event": error}


async def sse(url: str, streams: int, rounds: int, stagger_ms: float = 0.0) -> dict[str, Any]:
    """`streams` concurrent streams per round. With `stagger_ms`, stream i opens i/streams of
    that window late (arrivals spread as real clients' are); without, all open at once."""
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    for r in range(rounds):
        got = await asyncio.gather(
            *(_one_stream(url, f"bench-{r}-{i}", stagger_ms / 1000 * i / streams)
              for i in range(streams)),
            return_exceptions=True)
        for g in got:
            if isinstance(g, BaseException):
                failures.append(f"{type(g).__name__}: {g}")
            else:
                results.append(_checked(g))
    return {"streams": results, "failures": failures,
            "expected_frames": len(STREAM_FRAMES) - 3}  # minus role, finish and [DONE] frames


async def json_load(url: str, concurrency: int, duration: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + duration

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                async with session.post(url, data=REQUEST_BODY, headers=HEADERS) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            latencies.append(time.monotonic() - t0)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.monotonic()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.monotonic() - start
    latencies.sort()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"rps": len(latencies) / elapsed, "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000,
            "requests": len(latencies), "errors": errors}


class _OneAtATime:
    """A keep-alive connection that sends the benchmark request and reads the whole answer,
    blocking: a few syscalls and a C parse per request, the same for every target."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.addr = (u.hostname or "127.0.0.1", u.port or 80)
        head = (f"POST {u.path or '/'} HTTP/1.1\r\nhost: {self.addr[0]}:{self.addr[1]}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in HEADERS.items())
                + f"content-length: {len(REQUEST_BODY)}\r\n\r\n")
        self.request = head.encode() + REQUEST_BODY
        self.sock: socket.socket | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.complete = False
        self.keep_alive = False
        self.status = 0

    def on_headers_complete(self) -> None:
        # Read here: once the message is complete, httptools' parser has reset and
        # `should_keep_alive()` answers False for every response.
        self.keep_alive = self.parser.should_keep_alive()

    def on_message_complete(self) -> None:
        self.complete = True

    def once(self) -> tuple[float, bool]:
        """(seconds from the first byte sent to the last byte read, 2xx)."""
        if self.sock is None:
            self.sock = socket.create_connection(self.addr, timeout=10)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.parser = httptools.HttpResponseParser(self)
        self.complete = False
        t0 = time.perf_counter()
        self.sock.sendall(self.request)
        while not self.complete:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed before the response ended")
            self.parser.feed_data(data)
        elapsed = time.perf_counter() - t0
        if not self.keep_alive:
            self.close()
        return elapsed, 200 <= self.parser.get_status_code() < 300

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def alternate(urls: list[str], duration: float, pause: float = 0.002) -> dict[str, Any]:
    """Concurrency 1 against every target in turn: one request to each, round after round
    (the order rotating), until `duration` is spent. Run back to back instead, target after
    target, the added latency moves with whatever else the shared machine does in between
    (the gap is a fraction of a millisecond on a 20 ms request); in turns, drift reaches
    every target alike. After each answer the driver waits `pause`, so that what a server
    does after its last byte (accounting, logging) is done before the next target's request
    is timed: on two cores it would otherwise slow whichever target comes next. Every request
    thus meets an idle server, as a lone client's does. {url: {latencies_ms, errors}}, the
    first request to each (connect) left out."""
    clients = [_OneAtATime(u) for u in urls]
    out: dict[str, dict[str, Any]] = {u: {"latencies_ms": [], "errors": 0} for u in urls}
    for c in clients:  # connect and warm up
        c.once()
    deadline = time.monotonic() + duration
    turn = 0
    while time.monotonic() < deadline:
        order = list(range(len(urls)))
        order = order[turn % len(order):] + order[:turn % len(order)]
        turn += 1
        for i in order:
            try:
                seconds, ok = clients[i].once()
            except (OSError, httptools.HttpParserError):
                clients[i].close()
                out[urls[i]]["errors"] += 1
                continue
            out[urls[i]]["latencies_ms"].append(seconds * 1000)
            out[urls[i]]["errors"] += not ok
            time.sleep(pause)
    for c in clients:
        c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sse", "json", "alternate"])
    ap.add_argument("--url", required=True, action="append",
                    help="the target (alternate: once per target)")
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--stagger-ms", type=float, default=0.0,
                    help="spread the streams' starts evenly over this window")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--pause-ms", type=float, default=2.0,
                    help="alternate: the wait after each answer")
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.mode == "alternate":
        out = alternate(args.url, args.duration, args.pause_ms / 1000)
    elif args.mode == "sse":
        out = asyncio.run(sse(args.url[0], args.streams, args.rounds, args.stagger_ms))
    else:
        out = asyncio.run(json_load(args.url[0], args.concurrency, args.duration))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

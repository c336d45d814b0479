"""Python load drivers, run in their own process so they never share a loop with a server.

    python bench/load.py sse  --url URL --streams 128 [--rounds 1] [--stagger-ms 20]  -> JSON
    python bench/load.py json --url URL --concurrency 16 --duration 5 -> JSON on stdout

`sse` opens N concurrent streams of the mock's answer (raw connections parsed by httptools, so
the driver's own cost stays out of the timestamps) and checks that each one's content arrives
whole and in order; `json` is the closed-loop fallback when wrk is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
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
    end = client.last
    deltas, finished, error = _contents(b"".join(client.parts))
    return {"rid": rid, "status": client.status, "start": t0, "first_byte": client.first,
            "first_content": client.first_content, "end": end,
            "frames": len(deltas), "intact": "".join(deltas) == ANSWER_TEXT,
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
                results.append(g)
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sse", "json"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--streams", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--stagger-ms", type=float, default=0.0,
                    help="spread the streams' starts evenly over this window")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.mode == "sse":
        out = asyncio.run(sse(args.url, args.streams, args.rounds, args.stagger_ms))
    else:
        out = asyncio.run(json_load(args.url, args.concurrency, args.duration))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

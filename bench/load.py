"""Python load drivers, run in their own process so they never share a loop with a server.

    python bench/load.py sse  --url URL --streams 128 [--rounds 1]   -> JSON on stdout
    python bench/load.py json --url URL --concurrency 16 --duration 5 -> JSON on stdout

`sse` opens N concurrent streams of the mock's answer and checks that each one's content
arrives whole and in order; `json` is the closed-loop fallback when wrk is not installed.
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
from typing import Any

import aiohttp

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


async def _one_stream(session: aiohttp.ClientSession, url: str, rid: str) -> dict[str, Any]:
    t0 = time.monotonic()
    first = first_content = 0.0
    parts: list[bytes] = []
    async with session.post(url, data=STREAM_REQUEST_BODY,
                            headers={**HEADERS, "x-request-id": rid}) as resp:
        async for chunk in resp.content.iter_any():
            now = time.monotonic()
            first = first or now
            parts.append(chunk)
            # A role-only opening frame is not a released claim: time the first text. Only
            # the new chunk is looked at (a regex, no JSON), so that with 128 streams the
            # driver's own parsing does not delay the timestamps it takes for the others.
            if not first_content and _CONTENT.search(chunk):
                first_content = now
        status = resp.status
    end = time.monotonic()
    deltas, done, error = _contents(b"".join(parts))
    return {"rid": rid, "status": status, "start": t0, "first_byte": first,
            "first_content": first_content, "end": end,
            "frames": len(deltas), "intact": "".join(deltas) == ANSWER_TEXT,
            "done": done, "error_event": error}


async def sse(url: str, streams: int, rounds: int) -> dict[str, Any]:
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    results: list[dict[str, Any]] = []
    failures: list[str] = []
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        for r in range(rounds):
            got = await asyncio.gather(
                *(_one_stream(session, url, f"bench-{r}-{i}") for i in range(streams)),
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
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    if args.mode == "sse":
        out = asyncio.run(sse(args.url, args.streams, args.rounds))
    else:
        out = asyncio.run(json_load(args.url, args.concurrency, args.duration))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

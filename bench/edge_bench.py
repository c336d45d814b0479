"""Edge timings (DESIGN §7): how soon the upstream is hung up on after the client hangs up
(target ≤ 100 ms), and whether 3,000 slowloris connections are timed out while a normal
request is still served. Prints figures; asserts nothing about time. Not part of `make test`.

    python bench/edge_bench.py [--trials 40] [--slowloris 3000] [--head-timeout 10]

The gateway runs as `citewarden serve` in its own process (uvloop, httptools, the production
limits); the upstream is a raw-socket server that records when each of its connections closed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common
from bench.run import gateway_argv
from tests.edge_harness import RawUpstream, chat_request, write_policies


def _request(path: str, body: bytes, **headers: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "host: gw", "content-type: application/json",
            f"content-length: {len(body)}"]
    head += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


MODES = {
    "buffered JSON": (_request("/v1/chat/completions", chat_request(), x_scenario="slow-json"),
                      False),
    "buffered stream": (_request("/v1/chat/completions", chat_request(True),
                                 x_scenario="slow-sse"), False),
    "progressive stream": (_request("/v1/chat/completions", chat_request(True),
                                    x_scenario="slow-sse", x_mode="progressive"), True),
    "passthrough": (b"GET /v1/files/big HTTP/1.1\r\nhost: gw\r\nx-scenario: slow-sse\r\n\r\n",
                    True),
}


def _ms(xs: list[float]) -> str:
    xs = sorted(x * 1000 for x in xs)
    p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
    return f"p50 {statistics.median(xs):6.1f} ms   p95 {p95:6.1f} ms   max {xs[-1]:6.1f} ms"


def hang_ups(port: int, upstream: RawUpstream, trials: int) -> None:
    print(f"client hang-up -> upstream connection closed ({trials} trials each, target ≤ 100 ms)")
    for name, (request, read_head) in MODES.items():
        delays: list[float] = []
        for _ in range(trials):
            before = len(upstream.conns)
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(request)
            upstream.wait_for(lambda b=before: len(upstream.conns) > b
                              and b"\r\n\r\n" in upstream.conns[b].data)
            conn = upstream.conns[before]
            if read_head:
                sock.recv(65536)
            time.sleep(0.05)  # mid-answer
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            hung_up = time.monotonic()
            sock.close()
            upstream.wait_for(lambda c=conn: c.closed_at is not None, timeout=10)
            assert conn.closed_at is not None
            delays.append(conn.closed_at - hung_up)
        print(f"  {name:<20} {_ms(delays)}")
    delays = []
    for _ in range(trials):
        before = len(upstream.conns)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(_request("/v1/chat/completions", chat_request(True),
                                  x_scenario="block-sse", x_mode="progressive"))
            data = b""
            while not data.endswith(b"0\r\n\r\n"):
                data += sock.recv(65536)
            ended = time.monotonic()
            upstream.wait_for(lambda b=before: upstream.conns[b].closed_at is not None, 10)
            closed = upstream.conns[before].closed_at
            assert closed is not None
            delays.append(max(0.0, closed - ended))
    print(f"  {'progressive block':<20} {_ms(delays)}   (from the client's last byte)")


async def slowloris(port: int, n: int, head_timeout: float) -> None:
    print(f"\n{n} slowloris connections (a header line every 2 s), head timeout {head_timeout:g} s")
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
    t0 = time.monotonic()
    for i in range(n):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as e:
            print(f"  connection {i} failed to open: {e}")
            break
        opened.append((reader, writer, time.monotonic()))
        writer.write(b"GET /v1/models HTTP/1.1\r\nhost: gw\r\n")
    print(f"  opened {len(opened)} in {time.monotonic() - t0:.1f} s")
    closed_at: list[float] = []
    statuses: dict[str, int] = {}

    async def drip(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, since: float
    ) -> None:
        async def dripping() -> None:
            with contextlib.suppress(OSError):
                while True:
                    await asyncio.sleep(2)
                    writer.write(b"x-drip: 1\r\n")
        task = asyncio.create_task(dripping())
        try:
            data = await asyncio.wait_for(reader.read(), head_timeout * 3 + 10)
            key = data.split(b" ", 2)[1].decode() if data else "closed"
        except TimeoutError:
            key = "still open"
        except OSError:
            key = "reset after the 408"  # its drip crossed the close: the 408 is lost
        statuses[key] = statuses.get(key, 0) + 1
        closed_at.append(time.monotonic() - since)
        task.cancel()
        writer.close()

    async def normal() -> list[tuple[float, int]]:
        out = []
        for _ in range(int(head_timeout * 2) + 4):
            t = time.monotonic()
            try:
                r, w = await asyncio.open_connection("127.0.0.1", port)
                w.write(b"GET /v1/models HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n")
                data = await asyncio.wait_for(r.read(), 10)
                w.close()
                out.append((time.monotonic() - t, int(data.split(b" ", 2)[1])))
            except (OSError, TimeoutError, IndexError, ValueError):
                out.append((time.monotonic() - t, 0))
            await asyncio.sleep(0.5)
        return out

    results = await asyncio.gather(normal(), *(drip(r, w, t) for r, w, t in opened))
    served = results[0]
    print(f"  slowloris outcomes: {dict(sorted(statuses.items()))}")
    if closed_at:
        print(f"  closed, from each connection's opening: first {min(closed_at):.1f} s, median "
              f"{statistics.median(closed_at):.1f} s, last {max(closed_at):.1f} s")
    ok = [s for _, s in served if s == 200]
    print(f"  normal requests meanwhile: {len(ok)}/{len(served)} answered 200, latency "
          f"{_ms([t for t, s in served if s == 200]) if ok else '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--slowloris", type=int, default=3000)
    ap.add_argument("--head-timeout", type=float, default=10.0)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 2 * args.slowloris + 512))
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # inherited by the gateway
    print(common.machine())
    upstream = RawUpstream(tick=0.05, ticks=400)
    with tempfile.TemporaryDirectory() as tmp, upstream.running(), \
            contextlib.ExitStack() as stack:
        progressive, buffered = write_policies(Path(tmp))
        port, admin = common.free_port(), common.free_port()
        argv = gateway_argv(upstream.url, progressive, port, admin)
        argv += ["--policy", str(buffered), "--head-timeout", str(args.head_timeout),
                 "--log-level", "warning"]
        srv = stack.enter_context(common.server("citewarden-edge", argv, port))
        hang_ups(srv.port, upstream, args.trials)
        asyncio.run(slowloris(srv.port, args.slowloris, args.head_timeout))


if __name__ == "__main__":
    main()

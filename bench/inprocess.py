"""The gateway's own CPU cost per request, in process: no sockets, no upstream latency.

`ProxyApp` is driven through ASGI directly with a stub upstream that returns the mock
upstream's answer at once, so what is timed is citewarden's work alone: request parsing,
routing, context, verification, rendering, metrics and the audit event. A bare ASGI
passthrough over the same stub is the baseline (what any proxy on this stack does anyway).

    .venv/bin/python bench/inprocess.py [--requests 5000] [--profile]

Prints µs per request for both and their difference; `--profile` adds a cProfile summary of
the gateway's requests.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mock_upstream import ANSWER_BODY, REQUEST_BODY

from gateway import audit
from gateway.app import ProxyApp
from gateway.metrics import Metrics
from gateway.policy import PolicyStore
from gateway.upstream import UpstreamResponse, forward_request_headers, response_headers

BENCH = Path(__file__).resolve().parent
UP_HEADERS = [("Content-Type", "application/json"), ("Content-Length", str(len(ANSWER_BODY)))]


class StubUpstream:
    """Answers every request with the mock's ~1 KB cited answer, at once."""

    async def request(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes,
        meanwhile: Callable[[], object] | None = None,
    ) -> UpstreamResponse:
        if meanwhile is not None:  # as the gateway's client does, once the request is out
            meanwhile()
        return UpstreamResponse(200, UP_HEADERS, ANSWER_BODY)

    async def aclose(self) -> None:
        return None


def scope() -> dict[str, Any]:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(REQUEST_BODY)).encode()),
            (b"authorization", b"Bearer sk-bench"),
        ],
    }


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": REQUEST_BODY, "more_body": False}


class Sink:
    def __init__(self) -> None:
        self.status = 0
        self.size = 0

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.size += len(message["body"])


async def bare(sc: dict[str, Any], receive: Any, send: Any, upstream: StubUpstream) -> None:
    message = await receive()
    headers = forward_request_headers(sc["headers"])
    r = await upstream.request(sc["method"], sc["path"], headers, message["body"])
    relayed = response_headers(r.headers, False)
    out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in relayed]
    await send({"type": "http.response.start", "status": r.status, "headers": out})
    await send({"type": "http.response.body", "body": r.body, "more_body": False})


async def run(n: int, profile: bool, args_sort: str = "tottime") -> None:
    audit.configure_logging(io.StringIO())
    app = ProxyApp(PolicyStore([str(BENCH / "policy.yaml")]), StubUpstream(), Metrics())  # type: ignore[arg-type]
    stub = StubUpstream()

    async def one_gateway() -> None:
        sink = Sink()
        await app(scope(), _receive, sink)
        assert sink.status == 200, sink.status

    async def one_bare() -> None:
        await bare(scope(), _receive, Sink(), stub)

    for fn in (one_gateway, one_bare):  # warm caches and the first-use paths
        for _ in range(200):
            await fn()
    results = {}
    for name, fn in (("bare", one_bare), ("citewarden", one_gateway)):
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n // 5):
                await fn()
            best = min(best, (time.perf_counter() - t0) / (n // 5))
        results[name] = best * 1e6
    print(f"bare ASGI passthrough: {results['bare']:7.1f} us/request")
    print(f"citewarden:            {results['citewarden']:7.1f} us/request")
    print(f"gateway's own work:    {results['citewarden'] - results['bare']:7.1f} us/request")
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n // 5):
            await one_gateway()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(args_sort).print_stats(45)
        print(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sort", default="tottime", help="cProfile sort key (tottime, cumulative)")
    args = ap.parse_args()
    asyncio.run(run(args.requests, args.profile, args.sort))


if __name__ == "__main__":
    main()

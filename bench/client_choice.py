"""Which HTTP client should the gateway use upstream? Measure, don't guess.

For each candidate client a minimal starlette proxy (one uvicorn worker, uvloop + httptools when
installed) forwards wrk's POSTs to a mock upstream with a fixed 20 ms latency; throughput is
reported as a ratio to wrk hitting the mock directly in the same round.

    python bench/client_choice.py [--duration 5] [--rounds 1] [--write]
    python bench/client_choice.py proxy --client aiohttp --port P --upstream URL   (internal)
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common
import report
from mock_upstream import REQUEST_BODY

POOL = 256  # more connections than the highest concurrency, so the pool never queues
Forward = Callable[[bytes, dict[str, str]], Awaitable[tuple[int, bytes]]]


def _httpx_like(module: Any, **client_kwargs: Any) -> Callable[[str], Any]:
    def factory(upstream: str) -> Any:
        limits = module.Limits(max_connections=POOL, max_keepalive_connections=POOL)
        client = module.AsyncClient(base_url=upstream, limits=limits, timeout=30.0,
                                    **client_kwargs)

        async def forward(body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
            r = await client.post("/v1/chat/completions", content=body, headers=headers)
            return r.status_code, r.content

        return forward, client.aclose

    return factory


def _make_httpx(upstream: str) -> Any:
    import httpx

    return _httpx_like(httpx)(upstream)


def _make_httpx2(upstream: str) -> Any:
    import httpx2

    return _httpx_like(httpx2)(upstream)


def _make_httpx_aiohttp(upstream: str) -> Any:
    import httpx
    from httpx_aiohttp import AiohttpTransport

    limits = httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL)
    return _httpx_like(httpx, transport=AiohttpTransport(limits=limits))(upstream)


def _make_aiohttp(upstream: str) -> Any:
    import aiohttp

    session = aiohttp.ClientSession(
        base_url=upstream,
        connector=aiohttp.TCPConnector(limit=POOL),
        timeout=aiohttp.ClientTimeout(total=30.0),
        auto_decompress=True,
    )

    async def forward(body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        async with session.post("/v1/chat/completions", data=body, headers=headers) as r:
            return r.status, await r.read()

    return forward, session.close


def _make_http1(upstream: str) -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from gateway.upstream import Limits, Timeouts, Upstream

    up = Upstream(upstream, Timeouts(total=30.0), Limits(pool_size=POOL))

    async def forward(body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        r = await up.request("POST", "/v1/chat/completions", list(headers.items()), body)
        return r.status, r.body

    return forward, up.aclose


CANDIDATES: dict[str, tuple[str, Callable[[str], Any]]] = {
    # name -> (module that must be importable, factory)
    "httpx": ("httpx", _make_httpx),
    "httpx2": ("httpx2", _make_httpx2),
    "httpx+aiohttp-transport": ("httpx_aiohttp", _make_httpx_aiohttp),
    "aiohttp": ("aiohttp", _make_aiohttp),
    # citewarden's own HTTP/1.1 client (gateway.http1, asyncio protocol + httptools)
    "gateway.http1": ("httptools", _make_http1),
}


def available() -> dict[str, str]:
    """Candidate -> '' if importable, else the reason it is not."""
    return {name: "" if importlib.util.find_spec(mod) else f"{mod} not installed"
            for name, (mod, _) in CANDIDATES.items()}


def proxy_app(client: str, upstream: str) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Clients bind to the running loop, so they are created inside it.
        state["forward"], close = CANDIDATES[client][1](upstream)
        yield
        await close()

    async def chat(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": "application/json"}
        if auth := request.headers.get("authorization"):
            headers["authorization"] = auth
        status, content = await state["forward"](body, headers)
        return Response(content, status_code=status, media_type="application/json")

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/healthz", health)], lifespan=lifespan)


def serve(app: Any, port: int) -> None:
    import uvicorn

    fast = common.uvloop_available()
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                loop="uvloop" if fast else "asyncio", http="httptools" if fast else "h11",
                backlog=1024)


def measure(duration: float, rounds: int) -> tuple[str, dict[str, dict[int, float]]]:
    """Run the comparison; returns (markdown, {candidate: {concurrency: median ratio}})."""
    conc = (16, 64)
    avail = available()
    names = [n for n, why in avail.items() if not why]
    rps: dict[str, dict[int, list[float]]] = {n: {c: [] for c in conc}
                                              for n in ["direct", *names]}
    errors: dict[str, int] = dict.fromkeys(rps, 0)
    cpu: dict[str, list[float]] = {n: [] for n in names}  # proxy CPU µs per request @64
    failed: dict[str, str] = {n: why for n, why in avail.items() if why}
    with common.mock_upstream(latency_ms=20.0) as mock:
        target = mock.url + "/v1/chat/completions"
        for rnd in range(rounds):
            common.wrk(target, REQUEST_BODY, 16, 1)  # warm-up
            for c in conc:
                r = common.wrk(target, REQUEST_BODY, c, duration)
                rps["direct"][c].append(r.rps)
                errors["direct"] += r.errors
                print(f"round {rnd + 1} direct c={c}: {r.rps:.0f} req/s", flush=True)
            for name in names:
                if name in failed:
                    continue
                port = common.free_port()
                argv = [common.PY, __file__, "proxy", "--client", name, "--port", str(port),
                        "--upstream", mock.url]
                try:
                    with common.server(name, argv, port, health="/healthz") as srv:
                        url = srv.url + "/v1/chat/completions"
                        common.wrk(url, REQUEST_BODY, 16, 1)  # warm-up: pools, JIT-free caches
                        for c in conc:
                            cpu0 = srv.cpu_seconds()
                            r = common.wrk(url, REQUEST_BODY, c, duration)
                            if c == 64 and r.requests:
                                cpu[name].append(1e6 * (srv.cpu_seconds() - cpu0) / r.requests)
                            rps[name][c].append(r.rps)
                            errors[name] += r.errors
                            print(f"round {rnd + 1} {name} c={c}: {r.rps:.0f} req/s "
                                  f"({r.rps / rps['direct'][c][-1]:.0%} of direct)", flush=True)
                except common.Unavailable as e:
                    failed[name] = str(e)
    ratios: dict[str, dict[int, float]] = {}
    rows = []
    for name in ["direct", *avail]:
        if name in failed:
            rows.append([name, f"unavailable: {failed[name]}", "", "", "", ""])
            continue
        med = {c: statistics.median(rps[name][c]) for c in conc}
        ratios[name] = {c: statistics.median(
            a / d for a, d in zip(rps[name][c], rps["direct"][c], strict=True)) for c in conc}
        rows.append([name, f"{med[16]:.0f}", f"{ratios[name][16]:.0%}", f"{med[64]:.0f}",
                     f"{ratios[name][64]:.0%}" + (f" ({errors[name]} errors)"
                                                   if errors[name] else ""),
                     f"{statistics.median(cpu[name]):.0f} µs" if cpu.get(name) else ""])
    table = report.table(["client", "req/s @16", "vs direct @16", "req/s @64",
                          "vs direct @64", "proxy CPU per request @64"], rows)
    text = (f"Machine: {common.machine()}  \n"
            f"Mock upstream: 20 ms latency, {len(REQUEST_BODY)} B request, ~1 KB JSON answer. "
            f"wrk, 1 thread, {duration:.0f} s per cell, {rounds} round(s), median ratio; "
            f"proxies: one uvicorn worker, "
            f"{'uvloop + httptools' if common.uvloop_available() else 'asyncio + h11'}.\n\n"
            + table)
    return text, ratios


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd")
    p = sub.add_parser("proxy")
    p.add_argument("--client", choices=sorted(CANDIDATES), required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", required=True)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--write", action="store_true",
                    help="replace the client-choice section of docs/benchmarks.md")
    args = ap.parse_args()
    if args.cmd == "proxy":
        serve(proxy_app(args.client, args.upstream), args.port)
        return
    text, _ = measure(args.duration, args.rounds)
    print(text)
    if args.write:
        report.write_section(common.ROOT / "docs" / "benchmarks.md", "client-choice", text)


if __name__ == "__main__":
    main()

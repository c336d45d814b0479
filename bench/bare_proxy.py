"""The "bare passthrough" baseline: citewarden's server stack (starlette + uvicorn + the
`gateway.upstream` client) forwarding every request without verification.

The gap between this and direct is the cost of being a Python proxy at all; the gap between
citewarden and this is the cost of verification. With `--buffer-streams` it holds each SSE
stream until the upstream's answer has ended and then sends it whole, as citewarden's buffer
mode does, minus the parsing and the verification: the floor of a buffered release.

    python bench/bare_proxy.py --upstream http://127.0.0.1:9000 --port 8081 [--workers 2]
        [--buffer-streams]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.upstream import (
    Limits,
    Timeouts,
    Upstream,
    forward_request_headers,
    response_headers,
)


def build_app(upstream_url: str, buffer_streams: bool = False) -> Starlette:
    upstream = Upstream(upstream_url, Timeouts(connect=5, read=30, total=120), Limits())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await upstream.aclose()

    async def forward(request: Request) -> Response:
        body = await request.body()
        headers = forward_request_headers(request.scope["headers"])
        path_qs = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if b'"stream": true' not in body and b'"stream":true' not in body:
            r = await upstream.request(request.method, path_qs, headers, body)
            return Response(r.body, r.status, dict(response_headers(r.headers, r.decoded)))
        if buffer_streams:
            async with upstream.stream(request.method, path_qs, headers, body) as held:
                whole = await held.read()
            return Response(whole, held.status, dict(response_headers(held.headers, held.decoded)))
        cm = upstream.stream(request.method, path_qs, headers, body)
        s = await cm.__aenter__()
        return StreamingResponse(
            s.iter_bytes(), s.status, dict(response_headers(s.headers, s.decoded)),
            background=BackgroundTask(cm.__aexit__, None, None, None),
        )

    return Starlette(
        routes=[Route("/{path:path}", forward, methods=["GET", "POST"])], lifespan=lifespan
    )


def create_app() -> Starlette:
    """The app factory uvicorn's worker processes import (upstream from the environment)."""
    return build_app(os.environ["BARE_PROXY_UPSTREAM"], bool(os.environ.get("BARE_PROXY_BUFFER")))


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--buffer-streams", action="store_true",
                    help="hold each SSE stream until the upstream's answer ends")
    args = ap.parse_args()
    try:
        import httptools  # noqa: F401
        import uvloop  # noqa: F401

        loop, http = "uvloop", "httptools"
    except ImportError:
        loop, http = "asyncio", "h11"
    common = dict(host="127.0.0.1", port=args.port, loop=loop, http=http, log_level="warning",
                  access_log=False, backlog=1024)
    if args.workers == 1:
        uvicorn.run(build_app(args.upstream, args.buffer_streams), **common)  # type: ignore[arg-type]
        return
    # Several workers need an import string: uvicorn starts each in a fresh process.
    os.environ["BARE_PROXY_UPSTREAM"] = args.upstream
    if args.buffer_streams:
        os.environ["BARE_PROXY_BUFFER"] = "1"
    uvicorn.run("bare_proxy:create_app", factory=True, workers=args.workers,
                app_dir=str(Path(__file__).resolve().parent), **common)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()

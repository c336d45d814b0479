"""The admin port: /healthz, /readyz and /metrics. Never served on the proxy port.

The gateway process serves it, next to the proxy port (one process per container: DESIGN §9,
docs/operations.md "One process per container").
"""

from __future__ import annotations

from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.policy import PolicyStore


class Exposition(Protocol):
    """What /metrics renders: `gateway.metrics.Metrics`."""

    def render(self, accept: str | None = None) -> tuple[bytes, str]: ...


def create_admin_app(
    store: PolicyStore,
    metrics: Exposition,
) -> Starlette:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        policies = store.current.policies
        if not policies:
            return JSONResponse(
                {"status": "not ready", "reason": "no policy loaded"}, status_code=503
            )
        body: dict[str, object] = {"status": "ready", "policies": [p.label for p in policies]}
        return JSONResponse(body)

    async def metrics_endpoint(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint),
        ]
    )

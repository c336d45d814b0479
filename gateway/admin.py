"""The admin port: /healthz, /readyz and /metrics. Never served on the proxy port."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.metrics import Metrics
from gateway.policy import PolicyStore


def create_admin_app(store: PolicyStore, metrics: Metrics) -> Starlette:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        policies = store.current.policies
        if not policies:
            return JSONResponse(
                {"status": "not ready", "reason": "no policy loaded"}, status_code=503
            )
        return JSONResponse({"status": "ready", "policies": [p.label for p in policies]})

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

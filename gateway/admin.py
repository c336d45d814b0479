"""The admin port: /healthz, /readyz and /metrics. Never served on the proxy port.

One process serves it: the gateway itself, or with `serve --workers N` the supervisor, which
adds its workers to readiness and exposes their metrics summed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.policy import PolicyStore


class Exposition(Protocol):
    """What /metrics renders: `Metrics` in one process, `SupervisorMetrics` with workers."""

    def render(self, accept: str | None = None) -> tuple[bytes, str]: ...


@dataclass(frozen=True, slots=True)
class WorkerState:
    """The supervisor's view of its workers, read on every /readyz."""

    configured: int
    ready: int
    stopping: bool = False


def create_admin_app(
    store: PolicyStore,
    metrics: Exposition,
    workers: Callable[[], WorkerState] | None = None,
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
        if workers is not None:
            state = workers()
            body["workers"] = {"configured": state.configured, "ready": state.ready}
            # A pod at part capacity leaves the Service until every worker serves again.
            if state.stopping or state.ready < state.configured:
                body["status"] = "not ready"
                body["reason"] = "shutting down" if state.stopping else "workers not ready"
                return JSONResponse(body, status_code=503)
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

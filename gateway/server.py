"""Process lifecycle: build the apps, run the proxy and admin servers, reload, drain on SIGTERM.

One event loop carries both servers (and, for `citewarden demo`, the demo upstream). SIGTERM
and SIGINT stop accepting, let in-flight requests and streams finish within the grace period,
then exit 0. One process per container: scale-out is replicas (DESIGN §9; docs/operations.md
"One process per container").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import uvicorn

from gateway import audit
from gateway.admin import create_admin_app
from gateway.app import ProxyApp
from gateway.errors import PolicyError
from gateway.judge import client as judge_client
from gateway.limits import (
    HEAD_TIMEOUT,
    KEEP_ALIVE_TIMEOUT,
    LIMIT_CONCURRENCY,
    MAX_HEAD_BYTES,
    limited_protocol,
)
from gateway.metrics import Metrics
from gateway.policy import PolicyStore
from gateway.upstream import Limits, Timeouts, Upstream
from gateway.upstream_tls import UpstreamNetwork

DEMO_POLICIES = [
    Path(__file__).parent / "demo" / "policy-strict.yaml",  # header-matched routes first
    Path(__file__).parent / "demo" / "policy.yaml",
]


@dataclass(slots=True)
class Settings:
    upstream: str
    policies: list[str]
    host: str = "0.0.0.0"
    port: int = 8080
    admin_port: int = 9090
    connect_timeout: float = 5.0
    read_timeout: float = 60.0
    total_timeout: float = 300.0
    max_request_bytes: int = 4 * 1024 * 1024
    max_response_bytes: int = 16 * 1024 * 1024
    shutdown_grace: float = 20.0
    reload_interval: float = 2.0
    log_level: str = "info"
    # Limits against slow and huge clients (DESIGN §7; gateway/limits.py). 0 connections: none.
    max_head_bytes: int = MAX_HEAD_BYTES
    head_timeout: float = HEAD_TIMEOUT
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
    limit_concurrency: int = LIMIT_CONCURRENCY
    # How upstream connections are made (DESIGN §11; gateway/upstream_tls.py): a CA bundle that
    # replaces the default trust, and a client certificate and key (mTLS). Proxies come from
    # the environment.
    upstream_ca_file: str | None = None
    upstream_client_cert: str | None = None
    upstream_client_key: str | None = None
    extra_servers: list[uvicorn.Server] = field(default_factory=list)
    # Listening sockets bound before start-up (a busy port is one line, not a traceback),
    # by the port their server is configured with.
    sockets: dict[int, socket.socket] = field(default_factory=dict)


class _Server(uvicorn.Server):
    """A uvicorn server whose signals are handled by the gateway, once for all servers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _uvicorn_config(
    app: object,
    host: str,
    port: int,
    grace: float,
    log_level: str,
    limits: Settings | None = None,
    metrics: Metrics | None = None,
) -> uvicorn.Config:
    """A server's uvicorn config; with `limits`, its head, keep-alive and connection limits
    (refusals counted in `metrics`), else uvicorn's own protocol and defaults."""
    http: str | type[asyncio.Protocol] = "auto"  # httptools when installed
    keep_alive: float = KEEP_ALIVE_TIMEOUT
    if limits is not None:
        http = limited_protocol(
            max_head_bytes=limits.max_head_bytes,
            head_timeout=limits.head_timeout,
            max_connections=limits.limit_concurrency or None,
            metrics=metrics,
        )
        keep_alive = limits.keep_alive_timeout
    return uvicorn.Config(
        app,  # type: ignore[arg-type]
        host=host,
        port=port,
        log_level="warning" if log_level == "info" else log_level,
        # uvicorn's own logging config would give its loggers handlers of their own, past the
        # redacting JSON writer that audit.configure_logging installs on the root logger.
        log_config=None,
        access_log=False,
        lifespan="on",
        loop="auto",  # uvloop when installed
        http=http,
        # uvicorn hands it to loop.call_later, which takes fractions of a second too.
        timeout_keep_alive=keep_alive,  # type: ignore[arg-type]
        # Never a WebSocket handshake, whether or not a WebSocket library is installed: an
        # upgrade reaches the app as HTTP and is refused with the gateway's JSON 403.
        ws="none",
        timeout_graceful_shutdown=int(grace) or 1,
        server_header=False,
        date_header=False,
    )


def proxy_config(proxy: ProxyApp, settings: Settings, metrics: Metrics) -> uvicorn.Config:
    """The proxy port's uvicorn config, limits included."""
    return _uvicorn_config(
        proxy,
        settings.host,
        settings.port,
        settings.shutdown_grace,
        settings.log_level,
        settings,
        metrics,
    )


def build(settings: Settings) -> tuple[ProxyApp, object, PolicyStore, Metrics]:
    """The proxy app, admin app, policy store and metrics for these settings.

    Raises PolicyError when a policy file is invalid (the caller exits 2).
    """
    metrics = Metrics()
    store = PolicyStore(settings.policies)
    metrics.set_policies([(p.policy.name, p.version) for p in store.current.policies])
    network = upstream_network(settings)
    judge_client.use_network(network)  # the judge pass connects as the upstream client does
    upstream = Upstream(
        settings.upstream,
        Timeouts(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            total=settings.total_timeout,
        ),
        Limits(max_response_bytes=settings.max_response_bytes),
        network,
    )
    proxy = ProxyApp(
        store,
        upstream,
        metrics,
        max_request_bytes=settings.max_request_bytes,
    )
    admin = create_admin_app(store, metrics)
    return proxy, admin, store, metrics


def upstream_network(settings: Settings) -> UpstreamNetwork:
    """The TLS files of `settings` and the proxy variables of the environment."""
    return UpstreamNetwork.from_env(
        ca_file=settings.upstream_ca_file,
        client_cert=settings.upstream_client_cert,
        client_key=settings.upstream_client_key,
    )


async def run(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM / SIGINT, then drain and return."""
    log = structlog.get_logger("citewarden")
    proxy, admin, store, metrics = build(settings)
    proxy_server = _Server(proxy_config(proxy, settings, metrics))
    servers: list[uvicorn.Server] = [
        proxy_server,
        _Server(
            _uvicorn_config(
                admin,
                settings.host,
                settings.admin_port,
                settings.shutdown_grace,
                settings.log_level,
                settings,
            )
        ),
    ]
    servers.extend(settings.extra_servers)

    def on_reload(outcome: str, error: PolicyError | None) -> None:
        metrics.policy_reloaded(outcome)
        if error is None:
            metrics.set_policies([(p.policy.name, p.version) for p in store.current.policies])
            log.info("policy_reloaded", policies=[p.label for p in store.current.policies])
        else:
            log.error(
                "policy_reload_failed",
                error=str(error),
                kept=[p.label for p in store.current.policies],
            )

    loop = asyncio.get_running_loop()

    def stop() -> None:
        log.info("shutdown_requested", grace_seconds=settings.shutdown_grace)
        for s in servers:
            s.should_exit = True

    if threading.current_thread() is threading.main_thread():
        # Signals reach only the main thread; embedded runs (tests) stop via should_exit.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop)

    watcher = (
        asyncio.create_task(store.watch(settings.reload_interval, on_reload))
        if settings.reload_interval > 0
        else None
    )
    log.info(
        "started",
        proxy=f"{settings.host}:{settings.port}",
        admin=f"{settings.host}:{settings.admin_port}",
        upstream=settings.upstream,
        upstream_proxy=proxy.upstream.proxy,
        policies=[p.label for p in store.current.policies],
        shadow=[p.label for p in store.current.policies if p.policy.mode == "shadow"],
        loop=type(loop).__module__.split(".")[0],  # "uvloop", or "asyncio" without it
    )
    def sockets_for(s: uvicorn.Server) -> list[socket.socket] | None:
        bound = settings.sockets.get(s.config.port)
        return [bound] if bound is not None else None

    tasks = [asyncio.create_task(s.serve(sockets=sockets_for(s))) for s in servers]
    if ready is not None:
        while not all(s.started for s in servers):
            await asyncio.sleep(0.01)
        ready.set()
    try:
        await asyncio.gather(*tasks)
    finally:
        if watcher is not None:
            watcher.cancel()
        log.info("stopped")


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port, as uvicorn would bind it (it starts listening on it).
    Raises OSError when the address is taken or the host unknown."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    sock.set_inheritable(True)
    return sock


def _bind_all(settings: Settings, demo_server: uvicorn.Server | None) -> str | None:
    """Bind the proxy and admin ports into `settings.sockets`; None, or the one-line reason
    why a port cannot be had (every socket bound so far is closed again)."""
    wanted = [(settings.host, settings.port), (settings.host, settings.admin_port)]
    if demo_server is not None:
        wanted.append(("127.0.0.1", demo_server.config.port))
    for host, port in wanted:
        try:
            settings.sockets[port] = listen(host, port)
        except OSError as e:
            for sock in settings.sockets.values():
                sock.close()
            settings.sockets.clear()
            # create_server rewrites strerror to repeat the address: name the errno instead.
            reason = (os.strerror(e.errno) if e.errno else str(e)).lower()
            return f"cannot listen on {host}:{port}: {reason}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def settings_from_args(
    args: argparse.Namespace, upstream: str, policies: Sequence[str]
) -> Settings:
    return Settings(
        upstream=upstream,
        policies=list(policies),
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        connect_timeout=args.connect_timeout,
        read_timeout=args.read_timeout,
        total_timeout=args.total_timeout,
        max_request_bytes=args.max_request_bytes,
        max_response_bytes=args.max_response_bytes,
        shutdown_grace=args.shutdown_grace,
        reload_interval=args.reload_interval,
        log_level=args.log_level,
        max_head_bytes=args.max_head_bytes,
        head_timeout=args.head_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        limit_concurrency=args.limit_concurrency,
        upstream_ca_file=getattr(args, "upstream_ca_file", None),
        upstream_client_cert=getattr(args, "upstream_client_cert", None),
        upstream_client_key=getattr(args, "upstream_client_key", None),
    )


def serve_from_args(args: argparse.Namespace, policies: Sequence[str], *, demo: bool) -> int:
    audit_file: str | None = getattr(args, "audit_file", None)  # `demo --audit-file`
    log_stream = None
    if audit_file:
        try:
            log_stream = open(audit_file, "a", encoding="utf-8")  # noqa: SIM115 - for the run
        except OSError as e:
            print(f"citewarden: cannot open audit file {audit_file}: {e.strerror}", file=sys.stderr)
            return 2
    audit.configure_logging(stream=log_stream, level=args.log_level)
    extra: list[uvicorn.Server] = []
    if demo:
        from gateway.demo.app import create_demo_app
        from gateway.demo.banner import banner

        demo_port = free_port()
        upstream = f"http://127.0.0.1:{demo_port}"
        extra.append(
            _Server(_uvicorn_config(create_demo_app(), "127.0.0.1", demo_port, 1.0, args.log_level))
        )
        policies = list(policies) or [str(p) for p in DEMO_POLICIES]
    else:
        upstream = args.upstream
    settings = settings_from_args(args, upstream, policies)
    settings.extra_servers = extra
    try:
        PolicyStore(settings.policies)  # fail fast with file:line before binding ports
    except PolicyError as e:
        print(f"citewarden: invalid policy: {e}", file=sys.stderr)
        return 2
    failure = _bind_all(settings, extra[0] if demo else None)
    if failure is not None:
        print(f"citewarden: {failure}", file=sys.stderr)
        return 1
    if demo:
        host = "localhost" if settings.host in ("0.0.0.0", "::") else settings.host
        print(
            banner(
                f"http://{host}:{settings.port}",
                f"http://{host}:{settings.admin_port}",
                audit_file=audit_file,
            ),
            flush=True,
        )
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run(settings))
    return 0


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (a dependency except on Windows), else None
    (asyncio's default). The servers share one loop that the gateway runs itself, so uvicorn's
    own `loop="auto"` never applies: without this every socket read, write and timer of the
    proxy would go through the pure-Python selector loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows, or a stripped install
        return None
    return uvloop.new_event_loop

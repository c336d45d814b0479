"""One proxy worker of `citewarden serve --workers N`, started by `gateway.supervisor` as
`python -m gateway.worker`, never by hand.

It runs the same `server.run()` as a single-process gateway (its own ProxyApp, PolicyStore with
hot reload, upstream pool and uvloop) on the proxy socket the supervisor bound, without the
admin port. Its metrics go to the multiprocess directory named by PROMETHEUS_MULTIPROC_DIR in
its environment, and every log line carries `worker` (index) and `pid`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Sequence

import structlog

from gateway import audit
from gateway.errors import PolicyError
from gateway.server import Settings, loop_factory, run

READY: bytes = b"ready\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.worker")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True, help="the bound proxy socket")
    parser.add_argument("--ready-fd", type=int, required=True, help="pipe: READY once serving")
    parser.add_argument("--lifeline-fd", type=int, required=True, help="pipe: EOF = no supervisor")
    parser.add_argument("--settings", required=True, help="server.Settings fields as JSON")
    args = parser.parse_args(argv)
    settings = Settings(**json.loads(args.settings))
    audit.configure_logging(level=settings.log_level)
    # Bound before the event loop exists, so every task's context (and every event) has them.
    structlog.contextvars.bind_contextvars(worker=args.index, pid=os.getpid())
    sock = socket.socket(fileno=args.listen_fd)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(_serve(settings, sock, args.ready_fd, args.lifeline_fd))
    except PolicyError as e:
        # The files changed since the supervisor checked them; it counts this as a failed start.
        print(f"citewarden: invalid policy: {e}", file=sys.stderr)
        return 2
    return 0


async def _serve(settings: Settings, sock: socket.socket, ready_fd: int, lifeline_fd: int) -> None:
    loop = asyncio.get_running_loop()

    def orphaned() -> None:
        # Readable only at EOF: the supervisor died without forwarding a signal. Drain as on
        # SIGTERM rather than serve on, unsupervised, from a port nobody manages.
        loop.remove_reader(lifeline_fd)
        structlog.get_logger("citewarden").error("supervisor_gone")
        os.kill(os.getpid(), signal.SIGTERM)

    loop.add_reader(lifeline_fd, orphaned)
    ready = asyncio.Event()
    serving = asyncio.create_task(run(settings, ready, proxy_socket=sock, serve_admin=False))
    started = asyncio.create_task(ready.wait())
    await asyncio.wait({serving, started}, return_when=asyncio.FIRST_COMPLETED)
    if ready.is_set():
        # The write end stays open until the process exits: its EOF tells the supervisor.
        os.write(ready_fd, READY)
    else:
        started.cancel()
    await serving


if __name__ == "__main__":
    sys.exit(main())

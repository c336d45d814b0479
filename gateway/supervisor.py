"""`citewarden serve --workers N`: one supervisor process and N proxy worker processes.

Verification is CPU-bound Python, so one event loop saturates one core. The supervisor binds
the proxy socket once and hands it to N fresh interpreters (`python -m gateway.worker`) that
accept on it side by side; it serves the admin port itself (/readyz: ready when every worker
is, /metrics: the workers' prometheus multiprocess files, summed), restarts a worker that dies
and stops everything after `MAX_START_FAILURES` failed starts in a row. docs/operations.md
("Worker processes") is the operator's view of the same rules.

Why fresh interpreters and not fork: a forked child would inherit the supervisor's
prometheus_client value class (chosen at import), its event loop and its threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Final

import structlog

from gateway.admin import WorkerState, create_admin_app
from gateway.metrics import SupervisorMetrics
from gateway.policy import PolicyStore
from gateway.server import Settings, _Server, _uvicorn_config, loop_factory

MAX_START_FAILURES: Final = 3
"""Consecutive exits of one worker before it ever became ready: then the pod is broken (say the
policy on disk turned invalid since start-up), so stop and let the orchestrator restart it."""
RESTART_DELAY: Final = 0.5
"""Seconds before replacing a worker that crashed or failed its first start; doubled for each
further failed start in a row."""
KILL_MARGIN: Final = 5.0
"""Seconds past the drain grace before a worker that has not exited is killed."""
BACKLOG: Final = 2048  # uvicorn's default

_log = structlog.get_logger("citewarden")


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound as uvicorn binds one (SO_REUSEADDR, IPv6 for a ':' host)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def supervise(settings: Settings, store: PolicyStore) -> int:
    """Run the supervisor until SIGTERM / SIGINT; the process exit code.

    `store` holds the policies the caller has already loaded and checked (an invalid one
    exits 2 before anything binds). 0 after a requested shutdown, 1 when workers cannot be kept
    running or a port cannot be bound.
    """
    with contextlib.ExitStack() as stack:
        try:
            proxy_socket = stack.enter_context(listen(settings.host, settings.port))
            admin_socket = stack.enter_context(listen(settings.host, settings.admin_port))
        except OSError as e:
            print(f"citewarden: cannot listen on {settings.host}: {e}", file=sys.stderr)
            return 1
        metrics_dir = _metrics_dir()
        stack.callback(shutil.rmtree, metrics_dir, ignore_errors=True)
        supervisor = Supervisor(settings, store, proxy_socket, admin_socket, metrics_dir)
        stack.callback(supervisor.close)
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(supervisor.run())


METRICS_DIR_PREFIX: Final = "citewarden-metrics-"


def _metrics_dir() -> str:
    """A private directory for the workers' multiprocess files, `<prefix><pid>-<random>` under
    the temp dir (/tmp: the chart's only writable path). Directories a killed supervisor left
    behind are removed first: a dead pid, or our own (a container restarted as pid 1 again),
    since kubelet keeps an emptyDir /tmp across container restarts."""
    tmp = tempfile.gettempdir()
    for entry in os.scandir(tmp):
        owner = entry.name.removeprefix(METRICS_DIR_PREFIX).partition("-")[0]
        stale = owner.isdigit() and (int(owner) == os.getpid() or not _alive(int(owner)))
        if entry.name.startswith(METRICS_DIR_PREFIX) and stale:
            shutil.rmtree(entry.path, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-", dir=tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@dataclass(slots=True)
class _Worker:
    index: int
    proc: subprocess.Popen[bytes]
    ready_fd: int
    """Read end of the worker's readiness pipe: a line when it serves, EOF when it exits."""
    ready: bool = False


class Supervisor:
    """Keeps `settings.workers` workers serving the proxy socket; serves the admin port."""

    def __init__(
        self,
        settings: Settings,
        store: PolicyStore,
        proxy_socket: socket.socket,
        admin_socket: socket.socket,
        metrics_dir: str,
    ) -> None:
        self._settings = settings
        self._store = store
        self._proxy_socket = proxy_socket
        self._admin_socket = admin_socket
        self._metrics = SupervisorMetrics(metrics_dir, settings.workers)
        self._workers: dict[int, _Worker] = {}
        self._stopping = asyncio.Event()
        self._exit_code = 0
        # Workers watch the read end; only the supervisor holds the write end, so they see EOF
        # (and drain) if the supervisor dies without forwarding a signal (SIGKILL, OOM kill).
        self._lifeline_r, self._lifeline_w = os.pipe()
        fields = {
            f.name: getattr(settings, f.name)
            for f in dataclasses.fields(settings)
            if f.name != "extra_servers"
        }
        self._settings_json = json.dumps(fields)
        self._env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}

    def close(self) -> None:
        for fd in (self._lifeline_r, self._lifeline_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def state(self) -> WorkerState:
        return WorkerState(
            configured=self._settings.workers,
            ready=sum(w.ready for w in self._workers.values()),
            stopping=self._stopping.is_set(),
        )

    async def run(self) -> int:
        s = self._settings
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        admin = _Server(
            _uvicorn_config(
                create_admin_app(self._store, self._metrics, self.state),
                s.host,
                s.admin_port,
                s.shutdown_grace,
                s.log_level,
            )
        )
        admin_task = asyncio.create_task(admin.serve(sockets=[self._admin_socket]))
        # Only for /readyz's policy list: the workers reload, log and count reloads themselves.
        watcher = (
            asyncio.create_task(self._store.watch(s.reload_interval))
            if s.reload_interval > 0
            else None
        )
        _log.info(
            "supervisor_started",
            proxy=f"{s.host}:{s.port}",
            admin=f"{s.host}:{s.admin_port}",
            upstream=s.upstream,
            workers=s.workers,
            pid=os.getpid(),
            policies=[p.label for p in self._store.current.policies],
        )
        slots = [asyncio.create_task(self._keep(i)) for i in range(s.workers)]
        await self._stopping.wait()
        _, pending = await asyncio.wait(slots, timeout=s.shutdown_grace + KILL_MARGIN)
        if pending:
            for w in self._workers.values():
                _log.error("worker_killed", worker=w.index, pid=w.proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    w.proc.kill()
            await asyncio.wait(pending)
        admin.should_exit = True
        await admin_task
        if watcher is not None:
            watcher.cancel()
        _log.info("stopped", exit_code=self._exit_code)
        return self._exit_code

    def stop(self) -> None:
        """Stop accepting and let every worker drain (SIGTERM); idempotent."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        _log.info("shutdown_requested", grace_seconds=self._settings.shutdown_grace)
        # The port refuses connections once the last process holding it lets go: this copy
        # now, each worker's own as it starts draining.
        self._proxy_socket.close()
        for w in self._workers.values():
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)

    def _fail(self, code: int) -> None:
        self._exit_code = code
        self.stop()

    def _spawn(self, index: int) -> _Worker:
        listen_fd = self._proxy_socket.fileno()
        ready_r, ready_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gateway.worker",
                    "--index",
                    str(index),
                    "--listen-fd",
                    str(listen_fd),
                    "--ready-fd",
                    str(ready_w),
                    "--lifeline-fd",
                    str(self._lifeline_r),
                    "--settings",
                    self._settings_json,
                ],
                pass_fds=(listen_fd, ready_w, self._lifeline_r),
                env=self._env,
                # Out of the terminal's process group: Ctrl-C reaches the supervisor alone,
                # which forwards it, so no worker exit races the supervisor's own shutdown.
                process_group=0,
            )
        except OSError:
            os.close(ready_r)
            raise
        finally:
            os.close(ready_w)
        return _Worker(index, proc, ready_r)

    async def _keep(self, index: int) -> None:
        """Keep worker `index` running until shutdown; replace it when it dies."""
        try:
            await self._keep_running(index)
        except Exception:
            _log.exception("worker_supervision_failed", worker=index)
            self._fail(1)

    async def _keep_running(self, index: int) -> None:
        failures = 0  # consecutive lives that ended before the worker became ready
        while not self._stopping.is_set():
            was_ready = await self._one_life(index)
            if was_ready is None:
                return
            failures = 0 if was_ready else failures + 1
            if failures >= MAX_START_FAILURES:
                _log.error("worker_start_failed", worker=index, attempts=failures)
                self._fail(1)
                return
            delay = RESTART_DELAY * 2 ** max(failures - 1, 0)
            _log.info("worker_restarting", worker=index, in_seconds=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _one_life(self, index: int) -> bool | None:
        """Start worker `index` and follow it until it exits: None when it was asked to stop,
        else whether it had become ready (a crash, not a failed start)."""
        try:
            w = self._spawn(index)
        except OSError as e:
            _log.error("worker_spawn_failed", worker=index, error=str(e))
            return False
        self._workers[index] = w
        _log.info("worker_started", worker=index, pid=w.proc.pid)
        code = await self._until_exit(w)
        del self._workers[index]
        expected = self._stopping.is_set()
        self._metrics.worker_gone(w.proc.pid, unexpected=not expected)
        self._metrics.set_ready(self.state().ready)
        if expected:
            _log.info("worker_stopped", worker=index, pid=w.proc.pid, exit_code=code)
            return None
        _log.error(
            "worker_exited",
            worker=index,
            pid=w.proc.pid,
            exit_code=code,
            signal=signal.Signals(-code).name if code < 0 else None,
            was_ready=w.ready,
        )
        return w.ready

    async def _until_exit(self, w: _Worker) -> int:
        """Follow the readiness pipe until EOF (the worker is gone); its exit code."""
        try:
            while data := await _read(w.ready_fd):
                if not w.ready and b"ready" in data:
                    w.ready = True
                    ready = self.state().ready
                    self._metrics.set_ready(ready)
                    _log.info("worker_ready", worker=w.index, pid=w.proc.pid, ready=ready)
        finally:
            os.close(w.ready_fd)
        # EOF comes as the process exits; wait() returns at once or nearly.
        return await asyncio.to_thread(w.proc.wait)


async def _read(fd: int) -> bytes:
    """The next bytes from a pipe, without blocking the loop; b"" at EOF."""
    loop = asyncio.get_running_loop()
    readable = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 4096)

"""Shared benchmark plumbing: server subprocesses, the wrk driver, machine description.

Every server runs in its own process on 127.0.0.1; every load run is bounded in time.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable


class Unavailable(Exception):
    """A server or tool a scenario needs could not be started; the scenario reports why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                r.read()
                return
        except urllib.error.HTTPError:
            return  # it answered; any status means it is up
        except OSError:
            time.sleep(0.05)
    raise Unavailable(f"no answer on {url} within {timeout:.0f}s")


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _pids(self) -> list[int]:
        """The process and its direct children (uvicorn's or citewarden's worker processes)."""
        pids = [self.proc.pid]
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
            pids += [int(p) for p in children.split()]
        return pids

    def cpu_seconds(self) -> float:
        """User + system CPU time used so far by the process and its direct children."""
        ticks = 0
        for pid in self._pids():
            with contextlib.suppress(OSError):
                # Fields after the parenthesised command name; utime and stime are 14 and 15.
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def peak_rss_kib(self) -> int | None:
        """VmHWM of the process and its direct children (uvicorn may fork a worker)."""
        peak = None
        for pid in self._pids():
            with contextlib.suppress(OSError):
                m = re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
                if m:
                    peak = max(peak or 0, int(m.group(1)))
        return peak


def tail(path: Path, lines: int = 5) -> str:
    with contextlib.suppress(OSError):
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    return ""


@contextlib.contextmanager
def server(name: str, argv: list[str], port: int, health: str = "/",
           timeout: float = 20.0, env: dict[str, str] | None = None,
           cwd: Path = ROOT) -> Iterator[Server]:
    """Start argv (which must listen on `port`), wait until it answers `health`, stop it after."""
    log = Path(tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".log")[1])
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    env={**os.environ, **(env or {})})
        except OSError as e:
            raise Unavailable(f"{name}: {e}") from e
    srv = Server(name, proc, port, log)
    try:
        try:
            _wait_http(srv.url + health, proc, timeout)
        except Unavailable as e:
            raise Unavailable(f"{name}: {e}; log: {tail(log)}") from e
        yield srv
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.unlink(missing_ok=True)


def mock_upstream(latency_ms: float = 20.0, token_interval_ms: float = 2.0,
                  jitter: float = 0.0) -> contextlib.AbstractContextManager[Server]:
    port = free_port()
    argv = [PY, str(BENCH / "mock_upstream.py"), "--port", str(port),
            "--latency-ms", str(latency_ms), "--token-interval-ms", str(token_interval_ms),
            "--jitter", str(jitter)]
    return server("mock-upstream", argv, port, health="/healthz")


# ---------------------------------------------------------------------------------- wrk


@dataclass
class LoadResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int  # socket errors + non-2xx responses


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNITS[m.group(2)]


_WRK_LUA = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer bench"
local f = io.open("{body}", "rb")
wrk.body = f:read("*a")
f:close()
"""


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def wrk(url: str, body: bytes, connections: int, duration_s: float,
        threads: int = 1) -> LoadResult:
    """POST `body` to `url` with `connections` concurrent keep-alive connections."""
    if not have_wrk():
        raise Unavailable("wrk not installed (apt-get install -y wrk)")
    with tempfile.TemporaryDirectory() as d:
        body_path = Path(d, "body.json")
        body_path.write_bytes(body)
        script = Path(d, "post.lua")
        script.write_text(_WRK_LUA.replace("{body}", str(body_path)))
        argv = ["wrk", f"-t{min(threads, connections)}", f"-c{connections}",
                f"-d{max(1, round(duration_s))}s", "--latency", "--timeout", "5s",
                "-s", str(script), url]
        out = subprocess.run(argv, capture_output=True, text=True,
                             timeout=duration_s + 30).stdout
    return parse_wrk(out)


def parse_wrk(out: str) -> LoadResult:
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", out, re.M))
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    total = re.search(r"(\d+) requests in", out)
    if not (rps and total and "50" in lat and "99" in lat):
        raise Unavailable(f"could not parse wrk output: {out[-300:]!r}")
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors += int(non2xx.group(1)) if non2xx else 0
    return LoadResult(float(rps.group(1)), _ms(lat["50"]), _ms(lat["99"]),
                      int(total.group(1)), errors)


# -------------------------------------------------------------------------------- machine


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if m:
            cpu = m.group(1).strip()
    load = os.getloadavg()
    return (f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()} "
            f"({platform.python_implementation()}), {platform.system()} {platform.release()}, "
            f"load average at start {load[0]:.2f}")


def uvloop_available() -> bool:
    try:
        import httptools  # noqa: F401
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True

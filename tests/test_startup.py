"""Start-up as an operator meets it, through the real `citewarden` command: a busy port or a
bad policy file is one line on stderr and a non-zero exit, never a traceback and never the demo
banner; an upstream that is not up yet is no start-up error (502 until it is, then 200)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from tests.upstream_app import Json, create_upstream, openai_body

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = '<chunk id="bat:1" version="3">The Voltra pack stores 62.5 kWh.</chunk>'
GOOD = "The Voltra pack stores 62.5 kWh [bat:1]."


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITEWARDEN_")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=ROOT,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _occupied() -> Iterator[int]:
    """A port something else is listening on."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        yield s.getsockname()[1]


def _one_clean_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert lines[0].startswith("citewarden")
    return lines[0]


@pytest.mark.parametrize("which", ["proxy", "admin"])
def test_demo_on_a_busy_port_is_one_line(which: str) -> None:
    with _occupied() as busy:
        other = _free_port()
        proxy, admin = (busy, other) if which == "proxy" else (other, busy)
        result = _cli("demo", "--port", str(proxy), "--admin-port", str(admin))
    assert result.returncode not in (0, None)
    line = _one_clean_line(result)
    assert f":{busy}" in line
    assert "in use" in line
    assert "verifying" not in result.stdout  # the banner never claims a port it did not get


def test_serve_on_a_busy_port_is_one_line() -> None:
    with _occupied() as busy:
        result = _cli(
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--policy",
            "policies/default.yaml",
            "--port",
            str(busy),
            "--admin-port",
            str(_free_port()),
        )
    assert result.returncode != 0
    line = _one_clean_line(result)
    assert f":{busy}" in line


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_missing_policy_file_is_one_line_exit_2(command: str, tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    extra = ["--upstream", "http://127.0.0.1:9"] if command == "serve" else []
    result = _cli(command, *extra, "--policy", str(missing), "--port", str(_free_port()))
    assert result.returncode == 2
    line = _one_clean_line(result)
    assert str(missing) in line
    assert "verifying" not in result.stdout


def test_invalid_policy_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmode: enforce\nroutes:\n  - name: r\n    protocol: nope\n")
    result = _cli("demo", "--policy", str(bad), "--port", str(_free_port()))
    assert result.returncode == 2
    line = _one_clean_line(result)
    assert f"{bad}:" in line
    assert "verifying" not in result.stdout


@contextlib.contextmanager
def _gateway(upstream: str) -> Iterator[str]:
    port, admin = _free_port(), _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--upstream",
            upstream,
            "--policy",
            "policies/default.yaml",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--admin-port",
            str(admin),
            "--reload-interval",
            "0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{admin}/readyz").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the gateway never became ready"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_upstream_not_up_yet_is_502_then_200() -> None:
    # Bound but not listening: connections to it are refused until the upstream starts.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    upstream_url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": "hi"}],
    }
    server = uvicorn.Server(
        uvicorn.Config(
            create_upstream({"hi": Json(openai_body(GOOD))}),
            lifespan="off",
            log_level="warning",
            loop="asyncio",
        )
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    try:
        with _gateway(upstream_url) as url:
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 502
            assert r.headers["x-citewarden-decision"] == "error"
            assert r.json()["error"]["type"] == "upstream_error"  # the protocol's envelope
            thread.start()
            deadline = time.monotonic() + 10
            while not server.started:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
            assert r.status_code == 200
            assert r.headers["x-citewarden-decision"] == "released"
            assert r.json()["choices"][0]["message"]["content"] == GOOD
    finally:
        server.should_exit = True
        if thread.is_alive():
            thread.join(10)
        sock.close()


@pytest.mark.parametrize("level", ["trace", "verbose"])
def test_an_unknown_log_level_is_a_usage_error_not_a_traceback(level: str) -> None:
    """`trace` included: uvicorn's trace level logs each request's headers, credentials too."""
    result = _cli("serve", "--upstream", "http://127.0.0.1:9", "--policy",
                  str(ROOT / "policies" / "default.yaml"), "--port", str(_free_port()),
                  "--log-level", level)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr + result.stdout
    assert result.stderr.strip().splitlines()[-1].endswith(
        f"unknown log level {level!r} (expected one of critical, error, warning, info, debug)")

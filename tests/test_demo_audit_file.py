"""`citewarden demo --audit-file PATH`: the log goes to PATH as JSON lines that `citewarden
report` reads, and stdout keeps only the banner, which names the file. Without the flag the
log follows the banner on stdout (the documented default)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def _demo(*extra: str) -> Iterator[tuple[str, list[str]]]:
    """A running `citewarden demo`; yields its URL and, after the block, its stdout lines."""
    port, admin = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CITEWARDEN_")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "demo", "--host", "127.0.0.1", "--port", str(port),
         "--admin-port", str(admin), "--reload-interval", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )  # fmt: skip
    out: list[str] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{admin}/readyz").status_code == 200:
                    break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}", out
    finally:
        proc.terminate()
        stdout, _ = proc.communicate(timeout=30)
        out.extend(stdout.splitlines())


def _ask(url: str, question: str) -> str:
    r = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "citewarden-demo", "messages": [{"role": "user", "content": question}]},
        timeout=10,
    )
    assert r.status_code == 200
    return r.headers["x-citewarden-decision"]


def _json_lines(lines: list[str]) -> list[dict[str, object]]:
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                out.append(value)
    return out


def test_audit_file_gets_the_events_and_stdout_only_the_banner(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    with _demo("--audit-file", str(audit)) as (url, stdout):
        decisions = [_ask(url, "Give me a good answer"), _ask(url, "hallucinated please")]
    assert decisions == ["released", "abstained"]
    assert stdout[0].startswith("citewarden demo:")
    assert any(str(audit) in line for line in stdout)  # the banner names the file
    assert _json_lines(stdout) == []  # no log line mixed into the banner
    events = _json_lines(audit.read_text().splitlines())
    assert [e["decision"] for e in events if e.get("event") == "audit"] == decisions
    report = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "report", str(audit), "--format", "json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert report.returncode == 0
    summary = json.loads(report.stdout)
    assert summary["total"] == 2
    assert summary["decisions"] == {"released": 1, "abstained": 1}


def test_without_audit_file_the_log_follows_the_banner() -> None:
    with _demo() as (url, stdout):
        assert _ask(url, "Give me a good answer") == "released"
    assert stdout[0].startswith("citewarden demo:")
    assert any("--audit-file" in line for line in stdout)  # the banner says how to separate
    audits = [e for e in _json_lines(stdout) if e.get("event") == "audit"]
    assert [e["decision"] for e in audits] == ["released"]


def test_unwritable_audit_file_is_one_line(tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "audit.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "demo", "--port", str(_free_port()),
         "--audit-file", str(target)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert str(target) in result.stderr
    assert "Traceback" not in result.stderr
    assert "verifying" not in result.stdout

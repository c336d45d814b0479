"""The real `citewarden serve` process: readiness, hot reload (atomic rename and ConfigMap
symlink swap), graceful drain on SIGTERM, and exit 2 on an invalid policy at start-up.

The gateway runs as a subprocess in front of a fake upstream served from this process.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.policy import PolicyStore
from gateway.server import free_port
from tests.gateway_harness import write_policy
from tests.upstream_app import (
    FakeUpstream,
    Json,
    Stream,
    create_upstream,
    openai_body,
    openai_sse,
    serve,
)

REPO = Path(__file__).resolve().parent.parent
GRACE = 5.0
CONTEXT = (
    '<chunk id="bat:1" version="3">The Voltra pack stores 62.5 kWh and weighs 410 kg.</chunk>\n'
    '<chunk id="bat:2" version="1">Charging from 10% to 80% takes 28 minutes on a 150 kW '
    "charger.</chunk>"
)
GOOD = "The Voltra pack stores 62.5 kWh [bat:1]. Charging from 10% to 80% takes 28 minutes [bat:2]."
MIXED = "The Voltra pack stores 62.5 kWh [bat:1]. It was built on the Moon [bat:9]."
SLOW_STREAM_SECONDS = 1.5


def _slow_stream() -> Stream:
    """A stream of GOOD whose pieces arrive over about SLOW_STREAM_SECONDS."""
    stream = Stream(openai_sse(GOOD, chunk_size=3), seed=5, max_piece=32, delay=0.0)
    return dataclasses.replace(stream, delay=SLOW_STREAM_SECONDS / len(stream.pieces()))


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, FakeUpstream]]:
    up = create_upstream()
    up.on("good", Json(openai_body(GOOD)))
    up.on("mixed", Json(openai_body(MIXED)))
    up.on("slow-stream", _slow_stream())
    with serve(up) as url:
        yield url, up


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    url: str
    admin_url: str
    port: int
    stdout: Path
    stderr: Path

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines written on stdout so far."""
        out = []
        for line in self.stdout.read_text(encoding="utf-8").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out


def start(upstream_url: str, policy: Path, tmp_path: Path, *extra: str) -> Process:
    """`citewarden serve` as a subprocess on free ports; `extra` flags are appended."""
    port, admin_port = free_port(), free_port()
    stdout, stderr = tmp_path / "stdout.log", tmp_path / "stderr.log"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "--upstream",
                upstream_url,
                "--policy",
                str(policy),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--admin-port",
                str(admin_port),
                "--reload-interval",
                "0.2",
                "--shutdown-grace",
                str(GRACE),
                "--read-timeout",
                "5",
                *extra,
            ],
            cwd=REPO,
            stdout=out,
            stderr=err,
        )
    return Process(
        proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", port, stdout, stderr
    )


def wait_ready(p: Process, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if p.proc.poll() is not None:
            raise AssertionError(
                f"gateway exited {p.proc.returncode}: {p.stderr.read_text(encoding='utf-8')}"
            )
        try:
            if httpx.get(f"{p.admin_url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("gateway not ready in time")
        time.sleep(0.05)


@contextlib.contextmanager
def launching(
    upstream_url: str, tmp_path: Path, *extra: str, stop_wait: float = 10.0
) -> Iterator[Callable[[Path], Process]]:
    """A launcher of ready gateways (`start` with `extra` flags); whatever is still running at
    the end gets SIGTERM, then SIGKILL after `stop_wait` seconds."""
    started: list[Process] = []

    def run(policy: Path) -> Process:
        p = start(upstream_url, policy, tmp_path, *extra)
        started.append(p)
        wait_ready(p)
        return p

    try:
        yield run
    finally:
        for p in started:
            if p.proc.poll() is None:
                p.proc.send_signal(signal.SIGTERM)
                try:
                    p.proc.wait(stop_wait)
                except subprocess.TimeoutExpired:
                    p.proc.kill()
                    p.proc.wait(5)


@pytest.fixture
def launch(
    upstream: tuple[str, FakeUpstream], tmp_path: Path
) -> Iterator[Callable[[Path], Process]]:
    with launching(upstream[0], tmp_path) as run:
        yield run


def chat(p: Process, key: str, *, stream: bool = False) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}],
    }
    if stream:
        body["stream"] = True
    return httpx.post(f"{p.url}/v1/chat/completions", json=body, timeout=15)


def metric(p: Process, name: str, **labels: str) -> float:
    text = httpx.get(f"{p.admin_url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


def policy_info(p: Process) -> dict[tuple[str, str], float]:
    text = httpx.get(f"{p.admin_url}/metrics", timeout=5).text
    return {
        (s.labels["name"], s.labels["version"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "citewarden_policy_info"
    }


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def label_of(path: Path) -> str:
    return PolicyStore([path]).current.policies[0].label


def replace_atomically(path: Path, text: str) -> None:
    """Write `text` next to `path` and rename it over `path`, as editors and deploy tools do."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def policy_text(tmp: Path, **kwargs: Any) -> str:
    return write_policy(tmp, filename="render.yaml", **kwargs).read_text(encoding="utf-8")


# --------------------------------------------------------------------------------------------


def test_hot_reload_atomic_swap_and_invalid_replacement(
    launch: Callable[[Path], Process], tmp_path: Path
) -> None:
    work = tmp_path / "render"
    work.mkdir()
    live = tmp_path / "policies"
    live.mkdir()
    policy = write_policy(live, name="live")
    p = launch(policy)
    v1 = label_of(policy)

    r = chat(p, "mixed")
    assert (r.status_code, r.headers["x-citewarden-decision"]) == (422, "blocked")
    assert r.headers["x-citewarden-policy"] == v1

    replace_atomically(policy, policy_text(work, name="live", on_unverified="strip"))
    v2 = label_of(policy)
    assert v2 != v1 and v2.startswith("live@")
    eventually(lambda: chat(p, "good").headers["x-citewarden-policy"] == v2)
    r = chat(p, "mixed")  # the new policy is in force, not only its label
    assert (r.status_code, r.headers["x-citewarden-decision"]) == (200, "partial")
    assert metric(p, "citewarden_policy_reloads_total", outcome="success") == 1
    info = policy_info(p)
    assert list(info.values()) == [1.0]
    ((name, version),) = info
    assert f"{name}@{version[: len(v2) - len(name) - 1]}" == v2

    broken = policy_text(work, name="live", on_unverified="block") + "bogus_key: true\n"
    bad_line = broken.count("\n")
    replace_atomically(policy, broken)
    eventually(lambda: metric(p, "citewarden_policy_reloads_total", outcome="error") == 1)
    r = chat(p, "mixed")  # still verified, under the last good policy
    assert (r.status_code, r.headers["x-citewarden-decision"]) == (200, "partial")
    assert r.headers["x-citewarden-policy"] == v2
    assert metric(p, "citewarden_policy_reloads_total", outcome="success") == 1
    assert httpx.get(f"{p.admin_url}/readyz", timeout=5).status_code == 200
    eventually(lambda: any(e["event"] == "policy_reload_failed" for e in p.events()))
    (failed,) = [e for e in p.events() if e["event"] == "policy_reload_failed"]
    assert failed["level"] == "error"
    assert f"{policy}:{bad_line}" in failed["error"]
    assert failed["kept"] == [v2]


def configmap_swap(mount: Path, text: str, ts: str) -> None:
    """What the kubelet does on a ConfigMap update: a new timestamped dir, then `..data`
    repointed atomically through a temporary symlink, then the old dir removed."""
    old = (mount / "..data").resolve()
    (mount / ts).mkdir()
    (mount / ts / "policy.yaml").write_text(text, encoding="utf-8")
    os.symlink(ts, mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")
    shutil.rmtree(old)


def test_hot_reload_follows_a_configmap_symlink_swap(
    launch: Callable[[Path], Process], tmp_path: Path
) -> None:
    work = tmp_path / "render"
    work.mkdir()
    mount = tmp_path / "config"
    (mount / "..2026_01_01_00_00_00.1").mkdir(parents=True)
    (mount / "..2026_01_01_00_00_00.1" / "policy.yaml").write_text(
        policy_text(work, name="cm"), encoding="utf-8"
    )
    os.symlink("..2026_01_01_00_00_00.1", mount / "..data")
    os.symlink("..data/policy.yaml", mount / "policy.yaml")
    policy = mount / "policy.yaml"
    p = launch(policy)
    v1 = label_of(policy)
    assert chat(p, "mixed").headers["x-citewarden-policy"] == v1

    configmap_swap(
        mount, policy_text(work, name="cm", on_unverified="strip"), "..2026_01_01_00_05_00.2"
    )
    v2 = label_of(policy)
    assert v2 != v1
    eventually(lambda: chat(p, "good").headers["x-citewarden-policy"] == v2)
    assert chat(p, "mixed").headers["x-citewarden-decision"] == "partial"
    assert metric(p, "citewarden_policy_reloads_total", outcome="success") == 1
    assert metric(p, "citewarden_policy_reloads_total", outcome="error") == 0


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except ConnectionRefusedError:
        return True


def _sse_content(body: str) -> tuple[str, list[str]]:
    datas = [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]
    text = ""
    for d in datas:
        if d == "[DONE]":
            continue
        for choice in json.loads(d).get("choices", []):
            text += choice.get("delta", {}).get("content") or ""
    return text, datas


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_sigterm_drains_an_in_flight_stream_then_exits_zero(
    launch: Callable[[Path], Process],
    upstream: tuple[str, FakeUpstream],
    tmp_path: Path,
    mode: str,
) -> None:
    _, up = upstream
    p = launch(write_policy(tmp_path, name="drain", streaming=mode))
    assert httpx.get(f"{p.admin_url}/readyz", timeout=5).status_code == 200
    seen = len(up.requests)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        future = pool.submit(chat, p, "slow-stream", stream=True)
        eventually(lambda: len(up.requests) > seen, timeout=5)
        time.sleep(0.2)
        p.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        eventually(lambda: _refused(p.port), timeout=1.0)
        assert not future.done(), "the stream ended before the listener closed: test too fast"
        r = future.result(timeout=GRACE + 5)
    assert time.monotonic() - started >= SLOW_STREAM_SECONDS * 0.9

    assert r.status_code == 200
    # Progressive release commits to a 200 before the answer is judged, and says so.
    assert r.headers["x-citewarden-decision"] == ("released" if mode == "buffer" else mode)
    text, datas = _sse_content(r.text)
    assert text == GOOD
    assert datas[-1] == "[DONE]"

    rc = p.proc.wait(GRACE + 2)
    assert rc == 0
    assert time.monotonic() - signalled < GRACE
    names = [e["event"] for e in p.events()]
    assert "shutdown_requested" in names
    assert names[-1] == "stopped"
    audits = [e for e in p.events() if e["event"] == "audit"]
    assert [(a["decision"], a["streaming"]) for a in audits] == [("released", True)]
    assert audits[0]["request_id"] == r.headers["x-request-id"]


def test_readyz_once_started(launch: Callable[[Path], Process], tmp_path: Path) -> None:
    policy = write_policy(tmp_path, name="ready")
    p = launch(policy)
    ready = httpx.get(f"{p.admin_url}/readyz", timeout=5)
    assert ready.status_code == 200
    assert ready.json()["policies"] == [label_of(policy)]
    assert httpx.get(f"{p.admin_url}/healthz", timeout=5).status_code == 200
    started = [e for e in p.events() if e["event"] == "started"]
    assert len(started) == 1 and started[0]["policies"] == [label_of(policy)]
    # The process runs its own loop; it must be uvloop (a dependency), not asyncio's selector.
    assert started[0]["loop"] == "uvloop"


def test_invalid_policy_at_start_up_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    """Before anything binds."""
    policy = tmp_path / "broken.yaml"
    text = write_policy(tmp_path, name="broken").read_text(encoding="utf-8")
    policy.write_text(text + "unknown_section: {x: 1}\n", encoding="utf-8")
    bad_line = text.count("\n") + 1
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--policy",
            str(policy),
            "--port",
            str(free_port()),
            "--admin-port",
            str(free_port()),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert f"{policy}:{bad_line}" in proc.stderr
    assert "unknown_section" in proc.stderr

"""`citewarden serve --workers 2` as real processes on real sockets: traffic spread over both
workers, metrics summed on the one admin port, per-worker hot reload, drain on SIGTERM, a
killed worker replaced, and a worker that cannot start stopping all. (Exit 2 on an invalid
policy, with and without workers, is in test_ops_lifecycle.)

The gateway runs as a subprocess (a supervisor and its workers) in front of a fake upstream
served from this process; helpers are shared with test_ops_lifecycle.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.cli import build_parser
from tests.gateway_harness import write_policy
from tests.test_ops_lifecycle import (
    CONTEXT,
    GOOD,
    Process,
    eventually,
    label_of,
    launching,
    metric,
    policy_info,
    policy_text,
    replace_atomically,
)
from tests.upstream_app import FakeUpstream, Json, Slow, create_upstream, openai_body, serve

GRACE = 5.0
WORKERS = 2
SLOW_SECONDS = 1.0


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[str, FakeUpstream]]:
    up = create_upstream()
    up.on("good", Json(openai_body(GOOD)))
    up.on("slow", Slow(SLOW_SECONDS, Json(openai_body(GOOD))))
    with serve(up) as url:
        yield url, up


@pytest.fixture
def launch(
    upstream: tuple[str, FakeUpstream], tmp_path: Path
) -> Iterator[Callable[[Path], Process]]:
    with launching(upstream[0], tmp_path, "--workers", str(WORKERS), stop_wait=GRACE + 10) as run:
        yield run


def supervisor_events(p: Process) -> list[dict[str, Any]]:
    return [e for e in p.events() if "worker" not in e or e["event"].startswith("worker_")]


def worker_pids(p: Process) -> set[int]:
    """Pids of the workers the supervisor reported ready and has not seen exit."""
    ready = {e["pid"] for e in supervisor_events(p) if e["event"] == "worker_ready"}
    gone = {e["pid"] for e in supervisor_events(p) if e["event"] in ("worker_exited",)}
    return ready - gone


def fresh_chat(p: Process, key: str) -> httpx.Response:
    """One request on its own connection, so the kernel hands it to whichever worker accepts."""
    body = {
        "model": "fake-model",
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}],
    }
    with httpx.Client(timeout=15) as client:
        return client.post(f"{p.url}/v1/chat/completions", json=body)


def readyz(p: Process) -> httpx.Response:
    return httpx.get(f"{p.admin_url}/readyz", timeout=5)


def audited(p: Process, n: int) -> Callable[[], bool]:
    return lambda: len(audits(p)) == n


def label(name: str, version: str) -> str:
    """`name@version` as response headers show it (the version shortened)."""
    return f"{name}@{version[:12]}"


def audits(p: Process) -> list[dict[str, Any]]:
    return [e for e in p.events() if e["event"] == "audit"]


# --------------------------------------------------------------------------------------------


def test_two_workers_share_traffic_sum_metrics_and_reload(
    launch: Callable[[Path], Process], tmp_path: Path
) -> None:
    live = tmp_path / "policies"
    live.mkdir()
    policy = write_policy(live, name="multi")
    p = launch(policy)
    ready = readyz(p)
    assert ready.status_code == 200
    assert ready.json()["workers"] == {"configured": 2, "ready": 2}
    assert ready.json()["policies"] == [label_of(policy)]
    pids = worker_pids(p)
    assert len(pids) == WORKERS and p.proc.pid not in pids

    # Which worker accepts a connection is the kernel's choice: send concurrent batches until
    # both have answered (in practice the first batch does it).
    sent = 0
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for _ in range(20):
            responses = list(pool.map(lambda _: fresh_chat(p, "good"), range(16)))
            sent += len(responses)
            for r in responses:
                assert (r.status_code, r.headers["x-citewarden-decision"]) == (200, "released")
                assert r.json()["choices"][0]["message"]["content"] == GOOD
            eventually(audited(p, sent))
            if {a["pid"] for a in audits(p)} == pids:
                break
    assert {a["pid"] for a in audits(p)} == pids
    assert len({a["request_id"] for a in audits(p)}) == sent

    # One admin port, every worker's counters summed.
    assert metric(p, "citewarden_requests_total", route="chat", decision="released") == sent
    assert metric(p, "citewarden_inflight_requests", route="chat") == 0
    assert metric(p, "citewarden_workers_ready") == WORKERS
    assert metric(p, "citewarden_workers_configured") == WORKERS
    assert metric(p, "citewarden_worker_exits_total") == 0
    v1 = label_of(policy)
    assert [label(n, v) for (n, v), value in policy_info(p).items() if value == 1] == [v1]

    # Each worker hot-reloads on its own; the retired version leaves policy_info once all did.
    work = tmp_path / "render"
    work.mkdir()
    replace_atomically(policy, policy_text(work, name="multi", on_unverified="strip"))
    v2 = label_of(policy)
    assert v2 != v1
    eventually(lambda: metric(p, "citewarden_policy_reloads_total", outcome="success") == WORKERS)
    eventually(lambda: len(policy_info(p)) == 1)
    ((name, version),) = policy_info(p)
    assert label(name, version) == v2
    eventually(lambda: readyz(p).json()["policies"] == [v2])
    assert fresh_chat(p, "good").headers["x-citewarden-policy"] == v2


def test_sigterm_drains_in_flight_requests_then_every_worker_and_the_supervisor_exit_zero(
    launch: Callable[[Path], Process],
    upstream: tuple[str, FakeUpstream],
    tmp_path: Path,
) -> None:
    _, up = upstream
    p = launch(write_policy(tmp_path, name="drain"))
    seen = len(up.requests)
    n = 6
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(fresh_chat, p, "slow") for _ in range(n)]
        eventually(lambda: len(up.requests) == seen + n, timeout=10)
        p.proc.send_signal(signal.SIGTERM)
        responses = [f.result(timeout=GRACE + 5) for f in futures]
    for r in responses:
        assert (r.status_code, r.headers["x-citewarden-decision"]) == (200, "released")
    assert p.proc.wait(GRACE + 10) == 0

    events = supervisor_events(p)
    names = [e["event"] for e in events]
    assert "shutdown_requested" in names and names[-1] == "stopped"
    assert sorted(e["worker"] for e in events if e["event"] == "worker_stopped") == [0, 1]
    assert all(e["exit_code"] == 0 for e in events if e["event"] == "worker_stopped")
    assert "worker_exited" not in names
    assert len(audits(p)) == n
    # Each worker drained and logged its own stop.
    worker_stops = [e for e in p.events() if e["event"] == "stopped" and "worker" in e]
    assert sorted(e["worker"] for e in worker_stops) == [0, 1]


def test_a_killed_worker_is_logged_counted_and_replaced(
    launch: Callable[[Path], Process], tmp_path: Path
) -> None:
    p = launch(write_policy(tmp_path, name="restart"))
    before = worker_pids(p)
    for _ in range(4):
        assert fresh_chat(p, "good").status_code == 200
    # Accounting follows each answer by about a millisecond (gateway/deferred.py): a worker
    # killed inside it loses that much; killed after it, its counts must survive.
    def released() -> float:
        return metric(p, "citewarden_requests_total", route="chat", decision="released")

    eventually(lambda: released() == 4)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)

    eventually(lambda: any(e["event"] == "worker_exited" for e in supervisor_events(p)))
    (exited,) = [e for e in supervisor_events(p) if e["event"] == "worker_exited"]
    assert exited["level"] == "error"
    assert (exited["pid"], exited["signal"], exited["was_ready"]) == (victim, "SIGKILL", True)
    eventually(lambda: len(worker_pids(p)) == WORKERS)
    after = worker_pids(p)
    assert victim not in after and len(after & before) == 1
    eventually(lambda: readyz(p).status_code == 200)
    assert readyz(p).json()["workers"] == {"configured": 2, "ready": 2}
    assert metric(p, "citewarden_worker_exits_total") == 1

    for _ in range(4):
        assert fresh_chat(p, "good").status_code == 200
    # The dead worker's counts stay in the sum: counters never go backwards.
    eventually(lambda: released() == 8)
    assert metric(p, "citewarden_inflight_requests", route="chat") == 0


def test_a_worker_that_cannot_start_stops_the_gateway_with_exit_1(
    launch: Callable[[Path], Process], tmp_path: Path
) -> None:
    live = tmp_path / "policies"
    live.mkdir()
    policy = write_policy(live, name="doomed")
    p = launch(policy)
    # The running workers keep their last good policy; a replacement worker cannot load it.
    policy.write_text(policy.read_text(encoding="utf-8") + "bogus_key: 1\n", encoding="utf-8")
    eventually(lambda: metric(p, "citewarden_policy_reloads_total", outcome="error") == WORKERS)
    os.kill(min(worker_pids(p)), signal.SIGKILL)

    assert p.proc.wait(30) == 1
    names = [e["event"] for e in supervisor_events(p)]
    assert names.count("worker_exited") == 4  # the killed one, then three failed starts
    assert "worker_start_failed" in names and names[-1] == "stopped"
    assert f"{policy}:" in p.stderr.read_text(encoding="utf-8")


def test_workers_flag_and_env() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve"]).workers == 1
    assert parser.parse_args(["serve", "--workers", "4"]).workers == 4
    for bad in ("0", "-1", "two"):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["serve", "--workers", bad])
        assert exc.value.code == 2
    # `demo` is one process by design: it has no --workers.
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--workers", "2"])


def test_workers_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITEWARDEN_WORKERS", "3")
    assert build_parser().parse_args(["serve"]).workers == 3
    assert not hasattr(build_parser().parse_args(["demo"]), "workers")

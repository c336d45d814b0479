"""gateway.deferred: accounting queued behind the answers, run in a batch a moment later."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

from gateway import audit
from gateway.app import ProxyApp
from gateway.deferred import Deferred
from gateway.metrics import Metrics
from gateway.policy import PolicyStore
from gateway.upstream import Upstream
from tests.gateway_harness import write_policy


async def test_calls_wait_for_the_batch_then_run_in_order() -> None:
    ran: list[tuple[str, int]] = []
    d = Deferred(delay=0.01)
    for i in range(3):
        d.call(lambda tag, n: ran.append((tag, n)), "call", i)
    await asyncio.sleep(0)  # answers released in this iteration and the next go first
    assert ran == [] and len(d) == 3
    await asyncio.sleep(0.05)
    assert ran == [("call", 0), ("call", 1), ("call", 2)]
    assert len(d) == 0


async def test_one_timer_per_batch_and_a_new_batch_after_it() -> None:
    ran: list[int] = []
    d = Deferred(delay=0.01)
    d.call(ran.append, 1)
    await asyncio.sleep(0.005)
    d.call(ran.append, 2)  # joins the batch already timed: runs with it, not 10 ms after
    await asyncio.sleep(0.008)
    assert ran == [1, 2]
    d.call(ran.append, 3)
    assert ran == [1, 2]
    await asyncio.sleep(0.03)
    assert ran == [1, 2, 3]


async def test_flush_runs_the_queue_now_and_only_once() -> None:
    ran: list[int] = []
    d = Deferred(delay=0.01)
    d.call(ran.append, 1)
    d.flush()
    assert ran == [1]
    await asyncio.sleep(0.03)
    assert ran == [1]


async def test_a_call_that_raises_is_logged_and_the_batch_goes_on() -> None:
    out = io.StringIO()
    audit.configure_logging(out)
    try:
        ran: list[int] = []

        def broken() -> None:
            raise RuntimeError("boom")

        d = Deferred(delay=0.001)
        d.call(ran.append, 1)
        d.call(broken)
        d.call(ran.append, 2)
        d.flush()
        assert ran == [1, 2]
        audit._flush_writers()
        events = [json.loads(line) for line in out.getvalue().splitlines()]
    finally:
        audit.reset_logging()
    failed = [e for e in events if e["event"] == "deferred_call_failed"]
    assert len(failed) == 1
    assert failed[0]["error"] == "RuntimeError" and "broken" in failed[0]["call"]
    assert "boom" in failed[0]["exception"]


async def test_calls_queued_by_a_call_run_in_the_same_batch() -> None:
    ran: list[str] = []
    d = Deferred(delay=0.01)
    d.call(lambda: (ran.append("first"), d.call(ran.append, "queued by it")))
    d.flush()
    assert ran == ["first", "queued by it"]
    assert len(d) == 0


def test_outside_a_running_loop_a_call_runs_at_once() -> None:
    ran: list[int] = []
    Deferred().call(ran.append, 1)
    assert ran == [1]


async def test_the_app_flushes_what_is_queued_when_it_shuts_down(tmp_path: Any) -> None:
    app = ProxyApp(
        PolicyStore([str(write_policy(tmp_path))]), Upstream("http://127.0.0.1:9"), Metrics()
    )
    ran: list[str] = []
    app.deferred = Deferred(delay=3600)  # the batch would never come in time by itself
    app.deferred.call(ran.append, "audit line")
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: Any) -> None:
        sent.append(message)

    await app({"type": "lifespan"}, receive, send)
    assert ran == ["audit line"]
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]

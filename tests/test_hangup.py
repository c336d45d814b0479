"""A client that hangs up cancels its exchange, whichever way the server tells it: through the
connection's `limits.Hangup` (the proxy port's own protocol, tested end to end in
test_proxy_disconnect.py) or, under any other ASGI server, by an `http.disconnect` message."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway.app import ProxyApp, _Exchange
from gateway.limits import HANGUP, Hangup
from gateway.metrics import Metrics
from gateway.policy import PolicyStore
from gateway.upstream import Upstream
from tests.gateway_harness import write_policy


def _exchange(tmp_path: Path, scope_extra: dict[str, Any], receive: Any) -> _Exchange:
    app = ProxyApp(
        PolicyStore([str(write_policy(tmp_path))]), Upstream("http://127.0.0.1:9"), Metrics()
    )
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "headers": [],
             **scope_extra}

    async def send(message: Any) -> None:
        pass

    return _Exchange(app, scope, receive, send)


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_the_protocols_hangup_cancels_the_work(tmp_path: Path) -> None:
    hangup = Hangup()
    ex = _exchange(tmp_path, {"extensions": {HANGUP: hangup}}, _never)
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, hangup.fire)
    t0 = loop.time()
    await asyncio.wait_for(ex._hangup_guarded(asyncio.sleep(30)), 5)
    assert ex.gone and ex.status == 499 and loop.time() - t0 < 5
    assert not hangup._callbacks  # the exchange stopped watching


async def test_a_disconnect_message_cancels_the_work_without_the_protocols_hangup(
    tmp_path: Path,
) -> None:
    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    ex = _exchange(tmp_path, {}, receive)
    await asyncio.wait_for(ex._hangup_guarded(asyncio.sleep(30)), 5)
    assert ex.gone and ex.status == 499


async def test_work_that_ends_first_is_not_cancelled_and_stops_watching(tmp_path: Path) -> None:
    hangup = Hangup()
    ex = _exchange(tmp_path, {"extensions": {HANGUP: hangup}}, _never)
    await ex._hangup_guarded(asyncio.sleep(0))
    hangup.fire()  # the connection closes later: nothing left to cancel
    assert not ex.gone and ex.status == 0


async def test_a_hangup_after_the_response_ended_cancels_nothing(tmp_path: Path) -> None:
    hangup = Hangup()
    ex = _exchange(tmp_path, {"extensions": {HANGUP: hangup}}, _never)

    async def work() -> None:
        ex.ended = True
        hangup.fire()
        await asyncio.sleep(0.01)

    await ex._hangup_guarded(work())
    assert not ex.gone


def test_a_callback_watching_after_the_hangup_runs_at_once() -> None:
    hangup = Hangup()
    hangup.fire()
    ran: list[int] = []
    hangup.watch(lambda: ran.append(1))
    assert ran == [1]

"""Turns: answers that become ready together verify one per event-loop iteration, FIFO, and
work that becomes ready meanwhile (a new request) runs between them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from itertools import pairwise

import pytest

from gateway.turns import Turns


class Iterations:
    """Counts event-loop iterations: a callback that re-schedules itself runs once in each."""

    def __init__(self) -> None:
        self.n = 0
        self._running = True
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        if self._running:
            self.n += 1
            asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> None:
        self._running = False


def recorder(log: list[tuple[str, int]], it: Iterations) -> Callable[[str], str]:
    def work(name: str) -> str:
        log.append((name, it.n))
        return name

    return work


async def test_an_uncontended_turn_is_taken_without_waiting() -> None:
    it = Iterations()
    turns = Turns()
    before = it.n
    assert await turns.run(lambda x: x * 2, 21) == 42
    assert it.n == before  # no loop iteration passed: the caller never yielded
    it.stop()


async def test_answers_ready_together_run_one_per_iteration_in_order() -> None:
    it = Iterations()
    turns = Turns()
    log: list[tuple[str, int]] = []
    work = recorder(log, it)
    names = [f"a{i}" for i in range(5)]
    results = await asyncio.gather(*(turns.run(work, n) for n in names))
    it.stop()
    assert results == names
    assert [n for n, _ in log] == names
    seen = [i for _, i in log]
    assert all(later > earlier for earlier, later in pairwise(seen)), seen


async def test_new_work_runs_between_queued_answers_not_after_all_of_them() -> None:
    it = Iterations()
    turns = Turns()
    log: list[tuple[str, int]] = []
    work = recorder(log, it)

    async def new_request() -> None:
        await asyncio.sleep(0)  # becomes ready after the answers have queued
        log.append(("request", it.n))

    await asyncio.gather(*(turns.run(work, f"a{i}") for i in range(6)), new_request())
    it.stop()
    order = [n for n, _ in log]
    assert order.index("request") < order.index("a5"), order


async def test_a_failing_answer_hands_the_turn_on() -> None:
    turns = Turns()

    def boom() -> None:
        raise ValueError("bad answer")

    results = await asyncio.gather(
        turns.run(boom), turns.run(lambda: "next"), return_exceptions=True
    )
    assert isinstance(results[0], ValueError)
    assert results[1] == "next"
    assert await turns.run(lambda: "free again") == "free again"


async def test_a_waiter_cancelled_before_its_turn_is_skipped() -> None:
    turns = Turns()
    ran: list[str] = []
    first = asyncio.ensure_future(turns.run(ran.append, "first"))
    second = asyncio.ensure_future(turns.run(ran.append, "second"))
    third = asyncio.ensure_future(turns.run(ran.append, "third"))
    await asyncio.sleep(0)  # all three have started; the first ran, two wait
    second.cancel()
    # A lost turn would leave "third" waiting for ever: bounded, so it fails instead of hanging.
    await asyncio.wait_for(asyncio.gather(first, third, return_exceptions=True), 5)
    assert second.cancelled()
    assert ran == ["first", "third"]
    assert await turns.run(lambda: "free again") == "free again"


async def test_a_waiter_cancelled_after_the_turn_reached_it_hands_it_on() -> None:
    turns = Turns()
    ran: list[str] = []
    first = asyncio.ensure_future(turns.run(ran.append, "first"))
    second = asyncio.ensure_future(turns.run(ran.append, "second"))
    third = asyncio.ensure_future(turns.run(ran.append, "third"))
    await asyncio.sleep(0)  # "first" ran; "second" and "third" queued behind it
    await asyncio.sleep(0)  # the next iteration handed the turn to "second", not yet resumed
    assert ran == ["first"]
    assert len(turns._waiting) == 1  # only "third" still waits
    second.cancel()
    # A lost turn would leave "third" waiting for ever: bounded, so it fails instead of hanging.
    await asyncio.wait_for(asyncio.gather(first, third, return_exceptions=True), 5)
    assert second.cancelled()
    assert ran == ["first", "third"]


async def test_a_turn_left_taken_by_an_ended_loop_does_not_block_a_new_one() -> None:
    turns = Turns()
    await turns.run(lambda: None)  # its hand-on is pending in this loop

    def in_new_loop() -> str:
        return asyncio.run(asyncio.wait_for(turns.run(lambda: "ran"), 2))

    assert await asyncio.to_thread(in_new_loop) == "ran"


@pytest.mark.parametrize("n", [1, 2, 50])
async def test_every_answer_gets_exactly_one_turn(n: int) -> None:
    turns = Turns()
    ran: list[int] = []
    await asyncio.gather(*(turns.run(ran.append, i) for i in range(n)))
    assert ran == list(range(n))

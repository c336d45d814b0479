"""Turns: answers that become ready together start their verification a few per event-loop
iteration, FIFO, and work that becomes ready meanwhile (a new request) runs between them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

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


@pytest.mark.parametrize("per", [1, 2, 4])
async def test_answers_ready_together_start_a_few_per_iteration_in_order(per: int) -> None:
    it = Iterations()
    turns = Turns(per_iteration=per)
    log: list[tuple[str, int]] = []
    work = recorder(log, it)
    names = [f"a{i}" for i in range(10)]
    results = await asyncio.gather(*(turns.run(work, n) for n in names))
    it.stop()
    assert results == names
    assert [n for n, _ in log] == names
    per_iteration = Counter(i for _, i in log)
    assert max(per_iteration.values()) <= per, per_iteration
    assert len(per_iteration) >= -(-len(names) // per)


@pytest.mark.parametrize("per", [1, 4])
async def test_new_work_runs_between_queued_answers_not_after_all_of_them(per: int) -> None:
    it = Iterations()
    turns = Turns(per_iteration=per)
    log: list[tuple[str, int]] = []
    work = recorder(log, it)

    async def new_request() -> None:
        await asyncio.sleep(0)  # becomes ready after the answers have queued
        log.append(("request", it.n))

    last = f"a{3 * per}"
    await asyncio.gather(*(turns.run(work, f"a{i}") for i in range(3 * per + 1)), new_request())
    it.stop()
    order = [n for n, _ in log]
    assert order.index("request") < order.index(last), order


async def test_a_failing_answer_does_not_stop_the_others() -> None:
    turns = Turns(per_iteration=1)

    def boom() -> None:
        raise ValueError("bad answer")

    results = await asyncio.gather(
        turns.run(boom), turns.run(lambda: "next"), return_exceptions=True
    )
    assert isinstance(results[0], ValueError)
    assert results[1] == "next"
    assert await turns.run(lambda: "free again") == "free again"


@pytest.mark.parametrize(
    ("iterations", "still_waiting"),
    [
        (1, 2),  # "first" ran; "second" and "third" wait: cancelled before its turn
        (2, 1),  # the next iteration woke "second", not yet resumed: cancelled after
    ],
)
async def test_a_cancelled_waiter_is_skipped_and_the_rest_still_run(
    iterations: int, still_waiting: int
) -> None:
    turns = Turns(per_iteration=1)
    ran: list[str] = []
    first = asyncio.ensure_future(turns.run(ran.append, "first"))
    second = asyncio.ensure_future(turns.run(ran.append, "second"))
    third = asyncio.ensure_future(turns.run(ran.append, "third"))
    for _ in range(iterations):
        await asyncio.sleep(0)
    assert ran == ["first"]
    assert len(turns._waiting) == still_waiting
    second.cancel()
    # A stalled queue would leave "third" waiting for ever: bounded, so it fails, not hangs.
    await asyncio.wait_for(asyncio.gather(first, third, return_exceptions=True), 5)
    assert second.cancelled()
    assert ran == ["first", "third"]


async def test_ticking_stops_once_nobody_starts_or_waits() -> None:
    turns = Turns(per_iteration=1)
    await asyncio.gather(*(turns.run(lambda: None) for _ in range(3)))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not turns._ticking  # an idle gateway schedules nothing on its loop


def test_a_tick_left_unrun_by_an_ended_loop_does_not_block_a_new_one() -> None:
    turns = Turns(per_iteration=1)
    old = asyncio.new_event_loop()
    # The loop stops in the iteration that spent its one start: its tick never runs.
    old.call_soon(lambda: old.create_task(turns.run(old.stop)))
    old.run_forever()
    old.close()
    assert turns._ticking
    assert asyncio.run(asyncio.wait_for(turns.run(lambda: "ran"), 2)) == "ran"


@pytest.mark.parametrize("n", [1, 2, 50])
async def test_every_answer_gets_exactly_one_turn(n: int) -> None:
    turns = Turns()
    ran: list[int] = []
    await asyncio.gather(*(turns.run(ran.append, i) for i in range(n)))
    assert ran == list(range(n))

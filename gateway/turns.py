"""Turns: under load, one answer's verification per event-loop iteration, so that the loop
polls its sockets between two answers and forwards new requests ahead of queued verification.

Why: upstream answers arrive in bursts (one poll wakes every exchange whose answer came in),
and an event loop runs everything that is ready before it polls again. Verifying a burst of 30
answers back to back kept the loop from its sockets for ~10 ms, while the clients' next
requests waited in the kernel to be forwarded; with a fixed upstream latency the bursts then fed
themselves, and one worker idled a quarter of the time at 64 concurrent clients while requests
queued (docs/benchmarks.md). Forwarding a request is cheap and starts the upstream's clock;
verifying is dear and only delays its own client. Taking turns puts the cheap work first.

Uncontended, a turn is taken at once, with no await: a lone request pays nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Turns:
    """A FIFO of answers waiting to run their CPU work, handed on one per loop iteration.

    `run(fn, ...)` calls a synchronous `fn` in this caller's turn: being synchronous, it cannot
    hold the turn across a wait for I/O (a slow client must never stall other answers)."""

    def __init__(self) -> None:
        self._taken = False
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        await self._take()
        try:
            return fn(*args, **kwargs)
        finally:
            self._hand_on()

    async def _take(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A loop that ended may have left the turn taken, its hand-on never run.
            self._loop, self._taken, self._waiting = loop, False, deque()
        if not self._taken:
            self._taken = True
            return
        turn = loop.create_future()
        self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._hand_on()  # cancelled after the turn was handed over: never lose it
            raise

    def _hand_on(self) -> None:
        """The first waiter gets the turn; it runs in the loop's next iteration, after the
        loop has polled. With nobody waiting the turn stays taken until then, so answers
        later in this same iteration queue behind this one instead of running straight on."""
        if not self._wake_first():
            asyncio.get_running_loop().call_soon(self._next_iteration)

    def _next_iteration(self) -> None:
        if not self._wake_first():
            self._taken = False

    def _wake_first(self) -> bool:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a cancelled waiter is skipped
                turn.set_result(None)
                return True
        return False

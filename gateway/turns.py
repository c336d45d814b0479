"""Turns: under load, only a few answers start their verification per event-loop iteration, so
the loop polls its sockets in between and forwards new requests ahead of queued verification.

Why: upstream answers arrive in bursts (one poll wakes every exchange whose answer came in),
and an event loop runs everything that is ready before it polls again. Verifying a burst of 30
answers back to back kept the loop from its sockets for ~10 ms, while the clients' next
requests waited in the kernel to be forwarded; with a fixed upstream latency the bursts then fed
themselves, and one worker idled a quarter of the time at 64 concurrent clients while requests
queued (docs/benchmarks.md). Forwarding a request is cheap and starts the upstream's clock;
verifying is dear and only delays its own client.

Four answers per iteration, not one: a loop iteration has a cost of its own, and one answer per
iteration cost ~15% of the throughput when the worker was saturated anyway (measured against
a jittered upstream); four kept that cost out and still bounds a new request's wait at ~2 ms.
Uncontended, a turn is taken at once, with no await: a lone request pays nothing.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

PER_ITERATION = 4


class Turns:
    """At most `per_iteration` answers start their CPU work per loop iteration; the others wait
    in FIFO order for a later one.

    `run(fn, ...)` calls a synchronous `fn` once it is this caller's turn. Being synchronous,
    `fn` runs to its end within that iteration."""

    def __init__(self, per_iteration: int = PER_ITERATION) -> None:
        self._per = per_iteration
        self._left = per_iteration  # starts left in this iteration
        self._ticking = False  # a `_tick` is scheduled for the next iteration
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # A loop that ended may have left its tick unrun: start afresh on this one.
            self._loop, self._left, self._ticking, self._waiting = loop, self._per, False, deque()
        if not self._waiting and self._left > 0:
            self._left -= 1
            if not self._ticking:
                self._ticking = True
                loop.call_soon(self._tick)
        else:
            turn = loop.create_future()
            self._waiting.append(turn)
            await turn  # cancelled while waiting: skipped; after it was woken: its start is spent
        return fn(*args, **kwargs)

    def _tick(self) -> None:
        """A new iteration: wake the next waiters (they run in the iteration after this one,
        once the loop has polled), and keep ticking while anyone started or waits."""
        self._left = self._per
        while self._left and self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a cancelled waiter is skipped
                turn.set_result(None)
                self._left -= 1
        if self._waiting or self._left < self._per:
            assert self._loop is not None
            self._loop.call_soon(self._tick)
        else:
            self._ticking = False

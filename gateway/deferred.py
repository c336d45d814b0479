"""Work an exchange owes but its client does not wait for, done a moment later in a batch.

After its last byte, each exchange records its metrics and writes its audit line (~50-70 µs of
CPU under load). Done in the exchange's own task, that work stands between this answer and the
next one the event loop could release: when buffered streams end a fraction of a millisecond
apart, every release waited behind the accounting of the ones before it. Queued here instead,
the calls run together about a millisecond after the first of them, once the answers around
them are out, and one after another while their code is warm.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

import structlog

__all__ = ["DELAY", "Deferred"]

DELAY: Final = 0.001  # seconds from the first queued call to the batch

_log = structlog.get_logger("citewarden")


class Deferred:
    """Calls queued in order and run in a batch `delay` seconds after the first of them.

    Outside a running loop a call runs at once. `flush()` runs whatever is queued now: the
    application calls it at shutdown, so that nothing queued is lost with the loop. A call
    that raises is logged (`deferred_call_failed`) and the batch goes on.
    """

    def __init__(self, delay: float = DELAY) -> None:
        self._delay = delay
        self._queue: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._queue)

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        self._queue.append((fn, args))
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._timer = loop.call_later(self._delay, self.flush)

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._queue:  # calls queued by a call in the batch run in it too
            batch, self._queue = self._queue, []
            for fn, args in batch:
                try:
                    fn(*args)
                except Exception as e:
                    _log.exception("deferred_call_failed", call=getattr(fn, "__qualname__", "?"),
                                   error=type(e).__name__)

"""A circuit breaker per judge endpoint: after `failures` failed calls in a row it opens and
refuses calls (an infrastructure error, never a bypass) for `reset_after` seconds; then one
probe call is let through (half-open): its success closes the circuit, its failure reopens it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

__all__ = ["Circuit"]

State = Literal["closed", "open", "half_open"]


class Circuit:
    def __init__(
        self, failures: int, reset_after: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.threshold = failures
        self.reset_after = reset_after
        self._clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self.probing = False

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        if self._clock() - self.opened_at >= self.reset_after:
            return "half_open"
        return "open"

    def allow(self) -> bool:
        """Whether a call may go out now (in half-open state, only the one probe)."""
        match self.state:
            case "closed":
                return True
            case "open":
                return False
            case "half_open":
                if self.probing:
                    return False
                self.probing = True
                return True

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.probing = False

    def failure(self) -> None:
        self.failures += 1
        if self.probing or self.failures >= self.threshold:
            self.opened_at = self._clock()
        self.probing = False

    def release_probe(self) -> None:
        """A probe that ended without an answer either way (cancelled): let another one go."""
        self.probing = False

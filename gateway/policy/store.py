"""Hot reload: the live PolicySet, swapped atomically when its files change.

A failed reload keeps the last good set; the initial load's PolicyError is start-up exit 2.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Literal

import structlog

from gateway.errors import PolicyError
from gateway.policy.load import load_policies
from gateway.policy.routing import PolicySet

__all__ = ["PolicyStore", "ReloadCallback", "ReloadOutcome"]

ReloadOutcome = Literal["success", "error"]
ReloadCallback = Callable[[ReloadOutcome, PolicyError | None], None]

# Named for the package, as log lines were before it was split into modules.
_log = structlog.get_logger("gateway.policy")


def _stat(path: str) -> tuple[object, ...]:
    # realpath: a ConfigMap swaps its `..data` symlink, so the target changes while every
    # stat field of the new file may look old; the inode catches an atomic rename.
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError as exc:
        return ("unreadable", exc.errno)
    return (real, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _digest(paths: Sequence[str]) -> str:
    h = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as fh:
                h.update(hashlib.sha256(fh.read()).digest())
        except OSError as exc:
            h.update(f"unreadable:{exc.errno}".encode())
    return h.hexdigest()


class PolicyStore:
    """The live PolicySet. Readers take `store.current` once per request; swaps are atomic.

    The constructor raises PolicyError when the initial load fails (start-up exit 2); later
    reloads that fail keep the last good set.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self.paths: tuple[str, ...] = tuple(os.fspath(p) for p in paths)
        # Snapshot before loading so an edit racing the first load is seen by the next poll.
        self._stats = tuple(_stat(p) for p in self.paths)
        self._digest = _digest(self.paths)
        self.current: PolicySet = load_policies(self.paths)
        self.last_error: PolicyError | None = None
        # The files the policies name (judge prompt template, key file), watched too.
        self._named = self._named_files()
        if self._named:
            self._stats += tuple(_stat(p) for p in self._named)
            self._digest = _digest(self.paths + self._named)

    def _named_files(self) -> tuple[str, ...]:
        return tuple(f for loaded in self.current.policies for f in loaded.files)

    def _watched(self) -> tuple[str, ...]:
        return self.paths + self._named

    def reload(self) -> bool:
        """Load the files again; swap in the result, or keep the last good set and say False."""
        try:
            fresh = load_policies(self.paths)
        except PolicyError as exc:
            self.last_error = exc
            return False
        self.current = fresh
        self.last_error = None
        named = self._named_files()
        if named != self._named:  # the set of named files changed: watch the new one
            self._named = named
            self._stats = tuple(_stat(p) for p in self._watched())
            self._digest = _digest(self._watched())
        return True

    def poll(self) -> ReloadOutcome | None:
        """One watch tick: reload if any file changed. None when nothing changed."""
        stats = tuple(_stat(p) for p in self._watched())
        if stats == self._stats:
            return None
        self._stats = stats
        digest = _digest(self._watched())
        if digest == self._digest:  # touched, or swapped for identical content
            return None
        self._digest = digest
        return "success" if self.reload() else "error"

    async def watch(self, interval_s: float = 2.0, on_event: ReloadCallback | None = None) -> None:
        """Poll every `interval_s` seconds until cancelled; report each reload to `on_event`."""
        while True:
            await asyncio.sleep(interval_s)
            outcome = self.poll()
            if outcome is None or on_event is None:
                continue
            try:
                on_event(outcome, self.last_error if outcome == "error" else None)
            except Exception:
                # A broken metrics/logging hook must not stop hot reload.
                _log.exception("policy_reload_callback_failed")

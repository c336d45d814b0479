"""The verdict cache: LRU with a time-to-live, keyed by (claim, chunk text hash, model, prompt
version[, question]) so that a changed chunk, model or prompt never reuses a verdict."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["VerdictCache", "cache_key"]


def cache_key(
    claim: str, chunks: Sequence[str], model: str, prompt_version: str, question: str | None
) -> bytes:
    """A fixed-size key: the digest of the parts, each length-prefixed so none can run into
    the next."""
    h = hashlib.blake2b(digest_size=20)
    for part in (model, prompt_version, claim, question if question is not None else "\0none"):
        b = part.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    for text in chunks:
        h.update(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).digest())
    return h.digest()


class VerdictCache:
    """At most `entries` verdicts, each valid `ttl` seconds; least recently used goes first."""

    def __init__(
        self, entries: int, ttl: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.entries = entries
        self.ttl = ttl
        self._clock = clock
        self._data: OrderedDict[bytes, tuple[float, str, str]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: bytes) -> tuple[str, str] | None:
        """(label, rationale), or None when absent or expired."""
        hit = self._data.get(key)
        if hit is None:
            return None
        expires, label, rationale = hit
        if expires <= self._clock():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return label, rationale

    def put(self, key: bytes, label: str, rationale: str) -> None:
        if self.entries <= 0:
            return
        self._data[key] = (self._clock() + self.ttl, label, rationale)
        self._data.move_to_end(key)
        while len(self._data) > self.entries:
            self._data.popitem(last=False)

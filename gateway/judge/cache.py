"""The verdict cache: LRU with a time-to-live, keyed by (claim, chunk text hash, model, prompt
version[, question]) so that a changed chunk, model or prompt never reuses a verdict."""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

__all__ = ["CacheKeys", "VerdictCache", "cache_key"]


def _part(part: str) -> bytes:
    b = part.encode("utf-8", "surrogatepass")
    return len(b).to_bytes(8, "big") + b


_NO_QUESTION = _part("\0none")


def _chunk_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).digest()


def cache_key(
    claim: str, chunks: Sequence[str], model: str, prompt_version: str, question: str | None
) -> bytes:
    """One verdict's key (see `CacheKeys`)."""
    return CacheKeys(model, prompt_version).key(claim, chunks, question)


class CacheKeys:
    """Verdict-cache keys for one model and prompt version, for the claims of one answer.

    A fixed-size key: the blake2b-160 digest of model, prompt version, claim and question
    ("\\0none" when there is none), each length-prefixed so none can run into the next, then
    each chunk's own digest. The model and prompt version are hashed once (a judge pass keeps
    one CacheKeys and takes a `fresh` one per answer), and each chunk once per answer however
    many claims cite it."""

    __slots__ = ("_chunks", "_prefix")

    def __init__(self, model: str, prompt_version: str) -> None:
        self._prefix = hashlib.blake2b(_part(model) + _part(prompt_version), digest_size=20)
        self._chunks: dict[str, bytes] = {}

    def fresh(self) -> CacheKeys:
        """The same model and prompt version, hashed already, with no chunk remembered: for
        the next answer (chunk digests are remembered for one answer only)."""
        keys = CacheKeys.__new__(CacheKeys)
        keys._prefix = self._prefix
        keys._chunks = {}
        return keys

    def key(self, claim: str, chunks: Sequence[str], question: str | None) -> bytes:
        h = self._prefix.copy()
        h.update(_part(claim) + (_part(question) if question is not None else _NO_QUESTION))
        known = self._chunks
        for text in chunks:
            digest = known.get(text)
            if digest is None:
                digest = known[text] = _chunk_digest(text)
            h.update(digest)
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

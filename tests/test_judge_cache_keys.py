"""CacheKeys (one answer's verdict-cache keys, the shared parts hashed once) gives exactly the
documented key, as cache_key does, so a verdict cached by either is found by the other."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest

from gateway.judge.cache import CacheKeys, cache_key


def _documented(
    claim: str, chunks: Sequence[str], model: str, prompt_version: str, question: str | None
) -> bytes:
    """The key as the module docstring defines it, written out independently."""
    h = hashlib.blake2b(digest_size=20)
    for part in (model, prompt_version, claim, question if question is not None else "\0none"):
        b = part.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    for text in chunks:
        h.update(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=20).digest())
    return h.digest()


CHUNKS = ["The reactor near Oslo holds 42 rods.", "", "snow \ud800 surrogate", "Ünïcødé ✓"]


@pytest.mark.parametrize("question", [None, "", "who won season 10?", "\0none"])
@pytest.mark.parametrize(
    "chunks", [[], [CHUNKS[0]], CHUNKS, [CHUNKS[0], CHUNKS[0]], list(reversed(CHUNKS))]
)
@pytest.mark.parametrize("claim", ["", "Fik-Shun.", "The reactor holds 42 rods \ud83d."])
def test_cache_keys_are_cache_key(claim: str, chunks: list[str], question: str | None) -> None:
    keys = CacheKeys("judge-model", "default-0123456789ab")
    want = _documented(claim, chunks, "judge-model", "default-0123456789ab", question)
    assert cache_key(claim, chunks, "judge-model", "default-0123456789ab", question) == want
    assert keys.key(claim, chunks, question) == want
    assert keys.key(claim, chunks, question) == want  # chunk digests now remembered
    # The next answer's keys: the same model and prompt version, no chunk remembered.
    fresh = keys.fresh()
    assert fresh.key(claim, chunks, question) == want
    assert CacheKeys("other-model", "v").fresh().key(claim, chunks, question) != want


def test_one_answer_s_keys_stay_apart() -> None:
    keys = CacheKeys("m", "v")
    seen = {
        keys.key("a claim", [CHUNKS[0]], None),
        keys.key("a claim", [CHUNKS[3]], None),
        keys.key("a claim", [CHUNKS[0]], "q"),
        keys.key("another claim", [CHUNKS[0]], None),
        keys.key("a claim", [CHUNKS[0], CHUNKS[3]], None),
    }
    assert len(seen) == 5
    # model and prompt version are part of the key
    assert CacheKeys("m2", "v").key("a claim", [CHUNKS[0]], None) not in seen
    assert CacheKeys("m", "v2").key("a claim", [CHUNKS[0]], None) not in seen

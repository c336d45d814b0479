"""CacheKeys (one answer's verdict-cache keys, the shared parts hashed once) gives exactly the
keys of cache_key, so a verdict cached by either is found by the other."""

from __future__ import annotations

import pytest

from gateway.judge.cache import CacheKeys, cache_key

CHUNKS = ["The reactor near Oslo holds 42 rods.", "", "snow \ud800 surrogate", "Ünïcødé ✓"]


@pytest.mark.parametrize("question", [None, "", "who won season 10?", "\0none"])
@pytest.mark.parametrize(
    "chunks", [[], [CHUNKS[0]], CHUNKS, [CHUNKS[0], CHUNKS[0]], list(reversed(CHUNKS))]
)
@pytest.mark.parametrize("claim", ["", "Fik-Shun.", "The reactor holds 42 rods \ud83d."])
def test_cache_keys_are_cache_key(claim: str, chunks: list[str], question: str | None) -> None:
    keys = CacheKeys("judge-model", "default-0123456789ab")
    want = cache_key(claim, chunks, "judge-model", "default-0123456789ab", question)
    assert keys.key(claim, chunks, question) == want
    assert keys.key(claim, chunks, question) == want  # chunk digests now remembered


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

"""ContextSet: exact-id chunks, and the context fingerprint of DESIGN §3."""

from __future__ import annotations

import hashlib

from gateway.types import Chunk, ContextSet


def reference_fingerprint(chunks: list[Chunk]) -> str:
    """sha256 over the sorted (id, sha256(text), version) triples, each field length-prefixed."""
    triples = sorted(
        (
            c.id,
            hashlib.sha256(c.text.encode()).hexdigest() if c.text is not None else "",
            c.version or "",
        )
        for c in chunks
    )
    h = hashlib.sha256()
    for triple in triples:
        for part in triple:
            b = part.encode()
            h.update(len(b).to_bytes(4, "big") + b)
    return h.hexdigest()


def make(*chunks: Chunk) -> ContextSet:
    ctx = ContextSet()
    ctx.extend(chunks)
    return ctx


def test_fingerprint_follows_the_definition_and_ignores_order() -> None:
    a = Chunk("doc:1", "Alpha text.", "3")
    b = Chunk("doc:2", "Beta text.")
    c = Chunk("doc:3")  # id only
    assert make(a, b, c).fingerprint == reference_fingerprint([a, b, c])
    assert make(c, b, a).fingerprint == make(a, b, c).fingerprint


def test_fingerprint_changes_with_text_version_and_ids() -> None:
    base = make(Chunk("doc:1", "Alpha text.", "3")).fingerprint
    assert make(Chunk("doc:1", "Alpha text!", "3")).fingerprint != base
    assert make(Chunk("doc:1", "Alpha text.", "4")).fingerprint != base
    assert make(Chunk("doc:2", "Alpha text.", "3")).fingerprint != base
    assert make(Chunk("doc:1", "Alpha text.", "3")).fingerprint == base  # cached digests agree
    long_text = "x" * 20_000  # beyond the digest cache: same definition
    assert make(Chunk("d", long_text)).fingerprint == reference_fingerprint([Chunk("d", long_text)])


def test_the_fingerprint_follows_a_chunk_added_later() -> None:
    ctx = make(Chunk("doc:1", "Alpha."))
    before = ctx.fingerprint
    ctx.add(Chunk("doc:2", "Beta."))
    assert ctx.fingerprint != before
    assert ctx.fingerprint == reference_fingerprint(
        [Chunk("doc:1", "Alpha."), Chunk("doc:2", "Beta.")]
    )


def test_ids_are_exact_code_points_and_text_upgrades_an_id_only_chunk() -> None:
    ctx = make(Chunk("dаta:1"))  # Cyrillic а
    assert ctx.get("data:1") is None
    ctx.add(Chunk("dаta:1", "now with text"))
    assert ctx.get("dаta:1") == Chunk("dаta:1", "now with text")
    ctx.add(Chunk("dаta:1", "a later copy never overwrites"))
    assert ctx.get("dаta:1") == Chunk("dаta:1", "now with text")

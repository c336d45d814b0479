"""ContextSet: exact-id chunks, and the context fingerprint of DESIGN §3."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.types import Chunk, Citation, ContextSet, Document, frozen_init


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


# -- frozen_init ----------------------------------------------------------------------------


def test_frozen_init_builds_the_same_value_as_the_dataclass_init() -> None:
    @dataclass(frozen=True, slots=True)
    class Plain:
        a: int
        b: str = "x"
        c: tuple[int, ...] = ()

    @frozen_init
    @dataclass(frozen=True, slots=True)
    class Quick:
        a: int
        b: str = "x"
        c: tuple[int, ...] = ()

    for args, kwargs in (((1,), {}), ((1, "y"), {}), ((2,), {"c": (3,)}), ((), {"a": 4})):
        p, q = Plain(*args, **kwargs), Quick(*args, **kwargs)
        assert (q.a, q.b, q.c) == (p.a, p.b, p.c)
    assert Quick(1) == Quick(1) and hash(Quick(1)) == hash(Quick(1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        Quick(1).a = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, d=2)  # type: ignore[call-arg]


def test_frozen_init_refuses_fields_it_cannot_build() -> None:
    with pytest.raises(TypeError, match="only plain fields"):

        @frozen_init
        @dataclass(frozen=True, slots=True)
        class Factory:
            a: list[int] = dataclasses.field(default_factory=list)


def test_the_per_claim_values_keep_their_frozen_dataclass_behaviour() -> None:
    c = Citation(id="doc:1", raw="[doc:1]", start=0, end=7)
    assert dataclasses.replace(c, id="doc:2").id == "doc:2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.id = "x"  # type: ignore[misc]


_chunk = st.builds(
    Chunk,
    id=st.sampled_from(["a", "b", "c", "doc:1"]),
    text=st.one_of(st.none(), st.sampled_from(["one", "two", ""])),
    version=st.one_of(st.none(), st.sampled_from(["1", "2"])),
)


@given(st.lists(st.lists(_chunk, max_size=5), min_size=1, max_size=4))
def test_update_with_a_set_read_apart_is_reading_its_chunks_in_place(
    sources: list[list[Chunk]],
) -> None:
    """A request's context read on its own (while the upstream answers) and then merged with
    `update` gives the set that reading every source, in order, into one set gives: the same
    chunks in the same order, the first with text kept for an id."""
    direct = ContextSet()
    for chunks in sources:
        direct.extend(chunks)
    merged = ContextSet()
    for chunks in sources:
        apart = ContextSet()
        apart.extend(chunks)
        apart.rejected["untrusted_role"] = len(chunks)
        merged.update(apart)
    assert list(merged.chunks.items()) == list(direct.chunks.items())
    assert merged.fingerprint == direct.fingerprint
    assert merged.rejected == ({"untrusted_role": sum(map(len, sources))})


def test_update_appends_documents_and_search_results_after_those_already_read() -> None:
    first, second = ContextSet(), ContextSet()
    d1, d2 = Document(0, "text", "one"), Document(0, "text", "two")
    first.documents.append(d1)
    second.documents.append(d2)
    second.search_results.append(d1)
    first.update(second)
    assert first.documents == [d1, d2]
    assert first.search_results == [d1]


def test_a_fingerprint_takes_text_with_a_lone_surrogate() -> None:
    """JSON allows "\\udfff" (a stdlib parse of a body with a 20-digit number keeps it): the
    fingerprint of the audit line must not fail on it, nor make it equal another text's."""
    lone = ContextSet()
    lone.add(Chunk("kb:7", "a\udfff"))
    other = ContextSet()
    other.add(Chunk("kb:7", "a?"))
    assert len(lone.fingerprint) == 64
    assert lone.fingerprint != other.fingerprint

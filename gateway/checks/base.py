"""The check protocols, and helpers every check family shares (cited chunks, claim body).

A sync check is pure and local; an async check may call a remote service under a deadline.
"""

from __future__ import annotations

import abc
import html
from collections.abc import Sequence
from decimal import Decimal
from functools import lru_cache
from operator import attrgetter
from typing import Protocol, runtime_checkable

from gateway.types import (
    CheckResult,
    Chunk,
    Claim,
    ContextSet,
    Document,
    NativeLocation,
    Reason,
)

__all__ = [
    "BLANKS",
    "AnyCheck",
    "AsyncCheck",
    "Check",
    "ClaimFacts",
    "FactsCheck",
    "SourceText",
    "as_unescaped",
    "cited_chunks",
    "claim_body",
    "native_document",
    "native_source",
    "run_safely",
    "source_text",
]


@runtime_checkable
class Check(Protocol):
    """A deterministic check of one claim against the context."""

    @property
    def name(self) -> str: ...

    def run(self, claim: Claim, ctx: ContextSet) -> CheckResult: ...


@runtime_checkable
class AsyncCheck(Protocol):
    """A remote check (an LLM judge) over a batch of claims.

    `deadline` is an absolute `time.monotonic()` value. It returns one result per claim, in
    order; the verifier also enforces the deadline and turns overruns into error("timeout").
    """

    @property
    def name(self) -> str: ...

    async def run_batch(
        self, claims: Sequence[Claim], ctx: ContextSet, deadline: float
    ) -> list[CheckResult]: ...


AnyCheck = Check | AsyncCheck


class FactsCheck(abc.ABC):
    """A sync check that reads a claim through `ClaimFacts`, so that the checks of one claim
    share its marker-free body and its cited sources (the verifier builds them once)."""

    name: str

    @abc.abstractmethod
    def check(self, facts: ClaimFacts) -> CheckResult: ...

    def run(self, claim: Claim, ctx: ContextSet) -> CheckResult:
        return self.check(ClaimFacts(claim, ctx))


def run_safely(check: Check, claim: Claim, ctx: ContextSet) -> CheckResult:
    """Run a sync check; a crash becomes error("crash"), never an exception or a pass."""
    try:
        result = check.run(claim, ctx)
    except Exception as exc:  # a check bug must not release an unverified claim
        return CheckResult.error(check.name, "crash", type(exc).__name__)
    if not isinstance(result, CheckResult):
        return CheckResult.error(check.name, "crash", "check returned no CheckResult")
    return result


def check_safely(check: FactsCheck, facts: ClaimFacts) -> CheckResult:
    """`run_safely` for a `FactsCheck` given the claim's shared facts."""
    try:
        result = check.check(facts)
    except Exception as exc:  # a check bug must not release an unverified claim
        return CheckResult.error(check.name, "crash", type(exc).__name__)
    if not isinstance(result, CheckResult):
        return CheckResult.error(check.name, "crash", "check returned no CheckResult")
    return result


def claim_body(claim: Claim) -> str:
    """The claim text with its citation markers blanked out (same length, offsets kept)."""
    text = claim.text
    cits = claim.citations
    if not cits:
        return text
    origin = claim.start if claim.start > 0 else 0
    if len(cits) == 1:  # the usual claim: one marker, blanked by one slice
        c = cits[0]
        if c.start < 0:
            return text
        s, e = c.start - origin, c.end - origin
        if s < 0 or e > len(text):
            return text
        return text[:s] + " " * (e - s) + text[e:]
    marked = [c for c in cits if c.start >= 0]
    if not marked:
        return text
    parts: list[str] = []
    pos = 0
    for c in sorted(marked, key=_START):
        s, e = c.start - origin, c.end - origin
        if s < pos or e > len(text):
            continue
        parts.append(text[pos:s])
        parts.append(" " * (e - s))
        pos = e
    parts.append(text[pos:])
    return "".join(parts)


_START = attrgetter("start")


def cited_chunks(claim: Claim, ctx: ContextSet) -> tuple[list[Chunk], bool]:
    """The context chunks a claim's well-formed marker citations resolve to (each once), and
    whether any of them is known by id only (no text)."""
    seen: set[str] = set()
    chunks: list[Chunk] = []
    textless = False
    for c in claim.citations:
        if c.malformed is not None or c.native is not None or c.id in seen:
            continue
        seen.add(c.id)
        chunk = ctx.chunks.get(c.id)
        if chunk is None:
            continue
        if chunk.text is None:
            textless = True
        else:
            chunks.append(chunk)
    return chunks, textless


def native_document(ctx: ContextSet, loc: NativeLocation) -> Document | None:
    """The request document or search result a native citation points at, if it exists."""
    if loc.type == "search_result_location":
        idx, pool = loc.search_result_index, ctx.search_results
    else:
        idx, pool = loc.document_index, ctx.documents
    if idx is None or idx < 0:
        return None
    if idx < len(pool) and pool[idx].index == idx:
        return pool[idx]
    return next((d for d in pool if d.index == idx), None)


def native_source(
    ctx: ContextSet, loc: NativeLocation
) -> tuple[str | None, Reason | None, str]:
    """The request's text a native citation cites: the document's `text[start:end]`
    (char_location), its blocks joined `[start:end]` (content_block_location,
    search_result_location), or (page_location, whose pages have no offsets in the extracted
    text) the `cited_text` when it occurs in the PDF's text, after `normalise`. The upstream's
    `cited_text` is never a source on its own word.

    Returns (text, None, "") when resolved; (None, reason, why) when the location is wrong
    ("quote_mismatch") or its text unknown ("source_text_unavailable"); (None, None, "") when
    it cites nothing that could be checked (an empty `cited_text` of a PDF page, a document
    without text)."""
    doc = native_document(ctx, loc)
    if doc is None:
        return None, "quote_mismatch", "cited document not in request"
    start, end = loc.start, loc.end
    if loc.type == "page_location":
        if start is None or end is None or start < 1 or end <= start:
            return None, "quote_mismatch", "bad page range"
        cited = normalise(loc.cited_text)
        if not cited:
            return None, None, ""
        if doc.text is None:
            return None, "source_text_unavailable", "pdf text is not available"
        if cited not in source_text(doc.text).normalised:
            return None, "quote_mismatch", "cited_text not in document"
        return loc.cited_text, None, ""
    if loc.type == "char_location":
        if doc.text is None:
            if not normalise(loc.cited_text):
                return None, None, ""
            return None, "source_text_unavailable", "document text is not available"
        size = len(doc.text)
    else:
        size = len(doc.blocks)
    if start is None or end is None or not 0 <= start <= end <= size:
        return None, "quote_mismatch", "cited range out of bounds"
    if loc.type == "char_location":
        assert doc.text is not None
        return doc.text[start:end], None, ""
    return "".join(doc.blocks[start:end]), None, ""


def source_texts(claim: Claim, ctx: ContextSet) -> tuple[list[str], bool]:
    """Texts a claim's citations point at: cited chunks' text and the request text each
    native citation cites (`native_source`), plus whether some cited source has no text to
    check against (a native citation whose text cannot be resolved has none)."""
    chunks, textless = cited_chunks(claim, ctx)
    texts = [c.text for c in chunks if c.text is not None]
    for c in claim.citations:
        if c.native is not None:
            text = native_source(ctx, c.native)[0]
            if text is None:
                textless = True
            else:
                texts.append(text)
    return texts, textless


# Characters shown as a blank that are no whitespace to `str.split`: the braille blank and the
# Hangul fillers.
BLANKS = "\u2800\u3164\u115f\u1160\uffa0"
_QUOTE_MAP = str.maketrans({"“": '"', "”": '"', "„": '"', "‟": '"', "«": '"', "»": '"',
                            "＂": '"', "‘": "'", "’": "'", "‚": "'", "‛": "'", "\u00a0": " ",
                            **dict.fromkeys(BLANKS, " ")})


def as_unescaped(text: str) -> str | None:
    """`text` with its HTML character references decoded ("&#x34;&#x33;" is "43", "&quot;" a
    quotation mark), as CommonMark and every HTML client show it; None when it has none."""
    if "&" not in text:
        return None
    shown = html.unescape(text)
    return None if shown == text else shown


def normalise(text: str) -> str:
    """Curly quotes to straight ones, whitespace runs (and the blank-looking `BLANKS`) to one
    space, ends stripped."""
    # `str.split()` splits at exactly the characters `\s` matches (`str.isspace`), and every
    # character `_QUOTE_MAP` changes is outside ASCII.
    if not text.isascii():
        text = text.translate(_QUOTE_MAP)
    return " ".join(text.split())


class SourceText:
    """What the checks read from one source text, each part computed on first use: the
    normalised text (quotes), its numbers and its content words. Shared through
    `source_text`, so a chunk cited by many claims (or requests) is indexed once."""

    __slots__ = ("_loose", "_numbers", "_words", "normalised_text", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.normalised_text: str | None = None
        self._numbers: frozenset[tuple[Decimal, bool, str]] | None = None
        self._loose: frozenset[tuple[Decimal, bool]] = frozenset()
        self._words: frozenset[str] | None = None

    @property
    def normalised(self) -> str:
        n = self.normalised_text
        if n is None:
            n = self.normalised_text = normalise(self.text)
        return n

    @property
    def numbers(self) -> frozenset[tuple[Decimal, bool, str]]:
        n = self._numbers
        if n is None:
            from gateway.checks.numbers import numbers_in

            n = frozenset(numbers_in(self.text))
            self._loose = frozenset([(v, p) for v, p, _ in n])
            self._numbers = n
        return n

    def has_number(self, q: tuple[Decimal, bool, str]) -> bool:
        """Whether the text has the number `q` (value, percent-ness, unit): equal value and
        percent-ness, and the same unit unless either side has none."""
        nums = self._numbers
        if nums is None:
            nums = self.numbers
        value, pct, unit = q
        if unit:
            return q in nums or (value, pct, "") in nums
        return (value, pct) in self._loose

    @property
    def words(self) -> frozenset[str]:
        w = self._words
        if w is None:
            from gateway.checks.support import content_words

            w = self._words = content_words(self.text)
        return w


@lru_cache(maxsize=4096)
def source_text(text: str) -> SourceText:
    """The shared index of a source text (keyed by the text itself, so never stale)."""
    return SourceText(text)


class ClaimFacts:
    """One claim's inputs to the checks, computed once and shared by all of them."""

    __slots__ = ("_body", "_sources", "claim", "ctx")

    def __init__(self, claim: Claim, ctx: ContextSet) -> None:
        self.claim = claim
        self.ctx = ctx
        self._body: str | None = None
        self._sources: tuple[list[SourceText], bool] | None = None

    @property
    def body(self) -> str:
        """`claim_body` of the claim."""
        b = self._body
        if b is None:
            b = self._body = claim_body(self.claim)
        return b

    def plain(self) -> bool:
        """Whether the claim's citations are plain: it has some, and each is a well-formed
        marker (not native) naming a context chunk, at the chunk's version when it cites
        one. The usual claim; for one with a single marker, this also finds its source."""
        cits = self.claim.citations
        if not cits:
            return False
        chunks = self.ctx.chunks
        chunk = None
        for c in cits:
            if c.malformed is not None or c.native is not None:
                return False
            chunk = chunks.get(c.id)
            if chunk is None:
                return False
            if c.version is not None and chunk.version != c.version:
                return False
        if len(cits) == 1 and chunk is not None and self._sources is None:
            # What `sources` finds for a single marker.
            text = chunk.text
            self._sources = ([], True) if text is None else ([source_text(text)], False)
        return True

    def sources(self) -> tuple[list[SourceText], bool]:
        """`source_texts` of the claim, indexed, and whether a cited source has no text."""
        got = self._sources
        if got is None:
            cits = self.claim.citations
            c = cits[0] if len(cits) == 1 else None
            if c is not None and c.malformed is None and c.native is None:
                # The usual claim: one well-formed marker.
                chunk = self.ctx.chunks.get(c.id)
                if chunk is None:
                    got = ([], False)
                elif chunk.text is None:
                    got = ([], True)
                else:
                    got = ([source_text(chunk.text)], False)
            else:
                texts, textless = source_texts(self.claim, self.ctx)
                got = ([source_text(t) for t in texts], textless)
            self._sources = got
        return got

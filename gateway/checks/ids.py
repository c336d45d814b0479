"""Checks on citation ids alone: missing, malformed, hallucinated and stale citations.

They need no chunk text, so they also work with an id-only context.
"""

from __future__ import annotations

from gateway.checks.base import ClaimFacts, FactsCheck, native_document
from gateway.types import CheckResult, Citation, ContextSet

__all__ = [
    "PASS_PLAIN",
    "HallucinatedCitation",
    "MalformedCitation",
    "MissingCitation",
    "StaleSource",
    "native_document",
]


# Pass results are values; one per check is shared.
_OK_MISSING = CheckResult.ok("missing_citation")
_OK_MALFORMED = CheckResult.ok("malformed_citation")
_OK_HALLUCINATED = CheckResult.ok("hallucinated_citation")
_OK_STALE = CheckResult.ok("stale_source")


class MissingCitation(FactsCheck):
    """A non-exempt claim must carry at least one citation (marker, structured or native)."""

    name = "missing_citation"

    def check(self, facts: ClaimFacts) -> CheckResult:
        claim = facts.claim
        if claim.exempt or claim.citations:
            return _OK_MISSING
        return CheckResult.fail(self.name, "missing_citation", "claim has no citation")


class MalformedCitation(FactsCheck):
    """Every citation-shaped marker must pass the shape rule."""

    name = "malformed_citation"

    def check(self, facts: ClaimFacts) -> CheckResult:
        for c in facts.claim.citations:
            if c.malformed is not None:
                return CheckResult.fail(self.name, "malformed_citation", c.malformed)
        return _OK_MALFORMED


class HallucinatedCitation(FactsCheck):
    """A well-formed id must name a chunk of the context (exact code points); a native
    citation must point at a document / search result the request carried."""

    name = "hallucinated_citation"

    def check(self, facts: ClaimFacts) -> CheckResult:
        ctx = facts.ctx
        for c in facts.claim.citations:
            if c.malformed is not None:
                continue
            if c.native is not None:
                if native_document(ctx, c.native) is None:
                    return CheckResult.fail(
                        self.name, "hallucinated_citation", "native citation index out of range"
                    )
            elif c.id not in ctx.chunks:
                return CheckResult.fail(
                    self.name, "hallucinated_citation", f"id {c.id!r} is not in the context"
                )
        return _OK_HALLUCINATED


def _stale(c: Citation, ctx: ContextSet) -> bool:
    if c.version is None or c.malformed is not None or c.native is not None:
        return False
    chunk = ctx.chunks.get(c.id)
    # A version the chunk does not have is no version the model was given.
    return chunk is not None and chunk.version != c.version


class StaleSource(FactsCheck):
    """A cited version must be the context chunk's version; citing one of a chunk that has
    none fails too. A citation without a version cites whatever version was given."""

    name = "stale_source"

    def check(self, facts: ClaimFacts) -> CheckResult:
        ctx = facts.ctx
        for c in facts.claim.citations:
            if _stale(c, ctx):
                return CheckResult.fail(
                    self.name, "stale_source", f"id {c.id!r} cited at a different version"
                )
        return _OK_STALE


# The checks (exact classes: a subclass may decide otherwise) that pass every claim whose
# `ClaimFacts.plain()` holds, so that a verifier may skip them for it.
PASS_PLAIN: frozenset[type] = frozenset(
    {MissingCitation, MalformedCitation, HallucinatedCitation, StaleSource}
)

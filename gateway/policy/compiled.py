"""A policy's regexes and lookups, compiled once when it is validated.

The hot path (`Verifier`, `CitationParser`, `trust_of`) reads these objects and compiles nothing.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.policy.model import Policy, Route

__all__ = [
    "CHUNK_PATTERN_FLAGS",
    "CompiledPolicy",
    "chunk_regex",
    "compile_policy",
    "compile_regex",
]

# Chunk regexes match across lines, as the built-in `<chunk>` form does.
CHUNK_PATTERN_FLAGS = re.S


def compile_regex(pattern: str, flags: int = 0) -> re.Pattern[str]:
    """`pattern` compiled; a ValueError (a policy error at its key) when it is not a regex."""
    try:
        return re.compile(pattern, flags)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None


def chunk_regex(pattern: str) -> re.Pattern[str]:
    """A `context.chunk_pattern`, compiled with the one set of flags chunk patterns get."""
    return compile_regex(pattern, CHUNK_PATTERN_FLAGS)


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """Everything the hot path needs, compiled once at load."""

    citation_pattern: re.Pattern[str] | None  # format: regex only
    chunk_pattern: re.Pattern[str] | None  # None: the built-in <chunk …> form
    exempt: tuple[re.Pattern[str], ...]
    checks: frozenset[str]
    routes: Mapping[str, Route]  # by name

    def __reduce__(self) -> tuple[Any, ...]:
        # A mappingproxy neither pickles nor deep-copies, and a Policy carries this object:
        # rebuild it from a plain dict so a copied or pickled Policy still works.
        fields = (self.citation_pattern, self.chunk_pattern, self.exempt, self.checks)
        return (_rebuild, (*fields, dict(self.routes)))


def _rebuild(
    citation_pattern: re.Pattern[str] | None,
    chunk_pattern: re.Pattern[str] | None,
    exempt: tuple[re.Pattern[str], ...],
    checks: frozenset[str],
    routes: dict[str, Route],
) -> CompiledPolicy:
    return CompiledPolicy(
        citation_pattern, chunk_pattern, exempt, checks, types.MappingProxyType(routes)
    )


def compile_policy(policy: Policy) -> CompiledPolicy:
    """The compiled form of a validated policy: its sections compiled their own regexes when
    they were validated; this gathers them."""
    citations = policy.citations
    return CompiledPolicy(
        citation_pattern=citations.regex if citations.format == "regex" else None,
        chunk_pattern=policy.context.chunk_re,
        exempt=policy.claims.exempt_re,
        checks=frozenset(policy.checks),
        routes=types.MappingProxyType({r.name: r for r in policy.routes}),
    )

"""Check families, one module each, and `build` to instantiate a policy's checks in order."""

from __future__ import annotations

from gateway import policy
from gateway.checks.base import AnyCheck, AsyncCheck, Check, run_safely
from gateway.checks.ids import (
    HallucinatedCitation,
    MalformedCitation,
    MissingCitation,
    StaleSource,
)
from gateway.checks.numbers import NumberMismatch
from gateway.checks.quotes import QuoteMismatch
from gateway.checks.support import LexicalSupport

__all__ = ["AnyCheck", "AsyncCheck", "Check", "build", "run_safely"]


def build(p: policy.Policy) -> list[AnyCheck]:
    """The policy's checks, in the order the policy lists them."""
    out: list[AnyCheck] = []
    for name in p.checks:
        match name:
            case "missing_citation":
                out.append(MissingCitation())
            case "malformed_citation":
                out.append(MalformedCitation())
            case "hallucinated_citation":
                out.append(HallucinatedCitation())
            case "stale_source":
                out.append(StaleSource())
            case "quote_mismatch":
                out.append(QuoteMismatch())
            case "number_mismatch":
                out.append(NumberMismatch())
            case "unsupported":
                s = p.support
                bounds = s.lexical
                out.append(
                    LexicalSupport(
                        s.threshold,
                        bounds.pass_above if bounds is not None else None,
                        bounds.fail_below if bounds is not None else None,
                        judged=s.judge is not None,
                    )
                )
            case _:
                raise ValueError(f"unknown check {name!r}")
    return out

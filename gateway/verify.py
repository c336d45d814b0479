"""Run a policy's checks over the claims of an answer and produce a Report.

A `Verifier` builds the citation parser and checks once per policy, from the regexes the policy
compiled at load (`Policy.compiled`). Sync checks run per claim; async (remote) checks run in
`averify` as one batch per check under a deadline, where an overrun or crash is an error
verdict, never a pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence

from gateway import checks as check_families
from gateway import policy
from gateway.checks.base import (
    AnyCheck,
    AsyncCheck,
    Check,
    ClaimFacts,
    FactsCheck,
)
from gateway.checks.ids import PASS_PLAIN
from gateway.citations import CitationParser
from gateway.claims import ClaimSegmenter, exempt_match, list_label_end
from gateway.types import (
    Answer,
    Channel,
    CheckResult,
    Citation,
    Claim,
    ClaimReport,
    ContextSet,
    Report,
    Status,
)

__all__ = ["Verifier"]

# A claim before it is numbered: (start, end, text, citations, exempt).
_Piece = tuple[int, int, str, tuple[Citation, ...], bool]


def _verified_kinds(p: policy.Policy) -> frozenset[str]:
    kinds = {"content", "refusal", "transcript"}
    if p.channels.tool_calls == "verify":
        kinds.add("tool_arguments")
    if p.channels.reasoning == "verify":
        kinds.add("reasoning")
    return frozenset(kinds)


class Verifier:
    """Claims and verification for one policy; safe to share across requests."""

    def __init__(self, p: policy.Policy, checks: Sequence[AnyCheck] | None = None) -> None:
        self.policy = p
        self.parser = CitationParser(p.citations)
        self._exempt = p.compiled.exempt  # compiled once, when the policy was validated
        # Whole texts (JSON answers, tool arguments, a stream's final text) are segmented by
        # `whole`, which leaves this segmenter's own streaming state alone: one serves all.
        self._whole = self.segmenter()
        self._kinds = _verified_kinds(p)
        self.checks: list[AnyCheck] = list(check_families.build(p) if checks is None else checks)
        self._remote: list[tuple[int, AsyncCheck]] = []
        # Per check in policy order: the facts-reading form of a sync check, or else its
        # plain form (None for a remote check, whose results arrive as `pending`).
        self._plan: list[tuple[int, FactsCheck | None, Check | None]] = []
        self._position: dict[str, int] = {}  # a check's name -> its place in policy order
        for i, c in enumerate(self.checks):
            if isinstance(c, AsyncCheck):
                self._remote.append((i, c))
                self._plan.append((i, None, None))
            elif isinstance(c, FactsCheck):
                self._plan.append((i, c, None))
            elif isinstance(c, Check):
                self._plan.append((i, None, c))
            else:
                raise TypeError(f"{c!r} is neither a sync nor an async check")
            self._position.setdefault(c.name, i)
        # The usual policy has facts-reading checks only: their bound methods, looped over
        # without the dispatch above.
        self._facts_only: list[tuple[int, Callable[[ClaimFacts], CheckResult]]] | None = None
        # The same without the checks that pass every claim with plain citations (the usual
        # claim), which `_decide` runs instead for such a claim.
        self._facts_plain: list[tuple[int, Callable[[ClaimFacts], CheckResult]]] = []
        if all(fast is not None for _, fast, _ in self._plan):
            self._facts_only = [(i, fast.check) for i, fast, _ in self._plan if fast is not None]
            self._facts_plain = [
                (i, run) for i, run in self._facts_only if type(self.checks[i]) not in PASS_PLAIN
            ]

    # -- claims ------------------------------------------------------------------------------

    def verifies(self, channel: Channel) -> bool:
        return channel.kind in self._kinds

    def segmenter(self) -> ClaimSegmenter:
        """A fresh incremental segmenter with this policy's citation format and exemptions."""
        spec = self.policy.claims
        return ClaimSegmenter(
            self.parser, self._exempt, title_words=spec.title_words, code=spec.code
        )

    def claims(self, answer: Answer) -> list[Claim]:
        """Every claim of the channels this policy verifies, indexed across the answer."""
        out: list[Claim] = []
        for ci, channel in enumerate(answer.channels):
            if not self.verifies(channel):
                continue
            if channel.structured is not None:
                out.extend(self._structured(ci, channel, len(out)))
                continue
            if channel.kind == "tool_arguments":
                tool_claims = self._tool_arguments(ci, channel, len(out))
                if tool_claims is not None:
                    out.extend(tool_claims)
                    continue
            segments = self._whole.whole(channel.text)
            if not channel.native:
                for s in segments:
                    out.append(
                        Claim(len(out), ci, s.text, s.start, s.end, s.citations,
                              s.exempt and not s.citations)
                    )
                continue
            here: list[_Piece] = []
            for s in segments:
                cits = s.citations + _native_for(channel, s.start, s.end)
                here.append((s.start, s.end, s.text, cits, s.exempt and not cits))
            here.extend(_uncovered_native(channel, here))
            here.sort(key=lambda c: c[0])
            for start, end, text, cits, exempt in here:
                out.append(Claim(len(out), ci, text, start, end, cits, exempt))
        return out

    def _tool_arguments(self, ci: int, channel: Channel, first: int) -> list[Claim] | None:
        """Claims in a tool call's JSON arguments: the prose among its string values.

        JSON syntax is no claim (its quotes are not quotations), and neither is a parameter
        such as a search query or an id; a string (a value or a key) is a claim-bearing text
        when it cites something or reads as prose (`_PROSE`). Arguments that are not JSON
        return None and are segmented as plain text, which fails closed.
        """
        try:
            args = json.loads(channel.text)
        except ValueError:
            return None
        out: list[Claim] = []
        cursor = 0
        for value in _string_leaves(args):
            if not (_PROSE.search(value) or self.parser.find(value)):
                continue
            literal = json.dumps(value, ensure_ascii=False)
            at = channel.text.find(literal, cursor)
            exact = at >= 0
            if exact:
                cursor = at + len(literal)
            # Offsets are in the channel text when the value is written there verbatim, else
            # in the value itself; either way claim and citation offsets agree.
            shift = at + 1 if exact else 0
            for sg in self._whole.whole(value):
                cits = tuple(
                    dataclasses.replace(c, start=c.start + shift, end=c.end + shift)
                    for c in sg.citations
                )
                out.append(
                    Claim(
                        first + len(out), ci, sg.text, sg.start + shift, sg.end + shift, cits,
                        sg.exempt and not cits,
                    )
                )
        return out

    def _structured(self, ci: int, channel: Channel, first: int) -> list[Claim]:
        out: list[Claim] = []
        cursor = 0
        for text, ids in channel.structured or ():
            text = text[list_label_end(text) :]  # "1. Choose …": the label is no claim
            at = channel.text.find(text, cursor) if text else -1
            start, end = (at, at + len(text)) if at >= 0 else (-1, -1)
            if at >= 0:
                cursor = end
            cits: list[Citation] = []
            for raw in ids:
                cid, sep, version = raw.rpartition("@")
                if not sep or not cid:
                    cid, version = raw, ""
                cits.append(Citation(id=cid, raw=raw, version=version or None))
            base = max(start, 0)
            markers = self.parser.markers(text, base=base)
            cits.extend(c for _, _, found in markers for c in found)
            if at >= 0:
                cits.extend(_native_for(channel, start, end))
            spans = [(s - base, e - base) for s, e, _ in markers]
            exempt = not cits and exempt_match(text, spans, self._exempt)
            out.append(Claim(first + len(out), ci, text, start, end, tuple(cits), exempt))
        return out

    # -- verification ------------------------------------------------------------------------

    def verify(self, answer: Answer, ctx: ContextSet) -> Report:
        t0 = time.perf_counter()
        reports = self.verify_claims(self.claims(answer), ctx)
        return Report(tuple(reports), ctx, time.perf_counter() - t0)

    def verify_claims(self, claims: Sequence[Claim], ctx: ContextSet) -> list[ClaimReport]:
        """Sync verification; an async check in the policy cannot run here and is an error."""
        pending = {
            i: [
                CheckResult.error(c.name, "async_unavailable", "remote check needs averify")
                for _ in claims
            ]
            for i, c in self._remote
        }
        return [self._decide(k, claim, ctx, pending) for k, claim in enumerate(claims)]

    async def averify(self, answer: Answer, ctx: ContextSet, deadline_s: float) -> Report:
        t0 = time.perf_counter()
        reports = await self.averify_claims(self.claims(answer), ctx, deadline_s)
        return Report(tuple(reports), ctx, time.perf_counter() - t0)

    async def averify_claims(
        self, claims: Sequence[Claim], ctx: ContextSet, deadline_s: float
    ) -> list[ClaimReport]:
        """Verification with async checks, each one batch over the non-exempt claims."""
        deadline = time.monotonic() + deadline_s
        checkable = [c for c in claims if not c.exempt]
        results = await asyncio.gather(
            *(_run_batch(c, checkable, ctx, deadline) for _, c in self._remote)
        )
        pending: dict[int, list[CheckResult]] = {}
        for (i, check), batch in zip(self._remote, results, strict=True):
            by_claim = dict(zip((c.index for c in checkable), batch, strict=True))
            # Exempt claims are decided before any check result is read.
            missing = CheckResult.error(check.name, "not_run")
            pending[i] = [by_claim.get(c.index, missing) for c in claims]
        return [self._decide(k, claim, ctx, pending) for k, claim in enumerate(claims)]

    def _decide(
        self, k: int, claim: Claim, ctx: ContextSet, pending: dict[int, list[CheckResult]]
    ) -> ClaimReport:
        if claim.exempt:
            return ClaimReport(claim, "exempt")
        facts = ClaimFacts(claim, ctx)  # shared by the checks of this claim
        # The isolation of `check_safely` / `run_safely`, inlined: in 3.11 a try block costs
        # nothing until something raises, while a helper call per check and claim does.
        r: object
        if self._facts_only is not None:
            runs = self._facts_only
            try:
                if facts.plain():
                    runs = self._facts_plain
            except Exception:  # then every check runs, each isolated
                pass
            for i, run in runs:
                try:
                    r = run(facts)
                except Exception as exc:  # a check bug must not release an unverified claim
                    r = CheckResult.error(self.checks[i].name, "crash", type(exc).__name__)
                if r.__class__ is CheckResult and r.status is _PASS:
                    continue
                report = self._report(claim, i, r)
                if report is not None:
                    return report
            return ClaimReport(claim, "verified")
        return self._from_plan(claim, ctx, facts, 0, lambda i: pending[i][k])

    def decide_with(
        self, claim: Claim, ctx: ContextSet, check: str, result: CheckResult
    ) -> ClaimReport:
        """The verdict of a claim whose verification stopped at the check named `check` with
        its result left for later (the judge pass's verdict for `unsupported`), that result
        now being `result`. The checks before it passed in that verification and are not run
        again; the ones after it run as usual, in policy order. A check the policy does not
        have is a crash, never a pass."""
        if claim.exempt:
            return ClaimReport(claim, "exempt")
        at = self._position.get(check)
        if at is None:
            return ClaimReport(claim, "errored", error_kind="crash", check=check,
                               detail="no such check in the policy")
        report = self._report(claim, at, result)
        if report is not None:
            return report
        return self._from_plan(
            claim, ctx, ClaimFacts(claim, ctx), at + 1,
            lambda i: CheckResult.error(self.checks[i].name, "async_unavailable"),
        )

    def _from_plan(
        self,
        claim: Claim,
        ctx: ContextSet,
        facts: ClaimFacts,
        start: int,
        remote: Callable[[int], object],
    ) -> ClaimReport:
        """The claim's verdict from the checks of the plan from `start` on, in policy order:
        the first that does not pass decides. `remote(i)` is remote check `i`'s result."""
        r: object
        for i, fast, plain in self._plan[start:]:
            try:
                if fast is not None:
                    r = fast.check(facts)
                elif plain is not None:
                    r = plain.run(claim, ctx)
                else:
                    r = remote(i)
            except Exception as exc:  # a check bug must not release an unverified claim
                r = CheckResult.error(self.checks[i].name, "crash", type(exc).__name__)
            report = self._report(claim, i, r)
            if report is not None:
                return report
        return ClaimReport(claim, "verified")

    def _report(self, claim: Claim, i: int, r: object) -> ClaimReport | None:
        """The verdict check `i`'s result `r` decides, or None when it passes."""
        if not isinstance(r, CheckResult):
            r = CheckResult.error(self.checks[i].name, "crash", "check returned no CheckResult")
        status = r.status
        if status is _PASS:
            return None
        if status is _FAIL:
            return ClaimReport(claim, "failed", reason=r.reason, check=r.check, detail=r.detail)
        if status is _ERROR:
            return ClaimReport(claim, "errored", error_kind=r.kind, check=r.check,
                               detail=r.detail)
        raise ValueError(f"unknown check status {status!r}")


_PASS, _FAIL, _ERROR = Status.PASS, Status.FAIL, Status.ERROR


async def _run_batch(
    check: AsyncCheck, claims: Sequence[Claim], ctx: ContextSet, deadline: float
) -> list[CheckResult]:
    """One async check over a batch; timeout, crash or a short answer become errors."""
    if not claims:
        return []
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0:
            raise TimeoutError
        async with asyncio.timeout(remaining):
            results = await check.run_batch(claims, ctx, deadline)
    except TimeoutError:
        return [CheckResult.error(check.name, "timeout", "deadline passed") for _ in claims]
    except Exception as exc:  # a remote check failure must never pass a claim
        return [CheckResult.error(check.name, "crash", type(exc).__name__) for _ in claims]
    if (
        not isinstance(results, list)
        or len(results) != len(claims)
        or not all(isinstance(r, CheckResult) for r in results)
    ):
        return [CheckResult.error(check.name, "crash", "bad batch result") for _ in claims]
    return results


# Prose, as opposed to a query, an id or an enum value: four or more words ending a sentence
# (closing quotes or brackets may follow its mark), or six or more words however punctuated
# (a sentence without its period is still one; keyword queries are shorter).
_PROSE = re.compile(
    r"(?:\S+\s+){3,}\S*?[.!?…。！？][\"'”’)\]»*_]*(?:\s|$)|(?:\S+\s+){5,}\S"
)


def _string_leaves(value: object) -> list[str]:
    """Strings of a JSON document, object keys included (a key can carry a sentence as well
    as a value can), in document order."""
    out: list[str] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, dict):
            for k, v in reversed(list(node.items())):
                stack.append(v)
                stack.append(k)
        elif isinstance(node, list):
            stack.extend(reversed(node))
    return out


def _uncovered_native(
    channel: Channel, claims: Sequence[_Piece]
) -> list[_Piece]:
    """Claims for the native citations no claim of `channel` carries: on text that is no
    claim (whitespace, a title, exempt code) a citation's `cited_text` would otherwise go out
    unchecked. Each is a claim of the text it spans (citations whose spans overlap share one),
    checked like any other."""
    carried = {id(c) for *_, cits, _ in claims for c in cits}
    spans = sorted(
        ((s, e, c) for s, e, c in channel.native if id(c) not in carried),
        key=lambda t: (t[0], t[1]),  # citations have no order: two may share a span
    )
    out: list[_Piece] = []
    i = 0
    while i < len(spans):
        start, end, first = spans[i]
        cits = [first]
        i += 1
        while i < len(spans) and spans[i][0] < end:
            end = max(end, spans[i][1])
            cits.append(spans[i][2])
            i += 1
        out.append((start, end, channel.text[start:end], tuple(cits), False))
    return out


def _native_for(channel: Channel, start: int, end: int) -> tuple[Citation, ...]:
    """Native citations whose span overlaps [start, end) (empty spans count at their point)."""
    if not channel.native:
        return ()
    return tuple(
        c
        for s, e, c in channel.native
        if (s < end and e > start) or (s == e and start <= s <= end)
    )


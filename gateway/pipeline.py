"""One route's verification pipeline: context → claims → checks → decision → body.

Compiled once per (policy, route) and shared by the proxy and the offline `citewarden verify`,
so both decide exactly alike. Pure apart from the optional async checks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.checks.base import cited_chunks, claim_body
from gateway.checks.judge import PENDING, JudgePass, JudgeStats, Pending
from gateway.context import build_context, request_context
from gateway.jsonio import dumps
from gateway.policy import LoadedPolicy, Route
from gateway.protocols import ADAPTERS
from gateway.protocols.base import Adapter, channel_key
from gateway.protocols.fields import allowed, level_of
from gateway.release import decide
from gateway.types import (
    Answer,
    Channel,
    Claim,
    ClaimReport,
    ContextSet,
    Decision,
    Outcome,
    Report,
)
from gateway.verify import Verifier

# Verdicts reached while a stream arrived, by the claim's (start, end, text) in the primary
# text channel.
KnownVerdicts = Mapping[tuple[int, int, str], ClaimReport]


@dataclass(frozen=True, slots=True)
class Judgement:
    claims: list[Claim]
    report: Report
    outcome: Outcome
    judge: JudgeStats | None = None  # what the judge pass did, when it ran


@dataclass(frozen=True, slots=True)
class Rendered:
    status: int
    body: bytes
    unchanged: bool  # True when `body` is the upstream's bytes


class RequestContext:
    """The context a request carries, read once: as soon as the request has gone upstream
    (the client's `meanwhile` calls it), so that the reading is done while the upstream
    answers, or else when it is first needed. A failure is kept and raised where the context
    is needed, as if it had been read there."""

    __slots__ = ("_ctx", "_error", "_policy", "_protocol", "_request")

    def __init__(self, pipeline: RoutePipeline, request: Mapping[str, Any]) -> None:
        self._protocol = pipeline.route.protocol
        self._policy = pipeline.policy
        self._request = request
        self._ctx: ContextSet | None = None
        self._error: Exception | None = None

    def __call__(self) -> None:
        """Read the request's context unless it was read; never raises."""
        if self._ctx is None and self._error is None:
            spec = self._policy.context
            try:
                self._ctx = (
                    request_context(self._protocol, self._request, spec)
                    if "request" in spec.from_ else ContextSet()
                )
            except Exception as e:  # raised where the context is needed
                self._error = e

    def read(self) -> ContextSet:
        self()
        if self._error is not None:
            raise self._error
        assert self._ctx is not None
        return self._ctx


class RoutePipeline:
    """Everything needed to judge answers on one route, built once."""

    def __init__(self, loaded: LoadedPolicy, route: Route) -> None:
        self.loaded = loaded
        self.policy = loaded.policy
        self.route = route
        self.adapter: Adapter = ADAPTERS[route.protocol]
        self.verifier = Verifier(loaded.policy)
        self.primary_key = self.adapter.primary_channel or ""
        spec = loaded.policy.support.judge
        # The judge pass (DESIGN §10); None keeps verification synchronous, as fast as ever.
        self.judge_pass: JudgePass | None = (
            JudgePass(spec) if spec is not None and "unsupported" in loaded.policy.checks
            else None
        )
        self.codec = self.adapter.stream_codec()  # how its streams are framed (SSE unless its own)

    def context(
        self,
        request_body: Mapping[str, Any] | RequestContext | None,
        response_body: Mapping[str, Any] | None,
        response_headers: Mapping[str, str] | None,
    ) -> ContextSet:
        """The trusted context of one exchange, the request's read from its body or taken from
        a `RequestContext`; a malformed context header raises ProtocolError."""
        prepared = None
        if isinstance(request_body, RequestContext):
            prepared, request_body = request_body.read(), None
        return build_context(
            self.route.protocol,
            self.policy.context,
            request=request_body,
            response=response_body,
            headers=response_headers,
            rag=self.route.rag,
            prepared=prepared,
        )

    def judge(
        self,
        answer: Answer,
        ctx: ContextSet,
        known: KnownVerdicts | None = None,
        streamed_text: str | None = None,
    ) -> Judgement:
        """Verify every claim of `answer` and decide.

        `known` holds verdicts a stream verifier already reached for claims of the primary text
        channel, keyed by (start, end, text), in claim order; a claim found there with the same
        citations is not checked twice, any other claim is. When `streamed_text` is the primary
        channel's text and the channel has no native citations, its claims are the streamed
        ones as they are (segmentation gives the same claims however the text was split), so
        the answer is not segmented a second time.
        """
        t0 = time.perf_counter()
        primary = self.primary_channel(answer) if known else None
        if (
            known
            and primary is not None
            and self._streamed_claims_hold(answer, primary, streamed_text)
        ):
            claims = self._with_streamed(answer, primary, known)
        else:
            claims = self.verifier.claims(answer)
        if not known:
            verdicts = self.verifier.verify_claims(claims, ctx)
        else:
            reused: dict[int, ClaimReport] = {}
            unchecked: list[Claim] = []
            for c in claims:
                hit = known.get((c.start, c.end, c.text)) if c.channel == primary else None
                if hit is None or hit.claim.citations != c.citations:
                    unchecked.append(c)
                else:
                    # Usually the very claim the stream verifier made (`_with_streamed`).
                    reused[c.index] = hit if hit.claim is c else dataclasses.replace(hit, claim=c)
            fresh = iter(self.verifier.verify_claims(unchecked, ctx))
            verdicts = [reused.get(c.index) or next(fresh) for c in claims]
        report = Report(tuple(verdicts), ctx, time.perf_counter() - t0)
        return Judgement(claims, report, decide(report, self.policy.release))

    def _streamed_claims_hold(self, answer: Answer, primary: int, text: str | None) -> bool:
        channel = answer.channels[primary]
        return (
            text is not None
            and channel.text == text
            and not channel.native
            and channel.structured is None
            and self.verifier.verifies(channel)
        )

    def _with_streamed(self, answer: Answer, primary: int, known: KnownVerdicts) -> list[Claim]:
        """The answer's claims, with the primary channel's taken from the stream verifier."""
        channels = list(answer.channels)
        ch = channels[primary]
        channels[primary] = Channel(ch.kind, ch.path, "", ch.choice)
        others = self.verifier.claims(dataclasses.replace(answer, channels=channels))
        placed = [(c, c.channel) for c in others if c.channel < primary]
        placed += [(r.claim, primary) for r in known.values()]
        placed += [(c, c.channel) for c in others if c.channel > primary]
        return [
            c if (c.index, c.channel) == (i, ch) else dataclasses.replace(c, index=i, channel=ch)
            for i, (c, ch) in enumerate(placed)
        ]

    def primary_channel(self, answer: Answer) -> int | None:
        """The index of the channel a stream verifier segments as it arrives."""
        for i, channel in enumerate(answer.channels):
            if channel_key(channel.path) == self.primary_key:
                return i
        return None

    def safe_judge(
        self,
        answer: Answer,
        ctx: ContextSet,
        known: KnownVerdicts | None = None,
        streamed_text: str | None = None,
    ) -> Judgement:
        """`judge`, except that a crash anywhere in verification becomes an infrastructure
        failure decided by `on_infrastructure_failure` — it never releases."""
        try:
            return self.judge(answer, ctx, known, streamed_text)
        except Exception:
            report = Report(claims=(), context=ctx)
            return Judgement([], report, self.infrastructure_outcome("verifier_crash"))

    # -- the judge pass (DESIGN §10) ---------------------------------------------------------

    @staticmethod
    def is_pending(report: ClaimReport) -> bool:
        """Whether the lexical tier left this claim to the judge."""
        return report.verdict == "errored" and report.error_kind == PENDING

    @staticmethod
    def pending_item(report: ClaimReport, ctx: ContextSet) -> Pending:
        claim = report.claim
        chunks, _ = cited_chunks(claim, ctx)
        pairs = [(c.id, c.text) for c in chunks if c.text is not None]
        pairs += [
            (f"native{i + 1}", c.native.cited_text)
            for i, c in enumerate(claim.citations)
            if c.native is not None
        ]
        return Pending(claim.index, " ".join(claim_body(claim).split()), tuple(pairs))

    def judge_deadline(self) -> float:
        spec = self.policy.support.judge
        return time.monotonic() + (spec.deadline if spec is not None else 0.0)

    async def judge_claims(
        self,
        reports: list[ClaimReport],
        ctx: ContextSet,
        question: str | None,
        deadline: float,
    ) -> tuple[list[ClaimReport], JudgeStats | None]:
        """`reports` with every claim the lexical tier left pending decided by the judge
        (and the checks after `unsupported` run); a crash is an infrastructure error."""
        waiting = [self.is_pending(r) for r in reports]
        pending = [r for r, w in zip(reports, waiting, strict=True) if w]
        if not pending or self.judge_pass is None:
            return reports, None
        try:
            results, stats = await self.judge_pass.run(
                [self.pending_item(r, ctx) for r in pending], question, deadline
            )
        except Exception as e:  # the pass itself broke: never a pass
            return [
                ClaimReport(r.claim, "errored", error_kind="judge_crash", check="unsupported",
                            detail=type(e).__name__)
                if w else r
                for r, w in zip(reports, waiting, strict=True)
            ], None
        out = []
        for r, w in zip(reports, waiting, strict=True):
            res = results.get(r.claim.index) if w else None
            # A pending claim without a verdict stays pending: an infrastructure error.
            out.append(r if res is None else self.verifier.decide_with(
                r.claim, ctx, "unsupported", res))
        return out, stats

    async def resolve_judge(self, judgement: Judgement, question: str | None) -> Judgement:
        """The judgement with its pending claims judged, and decided again. `question`: the
        request's (`Adapter.question`), shown to the judge to read a claim by."""
        report = judgement.report
        if self.judge_pass is None or not any(self.is_pending(r) for r in report.claims):
            return judgement
        ctx = report.context
        if not isinstance(ctx, ContextSet):
            return judgement  # unreachable: a fresh report holds its context; pending fails closed
        t0 = time.perf_counter()
        reports, stats = await self.judge_claims(
            list(report.claims), ctx, question, self.judge_deadline()
        )
        new = Report(tuple(reports), ctx, report.seconds + time.perf_counter() - t0)
        return Judgement(judgement.claims, new, decide(new, self.policy.release), stats)

    def infrastructure_outcome(self, reason: str) -> Outcome:
        match self.policy.release.on_infrastructure_failure:
            case "block":
                return Outcome(Decision.BLOCKED, reason=reason)
            case "abstain":
                return Outcome(Decision.ABSTAINED, reason=reason, template="verifier_unavailable")

    def parse_stream(self, raw: bytes) -> Answer:
        """A whole buffered SSE capture → the same Answer the JSON body would give."""
        decoder = self.codec.decoder()
        parser = self.adapter.stream_parser(self.route)
        for event in decoder.feed(raw):
            parser.feed(event)
        for event in decoder.finish():
            parser.feed(event)
        answer = parser.finish()
        answer.dropped.extend([("sse", ("line",))] * decoder.undefined)
        return answer

    def render(
        self,
        answer: Answer,
        judgement: Judgement,
        raw: bytes,
        request_id: str,
        *,
        stream: bool = False,
        include_usage: bool = False,
    ) -> Rendered:
        """The status and body the client receives for this judgement (enforce mode).

        A released answer that needs no rewrite is the upstream's bytes, JSON or SSE alike;
        anything else is rendered from the answer, and re-framed as a stream when the
        client asked for one. A block is always a JSON error envelope with the block status.
        """
        outcome = judgement.outcome
        if outcome.decision is Decision.BLOCKED:
            blocked = self.block_body(outcome, request_id)
            blocked = {**self.adapter.kept_fields(answer), **blocked}  # the envelope's keys win
            return Rendered(
                self.policy.release.block_status,
                dumps(blocked),
                unchanged=False,
            )
        if (
            outcome.decision is Decision.RELEASED
            and not self.adapter.needs_rewrite(answer, self.policy)
            and (not stream or self.adapter.stream_relayable(raw))
        ):
            return Rendered(200, raw, unchanged=True)
        body = self.adapter.render(answer, judgement.claims, outcome, judgement.report, self.policy)
        if stream:
            events = self.adapter.to_stream(body, include_usage)
            return Rendered(200, b"".join(map(self.codec.encode, events)), unchanged=False)
        return Rendered(200, dumps(body), unchanged=False)

    def dropped_levels(self, answer: Answer) -> dict[str, int]:
        """How many fields of `answer` the client does not receive, per field-table level: what
        the table removed while parsing, and unknown fields the policy does not allow."""
        if not answer.dropped and not answer.unknown_fields:
            return {}
        out: dict[str, int] = {}
        for level, _ in answer.dropped:
            out[level] = out.get(level, 0) + 1
        table = self.adapter.field_table
        allow = self.policy.channels.allow_fields
        for path in answer.unknown_fields:
            if not allowed(path, allow):
                level = "top" if table is None else level_of(table, path)
                out[level] = out.get(level, 0) + 1
        return out

    def block_body(self, outcome: Outcome, request_id: str) -> dict[str, Any]:
        status = self.policy.release.block_status
        body = self.adapter.error_envelope(
            status,
            f"answer blocked by citewarden: {outcome.reason or 'unverified'}",
            "citation_verification_failed",
        )
        body["citewarden"] = {
            "reason": outcome.reason,
            "claim_index": outcome.claim_index,
            "request_id": request_id,
            "policy": self.loaded.label,
        }
        return body


class Pipelines:
    """Caches a RoutePipeline per (policy version, what it read from the files it names,
    route name): a reload after an edit of the judge's prompt template or key file builds
    the pipeline anew, though the version (which names the files) is the same."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str, str, str], RoutePipeline] = {}

    def get(self, loaded: LoadedPolicy, route: Route) -> RoutePipeline:
        key = (str(loaded.path), loaded.version, loaded.contents, route.name)
        p = self._cache.get(key)
        if p is None:
            p = self._cache[key] = RoutePipeline(loaded, route)
        return p


def claim_views(judgement: Judgement, include_text: bool = True) -> Sequence[dict[str, Any]]:
    out = []
    for cr in judgement.report.claims:
        c = cr.claim
        view: dict[str, Any] = {
            "index": c.index,
            "span": [c.start, c.end],
            "channel": c.channel,
            "citations": [cit.id for cit in c.citations],
            "status": cr.verdict,
            "reason": cr.reason or cr.error_kind,
        }
        if include_text:
            view["text"] = c.text
        out.append(view)
    return out

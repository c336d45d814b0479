"""Progressive release of a streamed answer: each claim goes out once it has verified.

Sans-io like the decoders it wires together: `feed(events) -> bytes`, `finish() -> bytes`,
`abort(message) -> bytes`; the app only moves bytes. The primary text channel (OpenAI choice 0
content, the Anthropic text blocks) is segmented incrementally; a verified claim's text is
framed and released at once, a failing claim is stripped (`on_unverified: strip`) or ends the
stream with the protocol's error event. Every other channel is held until the upstream stream
ends and the whole answer has been judged, then released per the policy — or, if that judgement
fails, the stream ends with an error event. Never a clean end after withheld content.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from gateway.checks.judge import JudgeStats
from gateway.claims import Segment
from gateway.errors import ProtocolError
from gateway.pipeline import Judgement, RoutePipeline
from gateway.release import template_text
from gateway.sse import SSEEvent
from gateway.types import (
    Answer,
    Claim,
    ClaimReport,
    ContextSet,
    Decision,
    Outcome,
    Report,
    TemplateName,
)

Json = dict[str, Any]

class StreamVerifier:
    """Parses a stream event by event and verifies each claim of the primary text channel as
    soon as it is complete, so little is left to check when the stream ends.

    Used by both streaming modes: progressive release acts on each verdict at once; buffer
    mode hands `known` to `RoutePipeline.judge`, which then checks only what is left.
    """

    def __init__(self, pipeline: RoutePipeline, ctx: ContextSet) -> None:
        self.pipeline = pipeline
        self.ctx = ctx
        self.parser = pipeline.adapter.stream_parser(pipeline.route)
        self.segmenter = pipeline.verifier.segmenter()
        self.primary = pipeline.primary_key
        self.known: dict[tuple[int, int, str], ClaimReport] = {}
        self.count = 0
        self.seconds = 0.0
        self.length = 0  # primary text seen so far
        self._texts: list[str] = []
        self.native = self.parser.native_spans
        # Context that arrives in the stream itself (file_search results).
        self.parser.bind_context(ctx, pipeline.policy.context)
        # SSE lines of the stream no event carried (`SSEDecoder.undefined`: comments, `id`,
        # `retry`, unknown fields), set by whoever decodes it: never relayed, so an answer
        # that had any is re-framed.
        self.sse_undefined = 0

    def feed(self, event: SSEEvent) -> tuple[str, list[ClaimReport]]:
        """The primary text this event adds, and the claims it completed, verified."""
        added: list[str] = []
        reports: list[ClaimReport] = []
        for key, delta in self.parser.feed(event):
            if key == self.primary:
                added.append(delta)
                self._texts.append(delta)
                self.length += len(delta)
                reports.extend(self._verify(seg) for seg in self.segmenter.feed(delta))
        return "".join(added), reports

    @property
    def text(self) -> str:
        """The primary text as streamed, for RoutePipeline.judge to reuse its claims."""
        return "".join(self._texts)

    def finish(self) -> tuple[list[ClaimReport], Answer]:
        """The last claims, verified, and the whole answer (ProtocolError if it is cut short)."""
        reports = [self._verify(seg) for seg in self.segmenter.finish()]
        answer = self.parser.finish()
        answer.dropped.extend([("sse", ("line",))] * self.sse_undefined)
        if self.parser.context_grew_late and (
            self.pipeline.policy.streaming.mode == "buffer"
        ):
            # Context arrived in the stream after claims were checked (search results sent
            # with the last frame): nothing went out yet, so the judge checks every claim again.
            self.known.clear()
        return reports, answer

    def _verify(self, seg: Segment) -> ClaimReport:
        citations = seg.citations
        if self.native is not None:
            citations += self.native.overlapping(seg.start, seg.end, self.length)
        # A claim that cites is checked, whatever exemption its words match.
        claim = Claim(
            self.count, 0, seg.text, seg.start, seg.end, citations, seg.exempt and not citations
        )
        self.count += 1
        t0 = time.perf_counter()
        try:
            report = self.pipeline.verifier.verify_claims([claim], self.ctx)[0]
        except Exception as e:  # a crashing verifier never passes a claim
            report = ClaimReport(claim, "errored", error_kind="crash", detail=type(e).__name__)
        self.seconds += time.perf_counter() - t0
        self.known[(seg.start, seg.end, seg.text)] = report
        return report


class ProgressiveRelease:
    """One progressive stream's state. Not shared between requests."""

    def __init__(
        self,
        pipeline: RoutePipeline,
        ctx: ContextSet,
        request_id: str,
        include_usage: bool,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.ctx = ctx
        self.request_id = request_id
        self.verifier = StreamVerifier(pipeline, ctx)
        # The judge pass: claims wait here, in order, while their verdicts are pending.
        self.judged = pipeline.judge_pass is not None
        self.waiting: deque[ClaimReport | asyncio.Task[ClaimReport]] = deque()
        self.judge_stats: JudgeStats | None = None
        self._question = pipeline.adapter.question(request) if self.judged else None
        self.framer = pipeline.adapter.progressive_framer(include_usage)
        self.buffer = ""  # primary text not yet released, from `released` on
        self.released = 0  # offset in the primary text up to which it has been decided
        self.stripped = False
        self.closed = False
        self.judgement: Judgement | None = None
        self.outcome: Outcome | None = None  # set when the stream ended on a failing claim
        self.reason: str | None = None  # why it ended early, when no claim decided it
        self.decision = "error"
        self.served = False
        self.judge_seconds = 0.0
        self.usage: Mapping[str, int] = {}
        self.include_usage = include_usage
        self.dropped: Mapping[str, int] = {}  # fields the client did not receive, per level

    @property
    def verify_seconds(self) -> float:
        return self.verifier.seconds + self.judge_seconds

    def summary(self) -> Judgement | None:
        """What this stream's audit event reports: the whole answer's judgement, or, when a
        claim ended the stream early, the claims verified up to it and that decision."""
        if self.judgement is not None or self.outcome is None:
            return self.judgement
        reports = tuple(self.verifier.known.values())
        report = Report(reports, self.ctx, self.verify_seconds)
        return Judgement([r.claim for r in reports], report, self.outcome, self.judge_stats)

    # -- input -------------------------------------------------------------------------------

    def feed(self, events: Sequence[SSEEvent]) -> bytes:
        if self.closed:
            return b""
        out: list[bytes] = []
        try:
            for event in events:
                self.framer.observe(event)
                added, reports = self.verifier.feed(event)
                self.buffer += added
                if self.judged:
                    out.extend(self._admit(r) for r in reports)
                else:
                    out.extend(self._decide(r) for r in reports)
                if self.closed:
                    return b"".join(out)
            if self.judged:
                out.append(self._drain())
        except ProtocolError as e:
            out.append(self.abort(f"invalid upstream stream: {e}"))
        return b"".join(out)

    # -- the judge pass: claims released in order as their verdicts arrive ---------------------

    def _admit(self, report: ClaimReport) -> bytes:
        """Queue a claim behind those still waiting; a pending one starts its judge call now,
        while the stream goes on (DESIGN §10: per claim in progressive mode)."""
        if self.pipeline.is_pending(report) and not self.closed:
            # The deadline runs from when the claim is complete: the stream's own duration is
            # the upstream's, not judge work; the wait after the stream ends stays bounded.
            deadline = self.pipeline.judge_deadline()
            task = asyncio.get_running_loop().create_task(self._judge(report, deadline))
            self.waiting.append(task)
        else:
            self.waiting.append(report)
        return self._drain()

    async def _judge(self, report: ClaimReport, deadline: float) -> ClaimReport:
        t0 = time.perf_counter()
        try:
            reports, stats = await self.pipeline.judge_claims(
                [report], self.ctx, self._question, deadline
            )
        except Exception as e:  # never a pass
            return ClaimReport(report.claim, "errored", error_kind="judge_crash",
                               detail=type(e).__name__)
        finally:
            self.judge_seconds += time.perf_counter() - t0
        if stats is not None:
            self.judge_stats = stats if self.judge_stats is None else self.judge_stats.merge(stats)
        return reports[0]

    def _drain(self) -> bytes:
        """Decide the waiting claims from the front, up to the first still being judged."""
        out: list[bytes] = []
        while self.waiting and not self.closed:
            head = self.waiting[0]
            if isinstance(head, asyncio.Task):
                if not head.done():
                    break
                report = head.result()
                c = report.claim
                self.verifier.known[(c.start, c.end, c.text)] = report
            else:
                report = head
            self.waiting.popleft()
            out.append(self._decide(report))
        if self.closed:
            self._cancel()
        return b"".join(out)

    def _cancel(self) -> None:
        for item in self.waiting:
            if isinstance(item, asyncio.Task):
                item.cancel()
        self.waiting.clear()

    async def interleave(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The upstream's chunks, and an empty one whenever a judge verdict arrives between
        two of them, so a claim goes out as soon as its verdict is in."""
        it = aiter(chunks)
        nxt: asyncio.Future[bytes] | None = None
        try:
            while True:
                busy = [t for t in self.waiting if isinstance(t, asyncio.Task) and not t.done()]
                if nxt is None and not busy:
                    try:
                        chunk = await anext(it)
                    except StopAsyncIteration:
                        return
                    yield chunk
                    continue
                if nxt is None:
                    nxt = asyncio.ensure_future(anext(it))
                waits: list[asyncio.Future[Any]] = [nxt, *busy]
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if nxt in done:
                    got, nxt = nxt, None
                    try:
                        chunk = got.result()
                    except StopAsyncIteration:
                        return
                    yield chunk
                else:
                    yield b""
        finally:
            if nxt is not None:
                nxt.cancel()

    async def afinish(self) -> bytes:
        """`finish` for a policy with a judge: the last claims judged, every verdict awaited,
        and what is left of the answer judged too, before the stream ends."""
        if self.closed:
            return b""
        try:
            reports, answer = self.verifier.finish()
        except ProtocolError as e:
            self._cancel()
            return self.abort(f"upstream stream ended early: {e}")
        out = [self._admit(r) for r in reports]
        busy = [t for t in self.waiting if isinstance(t, asyncio.Task)]
        if busy:
            await asyncio.wait(busy)
        out.append(self._drain())
        if self.closed:
            return b"".join(out)
        return b"".join(out) + await self._finish_answer(answer)

    async def _finish_answer(self, answer: Answer) -> bytes:
        t0 = time.perf_counter()
        judgement = self.pipeline.safe_judge(
            answer, self.ctx, self.verifier.known, self.verifier.text
        )
        self.judge_seconds += time.perf_counter() - t0
        judged = await self.pipeline.resolve_judge(judgement, self._question)
        if judged.judge is not None:
            self.judge_stats = (
                judged.judge if self.judge_stats is None else self.judge_stats.merge(judged.judge)
            )
        if self.judge_stats is not None:
            judged = dataclasses.replace(judged, judge=self.judge_stats)
        return self._release_answer(answer, judged)

    def finish(self) -> bytes:
        if self.closed:
            return b""
        out: list[bytes] = []
        try:
            reports, answer = self.verifier.finish()
        except ProtocolError as e:
            return self.abort(f"upstream stream ended early: {e}")
        out.extend(self._decide(r) for r in reports)
        if self.closed:
            return b"".join(out)
        # What is left is no claim (trailing whitespace, a heading, a code fence): it needs
        # no citation, but goes out only if the whole answer is released below.
        t0 = time.perf_counter()
        judgement = self.pipeline.safe_judge(
            answer, self.ctx, self.verifier.known, self.verifier.text
        )
        self.judge_seconds += time.perf_counter() - t0
        return b"".join(out) + self._release_answer(answer, judgement)

    def _release_answer(self, answer: Answer, judgement: Judgement) -> bytes:
        """The end of the stream once the whole answer is judged."""
        out: list[bytes] = []
        rest, self.buffer = self.buffer, ""
        self.judgement = judgement
        self.usage = answer.usage
        outcome = judgement.outcome
        self.dropped = self.pipeline.dropped_levels(answer)
        # The claims that went out: every one the stream verifier decided, it released or
        # the stream ended (the rest were stripped).
        known = self.verifier.known
        for r in judgement.report.claims:
            c = r.claim
            went = known.get((c.start, c.end, c.text))
            if (
                r.verdict in ("failed", "errored")
                and went is not None
                and went.verdict in ("verified", "exempt")
            ):
                # Judged whole, a claim that already went out fails (a citation that came
                # after it, context that grew): it cannot be taken back, so no clean end.
                return self._fail(Outcome(Decision.BLOCKED, r.reason or r.error_kind, c.index))
        match outcome.decision:
            case Decision.RELEASED:
                # The same channel rules as a buffered answer: the adapter renders it.
                body: Mapping[str, Any] = self.pipeline.adapter.render(
                    answer, judgement.claims, outcome, judgement.report, self.pipeline.policy
                )
                if rest:
                    out.append(self.framer.text(rest))
            case Decision.PARTIAL:
                body = self.pipeline.adapter.render(
                    answer, judgement.claims, outcome, judgement.report, self.pipeline.policy
                )
                if rest:
                    out.append(self.framer.text(rest))
                # A claim stripped from the text, or only from another channel (a tool
                # call, another choice): the answer says it is partial either way.
                out.append(
                    self.framer.text("\n\n" + self.pipeline.policy.release.templates.partial)
                )
            case Decision.ABSTAINED | Decision.REVIEW if not self.framer.started:
                body = self.pipeline.adapter.render(
                    answer, judgement.claims, outcome, judgement.report, self.pipeline.policy
                )
                return b"".join(out) + self._abstain(outcome, body)
            case Decision.BLOCKED | Decision.ABSTAINED | Decision.REVIEW:
                return b"".join(out) + self._fail(outcome)
            case _:
                raise AssertionError(f"unhandled decision {outcome.decision!r}")
        out.append(self.framer.tail(self.pipeline, body))
        self.decision = outcome.decision.value
        self.served = True
        self.closed = True
        return b"".join(out)

    def abort(self, message: str) -> bytes:
        """End the stream with the protocol's error event (upstream broke)."""
        if self.closed:
            return b""
        self.closed = True
        self._cancel()
        self.decision = "error"
        self.reason = "upstream_stream_broken"
        return self.framer.error(f"citewarden: {message}", "upstream_error")

    # -- claims ------------------------------------------------------------------------------

    def _decide(self, verdict: ClaimReport) -> bytes:
        if self.closed:
            return b""
        claim = verdict.claim
        gap_and_claim = self.buffer[: claim.end - self.released]
        self.buffer = self.buffer[claim.end - self.released :]
        self.released = claim.end
        match verdict.verdict:
            case "verified" | "exempt":
                return self.framer.text(gap_and_claim, [claim])
            case "failed" if self.pipeline.policy.release.on_unverified == "strip":
                self.stripped = True
                return b""
            case "failed":
                return self._fail(self._unverified_outcome(verdict))
            case "errored":
                kind = verdict.error_kind or "error"
                return self._fail(self.pipeline.infrastructure_outcome(kind))
            case _:
                raise AssertionError(f"unhandled verdict {verdict.verdict!r}")

    def _unverified_outcome(self, verdict: ClaimReport) -> Outcome:
        """What a failing claim decides mid-stream: what `release.decide` gives the answer."""
        reason, index = verdict.reason, verdict.claim.index
        match self.pipeline.policy.release.on_unverified:
            case "abstain":
                template: TemplateName = (
                    "stale_source" if reason == "stale_source" else "no_evidence"
                )
                return Outcome(Decision.ABSTAINED, reason, index, template)
            case "review":
                return Outcome(Decision.REVIEW, reason, index, "review_required")
            case _:
                return Outcome(Decision.BLOCKED, reason=reason, claim_index=index)

    def _abstain(self, outcome: Outcome, body: Mapping[str, Any]) -> bytes:
        """Nothing went out yet: stream `body` (the abstention template in the protocol's
        answer shape) as the whole answer, ending normally, as buffer mode would (DESIGN §5)."""
        self.closed = True
        self.decision = outcome.decision.value
        self.outcome = outcome
        events = self.pipeline.adapter.to_stream(body, self.include_usage)
        return b"".join(map(self.pipeline.codec.encode, events))

    def _fail(self, outcome: Outcome) -> bytes:
        if outcome.decision in (Decision.ABSTAINED, Decision.REVIEW) and not self.framer.started:
            text = template_text(outcome, self.pipeline.policy.release.templates)
            return self._abstain(outcome, self.framer.template_body(text or ""))
        self.closed = True
        # Claims went out, so an abstention can no longer be streamed: the client gets the
        # error event a block ends with, and the audit line says so (a review is still
        # requested from the outcome).
        self.decision = Decision.BLOCKED.value
        self.outcome = outcome
        reason = outcome.reason or "unverified"
        message = template_text(outcome, self.pipeline.policy.release.templates) or (
            f"answer blocked by citewarden: {reason}"
        )
        text = f"{message} (reason: {reason}, request_id: {self.request_id})"
        return self.framer.error(text, "citation_verification_failed")

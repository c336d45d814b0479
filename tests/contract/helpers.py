"""Shared moves of the contract tests: a case, the primary text, awkward byte splits, a
two-claim answer (one verified, one failed and carrying MARKER) and an outcome per decision."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.protocols import Adapter
from gateway.sse import SSEEvent
from gateway.types import Answer, Claim, ClaimReport, ContextSet, Decision, Outcome, Report
from tests.contract.samples import BAD, GOOD, Sample
from tests.test_protocol_helpers import claims_for


@dataclass(frozen=True)
class Case:
    name: str
    adapter: Adapter
    sample: Sample


OUTCOMES: dict[Decision, Outcome] = {
    Decision.RELEASED: Outcome(Decision.RELEASED),
    Decision.PARTIAL: Outcome(
        Decision.PARTIAL,
        reason="hallucinated_citation",
        claim_index=1,
        template="partial",
        kept=frozenset({0}),
    ),
    Decision.ABSTAINED: Outcome(
        Decision.ABSTAINED, reason="hallucinated_citation", claim_index=1, template="no_evidence"
    ),
    Decision.REVIEW: Outcome(
        Decision.REVIEW, reason="hallucinated_citation", claim_index=1, template="review_required"
    ),
    Decision.BLOCKED: Outcome(Decision.BLOCKED, reason="hallucinated_citation", claim_index=1),
}
# The decisions whose body must not carry the failed claim's words.
WITHHOLDING = (Decision.PARTIAL, Decision.ABSTAINED, Decision.BLOCKED)


def primary_index(answer: Answer) -> int:
    """The answer's primary text channel: its first `content` channel."""
    return next(i for i, c in enumerate(answer.channels) if c.kind == "content")


def primary_text(answer: Answer) -> str:
    return answer.channels[primary_index(answer)].text


def mixed_answer(
    case: Case, extra: Mapping[str, object] | None = None
) -> tuple[Answer, list[Claim], Report]:
    """GOOD (verified) then BAD (failed, carrying MARKER) in one primary text; `extra`
    top-level fields are planted in the body."""
    body = {**case.sample.body(f"{GOOD} {BAD}"), **(extra or {})}
    answer = case.adapter.parse(body, case.sample.route)
    claims = claims_for(answer, primary_index(answer), [GOOD, BAD])
    report = Report(
        (
            ClaimReport(claims[0], "verified"),
            ClaimReport(claims[1], "failed", reason="hallucinated_citation"),
        ),
        ContextSet(),
    )
    return answer, claims, report


def encode(adapter: Adapter, events: Iterable[SSEEvent]) -> bytes:
    codec = adapter.stream_codec()
    return b"".join(codec.encode(e) for e in events)


def random_pieces(data: bytes, seed: int) -> list[bytes]:
    """`data` cut at random byte boundaries (seeded), single bytes and empty pieces included."""
    rng = random.Random(seed)
    cuts = sorted(rng.randrange(len(data) + 1) for _ in range(rng.randint(1, 40)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def decode(adapter: Adapter, pieces: Iterable[bytes]) -> list[SSEEvent]:
    decoder = adapter.stream_codec().decoder()
    events = [e for p in pieces for e in decoder.feed(p)]
    return [*events, *decoder.finish()]


def parse_events(case: Case, events: Iterable[SSEEvent]) -> Answer:
    parser = case.adapter.stream_parser(case.sample.route)
    for e in events:
        parser.feed(e)
    return parser.finish()


def event_text(event: SSEEvent) -> str:
    """Every field of an event a client could read."""
    return f"{event.event}\n{event.id}\n{event.data}"

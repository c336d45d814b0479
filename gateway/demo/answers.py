"""The demo's canned answers — good, partly hallucinated, fully hallucinated, stale — and the
deterministic rule that picks one for a question.

Selection looks only at the last user message, with any `<chunk>` tags removed, lower-cased:

1. an explicit kind keyword, checked in this order: "partial"/"partly" -> partial,
   "hallucinat…"/"made up"/"fake" -> hallucinated, "stale"/"outdated" -> stale,
   "good"/"correct" -> good;
2. otherwise the topic map: capacity, kWh, power, charging, efficiency, specs -> good;
   warranty, guarantee -> partial; install, stacking, off-grid -> hallucinated;
   firmware, cobalt, LFP, chemistry, cells -> stale;
3. otherwise good.

Keywords match at the start of a word ("charg" matches "charging").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from gateway.types import Chunk

from .documents import document

AnswerKind = Literal["good", "partial", "hallucinated", "stale"]
ANSWER_KINDS: Final[tuple[AnswerKind, ...]] = ("good", "partial", "hallucinated", "stale")


@dataclass(frozen=True, slots=True)
class CannedAnswer:
    """An answer text and the chunks the demo "retrieved" for it.

    `failing` lists, per sentence in order, the reason the gateway should give for it, or None
    for a sentence that verifies against `retrieved` (kept as documentation and test oracle).
    """

    kind: AnswerKind
    text: str
    retrieved: tuple[Chunk, ...]
    failing: tuple[str | None, ...]


def _chunks(*ids: str) -> tuple[Chunk, ...]:
    return tuple(document(i) for i in ids)


ANSWERS: Final[Mapping[AnswerKind, CannedAnswer]] = {
    "good": CannedAnswer(
        kind="good",
        text=(
            "The Kestrel K7 stores 13.5 kWh of usable energy and delivers up to 5 kW of "
            "continuous power [handbook:1]. "
            "A full charge from empty takes about 4 hours on a 240 V circuit [handbook:2]. "
            "Round-trip efficiency is 90% [handbook:3]. "
            'The handbook says the K7 is "designed for daily cycling" [handbook:2].'
        ),
        retrieved=_chunks("handbook:1", "handbook:2", "handbook:3"),
        failing=(None, None, None, None),
    ),
    "partial": CannedAnswer(
        kind="partial",
        text=(
            "The K7 warranty lasts 10 years [warranty:1]. "
            "It guarantees at least 80% of the original capacity at the end of that period "
            "[warranty:1]. "
            "The warranty is void unless a certified Kestrel installer installs the unit "
            "[warranty:2]. "
            "Commercial sites can extend the coverage to 15 years [warranty:3]."
        ),
        retrieved=_chunks("warranty:1", "warranty:2"),
        failing=(None, "number_mismatch", None, "hallucinated_citation"),
    ),
    "hallucinated": CannedAnswer(
        kind="hallucinated",
        text=(
            "You can install the K7 yourself in under 2 hours [install:4]. "
            "Up to 12 K7 units can be stacked in one installation [faq:1]. "
            'The K7 is "certified for off-grid use in every climate" [safety:1].'
        ),
        retrieved=_chunks("warranty:2", "faq:1", "safety:1"),
        failing=("hallucinated_citation", "number_mismatch", "quote_mismatch"),
    ),
    "stale": CannedAnswer(
        kind="stale",
        text=(
            "The K7 uses lithium iron phosphate (LFP) cells, which contain no cobalt "
            "[safety:1]. "
            "Firmware updates are delivered over the air every quarter [faq:1@4]."
        ),
        retrieved=_chunks("safety:1", "faq:1"),
        failing=(None, "stale_source"),
    ),
}

DEMO_QUESTIONS: Final[Mapping[str, AnswerKind]] = {
    "What is the usable capacity of the Kestrel K7 and how fast does it charge?": "good",
    "How long is the K7 warranty and what does it guarantee?": "partial",
    "Can I install and stack K7 units myself?": "hallucinated",
    "Does the K7 get firmware updates?": "stale",
}
"""Questions for the printed examples, and the kind of answer each one gets."""

_KIND_WORDS: Final[tuple[tuple[AnswerKind, tuple[str, ...]], ...]] = (
    ("partial", ("partial", "partly")),
    ("hallucinated", ("hallucinat", "made up", "fake")),
    ("stale", ("stale", "outdated")),
    ("good", ("good", "correct")),
)
_TOPIC_WORDS: Final[tuple[tuple[AnswerKind, tuple[str, ...]], ...]] = (
    ("good", ("capacity", "kwh", "power", "charg", "efficien", "spec")),
    ("partial", ("warrant", "guarantee")),
    ("hallucinated", ("install", "stack", "off-grid")),
    ("stale", ("firmware", "cobalt", "lfp", "chemistry", "cell")),
)
_CHUNK_TAG = re.compile(r"<chunk\b[^>]*>.*?</chunk>", re.DOTALL)


def _compile(
    rules: tuple[tuple[AnswerKind, tuple[str, ...]], ...],
) -> tuple[tuple[AnswerKind, re.Pattern[str]], ...]:
    return tuple(
        (kind, re.compile(r"\b(?:" + "|".join(re.escape(w) for w in words) + ")"))
        for kind, words in rules
    )


_KIND_RULES: Final = _compile(_KIND_WORDS)
_TOPIC_RULES: Final = _compile(_TOPIC_WORDS)


def choose_kind(question: str) -> AnswerKind:
    """The answer kind for a question (see the module docstring for the rule)."""
    text = _CHUNK_TAG.sub(" ", question).lower()
    for rules in (_KIND_RULES, _TOPIC_RULES):
        for kind, pattern in rules:
            if pattern.search(text):
                return kind
    return "good"


def choose(question: str) -> CannedAnswer:
    """The canned answer for a question."""
    return ANSWERS[choose_kind(question)]

"""number_mismatch: every number in a claim must appear, with equal value, in a cited source.

A number is an integer or decimal, with optional sign (only at a word start, so "2019-2021" is
two positive years), currency symbol, thousands separators ("1,200" == 1200), scale word
("3.2 million" == 3200000), percent ("80%", "80 percent") and unit ("62.5 kWh"). Values compare
exactly as decimals (sign included); percent-ness must agree; a known unit on both sides must
agree (a source number without a unit matches any unit). Years and dates are numbers too.
Numbers inside citation markers and list numbering are not part of the claim text checked.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from gateway.checks.base import ClaimFacts, FactsCheck
from gateway.types import CheckResult

__all__ = ["NumberMismatch", "Quantity", "numbers_in"]

_SCALES = {
    "thousand": Decimal(10) ** 3,
    "million": Decimal(10) ** 6,
    "mn": Decimal(10) ** 6,
    "billion": Decimal(10) ** 9,
    "bn": Decimal(10) ** 9,
    "trillion": Decimal(10) ** 12,
}
_UNITS_WORDS = """
    wh kwh mwh gwh twh w kw mw gw kv mv ma mah hz khz mhz ghz
    mm cm m km ft mi nm mg g kg lb lbs oz ml
    ms s sec min h hr hrs
    b kb mb gb tb pb kib mib gib tib
    °c °f
    """
_UNITS = frozenset(_UNITS_WORDS.split())

_NUMBER = re.compile(
    r"(?<![\w.,])"
    r"(?P<sign>(?<![^\s(\[{])[-−–])?"
    r"(?P<cur>[$€£¥])?\s?"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?![\d])"
    r"(?:\s?(?P<scale>thousand|million|billion|trillion|mn|bn)\b)?"
    r"(?:\s?(?P<pct>%|percent\b|per\s+cent\b)|\s?(?P<unit>°[CF]|[A-Za-z]{1,3}\b))?"
)

# (value, is_percent, unit or "")
Quantity = tuple[Decimal, bool, str]


_DIGIT = re.compile(r"\d")
_DIGITS = re.compile(r"\d+")
_CURRENCY = "$€£¥"
_SIGN = "-−–"


def _matches(text: str) -> list[re.Match[str]]:
    """`_NUMBER.finditer(text)`, trying the pattern only where a match can start.

    Its leading lookbehinds make a scan of every position slow. A match starts at a run of
    digits or at most four characters before it ([sign][currency][space][.]); inside a run
    the lookbehind fails, so each run is tried once. A start right after a word character,
    "." or "," fails that lookbehind (`\\w` is `str.isalnum()` or "_"), so it is skipped
    without calling the pattern."""
    out: list[re.Match[str]] = []
    pos = 0
    while True:
        run = _DIGITS.search(text, pos)
        if run is None:
            return out
        d = run.start()
        j = d
        if j > pos and text[j - 1] == ".":
            j -= 1
        if j > pos and text[j - 1].isspace():
            j -= 1
        if j > pos and text[j - 1] in _CURRENCY:
            j -= 1
        if j > pos and text[j - 1] in _SIGN:
            j -= 1
        for i in range(j, d + 1):
            if i:
                before = text[i - 1]
                if before.isalnum() or before in "_.,":
                    continue
            m = _NUMBER.match(text, i)
            if m is not None:
                out.append(m)
                pos = m.end()
                break
        else:
            pos = run.end()


def numbers_in(text: str) -> list[Quantity]:
    """The numbers of `text` as exact values with percent-ness and known unit."""
    out: list[Quantity] = []
    for m in _matches(text):
        sign, _, num, scale, pct, unit = m.groups()
        try:
            value = Decimal(num.replace(",", "") if "," in num else num)
        except InvalidOperation:  # pragma: no cover - the pattern only admits digits
            continue
        if sign:
            value = -value
        if scale:
            value *= _SCALES[scale.lower()]
        if unit:
            unit = unit.lower()
            if unit not in _UNITS:
                unit = ""
        else:
            unit = ""
        out.append((value.normalize(), pct is not None, unit))
    return out


def _found(q: Quantity, sources: list[frozenset[Quantity]]) -> bool:
    value, pct, unit = q
    for nums in sources:
        if q in nums or (value, pct, "") in nums:
            return True
        if not unit and any(v == value and p == pct for v, p, _ in nums):
            return True
    return False


_OK = CheckResult.ok("number_mismatch")


class NumberMismatch(FactsCheck):
    name = "number_mismatch"

    def check(self, facts: ClaimFacts) -> CheckResult:
        body = facts.body
        if _DIGIT.search(body) is None:
            return _OK
        wanted = numbers_in(body)
        if not wanted:
            return _OK
        indexed, textless = facts.sources()
        sources = [s.numbers for s in indexed]
        for q in wanted:
            if not _found(q, sources):
                if textless:
                    return CheckResult.fail(
                        self.name, "source_text_unavailable", "a cited chunk has no text"
                    )
                shown = f"{q[0]}{'%' if q[1] else ''}{' ' + q[2] if q[2] else ''}"
                return CheckResult.fail(
                    self.name, "number_mismatch", f"{shown} is in none of the cited sources"
                )
        return _OK

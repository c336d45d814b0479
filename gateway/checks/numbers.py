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
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

from gateway.checks.base import ClaimFacts, FactsCheck, SourceText
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

# `_NUMBER` from the first digit of its number on: what a scan finds without trying the
# pattern's lookbehinds at every position. The same alternatives, with the first digit in
# front (so the pattern starts with a character set, which a search skips to in C) and the
# optional space before the scale word, percent sign or unit taken possessively and once for
# both (none of those starts with a space, so no match is lost or changed). After the first
# digit, `pre` captures the character before it, if any (a lookbehind: it consumes nothing).
# `{d}` is \d, or [0-9] for ASCII text, where the two are the same.
_TAIL_PATTERN = (
    r"(?P<num>{d}(?:(?<=(?P<pre>.){d}))?"
    r"(?:{d}{{0,2}}(?:,{d}{{3}})+(?:\.{d}+)?|{d}*(?:\.{d}+)?))(?!{d})"
    r"(?:\s?+(?P<scale>thousand|million|billion|trillion|mn|bn)\b)?"
    r"(?:\s?+(?:(?P<pct>%|percent\b|per\s+cent\b)|(?P<unit>°[CF]|[A-Za-z]{{1,3}}\b)))?"
)
_TAIL = re.compile(_TAIL_PATTERN.format(d=r"\d"), re.DOTALL)
_TAIL_ASCII = re.compile(_TAIL_PATTERN.format(d="[0-9]"), re.DOTALL)

# (value, is_percent, unit or "")
Quantity = tuple[Decimal, bool, str]
# Exact arithmetic: the default context rounds to 28 significant digits, which would make two
# long numbers that differ only past the 28th digit compare equal (a wrong number passing).
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)

_CURRENCY = "$€£¥"
_SIGN = "-−–"


def numbers_in(text: str) -> list[Quantity]:
    """The numbers of `text` as exact values with percent-ness and known unit: those of the
    matches of `_NUMBER.finditer(text)`, in order.

    A scan finds each digit run that can begin a number, with its `_TAIL`. Before the run, a
    match may also take a sign, a currency symbol, a space and a "." (".5"); of those only
    the sign and the "." change the number, so a run with neither among the four characters
    before it is the tail of the leftmost match exactly when the character before it is no
    word character, "." or ",". In text without a sign, where no "." precedes a run, that
    decides every number (the usual text: one `findall`). Otherwise `_scan` tries `_NUMBER`
    where a sign or "." is near."""
    if "-" in text or "−" in text or "–" in text:
        return _scan(text)
    out: list[Quantity] = []
    memo = _UNSIGNED
    for g in (_TAIL_ASCII if text.isascii() else _TAIL).findall(text):
        pre = g[1]
        if pre and pre != " ":
            if pre.isalnum() or pre == "_" or pre == ",":
                continue  # no match starts at the run, and nothing that could precedes it
            if pre == ".":
                return _scan(text)
        q = memo.get(g)
        out.append(_unsigned(g) if q is None else q)
    return out


def _scan(text: str) -> list[Quantity]:
    """`numbers_in` for any text: where a sign or "." is near a digit run, `_leftmost` tries
    `_NUMBER` at each start a match can have, leftmost first, as `finditer` would. No match
    starts inside a tail after its first digit (every character there that could start one
    follows a digit, a letter or a space that the pattern's lookbehinds reject), so the scan
    resumes after the tail."""
    out: list[Quantity] = []
    signed = "-" in text or "−" in text or "–" in text
    last: re.Match[str] | None = None  # the last number's match
    for t in (_TAIL_ASCII if text.isascii() else _TAIL).finditer(text):
        d = t.start()
        if d:
            before = text[d - 1]
            if before.isalnum() or before == "_" or before == ",":
                continue  # no match starts at d, and no sign, currency, space or "." precedes
            if before == "." or (signed and _sign_near(text, d)):
                m = _leftmost(text, 0 if last is None else last.end(), d)
                if m is not None:
                    last = m
                    g = m.groups()
                    out.append(_quantity(g[0] is not None, g[2:]))
                continue
        last = t
        out.append(_quantity(False, t.group("num", "scale", "pct", "unit")))
    return out


def _sign_near(text: str, d: int) -> bool:
    """Whether a sign is among the four characters before `d`."""
    near = text[d - 4 if d > 4 else 0 : d]
    return "-" in near or "−" in near or "–" in near


def _leftmost(text: str, pos: int, d: int) -> re.Match[str] | None:
    """The `_NUMBER` match that `finditer` finds for the digit run at `d`, resuming at `pos`:
    it starts at most four characters before the run ([sign][currency][space][.])."""
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
            return m
    return None


# The value of a number from its groups (num, scale, pct, unit; None when unmatched),
# memoised per sign, since the same few numbers recur. Bounded: a full memo starts again, and
# a number of more than `_MEMO_DIGITS` characters is not kept.
_Groups = tuple[Any, ...]
_POSITIVE: dict[_Groups, Quantity] = {}
_NEGATIVE: dict[_Groups, Quantity] = {}
# The same for `findall` tuples of `_TAIL` (num, pre, scale, pct, unit; "" when unmatched).
_UNSIGNED: dict[tuple[str, ...], Quantity] = {}
_MAX_MEMO = 4096
_MEMO_DIGITS = 40


def _unsigned(g: tuple[str, ...]) -> Quantity:
    num, _, scale, pct, unit = g
    q = _quantity(False, (num, scale or None, pct or None, unit or None))
    if len(num) <= _MEMO_DIGITS:
        if len(_UNSIGNED) >= _MAX_MEMO:
            _UNSIGNED.clear()
        _UNSIGNED[g] = q
    return q


def _quantity(negative: bool, groups: _Groups) -> Quantity:
    memo = _NEGATIVE if negative else _POSITIVE
    q = memo.get(groups)
    if q is not None:
        return q
    num, scale, pct, unit = groups
    value = Decimal(num.replace(",", "") if "," in num else num)
    if negative:
        value = _EXACT.minus(value)
    if scale:
        value = _EXACT.multiply(value, _SCALES[scale.lower()])
    u = ""
    if unit:
        u = unit.lower()
        if u not in _UNITS:
            u = ""
    q = (value.normalize(_EXACT), pct is not None, u)
    if len(num) <= _MEMO_DIGITS:
        if len(memo) >= _MAX_MEMO:
            memo.clear()
        memo[groups] = q
    return q


def _found(q: Quantity, sources: list[SourceText]) -> bool:
    """Whether a cited source has `q` (see `SourceText.has_number`)."""
    return any(s.has_number(q) for s in sources)


_OK = CheckResult.ok("number_mismatch")


class NumberMismatch(FactsCheck):
    name = "number_mismatch"

    def check(self, facts: ClaimFacts) -> CheckResult:
        wanted = numbers_in(facts.body)
        if not wanted:
            return _OK
        sources, textless = facts.sources()
        if len(sources) == 1:
            has = sources[0].has_number
            for q in wanted:
                if not has(q):
                    return self._missing(q, textless)
        else:
            for q in wanted:
                if not _found(q, sources):
                    return self._missing(q, textless)
        return _OK

    def _missing(self, q: Quantity, textless: bool) -> CheckResult:
        if textless:
            return CheckResult.fail(
                self.name, "source_text_unavailable", "a cited chunk has no text"
            )
        shown = f"{q[0]}{'%' if q[1] else ''}{' ' + q[2] if q[2] else ''}"
        return CheckResult.fail(
            self.name, "number_mismatch", f"{shown} is in none of the cited sources"
        )

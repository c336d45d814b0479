"""number_mismatch: every number in a claim must appear, with equal value, in a cited source.

Numbers are read by value, the same way on both sides (claim and chunk, DESIGN §4):

* digits, with an optional sign (only at a word start, so "2019-2021" is two positive years),
  currency symbol, thousands separators ("1,200", "1 200" with a thin or narrow no-break
  space), decimals (".5"), leading zeros ("007" == 7);
* scientific notation: "1.2e4", "10e3" (== 10,000), "1.2×10^4", "1.2x10^4", "1.2 * 10**4",
  "1.2×10⁴", "10⁴", "10^-3"; a superscript after any other base is a footnote, not a power;
* number words: "twelve", "forty-two", "one hundred and five", "two thousand", "a dozen"
  (12), "three dozen" (36), "a million"; a bare "one" is a pronoun as often as a number
  ("one of them") and is read only inside a longer number ("twenty-one", "one million");
  ordinals ("third") are not numbers;
* a scale word ("3.2 million" == 3200000, "3 hundred", "5 dozen"), percent ("80%", "80 percent",
  "eighty per cent") and unit ("62.5 kWh"). Values compare exactly as decimals (sign included);
  percent-ness must agree; a known unit on both sides must agree (a number without a unit
  matches any unit). A decade ("1970s", "1970's", "1970 's") is the year, without a unit.
  Years and dates are numbers too.

A currency code written against its amount ("USD42"), or a fiscal period's prefix against its
number ("FY2024", "Q3"), does not hide it: the prefix is set apart.
Numbers are read as they may show: a character that renders as nothing or joins the one
before (U+200B, a soft hyphen, a combining mark, a control) splits neither a number nor a
number word, and the text split at it is read too (a renderer may show it or break the line
there); fullwidth forms and the Arabic percent and decimal signs read as ASCII ("４０％",
"١٢٫٥"); superscript digits at a word's start are digits ("⁴²"), a vulgar fraction ("¾") is
its two numbers, and digits under a bidi override must match both as written and as shown.

A bare citation number in brackets ("according to [1]", "[2, 3]", "[^4]") is not a number, in
any citation format; neither are numbers inside the claim's own citation markers (blanked by
`claim_body`) or its list label (dropped by the segmenter).
"""

from __future__ import annotations

import re
import unicodedata
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

from gateway.checks.base import ClaimFacts, FactsCheck, SourceText
from gateway.types import CheckResult

__all__ = ["NumberMismatch", "Quantity", "numbers_in"]

_SCALES = {
    "hundred": Decimal(10) ** 2,
    "thousand": Decimal(10) ** 3,
    "million": Decimal(10) ** 6,
    "mn": Decimal(10) ** 6,
    "billion": Decimal(10) ** 9,
    "bn": Decimal(10) ** 9,
    "trillion": Decimal(10) ** 12,
    "dozen": Decimal(12),
}
_UNITS_WORDS = """
    wh kwh mwh gwh twh w kw mw gw kv mv ma mah hz khz mhz ghz
    mm cm m km ft mi nm mg g kg lb lbs oz ml
    ms s sec min h hr hrs
    b kb mb gb tb pb kib mib gib tib
    °c °f
    """
_UNITS = frozenset(_UNITS_WORDS.split())

_SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
_SUPER = str.maketrans(_SUPERSCRIPTS + "⁻⁺", "0123456789-+")
_SCALE_WORDS = r"hundred|thousand|million|billion|trillion|mn|bn|dozen"
# What may follow a number (digits or words): a scale word, then percent or a unit (an "s"
# after a year is a decade, see `_digits`; "1970's" has none).
_TAIL = (
    rf"(?:\s?+(?P<scale>{_SCALE_WORDS})\b)?"
    r"(?:\s?+(?:(?P<pct>%|percent\b|per\s?cent\b)|(?P<unit>°[CF]|[A-Za-z]{1,3}\b)))?"
)
# A number from its first digit on (a search skips to a digit in C); what may stand before it
# (a sign, a currency symbol, a space, a "." of ".5") is read by `_number_at`.
_POWER = (  # the lookahead fails quickly after the usual number
    r"(?:(?=[\seE×x✕⨉*·^⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺])(?:[eE](?P<exp>[-+−]?\d{1,4})(?!\w)"
    r"|\s?[×x✕⨉*·]\s?10(?:(?:\^|\*\*)\(?(?P<pow>[-+−]?\d{1,4})\)?"
    r"|(?P<sup>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]{1,4}))"
    r"|\^\(?(?P<caret>[-+−]?\d{1,4})\)?"
    r"|(?P<sup10>[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]{1,4})"
    r"))?"
)
_NUMBER_PATTERN = (
    # The separated form only where a separator is near (a lookahead is cheaper than
    # trying that alternative's repeats on every number).
    r"(?P<num>\d{pre}(?:(?=\d{{0,2}}[,\u2009\u202f])\d{{0,2}}"
    r"(?:(?:,\d{{3}})+|(?:[\u2009\u202f]\d{{3}})+)(?:\.\d+)?"
    r"|\d*(?:\.\d+)?))"
    + (_POWER + r"(?!\d|[⁰¹²³⁴⁵⁶⁷⁸⁹])" + _TAIL).replace("{", "{{").replace("}", "}}")
)
_NUMBER = re.compile(_NUMBER_PATTERN.format(pre=""), re.DOTALL)
# The same without powers and with `pre`, the character before the first digit (a
# lookbehind: it consumes nothing), for `findall` on text where that character alone decides
# (`_digit_numbers`); and with [0-9] for ASCII text, where it is the same as \d and quicker.
_FAST = re.compile(
    _NUMBER_PATTERN.replace(
        _POWER.replace("{", "{{").replace("}", "}}"),
        # What may begin a power after the number: then `_scan` reads the text instead.
        r"(?:(?=(?P<power>[eE×x✕⨉*·^⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]|\s[×x✕⨉*·])))?",
    )
    .replace("(?!\\d|[⁰¹²³⁴⁵⁶⁷⁸⁹])", "(?!\\d)")  # a superscript after it is a power
    .format(pre=r"(?:(?<=(?P<pre>.)\d))?"),
    re.DOTALL,
)
_FAST_ASCII = re.compile(_FAST.pattern.replace(r"\d", "[0-9]"), re.DOTALL)
_SIGNS_NEAR = re.compile(r"[-−–]")
_CURRENCY = "$€£¥"
_SIGNS = "-−–"

_SMALL = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90,
}
_WORD_SCALES = {"hundred": 100, "dozen": 12, "thousand": 10**3, "million": 10**6,
                "billion": 10**9, "trillion": 10**12}
_W = "|".join(sorted([*_SMALL, *_WORD_SCALES], key=len, reverse=True))
_S = "|".join(sorted(_SMALL, key=len, reverse=True))
_BIG = "hundred|thousand|million|billion|trillion"
# A run of number words ("forty-two", "one hundred and five", "a dozen"): it starts with a
# number below a hundred, or "a"/"an" and a scale word ("3 million" is read as digits, so a
# scale word alone is not a number); "and" only after a scale word.
# Matched against the lowercased text.
_WORDS = re.compile(
    rf"(?<![\w-])(?P<sign>(?<![^\s(\[{{])(?:minus|negative)\s+)?"
    rf"(?P<words>(?:(?:an?\s+)(?:{_BIG}|dozen)|{_S})"
    rf"(?:(?:\s*-\s*|\s+|(?:(?<=hundred)|(?<=thousand)|(?<=million)|(?<=billion)"
    rf"|(?<=trillion))\s+and\s+)(?:{_W}))*)"
    rf"(?![\w-])" + _TAIL,
)
_WORD_SPLIT = re.compile(r"[\s-]+")
# "[1]", "[2, 3]", "[4-6]", "[^7]": citation numbers, whatever the policy's format.
_BARE_CITATION = re.compile(r"\[\^?\d+(?:\s*[,–-]\s*\^?\d+)*\]")
# Where one can start: a "[" followed by a digit or "^". A claim body keeps the brackets of its
# blanked markers ("[     ]"): for it this one search saves the substitution, which would scan
# the whole text and then make `_digit_numbers` read it from the start.
_BARE_START = re.compile(r"\[[\^\d]")
_DIGIT = re.compile(r"\d")
_LETTERS = re.compile(r"[a-z]+")
# ASCII text folded for the prechecks of `numbers_in`: letters lowercased, digits "0",
# everything else a space. A number word `_WORDS` can match is a whole token of it (\w on
# neither side), and the text has a digit exactly when it has a "0".
_ASCII_FOLD = bytes.maketrans(
    bytes(range(128)),
    bytes(
        c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 else 48 if 48 <= c <= 57 else 32
        for c in range(128)
    ),
)
_NUMBER_WORDS = frozenset([*_SMALL, "dozen", "hundred", "thousand", "million", "billion",
                           "trillion"])
_NUMBER_WORDS_ASCII = frozenset(w.encode() for w in _NUMBER_WORDS)
# The words a `_WORDS` match can start with, and the scale words "a"/"an" need after them
# (`_word_runs`).
_RUN_STARTS_ASCII = frozenset(w.encode() for w in [*_SMALL, "a", "an", "minus", "negative"])
_A_AN = frozenset([b"a", b"an"])
_SCALES_ASCII = frozenset([b"hundred", b"thousand", b"million", b"billion", b"trillion", b"dozen"])

# Characters a reader does not see as characters (`_as_read`): format characters (U+200B,
# U+00AD, U+2060, bidi controls, tags, ...), combining marks (U+034F, variation selectors) and
# controls other than whitespace; the Hangul fillers are letters that render as nothing.
# `_ODD` finds runs of candidates (neither word, whitespace nor printable ASCII) in C; their
# category decides in Python, so prose with curly quotes and dashes pays one search.
_ODD = re.compile(r"[^\w\s\x20-\x7e]+|[\u115f\u1160\u3164\uffa0]+")
_UNSEEN_CATEGORIES = frozenset({"Cf", "Mn", "Me", "Cc"})
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0")
# Characters read as the ASCII they stand for: the hyphens a number word may be written with
# ("forty\u2011two"), fullwidth forms of ASCII ("４２％", "３．５") and the Arabic percent,
# decimal and thousands signs ("٪", "٫", "٬").
_AS_ASCII = str.maketrans(
    {
        **{chr(0xFF01 + i): chr(0x21 + i) for i in range(94)},
        **{"\u2010": "-", "\u2011": "-", "٪": "%", "﹪": "%", "٫": ".", "٬": ","},
    }
)
_AS_ASCII_CHARS = re.compile("[\u2010\u2011\uff01-\uff5e٪﹪٫٬]")
# A bidi override shows the characters after it in reverse ("\u202e24" shows as "42"), up to
# its pop (U+202C) or the paragraph's end.
_OVERRIDDEN = re.compile("[\u202d\u202e][^\u202c\n\r\u2029]*")
_DIGIT_RUN = re.compile(r"\d[\d.,]*")
# Superscript digits at a word's start are a number as shown ("has ⁴² reactors"); after a
# word they are a footnote ("MB¹"), after a base of 10 a power (`_POWER`).
_LONE_SUPERSCRIPT = re.compile(rf"(?<![^\s(])[⁻⁺]?[{_SUPERSCRIPTS}]+")
# Vulgar fractions as their numerator and denominator ("¾" reads as 3 and 4, on both sides).
_FRACTIONS = "¼½¾⅐⅑⅒⅓⅔⅕⅖⅗⅘⅙⅚⅛⅜⅝⅞↉"
_FRACTION = re.compile(f"[{_FRACTIONS}]")


def _unseen(c: str) -> bool:
    return c in _FILLERS or unicodedata.category(c) in _UNSEEN_CATEGORIES


def _seen(m: re.Match[str]) -> str:
    return "".join(c for c in m.group() if not _unseen(c))


def _seen_split(m: re.Match[str]) -> str:
    return "".join(" " if _unseen(c) else c for c in m.group())


def _as_read(text: str) -> str:
    """`text` as a reader may see its numbers. Characters that render as nothing or join the
    one before split neither a number nor a number word (a zero-width space inside "42", a
    soft hyphen inside "forty"); since a renderer may also show them or break the line there,
    the text split at them is appended too. Unicode hyphens read as "-", fullwidth forms and
    the Arabic percent and decimal signs as their ASCII ("４０％" is 40%), superscript digits
    at a word's start as digits, a vulgar fraction as its two numbers. Under a bidi override
    the digits show in reverse: the overridden spans are appended with their digit runs
    reversed. Every number of every reading must then be in a source."""
    if text.isascii():  # only controls other than whitespace are unseen: read both ways
        if _ODD.search(text) is None:
            return text
        return _ODD.sub("", text) + "\n" + _ODD.sub(" ", text)
    overridden = [m.group() for m in _OVERRIDDEN.finditer(text)]
    if _ODD.search(text) is not None:
        # A renderer may show such a character (a box), or break the line at it (a soft
        # hyphen shows as "-"), or show nothing: the text is read both joined and split
        # there, so "4"+U+200B+"2" must be supported as 42 and as 4 and 2, and "has"+U+200B+
        # "42" still has the number 42 (joined, digits after letters are a word's).
        joined = _ODD.sub(_seen, text)
        if joined != text:
            split = _ODD.sub(_seen_split, text)
            text = joined if split == joined else joined + "\n" + split
    if _AS_ASCII_CHARS.search(text) is not None:
        text = text.translate(_AS_ASCII)
    if _LONE_SUPERSCRIPT.search(text) is not None:
        text = _LONE_SUPERSCRIPT.sub(lambda m: m.group().translate(_SUPER), text)
    if _FRACTION.search(text) is not None:
        text = _FRACTION.sub(lambda m: " " + unicodedata.normalize("NFKC", m.group()) + " ", text)
    for span in overridden:
        text += "\n" + _DIGIT_RUN.sub(lambda m: m.group()[::-1], _as_read(span[1:]))
    return text


# A currency code written against its amount ("USD42", "EUR1,200") or a fiscal period's prefix
# against its number ("FY2024", "Q3"): digits after letters are a word's ("A4", "H2O") and
# not read, so these are set apart from their digits first.
_PREFIXES = (
    "USD|EUR|GBP|JPY|CNY|RMB|INR|CHF|CAD|AUD|NZD|HKD|SGD|SEK|NOK|DKK|KRW|BRL|MXN|ZAR|RUB|TRY"
    "|PLN|FY|Q"
)
_CODE_GLUED = re.compile(rf"(?:{_PREFIXES})(?=\d)")


def _code_apart(m: re.Match[str]) -> str:
    s = m.string
    k = m.start()
    glued = k > 0 and (s[k - 1].isalnum() or s[k - 1] == "_")  # "XUSD4": a word's
    return m.group() if glued else m.group() + " "


# (value, is_percent, unit or "")
Quantity = tuple[Decimal, bool, str]
# Exact arithmetic: the default context rounds to 28 significant digits, which would make two
# long numbers that differ only past the 28th digit compare equal (a wrong number passing).
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)

# The value of a match from its groups, memoised (the same few numbers recur). Bounded: a
# full memo starts again, and a number of more than `_MEMO_DIGITS` characters is not kept.
_MEMO: dict[str, Quantity] = {}
_FAST_MEMO: dict[tuple[str, ...], Quantity] = {}
_MAX_MEMO = 4096
_MEMO_DIGITS = 40


def numbers_in(text: str) -> list[Quantity]:
    """The numbers of `text`: those written with digits, in order, then those in words."""
    ascii_text = text.isascii()
    if not ascii_text or not text.isprintable():
        text = _as_read(text)
        ascii_text = text.isascii()
    if "[" in text and _BARE_START.search(text):
        text = _BARE_CITATION.sub(" ", text)
    tokens: list[bytes] = []
    folded = b""
    if ascii_text:  # both prechecks from one pass in C
        folded = text.encode().translate(_ASCII_FOLD)
        first = folded.find(b"0")  # every number written with digits starts at a digit
        tokens = folded.split()
        words = not _NUMBER_WORDS_ASCII.isdisjoint(tokens)
    else:
        m = _DIGIT.search(text)
        first = -1 if m is None else m.start()
        words = not _NUMBER_WORDS.isdisjoint(_LETTERS.findall(text.lower()))
    if first < 0 and not words:
        return []
    out: list[Quantity] = []
    if first >= 0:
        out.extend(_digit_numbers(text, ascii_text, first))
    if words:
        lower = text.lower()
        runs = _word_runs(lower, folded, tokens) if ascii_text else _WORDS.finditer(lower)
        for m in runs:
            run = m.group("words")
            if run == "one":
                continue  # a pronoun as often as a number
            g = ("w", m.group("sign"), run, m.group("scale"), m.group("pct"), m.group("unit"))
            qs = _WORD_MEMO.get(g)
            if qs is None:
                qs = _words(g)
                if len(run) <= _MEMO_DIGITS:
                    if len(_WORD_MEMO) >= _MAX_MEMO:
                        _WORD_MEMO.clear()
                    _WORD_MEMO[g] = qs
            out.extend(qs)
    return out


def _word_runs(lower: str, folded: bytes, tokens: list[bytes]) -> list[re.Match[str]]:
    """`list(_WORDS.finditer(lower))` for ASCII text, `folded` and `tokens` being its fold
    (`_ASCII_FOLD`) and that fold's words. A match starts with a sign word, "a"/"an" or a
    number below a hundred, as a whole word: its lookbehind wants no word character or "-"
    before it, and what follows its first word is a space, a "-" or no word character; in the
    fold, that word stands between spaces (or an end). `finditer` tries the pattern at every
    position, which for prose with number words costs several times the rest of
    `numbers_in`; here it is tried only where such a word stands, left to right, past the end
    of the last match, which finds what `finditer` finds. "a"/"an" start a run only before a
    scale word ("a dozen"), so they are tried only in text that has one."""
    present = _RUN_STARTS_ASCII.intersection(tokens)
    if not present.isdisjoint(_A_AN) and _SCALES_ASCII.isdisjoint(tokens):
        present -= _A_AN
    padded = b" " + folded + b" "
    starts: list[int] = []
    for word in present:
        needle = b" " + word + b" "
        at = padded.find(needle)
        while at >= 0:
            starts.append(at)  # the word's offset in `folded` (and `lower`)
            at = padded.find(needle, at + len(word) + 1)
    starts.sort()
    out: list[re.Match[str]] = []
    end = 0
    match = _WORDS.match
    for start in starts:
        if start >= end:
            m = match(lower, start)
            if m is not None:
                end = m.end()
                out.append(m)
    return out


def _digit_numbers(text: str, ascii_text: bool, first: int = 0) -> list[Quantity]:
    """The numbers written with digits, in order. Only a sign or a "." before a digit run
    changes its value (a currency symbol or a space does not): in text without a sign, where
    no "." stands before a run, the character before each run decides it (one `findall`,
    from `first`, at or before the first digit: every match starts at a digit, and the
    pattern's lookbehind still reads the character before it)."""
    if "-" in text or "−" in text or "–" in text:
        return _scan(text)
    out: list[Quantity] = []
    memo = _FAST_MEMO
    glued = False
    for g in (_FAST_ASCII if ascii_text else _FAST).findall(text, first):
        if g[2]:
            return _scan(text)  # a power may follow (read, even inside a word, by `_scan`)
        pre = g[1]
        if pre and pre != " ":
            if pre.isalnum() or pre == "_" or pre == ",":
                glued = glued or pre.isalpha()
                continue  # inside a word or a number ("A4")
            if pre == ".":
                return _scan(text)
        q = memo.get(g)
        if q is None:
            num, _, _, scale, pct, unit = g
            q = _digits((num, None, None, None, None, None, scale or None, pct or None,
                         unit or None))
            if len(g[0]) <= _MEMO_DIGITS:
                if len(memo) >= _MAX_MEMO:
                    memo.clear()
                memo[g] = q
        out.append(q)
    if glued and (apart := _prefixes_apart(text)) is not None:
        return _digit_numbers(apart, ascii_text)
    return out


def _prefixes_apart(text: str) -> str | None:
    """`text` with every currency code or fiscal prefix set apart from the digits written
    against it (`_CODE_GLUED`); None when it has none."""
    if _CODE_GLUED.search(text) is None:
        return None
    apart = _CODE_GLUED.sub(_code_apart, text)
    return None if apart == text else apart  # "XUSD4": inside a word, nothing set apart


def _scan(text: str) -> list[Quantity]:
    """`_digit_numbers` for any text: each match's start is read by `_number_at`."""
    out: list[Quantity] = []
    memo = _MEMO
    glued = False
    for m in _NUMBER.finditer(text):
        d = m.start()
        negative = False
        if d:
            before = text[d - 1]
            if before.isalnum() or before == "_" or before == ",":
                glued = glued or before.isalpha()
                continue  # inside a word or a number ("A4", "v2.1.3")
            if before == "." or _SIGNS_NEAR.search(text, max(d - 4, 0), d):
                lead, negative = _number_at(text, d)
                if lead is None:
                    continue
                if lead:
                    g = m.groups()
                    num = g[0]
                    if "." in num or "," in num:  # ".1.2": the number is ".1"
                        digits = re.match(r"\d+", num)
                        assert digits is not None
                        out.append(_finish(Decimal("." + digits.group()), None, None, None))
                        continue
                    led = _digits((lead + num, *g[1:]))
                    out.append(_negate(led) if negative else led)
                    continue
        key = m.group()  # the value depends on the matched text only
        q = memo.get(key)
        if q is None:
            q = _remember(key, _digits(m.groups()))
        out.append(_negate(q) if negative else q)
    if glued and (apart := _prefixes_apart(text)) is not None:
        return _scan(apart)
    return out


def _number_at(text: str, d: int) -> tuple[str | None, bool]:
    """What stands before the digit run at `d`: None when it is part of something else (the
    ".3" of "2.1.3"), else "." for ".5" or "", and whether a sign makes it negative. A sign
    counts at a word start, before an optional currency symbol and one space."""
    lead = ""
    j = d
    if text[j - 1] == ".":
        if j >= 2 and (text[j - 2].isalnum() or text[j - 2] in "_.,"):
            return None, False
        lead = "."
        j -= 1
    if j and text[j - 1].isspace():
        j -= 1
    if j and text[j - 1] in _CURRENCY:
        j -= 1
    negative = bool(j) and text[j - 1] in _SIGNS and (
        j == 1 or text[j - 2].isspace() or text[j - 2] in "([{"
    )
    return lead, negative


def _negate(q: Quantity) -> Quantity:
    return (_EXACT.minus(q[0]), q[1], q[2])


_WORD_MEMO: dict[tuple[str | None, ...], list[Quantity]] = {}


def _remember(key: str, q: Quantity) -> Quantity:
    if len(key) <= _MEMO_DIGITS:
        if len(_MEMO) >= _MAX_MEMO:
            _MEMO.clear()
        _MEMO[key] = q
    return q


def _signed(text: str) -> str:
    return text.replace("−", "-")


def _digits(g: tuple[str | Any, ...]) -> Quantity:
    """The value of a `_NUMBER` match from its groups."""
    num, exp, pw, sup, caret, sup10, scale, pct, unit = g
    if unit is not None and len(num) == 4 and unit in ("s", "S") and num.isdigit():
        unit = None  # "1970s": a decade, not seconds
    assert num is not None
    value = Decimal(num.replace(",", "").replace("\u2009", "").replace("\u202f", ""))
    if exp is not None or pw is not None:  # m e p, m × 10^p
        value = value.scaleb(int(_signed(exp or pw or "")), _EXACT)
    elif sup is not None:  # m × 10 with a superscript power
        value = value.scaleb(int(sup.translate(_SUPER)), _EXACT)
    elif caret is not None:  # b^p
        p = int(_signed(caret))
        if num == "10":
            value = Decimal(1).scaleb(p, _EXACT)
        elif 0 < p <= 16 and len(num) <= 16:
            value = _EXACT.power(value, p)
        elif p == 0:
            value = Decimal(1)
    elif sup10 is not None and num == "10":  # 10⁴; after any other number, a footnote
        value = Decimal(1).scaleb(int(sup10.translate(_SUPER)), _EXACT)
    return _finish(value, scale, pct, unit)


def _words(g: tuple[str | None, ...]) -> list[Quantity]:
    """The numbers of a run of number words: "twenty one" is 21, "two three" is 2 and 3."""
    _, sign, run, scale, pct, unit = g
    assert run is not None
    values: list[int] = []
    total = current = 0
    room: int | None = None  # what can still be added to `current`; None: nothing started
    for w in _WORD_SPLIT.split(run):
        if w in ("a", "an", "and", ""):
            continue
        small = _SMALL.get(w)
        if small is not None:
            if room is not None and small >= room:
                values.append(total + current)
                total = current = 0
            current += small
            room = 10 if small >= 20 and room != 10 else 0
        elif w == "hundred":
            if room is not None and (current >= 100 or room == 100):
                values.append(total + current)
                total = current = 0
            current = (current or 1) * 100
            room = 100
        elif w == "dozen":
            current = (current or 1) * 12
            room = 0
        else:
            scale_value = _WORD_SCALES[w]
            total += (current or 1) * scale_value
            current = 0
            room = scale_value
    values.append(total + current)
    out: list[Quantity] = []
    for k, v in enumerate(values):
        value = Decimal(v)
        if sign and k == 0:
            value = _EXACT.minus(value)
        last = k == len(values) - 1
        out.append(_finish(value, scale if last else None, pct if last else None,
                           unit if last else None))
    return out


def _finish(value: Decimal, scale: str | None, pct: str | None, unit: str | None) -> Quantity:
    if scale:
        value = _EXACT.multiply(value, _SCALES[scale.lower()])
    u = ""
    if unit:
        u = unit.lower()
        if u not in _UNITS:
            u = ""
    return (value.normalize(_EXACT), pct is not None, u)


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

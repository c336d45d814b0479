"""number_mismatch: every number in a claim must appear, with equal value, in a cited source.

Numbers are read by value, the same way on both sides (claim and chunk, DESIGN §4):

* digits, with an optional sign (only at a word start, so "2019-2021" is two positive years;
  a figure dash, small, heavy or modifier minus is a "-"), currency symbol, thousands
  separators ("1,200"; "1 200" with a thin, narrow no-break, no-break or figure space, and
  "1'200", "1’200" with an apostrophe, between groups of three; a plain space is none: "In
  2021 500 units" is two numbers), decimals (".5"), leading
  zeros ("007" == 7); digits after a comma that are not a thousands group are a number of their
  own ("2021,2023"), and one or two of them after a plain number may be its decimals: "9,99"
  is 9 and 99, or 9.99 (a decimal comma). A number read several ways is an alternative: a
  claim needs one reading whole ("Sections 1,2" passes on 1 and 2, "9,99" on 9.99), a source
  has every reading. Two or more "." groups of three are thousands ("40.000.000"); one group
  after one to three digits (no leading 0) is thousands or decimals ("3.142": 3142 or 3.142),
  thousands only when it ends in 0 ("40.000" is 40000: its decimal reading would be a plain
  40, which any source may have, for a number much of Europe reads as forty thousand);
* scientific notation: "1.2e4", "10e3" (== 10,000), "1.2×10^4", "1.2x10^4", "1.2 * 10**4",
  "1.2×10⁴", "10⁴", "10^-3"; a superscript after any other base is a footnote, not a power;
* number words: "twelve", "forty-two", "one hundred and five", "two thousand", "a dozen"
  (12), "three dozen" (36), "a million"; a bare "one" is a pronoun as often as a number
  ("one of them") and is read only inside a longer number ("twenty-one", "one million");
  ordinals ("third") are not numbers;
* a scale word in any case, singular or plural, or its abbreviation ("3.2 million" ==
  3200000, "40 Million", "40 millions", "3 hundred", "5 dozen", "3tn", "40 mln", "40 bln",
  "$40 mil", "40 Mio.", "40 Mrd", "40 Millionen", "40 Milliarden", "40 lakh", "40 crore"), a
  scale letter ("40k", "40M", "40MM", "$40m", "$40 B", "$3T", "40 $M", "40 €bn"; after no
  currency symbol "40m", "40b", "40B", "40t", "40T", "40 K", "40 M" may be units and read both
  ways, so they never pass on the plain number), percent ("80%", "80 percent", "eighty per
  cent"; "4‰" and "4 per mille" are 0.4%, "4‱" 0.04%) and unit ("62.5 kWh"). Values compare
  exactly as decimals (sign included); percent-ness must agree; a known unit on both sides
  must agree (a number without a unit matches any unit). A decade ("1970s", "1970's",
  "1970 's") is the year, without a unit. Years and dates are numbers too.

A currency code written against its amount ("USD42"), or a fiscal period's prefix against its
number ("FY2024", "Q3"), does not hide it: the prefix is set apart.
Numbers are read as they may show: a character that renders as nothing or joins the one
before (U+200B, a soft hyphen, a combining mark, a control) splits neither a number nor a
number word, and the text split at it is read too (a renderer may show it or break the line
there); fullwidth forms and the Arabic percent and decimal signs read as ASCII ("４０％",
"١٢٫٥"); superscript digits at a word's start are digits ("⁴²"), a vulgar fraction ("¾") is
its two numbers, an enclosed number ("①", "⑳", "㊾", "⓵", "⒈", "⑴") its value, and digits
under a bidi override must match both as written and as shown. HTML character references
("&#x34;&#x33;", "4&frac12;") are read both as written and decoded; markup that renders as
nothing between two digits ("4**3**", "4<b>3</b>", "4<!-- -->3", "4`3`") is read both as
written (4 and 3) and removed (43). Subscript digits are digits ("₄₂"; "CO₂" is a word's), a
Roman numeral character its value ("Ⅻ" 12), "fourty" is forty, a number word written with
Cyrillic or Greek look-alike letters ("f\u043erty") the Latin word, and a look-alike of a digit
or separator next to digits ("4\u041e", "4\u0417", Lisu "4\ua4f83") is read both as written
and as the digit or separator it looks like (a small explicit table, `_AS_LATIN`, `_AS_DIGITS`).

A bare citation number in brackets ("according to [1]", "[2, 3]", "[^4]") is not a number, in
any citation format; neither are numbers inside the claim's own citation markers (blanked by
`claim_body`) or its list label (dropped by the segmenter).
"""

from __future__ import annotations

import re
import unicodedata
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal
from typing import Any

from gateway.checks.base import ClaimFacts, FactsCheck, SourceText, as_unescaped
from gateway.types import CheckResult

__all__ = ["NumberMismatch", "Quantity", "numbers_in"]

# Scale words and their abbreviations, singular and plural ("40 millions", "40 Mio.", "40 mln",
# "40 Mrd", "40 lakh", "40 crore"): each is its value, never the plain number before it.
_SCALES = {
    **dict.fromkeys(["hundred", "hundreds"], Decimal(10) ** 2),
    **dict.fromkeys(["thousand", "thousands"], Decimal(10) ** 3),
    **dict.fromkeys(["lakh", "lakhs"], Decimal(10) ** 5),
    **dict.fromkeys(["million", "millions", "millionen", "mn", "mln", "mio", "mil"],
                    Decimal(10) ** 6),
    **dict.fromkeys(["crore", "crores"], Decimal(10) ** 7),
    **dict.fromkeys(["billion", "billions", "milliard", "milliards", "milliarde", "milliarden",
                     "bn", "bln", "mrd"], Decimal(10) ** 9),
    **dict.fromkeys(["trillion", "trillions", "tn"], Decimal(10) ** 12),
    **dict.fromkeys(["dozen", "dozens"], Decimal(12)),
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
# In any case: "40 Million" is 40 million, "40BN" 40 billion (the lookahead spares the
# usual word after a number the slower case-insensitive try). Longest first.
_SCALE_WORDS = (
    r"(?=[hHtTmMbBdD]|[lL][aA]|[cC][rR])(?i:"
    + "|".join(sorted(_SCALES, key=lambda w: (-len(w), w)))
    + ")"
)
# What may follow a number (digits or words): a scale word, then percent (per mille and per
# ten thousand too, see `_finish`) or a unit, with the space before it (a letter against the
# digits may be a scale, see `_MONEY_SCALES`, and so may one after a currency symbol written
# after the digits, "40 $M"; an "s" after a year is a decade, see `_digits`; "1970's" has none).
_TAIL = (
    rf"(?:\s?+(?P<scale>{_SCALE_WORDS})\b)?"
    r"(?:\s?+(?P<pct>%|‰|‱|percent\b|per\s?cent\b|per\s?mil(?:le)?\b)"
    r"|(?P<unit>\s?+(?:°[CF]|[$€£¥]?[A-Za-z]{1,3}\b)))?"
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
    r"(?P<num>\d{pre}(?:(?=\d{{0,2}}[,\u2009\u202f\u00a0\u2007'\u2019\u02bc])\d{{0,2}}"
    r"(?:(?:,\d{{3}})+|(?:[\u2009\u202f\u00a0\u2007'\u2019\u02bc]\d{{3}})+)(?:\.\d+)?"
    # Two or more "." groups of three are thousands ("40.000.000"; `_digits` reads one).
    r"|(?=\d{{0,2}}\.\d{{3}}\.\d{{3}})\d{{0,2}}(?:\.\d{{3}})+"
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
# Thousands separators, dropped from a number's digits: the comma, and between groups of
# three the thin, narrow no-break, no-break and figure spaces and the apostrophes ("3 200",
# "3'200", "3’200"). A plain space is none: "In 2021 500 units" is a year and a count.
_UNGROUPED = str.maketrans(dict.fromkeys(",\u2009\u202f\u00a0\u2007'\u2019\u02bc"))
_SIGNS_NEAR = re.compile(r"[-−–]")
_CURRENCY = "$€£¥"
_SIGNS = "-−–"
_THOUSAND, _MILLION, _BILLION, _TRILLION = (Decimal(10) ** k for k in (3, 6, 9, 12))
# A letter after a number that may be a scale ("40k", "$40M", "$1.2b"): for each way it is
# written, its scale and whether it is only that (`_finish`). After a currency symbol each is
# a scale alone (money has no metres or bytes). Against digits without one, k/K and M/MM are
# scales; m, b/B and t/T are scales or units (metres, bytes, tonnes): read both ways, so such a
# claim needs both numbers in its source and never passes on the plain number alone. Written
# apart ("40 K"), k and the capitals K, M and T are read both ways too; "40 m", "40 b", "40 t"
# and "40 B" (bytes, and "44 B.C.") are units.
_MONEY_SCALES = {
    "k": _THOUSAND, "K": _THOUSAND, "m": _MILLION, "M": _MILLION, "mm": _MILLION,
    "MM": _MILLION, "b": _BILLION, "B": _BILLION, "t": _TRILLION, "T": _TRILLION,
}
_GLUED_SCALES = {
    "k": (_THOUSAND, True), "K": (_THOUSAND, True), "M": (_MILLION, True),
    "MM": (_MILLION, True), "m": (_MILLION, False), "b": (_BILLION, False),
    "B": (_BILLION, False), "t": (_TRILLION, False), "T": (_TRILLION, False),
}
_APART_SCALES = {
    "k": (_THOUSAND, False), "K": (_THOUSAND, False), "M": (_MILLION, False),
    "MM": (_MILLION, False), "T": (_TRILLION, False),
}
# Per mille and per ten thousand as the percent they are (4‰ is 0.4%): never a plain 4 or 4%.
# Keyed by the percent group's last character: "per mille" and "per mil" end in "e" and "l",
# "%", "percent" and "per cent" in neither.
_PER_MILLE = {"‰": Decimal("0.1"), "‱": Decimal("0.01"), "e": Decimal("0.1"),
              "l": Decimal("0.1")}

_SMALL = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90,
    "fourty": 40,  # a common misspelling, read as what its writer meant
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
# ("forty\u2011two"), the modifier apostrophe (a letter: "3\u02bc200" is "3'200"), the dashes
# written as a minus sign (a figure dash, the small and heavy minus, the modifier minus:
# "\u201240" is -40, as "-40" and "\u221240" are), fullwidth forms of ASCII ("４２％", "３．５")
# and the Arabic percent, decimal and thousands signs ("٪", "٫", "٬"), subscript digits ("₄₂";
# after a letter, "CO₂", they are a word's, as "CO2" is).
_MINUSES = "\u2012\ufe63\u2796\u02d7"
_AS_ASCII = str.maketrans(
    {
        **{chr(0xFF01 + i): chr(0x21 + i) for i in range(94)},
        **{"\u2010": "-", "\u2011": "-", "٪": "%", "﹪": "%", "٫": ".", "٬": ",", "\u02bc": "'"},
        **{chr(0x2080 + i): str(i) for i in range(10)}, "\u208a": "+", "\u208b": "-",
        **dict.fromkeys(_MINUSES, "-"),
    }
)
_AS_ASCII_CHARS = re.compile(f"[\u2010\u2011\uff01-\uff5e٪﹪٫٬\u02bc\u2080-\u208b{_MINUSES}]")
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
# Enclosed numbers, read as their value ("①" 1, "⑳" 20, "㊾" 49, "⓵" 1, "⒈" 1, "⑴" 1, "❿" 10):
# circled, parenthesized, with a full stop, double and negative circled, dingbat circled and
# the digit-with-comma forms; and the Roman numeral characters ("Ⅻ" 12, "ↀ" 1000; not the
# reversed C, U+2183-U+2184, which has no value). Not the enclosed letters (U+249C-U+24E9).
_ENCLOSED = re.compile(
    "[\u2460-\u249b\u24ea-\u24ff\u2776-\u2793\u3251-\u325f\u32b1-\u32bf"
    "\U0001f100-\U0001f10c\u2160-\u2182\u2185-\u2188]"
)


# Look-alikes, a small explicit table (not a confusables library). Cyrillic and Greek letters
# that look like Latin ones, so that "f\u043erty" (a Cyrillic о) reads as "forty"...
_AS_LATIN = str.maketrans(
    dict(
        zip(
            # Cyrillic small, Cyrillic capital, Greek small, Greek capital.
            "\u0430\u0435\u0456\u0458\u043e\u0440\u0441\u0443\u0445\u0455\u0501\u051b"
            "\u051d\u04bb\u04cf"
            "\u0410\u0412\u0415\u0406\u0408\u041a\u041c\u041d\u041e\u0420\u0421\u0422"
            "\u0423\u0425\u0405"
            "\u03b1\u03bf\u03bd\u03b9\u03ba\u03c1\u03c5"
            "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4"
            "\u03a5\u03a7",
            "aeijopcyxsdqwhlABEIJKMHOPCTYXSaovikpuABEZHIKMNOPTYX",
            strict=True,
        )
    )
)
_LOOK_LATIN = re.compile("[" + "".join(map(chr, _AS_LATIN)) + "]")
# ...and characters that look like digits or separators next to digits: the Latin, Cyrillic
# and Greek capital O and the Cyrillic small о as 0, the Cyrillic З as 3, the Lisu ꓸ and ꓹ as
# "." and ",". Next to a digit, such a character is read both as written and as the look-alike
# ("4\u041e" needs 4 and 40 in a source).
_AS_DIGITS = str.maketrans("O\u041e\u043e\u039f\u0417\ua4f8\ua4f9", "00003.,")
_DIGIT_LIKE = re.compile(
    "\\d[O\u041e\u043e\u039f\u0417\ua4f8\ua4f9]+|[O\u041e\u043e\u039f\u0417]+(?=\\d)"
)
_LATIN_O = re.compile(r"O(?:(?<=\dO)|(?=\d))")  # `_DIGIT_LIKE` in ASCII text, quicker


def _look_alikes(text: str) -> str:
    """`text` with its readings through look-alikes appended: the number words of Cyrillic or
    Greek look-alike letters as the Latin words (`_AS_LATIN`), and look-alike digits and
    separators next to digits as what they look like (`_AS_DIGITS`). Every number of every
    reading must then be in a source (a claim), or any supports one (a source)."""
    if not text.isascii() and _LOOK_LATIN.search(text) is not None:
        latin = text.translate(_AS_LATIN)
        if latin != text:
            text = text + "\n" + latin
    if _DIGIT_LIKE.search(text) is None:
        return text
    return text + "\n" + _DIGIT_LIKE.sub(_as_digits, text)


def _as_digits(m: re.Match[str]) -> str:
    return m.group().translate(_AS_DIGITS)


def _enclosed(m: re.Match[str]) -> str:
    return f" {int(unicodedata.numeric(m.group()))} "  # apart: "[①]" is no citation


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
    the text split at them is appended too. Unicode hyphens and the dashes written as a minus
    read as "-", fullwidth forms and the Arabic percent and decimal signs as their ASCII
    ("４０％" is 40%), superscript digits at a word's start as digits, a vulgar fraction as its
    two numbers, an enclosed number ("①", "㊾") as its value. Under a bidi override
    the digits show in reverse: the overridden spans are appended with their digit runs
    reversed. Every number of every reading must then be in a source."""
    if text.isascii():  # only controls other than whitespace are unseen: read both ways
        if _ODD.search(text) is None:
            return text
        return _ODD.sub("", text) + "\n" + _ODD.sub(" ", text)
    text = _look_alikes(text)
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
    if _ENCLOSED.search(text) is not None:
        text = _ENCLOSED.sub(_enclosed, text)
    for span in overridden:
        text += "\n" + _DIGIT_RUN.sub(lambda m: m.group()[::-1], _as_read(span[1:]))
    return text


# Markup between two digits that renders as nothing, so that "4**3**", "4<b>3</b>",
# "4<!-- -->3" or "4`3`" shows as 43: an HTML tag or comment (one without "<" inside), or a
# run of emphasis, strikethrough or code-span delimiters that the same run closes later on the
# line (unclosed, "10**4", it shows as written). A match is the digit before the markup and
# the markup; each piece is bounded (possessive runs, a tag or comment ends before the next
# "<", a closer is looked for up to the next same run), so the search stays linear.
_MARKUP = re.compile(
    r"\d(?:<!--[^<]*?-->|</?[A-Za-z][^<>]*>"
    r"|(?P<delim>\*{1,3}+|~{1,2}+|`{1,3}+)(?=[^\n]*?(?P=delim)))+(?=\d)",
    re.DOTALL,
)


def _unmarked(m: re.Match[str]) -> str:
    return m.group()[0]


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
# The readings of one written number, any one of which its writer may have meant.
Readings = tuple[tuple[Quantity, ...], ...]


class _Either(tuple[Quantity, ...]):
    """A number with several readings ("1,2": 1 and 2, or 1.2; "3.142": 3.142 or 3142). As a
    tuple it is every quantity of every reading: a source has all of them (it supports any
    reading), and code that does not look for `readings` needs all of them (fails closed)."""

    readings: Readings


def _either(readings: Readings) -> _Either:
    e = _Either(q for r in readings for q in r)
    e.readings = readings
    return e

# Exact arithmetic: the default context rounds to 28 significant digits, which would make two
# long numbers that differ only past the 28th digit compare equal (a wrong number passing).
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)

# The value of a match from its groups, memoised (the same few numbers recur). Bounded: a
# full memo starts again, and a number of more than `_MEMO_DIGITS` characters is not kept.
_MEMO: dict[str, tuple[Quantity, ...]] = {}
_FAST_MEMO: dict[tuple[str, ...], tuple[Quantity, ...]] = {}
_MAX_MEMO = 4096
_MEMO_DIGITS = 40


def numbers_in(text: str, choices: list[Readings] | None = None) -> list[Quantity]:
    """The numbers of `text`: those written with digits, in order, then those in words. A
    number with several readings (`_Either`) gives the quantities of all of them (a source
    supports each); with `choices` (a claim) it gives none, and its readings are appended to
    `choices` instead: the claim needs one of them whole."""
    if "&" in text and (shown := as_unescaped(text)) is not None:
        text = text + "\n" + shown  # a plain-text client shows the references as written
    if ("*" in text or "<" in text or "`" in text or "~" in text) and _MARKUP.search(text):
        text = text + "\n" + _MARKUP.sub(_unmarked, text)
    ascii_text = text.isascii()
    if ascii_text and "O" in text and _LATIN_O.search(text) is not None:
        text = _look_alikes(text)  # "4O" may show as 40
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
        out.extend(_digit_numbers(text, ascii_text, first, choices))
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


def _digit_numbers(
    text: str, ascii_text: bool, first: int = 0, choices: list[Readings] | None = None
) -> list[Quantity]:
    """The numbers written with digits, in order. Only a sign, a "." or a "," before a digit
    run changes what it reads as (a currency symbol only what a letter after it means, a space
    nothing): in text without a sign, where no "." or "," stands before a run, the character
    before each run decides it (one `findall`, from `first`, at or before the first digit:
    every match starts at a digit, and the pattern's lookbehind still reads the character
    before it). `choices`: see `numbers_in`."""
    if "-" in text or "−" in text or "–" in text:
        return _scan(text, choices)
    n = len(choices) if choices else 0  # a rescan drops the readings found here
    out: list[Quantity] = []
    memo = _FAST_MEMO
    glued = False
    for g in (_FAST_ASCII if ascii_text else _FAST).findall(text, first):
        if g[2]:  # a power may follow (read, even inside a word, by `_scan`)
            if choices:
                del choices[n:]
            return _scan(text, choices)
        pre = g[1]
        if pre and pre != " ":
            if pre.isalnum() or pre == "_":
                glued = glued or pre.isalpha()
                continue  # inside a word or a number ("A4")
            if pre == "." or pre == ",":
                if choices:
                    del choices[n:]
                return _scan(text, choices)
        qs = memo.get(g)
        if qs is None:
            num, _, _, scale, pct, unit = g
            qs = _digits(
                (num, None, None, None, None, None, scale or None, pct or None, unit or None),
                _money(pre) if unit else False,
            )
            if len(g[0]) <= _MEMO_DIGITS:
                if len(memo) >= _MAX_MEMO:
                    memo.clear()
                memo[g] = qs
        if choices is not None and type(qs) is _Either:
            choices.append(qs.readings)
        else:
            out.extend(qs)
    if glued and (apart := _prefixes_apart(text)) is not None:
        if choices:
            del choices[n:]
        return _digit_numbers(apart, ascii_text, 0, choices)
    return out


def _money(c: str) -> bool:
    """Whether `c`, just before a number's digits, is a currency symbol."""
    return unicodedata.category(c) == "Sc" if c > "\x7f" else c == "$"


def _prefixes_apart(text: str) -> str | None:
    """`text` with every currency code or fiscal prefix set apart from the digits written
    against it (`_CODE_GLUED`); None when it has none."""
    if _CODE_GLUED.search(text) is None:
        return None
    apart = _CODE_GLUED.sub(_code_apart, text)
    return None if apart == text else apart  # "XUSD4": inside a word, nothing set apart


def _scan(text: str, choices: list[Readings] | None = None) -> list[Quantity]:
    """`_digit_numbers` for any text: each match's start is read by `_number_at`. Digits after
    a "," that do not continue a number's thousands groups ("2021,2023", "9,99") are a number
    of their own; one or two of them after a plain number may also be its decimals (a decimal
    comma): "9,99" is 9 and 99, or 9.99 (`_Either`; without `choices` all three)."""
    n = len(choices) if choices else 0  # a rescan drops the readings found here
    out: list[Quantity] = []
    memo = _MEMO
    glued = False
    last_end = last_at = -1  # where the last number read by the common path ends, its index
    for m in _NUMBER.finditer(text):
        d = m.start()
        negative = False
        decimal: tuple[Quantity, ...] = ()
        money = False
        if d:
            before = text[d - 1]
            if before.isalnum() or before == "_":
                glued = glued or before.isalpha()
                continue  # inside a word or a number ("A4", "v2.1.3")
            if before == ",":
                decimal = _decimal_comma(text, m)
            money = _money(before)
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
                        out.extend(_finish(Decimal("." + digits.group()), None, None, None))
                        continue
                    led = _digits((lead + num, *g[1:]))
                    out.extend(_negate(led) if negative else led)
                    continue
        key = m.group()  # the value depends on the matched text (and a currency before it)
        if money and m.group("unit"):
            key = "$" + key
        qs = memo.get(key)
        if qs is None:
            qs = _remember(key, _digits(m.groups(), money))
        if negative:
            qs = _negate(qs)
        if choices is None:
            out.extend(qs)
            out.extend(decimal)
        elif decimal and last_end == d - 1:
            # The number before the comma and this one, or the decimal: either reading.
            choices.append(((*out[last_at:], *qs), decimal))
            del out[last_at:]
        elif type(qs) is _Either:
            choices.append(qs.readings)
        else:
            last_end, last_at = m.end(), len(out)
            out.extend(qs)
            out.extend(decimal)  # not after the last number read: both (fails closed)
    if glued and (apart := _prefixes_apart(text)) is not None:
        if choices:
            del choices[n:]
        return _scan(apart, choices)
    return out


def _decimal_comma(text: str, m: re.Match[str]) -> tuple[Quantity, ...]:
    """The value of the match `m`, just after a ",", read as the decimals of the number before
    the comma: only one or two digits (three are a thousands group), after a plain number at a
    word start ("9,99", "-2,5", "€9,5%"; not "1.5,25", "1,200,50" or "A4,5") and before no
    other ",digit" ("1,5,7" is a list)."""
    num = m.group("num")
    if len(num) > 2 or not num.isdecimal() or m.group(2, 3, 4, 5, 6) != (None,) * 5:
        return ()
    end = m.end("num")
    if text[end : end + 1] == "," and text[end + 1 : end + 2].isdecimal():
        return ()
    k = m.start() - 1  # the comma
    while k and text[k - 1].isdecimal():
        k -= 1
    if k == m.start() - 1:
        return ()  # no digits before the comma
    if k and (text[k - 1].isalnum() or text[k - 1] in "_.,"):
        return ()
    _, negative = _number_at(text, k) if k else ("", False)
    value = Decimal(text[k : m.start() - 1] + "." + num)
    qs = _finish(value, m.group("scale"), m.group("pct"), m.group("unit"),
                 bool(k) and _money(text[k - 1]))
    return _negate(qs) if negative else qs


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


def _negate(qs: tuple[Quantity, ...]) -> tuple[Quantity, ...]:
    if type(qs) is _Either:
        return _either(tuple(_negate(r) for r in qs.readings))
    return tuple((_EXACT.minus(q[0]), q[1], q[2]) for q in qs)


_WORD_MEMO: dict[tuple[str | None, ...], list[Quantity]] = {}


def _remember(key: str, qs: tuple[Quantity, ...]) -> tuple[Quantity, ...]:
    if len(key) <= _MEMO_DIGITS:
        if len(_MEMO) >= _MAX_MEMO:
            _MEMO.clear()
        _MEMO[key] = qs
    return qs


def _signed(text: str) -> str:
    return text.replace("−", "-")


def _digits(g: tuple[str | Any, ...], money: bool = False) -> tuple[Quantity, ...]:
    """The value of a `_NUMBER` match from its groups (`money`: after a currency symbol)."""
    num, exp, pw, sup, caret, sup10, scale, pct, unit = g
    if unit is not None and len(num) == 4 and unit.lstrip() in ("s", "S") and num.isdigit():
        unit = None  # "1970s": a decade, not seconds
    assert num is not None
    if "." in num:
        dot = num.index(".")
        if dot < len(num) - 4:  # "40.000.000": dot thousands (`_NUMBER` matches no other)
            num = num.replace(".", "")
        elif (
            dot == len(num) - 4 and dot <= 3 and num[0] != "0" and num[:dot].isdecimal()
            and exp is None and pw is None and sup is None and caret is None
        ):
            # "3.142": thousands or decimals. Written "40.000", the decimal reading would be a
            # plain 40 (any chunk's) for what much of Europe reads as forty thousand: three
            # decimals ending in 0 are read as thousands only.
            whole = Decimal(num[:dot] + num[dot + 1 :])
            if num[-1] == "0":
                return _finish(whole, scale, pct, unit, money)
            return _either(
                (_finish(Decimal(num), scale, pct, unit, money),
                 _finish(whole, scale, pct, unit, money))
            )
    value = Decimal(num if num.isdecimal() else num.translate(_UNGROUPED))
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
    return _finish(value, scale, pct, unit, money)


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
        out.extend(_finish(value, scale if last else None, pct if last else None,
                           unit if last else None))
    return out


def _finish(
    value: Decimal, scale: str | None, pct: str | None, unit: str | None, money: bool = False
) -> tuple[Quantity, ...]:
    """The quantities a number reads as, from its value and what follows it: one, or two when
    a letter after it may be a scale or a unit (`_GLUED_SCALES`)."""
    if scale:
        value = _EXACT.multiply(value, _SCALES[scale.lower()])
    if pct is not None and (per := _PER_MILLE.get(pct[-1])) is not None:
        value = _EXACT.multiply(value, per)
    u = ""
    if unit:
        letters = unit.lstrip()
        if letters[0] in _CURRENCY:  # "40 $M": a currency symbol before the scale letter
            letters = letters[1:]
            money = True
        if not scale:
            if money:
                by = _MONEY_SCALES.get(letters) or _SCALES.get(letters.lower())
                if by is not None:
                    return ((_EXACT.multiply(value, by).normalize(_EXACT), False, ""),)
            suffix = (_GLUED_SCALES if letters is unit else _APART_SCALES).get(letters)
            if suffix is not None:
                scaled = (_EXACT.multiply(value, suffix[0]).normalize(_EXACT), False, "")
                if suffix[1]:
                    return (scaled,)
                u = letters.lower()
                return ((value.normalize(_EXACT), False, u if u in _UNITS else ""), scaled)
        u = letters.lower()
        if u not in _UNITS:
            u = ""
    return ((value.normalize(_EXACT), pct is not None, u),)


def _found(q: Quantity, sources: list[SourceText]) -> bool:
    """Whether a cited source has `q` (see `SourceText.has_number`)."""
    return any(s.has_number(q) for s in sources)


_OK = CheckResult.ok("number_mismatch")


class NumberMismatch(FactsCheck):
    name = "number_mismatch"

    def check(self, facts: ClaimFacts) -> CheckResult:
        choices: list[Readings] = []
        wanted = numbers_in(facts.body, choices)
        if not wanted and not choices:
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
            has = lambda q: _found(q, sources)  # noqa: E731
        for readings in choices:  # a number read several ways: one reading, whole, will do
            if not any(all(map(has, r)) for r in readings):
                return self._missing(next(q for q in readings[0] if not has(q)), textless)
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

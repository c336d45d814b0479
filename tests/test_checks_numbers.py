import re
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.checks.numbers import NumberMismatch, numbers_in
from gateway.citations import CitationParser
from gateway.policy import Citations
from gateway.types import (
    CheckResult,
    Chunk,
    Citation,
    Claim,
    ContextSet,
    Document,
    NativeLocation,
    Status,
)

PARSER = CitationParser(Citations())
CHECK = NumberMismatch()
CTX = ContextSet()
CTX.extend(
    [
        Chunk(
            "a:1",
            "In 2021 the plant served 1200 homes; 62% were rural. The battery holds 62.5 kWh "
            "and cost $3,200,000. Temperatures fell to -5 degrees. Uptake was 80 percent.",
        ),
        Chunk("b:2", "Sales reached 3.2 million units, up 12.5%."),
        Chunk("n:1", None),
    ]
)


def claim(text: str, *extra: Citation) -> Claim:
    return Claim(0, 0, text, 0, len(text), (*PARSER.find(text), *extra))


@pytest.mark.parametrize(
    "text",
    [
        "It served 1,200 homes [a:1].",
        "It served 1200 homes in 2021 [a:1].",
        "62% were rural [a:1].",
        "The battery holds 62.5 kWh [a:1].",
        "The battery holds 62.50kWh [a:1].",
        "It cost $3.2 million [a:1].",
        "It fell to -5 degrees [a:1].",
        "Uptake was 80% [a:1].",
        "Sales were 3,200,000 units, up 12.5 percent [b:2].",
        "Both sources, 1200 homes and 3.2 million units [a:1][b:2].",
        "No numbers at all [a:1].",
        "Numbers only in markers [a:1].",
        "Version v2.1.3 is not a number claim [b:2].",
    ],
)
def test_numbers_found(text: str) -> None:
    assert CHECK.run(claim(text), CTX).status is Status.PASS


@pytest.mark.parametrize(
    "text",
    [
        "90% were rural [a:1].",
        "It served 1,300 homes [a:1].",
        "In 2022 it opened [a:1].",
        "62 homes were rural [a:1].",  # 62% in the source: percent-ness differs
        "The battery holds 62.5 km [a:1].",
        "It fell to 5 degrees below [b:2].",
        "It cost $3.3 million [a:1].",
        "It served 1200 homes [b:2].",
        "It served 1200 homes.",  # no cited source at all
    ],
)
def test_number_mismatch(text: str) -> None:
    assert CHECK.run(claim(text), CTX).reason == "number_mismatch"


def test_number_against_textless_chunk() -> None:
    assert CHECK.run(claim("It served 1200 homes [n:1]."), CTX).reason == (
        "source_text_unavailable"
    )
    assert CHECK.run(claim("No numbers [n:1]."), CTX).status is Status.PASS


NATIVE = ContextSet(
    documents=[
        Document(0, "text", "Sales reached 3.2 million units, up 12.5%."),
        Document(1, "content", blocks=("Sales grew.", " Up 12.5%.", " Costs fell 4%.")),
        Document(2, "pdf"),
        Document(3, "pdf", text="Page text: sales rose 12.5% in spring."),
    ],
    search_results=[Document(0, "search_result", blocks=("Costs fell 4%.", " Up 12.5%."))],
)


def _native(text: str, kind: str, cited: str, start: int, end: int, index: int = 0) -> Claim:
    where = {"search_result_index" if kind == "search_result_location" else "document_index":
             index}
    loc = NativeLocation(kind, cited, start=start, end=end, **where)  # type: ignore[arg-type]
    return Claim(0, 0, text, 0, len(text), (Citation("", "", native=loc),))


@pytest.mark.parametrize(
    ("kind", "cited", "start", "end", "index"),
    [
        ("char_location", "up 12.5%.", 33, 42, 0),
        ("content_block_location", "Up 12.5%.", 1, 2, 1),
        ("search_result_location", "Up 12.5%.", 1, 2, 0),
        ("page_location", "sales rose 12.5% in spring", 1, 2, 3),
    ],
)
def test_a_native_citation_is_read_in_the_cited_slice_of_its_document(
    kind: str, cited: str, start: int, end: int, index: int
) -> None:
    assert CHECK.run(_native("Sales rose 12.5%.", kind, cited, start, end, index), NATIVE).status \
        is Status.PASS


@pytest.mark.parametrize(
    ("kind", "cited", "start", "end", "index", "reason"),
    [
        # The upstream's own cited_text is no source: only the document's slice is.
        ("char_location", "Sales rose 99%.", 33, 42, 0, "number_mismatch"),
        ("char_location", "Sales rose 99%.", 0, 13, 0, "number_mismatch"),  # "Sales reached"
        ("content_block_location", "Sales rose 99%.", 1, 2, 1, "number_mismatch"),
        ("content_block_location", "Costs fell 99%.", 2, 3, 1, "number_mismatch"),
        ("search_result_location", "Sales rose 99%.", 0, 1, 0, "number_mismatch"),
        # A slice that cannot be resolved is a source without text.
        ("char_location", "Sales rose 99%.", 0, 999, 0, "source_text_unavailable"),
        ("char_location", "Sales rose 99%.", 0, 5, 9, "source_text_unavailable"),
        ("content_block_location", "Sales rose 99%.", 2, 9, 1, "source_text_unavailable"),
        ("page_location", "Sales rose 99%.", 1, 2, 2, "source_text_unavailable"),  # no pdf text
        ("page_location", "Sales rose 99%.", 1, 2, 3, "source_text_unavailable"),  # not in it
        ("page_location", "sales rose 12.5% in spring", 0, 2, 3, "source_text_unavailable"),
    ],
)
def test_a_native_citation_s_own_cited_text_supports_no_number(
    kind: str, cited: str, start: int, end: int, index: int, reason: str
) -> None:
    result = CHECK.run(_native("Sales rose 99%.", kind, cited, start, end, index), NATIVE)
    assert result.reason == reason


def test_numbers_in() -> None:
    assert numbers_in("1,200 and 80% and 2019-2021") == [
        (Decimal(1200), False, ""),
        (Decimal(80), True, ""),
        (Decimal(2019), False, ""),
        (Decimal(2021), False, ""),
    ]
    assert numbers_in("(−3%)") == [(Decimal(-3), True, "")]
    assert numbers_in("v2.1.3 A4") == []


def test_shared_pass_result() -> None:
    # Passing claims share one result value (the verifier reads its status, not its identity).
    ok = CHECK.run(claim("It served 1200 homes [a:1]."), CTX)
    assert ok is CHECK.run(claim("No numbers [a:1]."), CTX)
    assert ok == CheckResult.ok("number_mismatch")


def test_value_memo_is_bounded_and_keeps_no_long_numbers() -> None:
    from gateway.checks import numbers

    for k in range(numbers._MAX_MEMO + 10):
        assert numbers_in(f"{k} and -{k}%") == [(Decimal(k), False, ""), (Decimal(-k), True, "")]
    assert len(numbers._MEMO) <= numbers._MAX_MEMO
    long = "9" * 100
    assert numbers_in(f"about {long} items") == [(Decimal(long), False, "")]
    assert all(len(key) <= numbers._MEMO_DIGITS for key in numbers._MEMO)


@pytest.mark.parametrize(
    ("source", "text"),
    [
        # Differ only in the 32nd significant digit: the default decimal context (28 digits)
        # rounded both to the same value and passed the wrong number.
        ("The id is 12345678901234567890123456789012.",
         "The id is 12345678901234567890123456789013"),
        ("Reserves were 1234567890123456789012345678.91 billion.",
         "Reserves were 1234567890123456789012345678.92 billion"),
        ("The balance was -98765432109876543210987654321.5 units.",
         "The balance was -98765432109876543210987654321.4 units"),
    ],
)
def test_long_numbers_are_compared_exactly(source: str, text: str) -> None:
    ctx = ContextSet()
    ctx.add(Chunk("l:1", source))
    wrong = claim(text + " [l:1].")
    assert CHECK.run(wrong, ctx).status is Status.FAIL
    right = claim(source.rstrip(".") + " [l:1].")
    assert CHECK.run(right, ctx).status is Status.PASS


# -- numbers by value, in every written form (DESIGN §4) ---------------------------------------


def _check(claim_text: str, chunk_text: str) -> CheckResult:
    ctx = ContextSet()
    ctx.add(Chunk("s:1", chunk_text))
    return CHECK.run(claim(claim_text + " [s:1]."), ctx)


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("The band released six albums", "The band released 6 albums."),
        ("The band released 6 albums", "The band released six albums."),
        ("It has forty-two rooms", "It has 42 rooms."),
        ("It has 42 rooms", "It has forty two rooms."),
        ("It cost twelve million dollars", "It cost $12,000,000."),
        ("It cost 3 million dollars", "It cost three million dollars."),
        ("One hundred and five people came", "105 people came."),
        ("A dozen eggs", "12 eggs were laid."),
        ("Eighty percent agreed", "80% agreed."),
        ("It holds 1.2×10^4 litres", "It holds 12,000 litres."),
        ("It holds 1.2x10^4 litres", "It holds 12000 litres."),
        ("It holds 1.2 × 10⁴ litres", "It holds 1.2e4 litres."),
        ("It holds 10e3 litres", "It holds 10,000 litres."),
        ("It holds 10⁴ litres", "It holds 10^4 litres."),
        ("It weighs 0.001 kg", "It weighs 10^-3 kg."),
        ("Agent 007 left", "Agent 7 left."),
        ("Agent 7 left", "Agent 007 left."),
        ("It began in the 1970s", "It began in the 1970 's."),
        ("It began in the 1970 's", "It began in the 1970s."),
        ("It serves 1\u202f200 homes", "It serves 1,200 homes."),
        ("According to [1], it serves 1,200 homes", "It serves 1,200 homes."),
        ("It serves 1,200 homes [2] [^3]", "It serves 1,200 homes."),
        ("One of the engineers agreed", "An engineer agreed."),
        ("In 2019² it opened", "In 2019 it opened."),  # a footnote mark, not a square
    ],
)
def test_equal_values_pass(text: str, chunk: str) -> None:
    assert _check(text, chunk).status is Status.PASS


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("The band released seven albums", "The band released 6 albums."),
        ("It has forty-two rooms", "It has 41 rooms."),
        ("It has twenty one rooms", "It has 20 rooms and 1 hall."),
        ("It cost twelve million dollars", "It cost $12,000."),
        ("A dozen eggs", "10 eggs were laid."),
        ("Seventy percent agreed", "80% agreed."),
        ("It holds 1.2e5 litres", "It holds 1.2e4 litres."),
        ("It holds 10⁷ litres", "It holds 10⁴ litres."),
        ("It holds 1.2×10^9 litres", "It holds 1.2 litres."),
        ("It weighs 10^-2 kg", "It weighs 10^-3 kg."),
        ("Agent 008 left", "Agent 007 left."),
        ("Two stations opened", "Both stations opened."),
    ],
)
def test_different_values_fail(text: str, chunk: str) -> None:
    assert _check(text, chunk).reason == "number_mismatch"


def test_numbers_in_forms() -> None:
    assert numbers_in("forty-two, 1.2e4 and 10⁴ [1]") == [
        (Decimal(12000), False, ""),
        (Decimal(10000), False, ""),
        (Decimal(42), False, ""),
    ]
    assert numbers_in("two and three, twenty one, a million") == [
        (Decimal(2), False, ""),
        (Decimal(3), False, ""),
        (Decimal(21), False, ""),
        (Decimal(10**6), False, ""),
    ]
    assert numbers_in("someone often said one thing; thousands came") == []


_ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _in_words(n: int, sep: str) -> str:
    """0 < n < 1,000,000 in English words."""
    def below_thousand(k: int) -> str:
        parts = []
        if k >= 100:
            parts.append(f"{_ONES[k // 100]} hundred")
            k %= 100
            if k:
                parts.append("and")
        if k >= 20:
            parts.append(_TENS[k // 10] + (sep + _ONES[k % 10] if k % 10 else ""))
        elif k:
            parts.append(_ONES[k])
        return " ".join(parts)

    if n >= 1000:
        rest = below_thousand(n % 1000)
        return f"{below_thousand(n // 1000)} thousand" + (f" {rest}" if rest else "")
    return below_thousand(n)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 999_999),
    st.sampled_from(["-", " "]),
    st.sampled_from(["{:d}", "{:,d}", "00{:d}", "{}e0", "{}×10^0"]),
    st.booleans(),
)
def test_a_number_in_words_equals_its_digits(n: int, sep: str, fmt: str, flip: bool) -> None:
    words = _in_words(n, sep)
    digits = fmt.format(n)
    a, b = (words, digits) if flip else (digits, words)
    assert _check(f"The count was {a} in total", f"The count was {b} in total.").status is (
        Status.PASS
    ), (a, b)
    assert _check(f"The count was {a} in total", f"The count was {n + 1} in total.").reason == (
        "number_mismatch"
    )


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_numbers_in_never_raises(text: str) -> None:
    for v, _, _ in numbers_in(text):
        assert v.is_finite()


_NUMBERISH = st.lists(
    st.sampled_from(
        [*"0123456789.,-$€ %kWhmsx×*^e()[{\t\n_v²⁴⁻", "1 200", "٣", "°C", "per cent", "bn",
         "1970s", "1970 's", " 10^4", "1.2e4", "10⁴", "×10^3", "é", "[1]", "[^2]", "million",
         "USD", "Q", "FY", "xEUR", "k", "K", "M", "MM", "B", "T", "tn", "Mn", ",5", "1,2345",
         "‒", "‰", "①", "£", ".000", "40.000", "1.234.567", "3.142", "mln", "Mio.", "lakh",
         " per mille", "$M", "millions"]
    ),
    max_size=16,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(_NUMBERISH)
def test_the_quick_scan_equals_the_full_scan(text: str) -> None:
    # Text without a sign, a "." before a digit or a power is read by one `findall`; it must
    # read what the match-by-match scan reads.
    from gateway.checks import numbers

    full = numbers._scan(text)
    assert numbers._digit_numbers(text, text.isascii()) == full
    # `numbers_in` starts the findall at the first digit (the character before it is still
    # read by the pattern's lookbehind): the same numbers.
    m = re.search(r"\d", text)
    first = m.start() if m else len(text)
    assert numbers._digit_numbers(text, text.isascii(), first) == full
    # With `choices` (a claim) too: the same numbers and the same readings.
    full_choices: list[numbers.Readings] = []
    full = numbers._scan(text, full_choices)
    quick_choices: list[numbers.Readings] = []
    assert numbers._digit_numbers(text, text.isascii(), first, quick_choices) == full
    assert quick_choices == full_choices


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # A claim body keeps the brackets of its blanked markers: no bare citation there.
        ("It grew 5% [     ].", [(Decimal(5), True, "")]),
        ("It grew 5% [     ] as [2] says.", [(Decimal(5), True, "")]),
        ("It grew 5% [     ] as [^3] says.", [(Decimal(5), True, "")]),
        ("It grew 5% [ 7] [x] [a2].", [(Decimal(5), True, ""), (Decimal(7), False, "")]),
        ("[٣] It grew 5%.", [(Decimal(5), True, "")]),  # a Unicode digit is \d too
        ("[[1]] 8", [(Decimal(8), False, "")]),
    ],
)
def test_bare_citations_after_blanked_markers(text: str, want: list[object]) -> None:
    assert numbers_in(text) == want


@settings(max_examples=300, deadline=None)
@given(_NUMBERISH)
def test_bare_citation_precheck_never_misses_one(text: str) -> None:
    # The precheck only decides whether the substitution can change the text.
    from gateway.checks import numbers

    if numbers._BARE_CITATION.search(text):
        assert numbers._BARE_START.search(text)


def _word_runs(text: str) -> list[object]:
    """The number-word matches `numbers_in` reads: `_word_runs` on ASCII text."""
    from gateway.checks import numbers

    text = text.encode("ascii", "replace").decode()  # the fast path is ASCII text's
    folded = text.encode().translate(numbers._ASCII_FOLD)
    runs = numbers._word_runs(text.lower(), folded, folded.split())
    return [(m.span(), m.groupdict()) for m in runs]


def _finditer(text: str) -> list[object]:
    from gateway.checks import numbers

    text = text.encode("ascii", "replace").decode()
    return [(m.span(), m.groupdict()) for m in numbers._WORDS.finditer(text.lower())]


_WORDISH = st.lists(
    st.sampled_from(
        [" ", "  ", "-", " - ", "\n", ",", ".", "(", "[", "{", '"', "_", "é", "İ", "K", "2",
         "%", " percent", " km", "a", "an", "A", "and", "minus", "negative", "Minus", "one",
         "Forty", "two", "seven", "seventeen", "ninety", "hundred", "thousand", "million",
         "dozen", "someone", "tone", "twos", "x"]
    ),
    max_size=24,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_WORDISH)
def test_word_runs_are_the_matches_finditer_finds(text: str) -> None:
    # `_word_runs` tries the number-word pattern only where a word it can start with stands;
    # it must find exactly the matches (spans and groups) of trying it everywhere.
    assert _word_runs(text) == _finditer(text)


_PROSE = (
    "After Alam Ara (1931), the first Indian talkie film, for many years singers made dual "
    "recordings for a film, one during the shoot, and later in the recording studio. Films "
    "typically include six or seven songs; two of the best-known singers recorded over a "
    "thousand of them. A dozen and forty-two minus one hundred and five people, an hundred, "
    "a million, negative three percent, Twenty-One km, someone's tone; (minus two) [ninety]."
)


def test_word_runs_equal_finditer_on_prose_and_the_fixtures() -> None:
    fixtures = Path(__file__).resolve().parent / "fixtures"
    texts = [_PROSE, *(p.read_text(errors="replace") for p in sorted(fixtures.rglob("*.*")))]
    assert len(texts) > 30
    for text in texts:
        assert _word_runs(text) == _finditer(text)
    assert len(_word_runs(_PROSE)) >= 10


# -- numbers as shown ------------------------------------------------------------------------

# Characters that render as nothing or join the one before: format characters (zero-width,
# soft hyphen, word joiner, invisible operators, tags), combining marks (grapheme joiner,
# variation selector, an accent), a control, a Hangul filler. None may split what a reader
# sees as one number or one number word.
_UNSEEN = [
    "\u200b", "\u200c", "\u200d", "\u2060", "\u2062", "\ufeff", "\u00ad", "\u180e",
    "\u034f", "\ufe0f", "\u0301", "\U000e0041", "\x00", "\x7f", "\u3164",
]


def _n(*values: int) -> set[object]:
    return {(Decimal(v), False, "") for v in values}


@pytest.mark.parametrize("c", _UNSEEN, ids=[f"U+{ord(c):04X}" for c in _UNSEEN])
def test_an_unseen_character_is_read_joined_and_split(c: str) -> None:
    # Shown as nothing it joins what it stands between; shown as a box or a line break it
    # splits it: a number must be supported either way.
    assert set(numbers_in(f"It has 4{c}2 rooms.")) == _n(42, 4, 2)
    assert set(numbers_in(f"It has fo{c}rty-two rooms.")) == _n(42)
    assert set(numbers_in(f"It has forty-{c}two rooms.")) == _n(42)
    assert set(numbers_in(f"It cost $3,{c}200.")) == _n(3200, 3, 200)
    # Joined to a word the digits are the word's ("has42"); split they are a number.
    assert set(numbers_in(f"It has{c}42 rooms.")) == _n(42)


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        # What the reader sees is 4242 rooms, 45 rooms, 90 litres, 2 and 1/2 hours.
        ("It has 42\u200b42 rooms", "It has 42 rooms."),
        ("It has fo\u00adrty-five rooms", "It has 40 rooms and 5 halls."),
        ("It has ni\u200bnety rooms", "It has 10 rooms."),
        ("It moves ⁹⁰ litres", "It moves 9 litres."),
        ("It took 2½ hours", "It took 2 hours."),
        # Under a bidi override "40" shows as "04": both readings must be in the source.
        ("It has \u202e40\u202c rooms", "It has 40 rooms."),
        ("It has \u202d40\u202c rooms", "It has 40 rooms."),
        ("It has 4\u200b2 rooms", "It has 42 rooms."),  # split: 4 and 2
        ("It has\u200b42 rooms", "It has 7 rooms."),  # split: has 42
        ("It costs USD420", "It costs USD42."),  # a currency code against its amount
        ("Revenue rose in FY2024", "Revenue rose in FY2023."),  # a fiscal year
        ("It rose 40％", "It rose 40 litres."),  # a fullwidth percent sign is a percent
        ("It rose 40٪", "It rose 40 litres."),  # so is the Arabic one
        ("It holds ３．６ kWh", "It holds 3.5 kWh."),
        ("It costs ＵＳＤ９０", "It costs USD42."),
        ("Revenue rose in Q4", "Revenue rose in Q3."),  # a quarter
        ("In 2021 it had \u202e12 rooms", "In 2021 it had 12 rooms."),  # to the line's end
    ],
)
def test_numbers_are_read_as_shown(text: str, chunk: str) -> None:
    assert _check(text, chunk).reason == "number_mismatch"


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("It has 4\u200b2 rooms", "It has 42 rooms, 4 halls and 2 wings."),
        ("It has for\u00adty rooms", "It has 40 rooms."),  # split: "for ty", no number
        ("It costs USD42", "It costs $42."),
        ("It rose ４０％", "It rose 40%."),
        ("It holds ３．５ kWh", "It holds 3.5 kWh."),  # a fullwidth full stop as decimal point
        ("It holds ١٢٫٥ kWh", "It holds 12.5 kWh."),  # the Arabic decimal separator
        ("It costs ＵＳＤ４２", "It costs $42."),
        ("Revenue rose in Q3 FY24", "Revenue rose in the third quarter (Q3) of FY24."),
        ("The H2O and A4 sizes", "Water comes in A3 sizes."),  # a word's digits: not numbers
        ("It has forty\u2011two rooms", "It has 42 rooms."),  # a non-breaking hyphen
        ("It has forty\u2010two rooms", "It has forty\u200b-two rooms."),
        ("It has ⁴² rooms", "It has 42 rooms."),
        ("It took ¾ of the time", "It took ¾ of the time."),
        ("It has \u202e44\u202c rooms", "It has 44 rooms."),  # the same both ways
        # Only the overridden span shows reversed (up to its pop, U+202C).
        ("In 2021 it had \u202e44\u202c rooms and 12 halls", "In 2021: 44 rooms, 12 halls."),
        ("Its size is 64 MB¹", "Its size is 64 MB."),  # a footnote after a word
        ("It holds 10⁴ litres", "It holds 10,000 litres."),  # a power after 10
    ],
)
def test_numbers_read_as_shown_still_match(text: str, chunk: str) -> None:
    assert _check(text, chunk).status is Status.PASS


_PLAIN = st.lists(
    st.sampled_from(
        [*"0123456789.,-$ %kWhx×^e()[]\t\n", "1 200", "forty", "-two", " million", "[1]", "[^2]",
         " percent", "1970s", "1.2e4", "seven", " and "]
    ),
    max_size=16,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(_PLAIN, st.lists(st.tuples(st.integers(0, 200), st.sampled_from(_UNSEEN)), max_size=4))
def test_unseen_characters_anywhere_lose_no_number(
    text: str, inserts: list[tuple[int, str]]
) -> None:
    marked = text
    for at, c in sorted(inserts, reverse=True):
        at = min(at, len(marked))
        marked = marked[:at] + c + marked[at:]
    # Joined, the text reads as before; split, it may read more numbers, never fewer.
    assert set(numbers_in(text)) <= set(numbers_in(marked))


# -- scale suffixes, digits after a comma, other minus signs, enclosed numbers, per mille -----


def _q(value: str, pct: bool = False, unit: str = "") -> tuple[Decimal, bool, str]:
    return (Decimal(value).normalize(), pct, unit)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # A scale suffix against digits is the scaled value, as "40 thousand" is.
        ("40k", [_q("40e3")]),
        ("40K", [_q("40e3")]),
        ("40M", [_q("40e6")]),
        ("40MM", [_q("40e6")]),
        ("40mn", [_q("40e6")]),
        ("40Mn", [_q("40e6")]),
        ("40 Million", [_q("40e6")]),
        ("40bn", [_q("40e9")]),
        ("40BN", [_q("40e9")]),
        ("3tn", [_q("3e12")]),
        # After a currency symbol m, b and t are scales too, written against or one space on.
        ("$40M", [_q("40e6")]),
        ("$40m", [_q("40e6")]),
        ("£40 m", [_q("40e6")]),
        ("$40mm", [_q("40e6")]),
        ("$40B", [_q("40e9")]),
        ("€40b", [_q("40e9")]),
        ("$1.2bn", [_q("1.2e9")]),
        ("$3T", [_q("3e12")]),
        ("$3 tn", [_q("3e12")]),
        ("$40k", [_q("40e3")]),
        # Without one they may be units (metres, bytes, tonnes): both readings, so such a
        # claim needs both and never passes on the plain number alone.
        ("40m", [_q("40", unit="m"), _q("40e6")]),
        ("40B", [_q("40", unit="b"), _q("40e9")]),
        ("40b", [_q("40", unit="b"), _q("40e9")]),
        ("40T", [_q("40"), _q("40e12")]),
        ("40t", [_q("40"), _q("40e12")]),
        # Apart, k and the capitals K, M, T are read both ways; B is bytes ("44 B.C.").
        ("40 K", [_q("40"), _q("40e3")]),
        ("40 M", [_q("40", unit="m"), _q("40e6")]),
        ("40 T", [_q("40"), _q("40e12")]),
        ("44 B.C.", [_q("44", unit="b")]),
        ("$40 B", [_q("40e9")]),
        ("forty k", [_q("40"), _q("40e3")]),
        # Real units, and units written apart, read as before.
        ("40 kg", [_q("40", unit="kg")]),
        ("40 km", [_q("40", unit="km")]),
        ("40kW", [_q("40", unit="kw")]),
        ("40 m", [_q("40", unit="m")]),
        ("40 MB", [_q("40", unit="mb")]),
        ("40GB", [_q("40", unit="gb")]),
        ("40mm", [_q("40", unit="mm")]),
        ("40 kWh and 40 ms", [_q("40", unit="kwh"), _q("40", unit="ms")]),
    ],
)
def test_scale_suffixes(text: str, want: list[object]) -> None:
    assert numbers_in(text) == want


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("It has 40k staff", "It has 40 staff."),
        ("It has 40K staff", "It has 40 staff."),
        ("It has 40M staff", "It has 40 staff."),
        ("It has 40m staff", "It has 40 staff."),
        ("It has 40MM staff", "It has 40 staff."),
        ("It has 3tn staff", "It has 3 staff."),
        ("It cost $40M", "It cost $40."),
        ("It cost $40B", "It cost $40."),
        ("It cost $40 m", "It cost $40."),
        ("It cost €1.2bn", "It cost 1.2 euros."),
        ("It has 40 Million staff", "It has 40 staff."),
        ("It cost $40M", "It cost 40 m."),  # money has no metres
    ],
)
def test_scale_suffix_does_not_pass_against_the_plain_number(text: str, chunk: str) -> None:
    assert _check(text, chunk).reason == "number_mismatch"


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("It has 40k staff", "It has 40,000 staff."),
        ("It has 40K staff", "It has 40 thousand staff."),
        ("It cost $40M", "It cost $40 million."),
        ("It cost $40 million", "It cost $40m."),
        ("It cost $1.2bn", "It cost 1.2 billion dollars."),
        ("The tower is 40m tall", "The tower is 40m tall."),
        ("The tower is 40 metres tall", "The tower is 40m tall."),
        ("The tower is 40 m tall", "The tower is 40 metres tall."),
        ("It weighs 40 kg and draws 40 kW", "It weighs 40 kg and draws 40 kW."),
        ("It stores 40 MB", "It stores 40 MB."),
    ],
)
def test_scale_suffix_matches_its_value(text: str, chunk: str) -> None:
    assert _check(text, chunk).status is Status.PASS


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1,200", [_q("1200")]),
        ("1,200,000", [_q("1200000")]),
        ("$3,200,000.50", [_q("3200000.5")]),
        # Digits after a comma that are not a thousands group are a number of their own.
        ("2021,2023", [_q("2021"), _q("2023")]),
        ("1,2345", [_q("1"), _q("2345")]),
        ("homes,42", [_q("42")]),
        ("1,5,7", [_q("1"), _q("5"), _q("7")]),
        # One comma and one or two digits may be a decimal comma: that value is read too.
        ("9,99", [_q("9"), _q("99"), _q("9.99")]),
        ("€9,5%", [_q("9"), _q("5", pct=True), _q("9.5", pct=True)]),
        ("-2,5", [_q("-2"), _q("5"), _q("-2.5")]),
    ],
)
def test_digits_after_a_comma(text: str, want: list[object]) -> None:
    assert numbers_in(text) == want


@pytest.mark.parametrize(
    ("text", "chunk", "passes"),
    [
        ("It opened in 2021,2023", "It opened in 2021.", False),
        ("It opened in 2021,2023", "It opened in 2021 and 2023.", True),
        ("Tickets cost 9,99 euros", "Tickets cost 9 euros.", False),
        ("Tickets cost 9,99 euros", "Tickets cost 9,99 euros.", True),
        ("Tickets cost 9.99 euros", "Tickets cost 9,99 euros.", True),
        ("It served 1,200 homes", "It served 1200 homes.", True),
    ],
)
def test_digits_after_a_comma_are_checked(text: str, chunk: str, passes: bool) -> None:
    got = _check(text, chunk)
    assert (got.status is Status.PASS) is passes, got


@pytest.mark.parametrize("minus", ["\u2012", "\ufe63", "\u2796", "\u2212", "\u02d7", "\uff0d"])
def test_other_minus_signs_read_as_minus(minus: str) -> None:
    assert numbers_in(f"It has {minus}40 staff.") == [_q("-40")]
    assert numbers_in(f"In 2019{minus}2021") == [_q("2019"), _q("2021")]  # a range
    assert _check(f"It has {minus}40 staff", "It has 40 staff.").reason == "number_mismatch"


def test_enclosed_numbers_are_read() -> None:
    assert numbers_in("①, ⑳, ㊾, ⓵, ⒈, ⑴, ⓿, ❿, ➓, ㉑, 🄂") == [
        _q(v) for v in ("1", "20", "49", "1", "1", "1", "0", "10", "10", "21", "1")
    ]
    assert _check("The plant has \u32be staff", "The plant has 40 staff.").reason == (
        "number_mismatch"
    )
    assert _check("The plant has ㊵ staff", "The plant has 40 staff.").status is Status.PASS
    assert numbers_in("[①]") == [_q("1")]  # not a bare citation


def test_per_mille_is_its_percent_value() -> None:
    assert numbers_in("4‰ and 4‱") == [_q("0.4", pct=True), _q("0.04", pct=True)]
    assert _check("It lost 4‰", "It lost 4 units.").reason == "number_mismatch"
    assert _check("It lost 4‰", "It lost 4%.").reason == "number_mismatch"
    assert _check("It lost 4‰", "It lost 0.4%.").status is Status.PASS
    assert _check("It lost 4‰", "It lost 4‰.").status is Status.PASS


# -- alternative readings: a decimal comma, a dot thousands separator ---------------------------


@pytest.mark.parametrize(
    ("text", "chunk", "passes"),
    [
        # "1,2" is a list (1 and 2) or a decimal comma (1.2): either reading in the chunk will do.
        ("Sections 1,2 and 3 apply", "Sections 1, 2 and 3 apply.", True),
        ("Scores were 3,4 and 5", "Scores were 3, 4 and 5.", True),
        ("It costs 9,5 €", "It costs 9,50 €.", True),
        ("It costs €9,99", "It costs €9.99.", True),
        ("It weighs 1,5 kg", "It weighs 1.5 kg.", True),
        ("It fell -2,5 degrees", "It fell -2.5 degrees.", True),
        ("The pump moves 40,0 litres", "The pump moves 40 litres.", True),
        # Neither reading whole in the chunk: a mismatch.
        ("It weighs 1,5 kg", "It weighs 1 kg.", False),
        ("It weighs 1,5 kg", "It weighs 5 kg and 1.4 kg.", False),
        ("It costs 9,5 €", "It costs 9 €.", False),
        ("It fell -2,5 degrees", "It fell 2.5 degrees.", False),
        ("Sections 1,2 and 4 apply", "Sections 1, 2 and 3 apply.", False),
        ("Scores were 3,4 and 5", "Scores were 3 and 5.", False),
        # Four digits are no decimals: a list only.
        ("The 2021,2022 and 2023 reports", "The 2021 and 2023 reports.", False),
        ("The 2021,2022 and 2023 reports", "The 2021, 2022 and 2023 reports.", True),
        ("Sections 1,2,3 apply", "Sections 1, 2 and 3 apply.", True),
    ],
)
def test_a_decimal_comma_is_an_alternative_reading(text: str, chunk: str, passes: bool) -> None:
    got = _check(text, chunk)
    assert (got.status is Status.PASS) is passes, got


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # Two or more dot groups are thousands; one group of three digits after a leading
        # 1-3 digits is thousands or decimals (both read), thousands only when its last digit is
        # 0 ("40.000": the decimal reading would be any plain 40).
        ("40.000.000", [_q("40000000")]),
        ("1.234.567 euros", [_q("1234567")]),
        ("€40.000", [_q("40000")]),
        ("40.000", [_q("40000")]),
        ("1.500 kg", [_q("1500", unit="kg")]),
        ("3.142", [_q("3.142"), _q("3142")]),
        ("-3.142", [_q("-3.142"), _q("-3142")]),
        ("0.125", [_q("0.125")]),
        ("1.5", [_q("1.5")]),
        ("12.5", [_q("12.5")]),
        ("1234.567", [_q("1234.567")]),
        ("1,234.567", [_q("1234.567")]),
        ("v2.1.3", []),
    ],
)
def test_dot_thousands(text: str, want: list[object]) -> None:
    assert numbers_in(text) == want


@pytest.mark.parametrize(
    ("text", "chunk", "passes"),
    [
        ("It costs 40.000.000 euros", "It moves 40 litres.", False),
        ("It costs €40.000", "It moves 40 litres.", False),
        ("It costs 40.000 euros", "It costs 40 euros.", False),
        ("It has 3.142 staff", "It has 3 staff.", False),
        ("It weighs 0.125 kg", "It weighs 125 kg.", False),
        # Controls: the same forms, supported.
        ("It costs 40.000.000 euros", "It costs 40,000,000 euros.", True),
        ("It costs 40.000.000 euros", "It costs 40 million euros.", True),
        ("It costs €40.000", "It costs €40,000.", True),
        ("It costs €40.000", "It costs €40.000.", True),
        ("It costs €40,000", "It costs €40.000.", True),
        ("Pi is about 3.142", "Pi is about 3.142.", True),
        ("It has 3.142 staff", "It has 3,142 staff.", True),
        ("It weighs 0.125 kg", "It weighs 0.125 kg.", True),
    ],
)
def test_dot_thousands_are_checked(text: str, chunk: str, passes: bool) -> None:
    got = _check(text, chunk)
    assert (got.status is Status.PASS) is passes, got


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("40 mln", [_q("40e6")]),
        ("40 Mln.", [_q("40e6")]),
        ("USD 40 bln", [_q("40e9")]),
        ("$40 mil", [_q("40e6")]),
        ("40 Mio. euros", [_q("40e6")]),
        ("40 Mrd", [_q("40e9")]),
        ("40 Mrd. Euro", [_q("40e9")]),
        ("40 millions", [_q("40e6")]),
        ("40 billions", [_q("40e9")]),
        ("40 thousands", [_q("40e3")]),
        ("40 Millionen", [_q("40e6")]),
        ("40 Milliarden", [_q("40e9")]),
        ("40 milliard", [_q("40e9")]),
        ("40 lakh", [_q("40e5")]),
        ("40 lakhs", [_q("40e5")]),
        ("40 crore", [_q("40e7")]),
        ("40 Crores", [_q("40e7")]),
        ("forty lakh", [_q("40e5")]),
        ("40 per mille", [_q("4", pct=True)]),
        ("40 per mil", [_q("4", pct=True)]),
        ("40 permille", [_q("4", pct=True)]),
        ("40 $M", [_q("40e6")]),
        ("40 $B", [_q("40e9")]),
        ("40€M", [_q("40e6")]),
        ("40 $bn", [_q("40e9")]),
        # Not scales: a word that only starts like one, a unit, a currency alone.
        ("40 litres", [_q("40")]),
        ("40 miles", [_q("40")]),
        ("40 mi", [_q("40", unit="mi")]),
        ("40 $ a day", [_q("40")]),
        ("40 per minute", [_q("40")]),
        ("40 per mile", [_q("40")]),
    ],
)
def test_scale_abbreviations_and_plurals(text: str, want: list[object]) -> None:
    assert numbers_in(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "It sold 40 mln units",
        "It earned USD 40 bln",
        "It earned $40 mil last year",
        "It sold 40 millions of units",
        "It earned 40 Mio. euros",
        "It earned 40 Mrd euros",
        "It sold 40 lakh units",
        "It earned 40 crore rupees",
        "It wastes 40 per mille of its flow",
        "It earned 40 $M last year",
    ],
)
def test_scale_abbreviations_do_not_pass_on_the_plain_number(text: str) -> None:
    assert _check(text, "The pump moves 40 litres per minute.").reason == "number_mismatch"


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("It sold 40 mln units", "It sold 40 million units."),
        ("It earned USD 40 bln", "It earned $40 billion."),
        ("It earned $40 mil last year", "It earned $40m last year."),
        ("It sold 40 millions of units", "It sold 40,000,000 units."),
        ("It earned 40 Mio. euros", "It earned 40 million euros."),
        ("It earned 40 Mrd euros", "It earned 40 bn euros."),
        ("It sold 40 lakh units", "It sold 4 million units."),
        ("It earned 40 crore rupees", "It earned 400 million rupees."),
        ("It wastes 40 per mille of its flow", "It wastes 4% of its flow."),
        ("It wastes 40 per mille of its flow", "It wastes 40‰ of its flow."),
        ("It earned 40 $M last year", "It earned $40M last year."),
    ],
)
def test_scale_abbreviations_match_their_value(text: str, chunk: str) -> None:
    assert _check(text, chunk).status is Status.PASS


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        # HTML character references show as the characters they name: 43, 43, 4½.
        ("The plant has &#x34;&#x33; reactors", "The plant has 42 reactors."),
        ("The plant has &#52;&#51; reactors", "The plant has 42 reactors."),
        ("The plant has 4&#x33; reactors", "The plant has 4 reactors and 3 halls."),
        ("Output is 4&frac12; GW", "Output is 4 GW."),
        # Markup between digits renders as nothing: each shows as 43.
        ("The plant has 4**3** reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4*3* reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4~~3~~ reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4<b>3</b> reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4<b></b>3 reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4<!-- -->3 reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4<!--\n-->3 reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4`3` reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4<span class='x'>3</span> reactors", "Units 4 and 3 were upgraded."),
        ("The plant has 4&#x200b;3 reactors", "Units 4 and 3 were upgraded."),
    ],
)
def test_numbers_hidden_by_character_references_or_markup_are_read_as_shown(
    text: str, chunk: str
) -> None:
    assert _check(text, chunk).reason == "number_mismatch"


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("The plant has &#x34;&#x32; reactors", "The plant has 42 reactors."),
        ("Output is 4&frac12; GW", "Output is 4½ GW."),
        ("Output is 4&frac12; GW", "Output is 4&frac12; GW."),
        ("The plant has **42** reactors", "The plant has 42 reactors."),
        # Split or joined, the chunk has each reading.
        ("The plant has 4**2** reactors", "It has 42 reactors: units 4 and 2."),
        ("The plant has 4<b>2</b> reactors", "It has 4<b>2</b> reactors, 4 and 2."),
        # No closing delimiter: no emphasis, a power.
        ("It holds 1.2 * 10**4 litres", "It holds 12,000 litres."),
        ("Tom &amp; Jerry own 42 reactors", "Tom and Jerry own 42 reactors."),
    ],
)
def test_numbers_behind_references_or_markup_still_match(text: str, chunk: str) -> None:
    assert _check(text, chunk).status is Status.PASS


def test_a_chunk_is_read_through_its_character_references_and_markup() -> None:
    # The chunk shows 43: neither 4 nor 3 alone, as the claim's reading must be.
    assert set(numbers_in("It has &#x34;&#x33; rooms")) == _n(43)
    assert set(numbers_in("It has 4**3** rooms")) == _n(43, 4, 3)
    # A "*" that no other closes is no emphasis ("10**4" is a power).
    assert set(numbers_in("It costs 2*3 units")) == _n(2, 3)


_GROUP_SEPARATORS = ["\u00a0", "\u2007", "'", "\u2019", "\u02bc", "\u2009", "\u202f"]


@pytest.mark.parametrize(
    "sep", _GROUP_SEPARATORS, ids=[f"U+{ord(c):04X}" for c in _GROUP_SEPARATORS]
)
def test_a_space_or_apostrophe_between_groups_of_three_is_a_thousands_separator(sep: str) -> None:
    assert set(numbers_in(f"The plant employs 3{sep}200 workers.")) == _n(3200)
    assert set(numbers_in(f"It cost 1{sep}200{sep}000.50 francs.")) == {
        (Decimal("1200000.5"), False, "")
    }
    # A part of a separated number is no match (the chunk says 3,200)...
    for part in ("3", "200"):
        assert _check(f"The plant employs {part} workers", f"It employs 3{sep}200 workers."
                      ).reason == "number_mismatch"
    # ...and the number written so matches its value on either side.
    assert _check(f"The plant employs 3{sep}200 workers", "It employs 3,200 workers."
                  ).status is Status.PASS
    assert _check("The plant employs 3,200 workers", f"It employs 3{sep}200 workers."
                  ).status is Status.PASS
    # Not a group of three: two numbers.
    assert set(numbers_in(f"Rooms 3{sep}20 and 5{sep}2000.")) == _n(3, 20, 5, 2000)


def test_a_plain_space_between_digit_groups_is_no_thousands_separator() -> None:
    # "In 2021 500 units": a year and a count as often as 2,021,500.
    assert set(numbers_in("In 2021 500 units were sold.")) == _n(2021, 500)


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        # Each shows as a number the chunk does not have.
        ("Output is 4\ua4f83 GW", "Output is 4 GW and 3 GW."),  # Lisu ꓸ looks like "."
        ("It has 4\ua4f9300 rooms", "It has 4 rooms and 300 halls."),  # Lisu ꓹ looks like ","
        ("It has 4\u041e rooms", "It has 4 rooms."),  # Cyrillic О: 40
        ("It has 4\u0417 rooms", "It has 4 rooms."),  # Cyrillic З: 43
        ("It has 4O rooms", "It has 4 rooms."),  # Latin O: 40
        ("It has 4\u039f rooms", "It has 4 rooms."),  # Greek Ο: 40
        ("It has \u2084\u2083 rooms", "It has 42 rooms."),  # subscript digits
        ("It has \u216b rooms", "It has 42 rooms."),  # Ⅻ: 12
        ("It has \u2167 rooms", "It has 7 rooms."),  # Ⅷ: 8
        ("It has f\u043erty-three rooms", "It has 42 rooms."),  # Cyrillic о in "forty"
        ("It has \u0430 dozen rooms", "It has 42 rooms."),  # Cyrillic а in "a dozen"
        ("It has t\u0435n rooms", "It has 42 rooms."),  # Cyrillic е in "ten"
        ("It has f\u03bfrty rooms", "It has 42 rooms."),  # Greek ο in "forty"
        ("It has fourty-three rooms", "It has 42 rooms."),  # a common misspelling
    ],
)
def test_numbers_written_with_look_alikes_or_number_characters_are_read(
    text: str, chunk: str
) -> None:
    assert _check(text, chunk).reason == "number_mismatch"


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("It has \u2084\u2082 rooms", "It has 42 rooms."),
        ("It has \u216b rooms", "It has 12 rooms."),
        ("It has f\u043erty-two rooms", "It has 42 rooms."),
        ("It has fourty rooms", "It has 40 rooms."),
        # Read both ways: the chunk has both readings.
        ("Output is 4\ua4f83 GW", "Output is 4.3 GW, from units 4 and 3."),
        ("It has 4\u041e rooms", "It has 40 rooms, 4 of them large."),
        # Formulas: digits against letters are a word's, as written and as read.
        ("It emits CO\u2082 and H\u2082O", "It emits gases."),
        ("It emits CO2 and H2O", "It emits gases."),
        ("It has 42 rooms in \u041c\u043e\u0441\u043a\u0432\u0430", "It has 42 rooms."),
    ],
)
def test_numbers_written_with_look_alikes_match_every_reading(text: str, chunk: str) -> None:
    assert _check(text, chunk).status is Status.PASS


def test_a_chunk_is_read_through_look_alikes_and_number_characters() -> None:
    assert set(numbers_in("It has \u2084\u2083 rooms")) == _n(43)
    assert set(numbers_in("Chapter \u216b and \u2180")) == _n(12, 1000)
    assert set(numbers_in("It has f\u043erty rooms")) == _n(40)
    # A character with no numeric value in the range is no number (and no crash).
    assert numbers_in("It has \u2183 rooms") == []

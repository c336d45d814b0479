from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, localcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.checks.base import claim_body, source_texts
from gateway.checks.numbers import _NUMBER, _SCALES, _UNITS, NumberMismatch, numbers_in
from gateway.citations import CitationParser
from gateway.policy import Citations
from gateway.types import CheckResult, Chunk, Citation, Claim, ContextSet, NativeLocation, Status

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
        "Two sources, 1200 homes and 3.2 million units [a:1][b:2].",
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


def test_native_cited_text_is_a_source() -> None:
    loc = NativeLocation("char_location", "up 12.5%", document_index=0, start=0, end=8)
    c = Claim(0, 0, "Sales rose 12.5%.", 0, 17, (Citation("", "", native=loc),))
    assert CHECK.run(c, CTX).status is Status.PASS


def test_numbers_in() -> None:
    assert numbers_in("1,200 and 80% and 2019-2021") == [
        (Decimal(1200), False, ""),
        (Decimal(80), True, ""),
        (Decimal(2019), False, ""),
        (Decimal(2021), False, ""),
    ]
    assert numbers_in("(−3%)") == [(Decimal(-3), True, "")]
    assert numbers_in("v2.1.3 A4") == []


# A straightforward reference: every `_NUMBER` match (the definition of a number) over the
# whole text, each converted on its own, and a claim number looked up in every source number.
def reference_numbers(text: str) -> list[tuple[Decimal, bool, str]]:
    out = []
    # Exact arithmetic: numbers are compared digit for digit, however long.
    with localcontext(Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN)):
        for m in _NUMBER.finditer(text):
            sign, _, num, scale, pct, unit = m.groups()
            value = Decimal(num.replace(",", ""))
            if sign:
                value = -value
            if scale:
                value *= _SCALES[scale.lower()]
            unit = unit.lower() if unit else ""
            out.append((value.normalize(), pct is not None, unit if unit in _UNITS else ""))
    return out


def reference_check(c: Claim, ctx: ContextSet) -> tuple[Status, str | None, str]:
    texts, textless = source_texts(c, ctx)
    sources = [reference_numbers(t) for t in texts]
    for v, p, u in reference_numbers(claim_body(c)):
        if not any(
            v2 == v and p2 == p and (u2 == u or not u or not u2)
            for nums in sources
            for v2, p2, u2 in nums
        ):
            if textless:
                return Status.FAIL, "source_text_unavailable", "a cited chunk has no text"
            shown = f"{v}{'%' if p else ''}{' ' + u if u else ''}"
            return Status.FAIL, "number_mismatch", f"{shown} is in none of the cited sources"
    return Status.PASS, None, ""


_NUMBERISH = st.lists(
    st.sampled_from(
        [*"0123456789.,-−–$€ %kWhmillon()[{\t\n_v²", "٣", "°C", "per cent", "bn", "é"]
    )
).map("".join)
# Numbers as answers and sources write them, and what may stand around them.
_NUMBER_WORDS = st.lists(
    st.sampled_from(
        [
            "1,200", "1.200", "1200", "1,2345", "62.5", "62.50", "$3.2 million", "$3,200,000",
            "€ 4 bn", "80%", "80 percent", "80 per  cent", "2021", "2019-2021", "10–20", "-5",
            " -5", " −3", "(−3%)", " – 4", ".5", "0.5", "62.5 kWh", "62.5kwh", "62.5 km",
            "5°C", "5 °F", "3 thousand", "3 thousands", "v2.1.3", "A4", "٣", "1.2.3", "x",
            " ", " ", "\n", ",", ".", "-", "$", "homes", " MB", "\u00a0", "_", "é", "’s",
            ' "', "“", "”", "[a:1]", "per", "cent",
        ]
    ),
    max_size=14,
).map("".join)


# Text without a sign takes a quicker path through the scan.
_UNSIGNED = st.one_of(_NUMBERISH, _NUMBER_WORDS).map(
    lambda t: t.replace("-", " ").replace("−", "(").replace("–", "_")
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_NUMBERISH, _NUMBER_WORDS, _UNSIGNED))
def test_numbers_in_equals_the_full_pattern_scan(text: str) -> None:
    # The scan tries the pattern only next to digit runs; it must find what a full scan finds.
    assert numbers_in(text) == reference_numbers(text)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(_NUMBER_WORDS, _UNSIGNED),
    _NUMBER_WORDS,
    _NUMBER_WORDS,
    st.sampled_from([" [a:1].", " [b:2].", " [a:1][b:2].", " [n:1].", " [a:1][n:1].", "."]),
)
def test_check_equals_the_reference(text: str, a_text: str, b_text: str, cite: str) -> None:
    ctx = ContextSet()
    ctx.extend([Chunk("a:1", a_text), Chunk("b:2", b_text), Chunk("n:1", None)])
    c = claim(text + cite)
    r = CHECK.run(c, ctx)
    assert (r.status, r.reason, r.detail) == reference_check(c, ctx)


def test_shared_pass_result() -> None:
    # Passing claims share one result value (the verifier reads its status, not its identity).
    ok = CHECK.run(claim("It served 1200 homes [a:1]."), CTX)
    assert ok is CHECK.run(claim("No numbers [a:1]."), CTX)
    assert ok == CheckResult.ok("number_mismatch")


def test_value_memo_is_bounded_and_keeps_no_long_numbers() -> None:
    from gateway.checks import numbers

    for k in range(numbers._MAX_MEMO + 10):
        assert numbers_in(f"{k} and -{k}%") == [(Decimal(k), False, ""), (Decimal(-k), True, "")]
    assert len(numbers._POSITIVE) <= numbers._MAX_MEMO
    assert len(numbers._NEGATIVE) <= numbers._MAX_MEMO
    assert len(numbers._UNSIGNED) <= numbers._MAX_MEMO
    long = "9" * 100
    assert numbers_in(f"about {long} items") == reference_numbers(f"about {long} items")
    assert all(len(g[0]) <= numbers._MEMO_DIGITS for g in numbers._UNSIGNED)


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

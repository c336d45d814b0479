from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.checks.numbers import _NUMBER, NumberMismatch, _matches, numbers_in
from gateway.citations import CitationParser
from gateway.policy import Citations
from gateway.types import Chunk, Citation, Claim, ContextSet, NativeLocation, Status

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


_NUMBERISH = st.lists(
    st.sampled_from(
        [*"0123456789.,-−–$€ %kWhmillon()[{\t\n_v²", "٣", "°C", "per cent", "bn", "é"]
    )
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_NUMBERISH)
def test_digit_anchored_scan_equals_the_pattern(text: str) -> None:
    # The scan tries the pattern only next to digit runs; it must find what a full scan finds.
    assert [m.span() for m in _matches(text)] == [m.span() for m in _NUMBER.finditer(text)]

"""Fuzz of the pure parsers the gateway trusts with upstream bytes: the SSE decoder, the
citation parser and the claim segmenter. Random input must give a result, never an exception,
and cutting the input into random pieces must not change the result."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.citations import CitationParser
from gateway.claims import ClaimSegmenter
from gateway.policy import Citations, ClaimsSpec
from gateway.sse import SSEDecoder
from tests.conftest import fuzz_examples

SSE_ATOMS = [
    b"data: ",
    b"data:",
    b"event: message_start\n",
    b"id: 7\n",
    b"retry: 1000\n",
    b": comment\n",
    b"\n",
    b"\r\n",
    b"\r",
    b"\n\n",
    b'{"choices": [{"delta": {"content": "x"}}]}',
    b"[DONE]",
    "é🙂".encode(),
    b"\xef\xbb\xbf",
    b"\xff\xfe",
    b"\xe2\x82",
]

sse_bytes = st.one_of(
    st.binary(max_size=400),
    st.lists(st.sampled_from(SSE_ATOMS) | st.binary(max_size=8), max_size=40).map(b"".join),
)


def _cuts(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


def _decode(pieces: list[bytes]) -> list[tuple[str, str | None, str | None, int | None]]:
    decoder = SSEDecoder()
    events = []
    for piece in pieces:
        events += decoder.feed(piece)
    events += decoder.finish()
    return [(e.data, e.event, e.id, e.retry) for e in events]


@settings(max_examples=fuzz_examples(300))
@given(data=sse_bytes, cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_sse_decoder_takes_any_bytes_cut_anywhere(data: bytes, cuts: list[int]) -> None:
    whole = _decode([data])
    assert _decode(_cuts(data, cuts)) == whole
    assert _decode([bytes([b]) for b in data]) == whole
    for text, _, _, retry in whole:
        assert isinstance(text, str)
        assert retry is None or retry >= 0


CITATION_ATOMS = [
    "[kb:1]",
    "[kb:1, kb:2]",
    "[kb:1][a:2]",
    "[kb:1@3]",
    "[1]",
    "[1, 2]",
    "[^3]",
    "[",
    "]",
    "[]",
    "[:]",
    "[a:]",
    "[ kb : 1 ]",
    "[kb:\u200b1]",
    "[kb:\u202e1]",
    "[kb:１]",
    "[link](http://x)",
    "![img](x)",
    "[[kb:1]]",
    "\\[kb:1]",
    "The pump moves 40 litres per minute",
    ". ",
    "\n",
    "\n\n",
    "- ",
    "1. ",
    "# ",
    "```\n",
    "I don't know",
    "e.g. ",
    "3.5",
    "?",
    "! ",
]

claim_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(CITATION_ATOMS) | st.text(max_size=6), max_size=30).map("".join),
)

FORMATS = ["doc-chunk", "numeric", "footnote"]


@settings(max_examples=fuzz_examples(300))
@given(text=claim_text, fmt=st.sampled_from(FORMATS))
def test_citation_parser_takes_any_text(text: str, fmt: str) -> None:
    parser = CitationParser(Citations.model_validate({"format": fmt}))
    markers = parser.markers(text)
    last = 0
    for start, end, cits in markers:
        assert last <= start < end <= len(text)
        last = end
        for c in cits:
            assert start <= c.start <= c.end <= end
            assert isinstance(c.id, str)


@settings(max_examples=fuzz_examples(300))
@given(
    text=claim_text,
    fmt=st.sampled_from(FORMATS),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10),
)
def test_claim_segmenter_takes_any_text_cut_anywhere(text: str, fmt: str, cuts: list[int]) -> None:
    parser = CitationParser(Citations.model_validate({"format": fmt}))
    seg = ClaimSegmenter(parser, ClaimsSpec().exempt_re)
    whole = seg.whole(text)
    pieces = [
        text[a:b]
        for a, b in zip(
            [0, *sorted({c % (len(text) + 1) for c in cuts})],
            [*sorted({c % (len(text) + 1) for c in cuts}), len(text)],
            strict=True,
        )
    ]
    inc = ClaimSegmenter(parser, ClaimsSpec().exempt_re)
    streamed = [s for p in pieces for s in inc.feed(p)] + inc.finish()
    assert streamed == whole
    last = 0
    for s in whole:
        assert last <= s.start <= s.end <= len(text)
        assert s.text == text[s.start : s.end]
        last = s.end

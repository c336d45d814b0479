from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import SSEDecoder, SSEEvent, encode


def decode_all(pieces: list[bytes]) -> list[SSEEvent]:
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for p in pieces:
        out.extend(d.feed(p))
    out.extend(d.finish())
    return out


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(data[last:p])
        last = p
    pieces.append(data[last:])
    return pieces


STREAM = (
    "\ufeff: comment line\r\n"
    "event: message_start\r\n"
    "id: 7\r\n"
    "retry: 1500\r\n"
    'data: {"a": "héllo 🌍"}\r\n'
    "\r\n"
    "data: first\rdata: second\r\r"
    "data:no-space\n"
    "data\n"
    "\n"
    "event: only-event-no-data\n\n"
    "data: [DONE]\n\n"
).encode()

EXPECTED = [
    SSEEvent(data='{"a": "héllo 🌍"}', event="message_start", id="7", retry=1500),
    SSEEvent(data="first\nsecond"),
    SSEEvent(data="no-space\n"),
    SSEEvent(data="[DONE]"),
]


def test_decodes_mixed_line_endings_fields_and_comments() -> None:
    assert decode_all([STREAM]) == EXPECTED


def test_every_single_byte_split() -> None:
    assert decode_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_cr_and_lf_in_separate_feeds_is_one_line_end() -> None:
    # "data: a\r" + "\n" + "\r\n" must be one event, not two blank lines.
    assert decode_all([b"data: a\r", b"\n", b"\r", b"\n"]) == [SSEEvent(data="a")]


def test_split_inside_multibyte_character() -> None:
    raw = "data: 🌍\n\n".encode()
    cut = raw.index(b"\xf0") + 2
    assert decode_all([raw[:cut], raw[cut:]]) == [SSEEvent(data="🌍")]


def test_unterminated_event_is_discarded_at_finish() -> None:
    assert decode_all([b"data: a\n\ndata: half\n"]) == [SSEEvent(data="a")]
    assert decode_all([b"data: no line end"]) == []


def test_invalid_retry_is_ignored() -> None:
    assert decode_all([b"retry: 1x\ndata: a\n\n"]) == [SSEEvent(data="a")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_random_byte_splits(cuts: list[int]) -> None:
    assert decode_all(split_at(STREAM, cuts)) == EXPECTED


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.builds(
            SSEEvent,
            data=_text.map(lambda s: s.replace("\r\n", "\n").replace("\r", "\n")),
            event=st.none() | st.text("abcdefgh_", min_size=1, max_size=10),
            id=st.none() | st.text("0123456789", max_size=5),
            retry=st.none() | st.integers(min_value=0, max_value=10**6),
        ),
        max_size=5,
    ),
    st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_encode_decode_round_trip(events: list[SSEEvent], cuts: list[int]) -> None:
    raw = b"".join(encode(e) for e in events)
    assert decode_all(split_at(raw, cuts)) == events


def test_decoder_is_incremental_not_rescanning() -> None:
    # A long line fed a byte at a time must still decode; quadratic rescans would be slow
    # but also this checks the partial-line buffer joins correctly.
    body = b"data: " + b"x" * 20_000 + b"\n\n"
    d = SSEDecoder()
    out: list[SSEEvent] = []
    for i in range(0, len(body), 7):
        out.extend(d.feed(body[i : i + 7]))
    assert out == [SSEEvent(data="x" * 20_000)]

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import SSEDecoder, SSEEvent, encode, encode_data


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


_LINE = st.one_of(
    st.builds(lambda v: f"data:{v}", st.text("ab :\x00é", max_size=6)),
    st.builds(lambda v: f"data: {v}", st.text("ab :{}", max_size=6)),
    st.builds(lambda v: f"event:{v}", st.text("ab ", max_size=4)),
    st.builds(lambda v: f"event: {v}", st.text("ab", max_size=4)),
    st.builds(lambda v: f"id: {v}", st.text("1\x00", max_size=3)),
    st.builds(lambda v: f"retry: {v}", st.text("12x", max_size=3)),
    st.sampled_from(["", ": ping", "data", "event", "other: x", "\ufeffdata: bom", " data: x"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_LINE, max_size=4), max_size=6), st.booleans())
def test_whole_lf_events_per_chunk_decode_like_single_bytes(
    blocks: list[list[str]], bom: bool
) -> None:
    # Upstreams usually send whole `...\n\n` events per chunk; however the lines are mixed,
    # those chunks must decode exactly as the same bytes fed one at a time.
    chunks = [("\n".join(lines) + "\n\n").encode() for lines in blocks]
    if bom and chunks:
        chunks[0] = "\ufeff".encode() + chunks[0]
    raw = b"".join(chunks)
    assert decode_all(chunks) == decode_all([raw[i : i + 1] for i in range(len(raw))])
    assert decode_all([raw]) == decode_all([raw[i : i + 1] for i in range(len(raw))])


def test_whole_events_per_chunk() -> None:
    chunks = [
        b"data: a\n\n",
        b'event: message_start\ndata: {"x": 1}\n\n',
        b"retry: 10\n\ndata: b\n\n",  # a retry with no data is dropped with its event
        b"id: 3\ndata: c\n\n: ping\n\n\n\nevent: e\ndata: d\ndata: e\n\n",
        b"event: half\n",
        b"data: f\n\n",
        "data: é🌍\n\n".encode(),
        b"data: g\r\n\r\n",
        b"retry: 5\n",
        b"data: h\n\n",
    ]
    assert decode_all(chunks) == [
        SSEEvent(data="a"),
        SSEEvent(data='{"x": 1}', event="message_start"),
        SSEEvent(data="b"),
        SSEEvent(data="c", id="3"),
        SSEEvent(data="d\ne", event="e"),
        SSEEvent(data="f", event="half"),
        SSEEvent(data="é🌍"),
        SSEEvent(data="g"),
        SSEEvent(data="h", retry=5),
    ]


@settings(max_examples=200, deadline=None)
@given(
    data=st.text(alphabet=st.characters(codec="utf-8"), max_size=40),
    event=st.none() | st.sampled_from(["message_start", "content_block_delta", "error"]),
)
def test_encode_data_frames_bytes_as_encode_frames_the_event(data: str, event: str | None) -> None:
    # Line breaks included: such a payload must still come out as encode's several data lines.
    assert encode_data(data.encode(), event) == encode(SSEEvent(data=data, event=event))

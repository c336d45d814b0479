"""gateway/eventstream.py: the AWS event-stream decoder and encoder, with botocore's own
parser (`EventStreamBuffer`) as the oracle both ways, fed at arbitrary byte boundaries."""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping

import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ProtocolError
from gateway.eventstream import EventStreamDecoder, Message, encode_message

_NAMES = st.text(
    alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters=":"),
    min_size=1,
    max_size=20,
).map(lambda s: ":" + s)
_VALUES = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=60),
    st.binary(max_size=60),
    st.uuids(),
)
_MESSAGES = st.lists(
    st.tuples(st.dictionaries(_NAMES, _VALUES, max_size=5), st.binary(max_size=300)),
    min_size=1,
    max_size=6,
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _decode(pieces: list[bytes]) -> list[Message]:
    dec = EventStreamDecoder()
    out: list[Message] = []
    for p in pieces:
        out.extend(dec.feed(p))
    out.extend(dec.finish())
    return out


def _botocore(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buf = EventStreamBuffer()
    buf.add_data(data)
    return [(dict(m.headers), m.payload) for m in buf]


@settings(max_examples=60, deadline=None)
@given(messages=_MESSAGES, cuts=st.lists(st.integers(min_value=0, max_value=10**6), max_size=30))
def test_round_trip_at_random_splits_agrees_with_botocore(
    messages: list[tuple[dict[str, object], bytes]], cuts: list[int]
) -> None:
    wire = b"".join(encode_message(h, p) for h, p in messages)  # type: ignore[arg-type]
    ours = [(_norm(m.headers), m.payload) for m in _decode(_split(wire, cuts))]
    theirs = _botocore(wire)
    assert ours == theirs
    assert [p for _, p in ours] == [p for _, p in messages]
    # botocore reads every header back as the value that was encoded
    for (got, _), (sent, _) in zip(theirs, messages, strict=True):
        assert got == _norm(sent)


def _norm(headers: Mapping[str, object]) -> dict[str, object]:
    """botocore gives a UUID header as its 16 bytes."""
    return {k: v.bytes if isinstance(v, uuid.UUID) else v for k, v in headers.items()}


def _botocore_encoded(headers: list[tuple[str, int, bytes]], payload: bytes) -> bytes:
    """A message framed independently of our encoder (every header type of the spec)."""
    raw = b""
    for name, kind, value in headers:
        raw += bytes([len(name)]) + name.encode() + bytes([kind]) + value
    total = 16 + len(raw) + len(payload)
    prelude = struct.pack("!II", total, len(raw))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    body = prelude + raw + payload
    return body + struct.pack("!I", zlib.crc32(body))


def test_every_header_type_decodes_as_botocore_reads_it() -> None:
    u = uuid.uuid4()
    headers = [
        ("t", 0, b""),
        ("f", 1, b""),
        ("b", 2, struct.pack("!b", -3)),
        ("s", 3, struct.pack("!h", -300)),
        ("i", 4, struct.pack("!i", 70000)),
        ("l", 5, struct.pack("!q", -(2**40))),
        ("y", 6, struct.pack("!H", 3) + b"\x00\xff\x10"),
        ("str", 7, struct.pack("!H", 4) + "hé!".encode()),
        ("ts", 8, struct.pack("!q", 1_700_000_000_000)),
        ("u", 9, u.bytes),
    ]
    wire = _botocore_encoded(headers, b'{"a":1}')
    (msg,) = _decode([wire])
    ((theirs, payload),) = _botocore(wire)
    assert msg.payload == payload == b'{"a":1}'
    assert theirs["u"] == u.bytes
    expected = {k: v for k, v in theirs.items() if k not in ("ts", "u")}
    assert {k: v for k, v in msg.headers.items() if k not in ("ts", "u")} == expected
    assert msg.headers["ts"] == 1_700_000_000_000
    assert msg.headers["u"] == u


def _one(payload: bytes = b'{"x":1}') -> bytes:
    return encode_message({":message-type": "event", ":event-type": "e"}, payload)


@pytest.mark.parametrize("at", [0, 5, 9, 11])
def test_a_bad_prelude_crc_or_length_fails(at: int) -> None:
    data = bytearray(_one())
    data[at] ^= 0x40
    with pytest.raises(ProtocolError):
        _decode([bytes(data)])


@pytest.mark.parametrize("offset", [13, 30, -6, -1])
def test_a_bad_message_crc_fails(offset: int) -> None:
    data = bytearray(_one())
    data[offset] ^= 0x01
    with pytest.raises(ProtocolError, match="CRC"):
        _decode([bytes(data)])


def test_impossible_lengths_and_oversize_messages_fail() -> None:
    def prelude(total: int, headers: int) -> bytes:
        head = struct.pack("!II", total, headers)
        return head + struct.pack("!I", zlib.crc32(head))

    with pytest.raises(ProtocolError, match="too small"):
        _decode([prelude(10, 0)])
    with pytest.raises(ProtocolError, match="too small"):
        _decode([prelude(20, 10)])
    with pytest.raises(ProtocolError, match="headers over"):
        _decode([prelude(300_000, 200_000)])
    with pytest.raises(ProtocolError, match="payload over"):
        EventStreamDecoder(max_payload=1024).feed(prelude(16 + 2048, 0))


def test_a_truncated_stream_fails_at_finish_and_yields_no_half_message() -> None:
    data = _one() + _one(b"second")
    dec = EventStreamDecoder()
    assert len(dec.feed(data[:-3])) == 1
    with pytest.raises(ProtocolError, match="inside a message"):
        dec.finish()


def test_malformed_headers_fail() -> None:
    good = [("a", 7, struct.pack("!H", 1) + b"x")]
    assert _decode([_botocore_encoded(good, b"")])[0].headers == {"a": "x"}
    for headers in (
        [("a", 7, struct.pack("!H", 9) + b"x")],  # value cut short
        [("a", 11, b"")],  # unknown type
        [("a", 7, struct.pack("!H", 1) + b"x"), ("a", 0, b"")],  # repeated name
        [("a", 7, struct.pack("!H", 1) + b"\xff")],  # not UTF-8
    ):
        with pytest.raises(ProtocolError):
            _decode([_botocore_encoded(headers, b"")])


def test_byte_at_a_time_is_linear_and_exact() -> None:
    wire = b"".join(_one(bytes([i % 251]) * (i * 7)) for i in range(60))
    dec = EventStreamDecoder()
    got: list[Message] = []
    for i in range(len(wire)):
        got.extend(dec.feed(wire[i : i + 1]))
    assert [m.payload for m in got] == [bytes([i % 251]) * (i * 7) for i in range(60)]

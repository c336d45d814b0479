from __future__ import annotations

import importlib
import sys
import tracemalloc
import zlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.decoding import ACCEPT_ENCODING, DECODABLE, make_decoder
from gateway.errors import ProtocolError, UpstreamTooLarge
from tests.test_sse import split_at


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


HAS_BR = _importable("brotli")
HAS_ZSTD = _importable("compression.zstd" if sys.version_info >= (3, 14) else "backports.zstd")


def gzip_(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


def zlib_deflate(data: bytes) -> bytes:
    return zlib.compress(data, 9)


def raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODERS: dict[str, Callable[[bytes], bytes]] = {"gzip": gzip_, "deflate": zlib_deflate}
LIB_ERRORS: dict[str, type[Exception]] = {"gzip": zlib.error, "deflate": zlib.error}
if HAS_BR:
    import brotli  # type: ignore[import-untyped]

    ENCODERS["br"] = brotli.compress
    LIB_ERRORS["br"] = brotli.error
if HAS_ZSTD:
    if sys.version_info >= (3, 14):
        from compression import zstd
    else:
        from backports import zstd

    ENCODERS["zstd"] = zstd.compress
    LIB_ERRORS["zstd"] = zstd.ZstdError
# deflate is also tested raw, under its own name, through make_decoder("deflate", ...)
CASES = {**ENCODERS, "deflate-raw": raw_deflate}
CODINGS = sorted(CASES)
BIG = 1 << 30


def coding_of(case: str) -> str:
    return case.removesuffix("-raw")




def decode(coding: str, pieces: list[bytes], limit: int = BIG) -> bytes:
    d = make_decoder(coding, limit)
    out = [d.feed(p) for p in pieces]
    out.append(d.finish())
    return b"".join(out)


TEXT = b"".join(b"claim %d cites [doc-%d] verbatim. " % (i, i % 7) for i in range(3000))


# --- what is offered


def test_decodable_and_accept_encoding_follow_the_installed_libraries() -> None:
    expected = ["gzip", "deflate"] + ["br"] * HAS_BR + ["zstd"] * HAS_ZSTD
    assert frozenset(expected) == DECODABLE
    assert ", ".join(expected) == ACCEPT_ENCODING


def test_this_environment_has_brotli_and_zstd() -> None:
    # Both are dependencies; without them the tests below would silently shrink.
    assert "br" in DECODABLE
    assert "zstd" in DECODABLE
    assert ACCEPT_ENCODING == "gzip, deflate, br, zstd"


@pytest.mark.parametrize("coding", ["identity", "GZIP", "x-gzip", "compress", "", "gzip, br"])
def test_unknown_coding_is_a_value_error(coding: str) -> None:
    with pytest.raises(ValueError, match="not a decodable content-coding"):
        make_decoder(coding, 100)


def test_negative_limit_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="negative"):
        make_decoder("gzip", -1)


# --- round trips


@pytest.mark.parametrize("case", CODINGS)
def test_round_trip_one_feed(case: str) -> None:
    assert decode(coding_of(case), [CASES[case](TEXT)]) == TEXT


@pytest.mark.parametrize("case", CODINGS)
def test_round_trip_byte_by_byte(case: str) -> None:
    body = CASES[case](TEXT[:5000])
    assert decode(coding_of(case), [body[i : i + 1] for i in range(len(body))]) == TEXT[:5000]


@settings(max_examples=200, deadline=None)
@given(
    case=st.sampled_from(CODINGS),
    payload=st.one_of(st.binary(max_size=3000), st.sampled_from([b"", TEXT, bytes(200_000)])),
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=12),
)
def test_round_trip_random_splits(case: str, payload: bytes, cuts: list[int]) -> None:
    pieces = split_at(CASES[case](payload), cuts)
    assert decode(coding_of(case), pieces) == payload


def test_brotli_output_larger_than_one_step_is_complete() -> None:
    # Several capped process() calls per feed: none of the output may be lost between them.
    payload = bytes(range(256)) * 3000  # 768 000 bytes, many 64 KiB steps
    body = ENCODERS["br"](payload)
    assert decode("br", [body]) == payload
    assert decode("br", [body], limit=len(payload)) == payload


@settings(max_examples=100, deadline=None)
@given(
    coding=st.sampled_from(["gzip", "zstd"]),
    members=st.lists(st.binary(max_size=500), min_size=1, max_size=6),
    cuts=st.lists(st.integers(min_value=0, max_value=1 << 16), max_size=10),
)
def test_members_decode_one_after_another(
    coding: str, members: list[bytes], cuts: list[int]
) -> None:
    body = b"".join(ENCODERS[coding](m) for m in members)
    assert decode(coding, split_at(body, cuts)) == b"".join(members)


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_member_count_is_bounded(coding: str) -> None:
    empty = ENCODERS[coding](b"")
    assert decode(coding, [empty * 1000]) == b""
    with pytest.raises(ProtocolError, match="more than 1000 members"):
        decode(coding, [empty * 1001])
    # the same bound when the members arrive one feed at a time
    d = make_decoder(coding, BIG)
    for _ in range(1000):
        assert d.feed(empty) == b""
    with pytest.raises(ProtocolError, match="more than 1000 members"):
        d.feed(empty)


# --- deflate: zlib-wrapped or raw, decided by the first two bytes


@pytest.mark.parametrize("encode", [zlib_deflate, raw_deflate])
def test_deflate_first_feed_of_one_byte(encode: Callable[[bytes], bytes]) -> None:
    body = encode(TEXT)
    d = make_decoder("deflate", BIG)
    assert d.feed(body[:1]) == b""
    assert d.feed(body[1:2]) + d.feed(body[2:]) + d.finish() == TEXT


def test_deflate_header_sniff_picks_each_format() -> None:
    wrapped, raw = zlib_deflate(b"hello"), raw_deflate(b"hello")
    assert (wrapped[0] & 0x0F) == 8 and (wrapped[0] << 8 | wrapped[1]) % 31 == 0
    assert not ((raw[0] & 0x0F) == 8 and (raw[0] << 8 | raw[1]) % 31 == 0)
    assert decode("deflate", [wrapped]) == b"hello"
    assert decode("deflate", [raw]) == b"hello"


def test_deflate_body_of_one_byte_is_truncated() -> None:
    d = make_decoder("deflate", BIG)
    assert d.feed(zlib_deflate(b"hello")[:1]) == b""
    with pytest.raises(ProtocolError, match="truncated"):
        d.finish()


# --- bounds


def _bomb_peak(coding: str, body: bytes, limit: int) -> int:
    tracemalloc.start()
    try:
        d = make_decoder(coding, limit)
        with pytest.raises(UpstreamTooLarge, match=f"over {limit} bytes decoded"):
            d.feed(body)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("case", CODINGS)
def test_bomb_is_stopped_without_decompressing_it(case: str) -> None:
    body = CASES[case](bytes(2_000_000))
    assert len(body) < 10_000
    # zlib and zstd stop at limit + 1 bytes; brotli may overshoot by one output block.
    assert _bomb_peak(coding_of(case), body, 100_000) < 500_000


@pytest.mark.parametrize("case", CODINGS)
def test_bomb_fed_in_pieces_never_yields_more_than_the_limit(case: str) -> None:
    body = CASES[case](TEXT * 20)  # 2 MB that decodes a little per piece
    d = make_decoder(coding_of(case), 100_000)
    got = 0
    with pytest.raises(UpstreamTooLarge):
        for i in range(0, len(body), 7):
            got += len(d.feed(body[i : i + 7]))
    assert got <= 100_000


class _Recorder:
    """Wraps a library decompressor and adds up every byte it hands back."""

    total = 0

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def decompress(self, data: bytes, max_length: int) -> bytes:
        out: bytes = self._inner.decompress(data, max_length)
        _Recorder.total += len(out)
        return out

    def process(self, data: bytes, output_buffer_limit: int) -> bytes:
        out: bytes = self._inner.process(data, output_buffer_limit=output_buffer_limit)
        _Recorder.total += len(out)
        return out


@pytest.mark.parametrize("coding", sorted(DECODABLE - {"deflate"}))
@pytest.mark.parametrize("limit", [0, 100_000, 500_000])
def test_libraries_are_never_asked_for_much_more_than_the_limit(
    coding: str, limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # White-box: what the libraries decompress, not just what the decoder returns.
    import gateway.decoding as decoding

    _Recorder.total = 0
    if coding == "br":
        real = brotli.Decompressor
        monkeypatch.setattr(brotli, "Decompressor", lambda: _Recorder(real()))
    else:
        new = {"gzip": "_new_gzip", "zstd": "_new_zstd"}[coding]
        real_new = getattr(decoding, new)
        monkeypatch.setattr(decoding, new, lambda: _Recorder(real_new()))
    lead = b"" if coding == "br" else ENCODERS[coding](b"ab")  # gzip, zstd: bomb in member 2
    d = make_decoder(coding, limit)
    with pytest.raises(UpstreamTooLarge):
        d.feed(lead + ENCODERS[coding](bytes(4_000_000)))
    # zlib and zstd: exactly one byte over; brotli caps per output block (< 2 x 64 KiB over).
    slack = 2 * 65_536 if coding == "br" else 1
    assert limit < _Recorder.total <= limit + slack


@pytest.mark.parametrize("case", CODINGS)
@pytest.mark.parametrize("size", [0, 1, 1000, 65_536, 100_000, 300_000])
def test_limit_is_inclusive(case: str, size: int) -> None:
    payload = (TEXT * 100)[:size]
    body = CASES[case](payload)
    assert decode(coding_of(case), [body], limit=size) == payload
    assert decode(coding_of(case), split_at(body, [3, 50, 51, 400]), limit=size) == payload
    if size:
        with pytest.raises(UpstreamTooLarge):
            decode(coding_of(case), [body], limit=size - 1)


def test_limit_counts_across_members_and_feeds() -> None:
    body = gzip_(b"a" * 600) + gzip_(b"b" * 600)
    assert decode("gzip", [body[:30], body[30:]], limit=1200) == b"a" * 600 + b"b" * 600
    with pytest.raises(UpstreamTooLarge):
        decode("gzip", [body[:30], body[30:]], limit=1199)


def test_zstd_window_over_8_mib_is_refused() -> None:
    c = zstd.ZstdCompressor(options={zstd.CompressionParameter.window_log: 25})
    body = c.compress(b"abc" * 100) + c.flush()  # streamed: the header asks for a 32 MiB window
    with pytest.raises(ProtocolError, match="does not decode"):
        decode("zstd", [body])


# --- fail closed


@pytest.mark.parametrize("case", CODINGS)
def test_undecodable_body_is_a_protocol_error(case: str) -> None:
    coding = coding_of(case)
    garbage = b"\xff\xff\xff\xff this is not compressed at all \xff\xff\xff\xff" * 4
    if case == "deflate":  # a valid zlib header, then garbage: fails in the zlib wrapper
        garbage = b"\x78\x9c" + garbage
    with pytest.raises(ProtocolError, match="upstream body does not decode") as info:
        decode(coding, [garbage])
    assert isinstance(info.value.__cause__, LIB_ERRORS[coding])


@pytest.mark.parametrize("case", CODINGS)
def test_every_cut_off_body_is_truncated(case: str) -> None:
    body = CASES[case](TEXT[:3000])
    for cut in range(1, len(body)):
        d = make_decoder(coding_of(case), BIG)
        out = d.feed(body[:cut])
        with pytest.raises(ProtocolError, match="truncated"):
            d.finish()
        assert TEXT.startswith(out)


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_cut_off_second_member_is_truncated(coding: str) -> None:
    body = ENCODERS[coding](b"first") + ENCODERS[coding](b"second")
    d = make_decoder(coding, BIG)
    assert d.feed(body[:-3]).startswith(b"first")
    with pytest.raises(ProtocolError, match="truncated"):
        d.finish()


@pytest.mark.parametrize("case", CODINGS)
@pytest.mark.parametrize("separate", [False, True])
def test_trailing_garbage_is_a_protocol_error(case: str, separate: bool) -> None:
    body = CASES[case](b"hello")
    garbage = b"trailing garbage, not a member"
    pieces = [body, garbage] if separate else [body + garbage]
    with pytest.raises(ProtocolError):
        decode(coding_of(case), pieces)


@pytest.mark.parametrize("case", ["deflate", "deflate-raw", "br"])
def test_single_stream_codings_refuse_a_second_stream(case: str) -> None:
    # gzip and zstd allow members; a deflate or brotli body ends with its one stream.
    first, second = CASES[case](b"first"), CASES[case](b"second")
    with pytest.raises(ProtocolError, match="data after its end"):
        decode(coding_of(case), [first, second])
    with pytest.raises(ProtocolError):
        decode(coding_of(case), [first + second])


@pytest.mark.parametrize("coding", sorted(DECODABLE))
def test_empty_body_is_complete(coding: str) -> None:
    assert make_decoder(coding, 0).finish() == b""
    d = make_decoder(coding, 0)
    assert d.feed(b"") == b""
    assert d.finish() == b""


@pytest.mark.parametrize("coding", sorted(DECODABLE))
def test_empty_content_fits_a_zero_limit(coding: str) -> None:
    assert decode(coding, [ENCODERS[coding](b"")], limit=0) == b""
    with pytest.raises(UpstreamTooLarge):
        decode(coding, [ENCODERS[coding](b"x")], limit=0)


@pytest.mark.parametrize("coding", sorted(DECODABLE))
def test_a_failed_decoder_stays_failed(coding: str) -> None:
    body = ENCODERS[coding](bytes(50_000))
    d = make_decoder(coding, 10)
    with pytest.raises(UpstreamTooLarge):
        d.feed(body)
    with pytest.raises(ProtocolError, match="after a failure"):
        d.feed(b"more")
    with pytest.raises(ProtocolError, match="after a failure"):
        d.finish()

"""Bounded, fail-closed decoding of upstream response bodies (Content-Encoding), sans-io.

`make_decoder(coding, limit)` returns an incremental `Decoder`: `feed(bytes) -> bytes` per piece
of body, `finish() -> bytes` at its end. The bounds exist because a few KB of compressed body can
expand to gigabytes (a "zip bomb"), and because the gateway must never pass a body it could not
read completely:

* output: more than `limit` decoded bytes in total raises `UpstreamTooLarge`, and the work is
  capped too: each library call is asked for the remaining budget plus one byte, so zlib and zstd
  never decompress more than `limit + 1` bytes. Brotli only caps whole output blocks, so its calls
  ask for at most 64 KiB each and it stops within ~100 KB past the limit;
* members: gzip members and zstd frames may follow one another, at most `_MAX_MEMBERS` of them,
  so that a stream of empty members cannot spin;
* zstd windows are limited to 8 MiB (RFC 9659): a tiny frame cannot claim a 128 MiB window;
* completeness: `finish()` on a stream that stopped mid-way, bytes after the end that do not
  start a new member, or bytes that do not decode at all raise `ProtocolError`. An empty body
  (a 204 carrying `content-encoding: gzip`) is complete.

After any error the decoder stays failed: further calls raise `ProtocolError`.
"""

from __future__ import annotations

import sys
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Protocol

from gateway.errors import GatewayError, ProtocolError, UpstreamTooLarge

try:
    import brotli  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - Brotli is a dependency; without it "br" is not offered
    _HAS_BROTLI = False
else:

    def _brotli_is_bounded() -> bool:
        # Brotli < 1.2 has no output_buffer_limit: a bomb could not be stopped, so no "br".
        try:
            brotli.Decompressor().process(b"", output_buffer_limit=1)
        except TypeError:  # pragma: no cover - depends on the installed Brotli
            return False
        return True

    _HAS_BROTLI = _brotli_is_bounded()

try:
    if sys.version_info >= (3, 14):
        from compression import zstd
    else:
        from backports import zstd
except ImportError:  # pragma: no cover - depends on the interpreter and installed packages
    _HAS_ZSTD = False
else:
    _HAS_ZSTD = True

_MAX_MEMBERS = 1000  # gzip members / zstd frames in one body
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_BROTLI_STEP = 64 * 1024  # output asked of one brotli call; it may return up to a block more


class _Stream(Protocol):
    """One member's decompressor: what zlib's decompressobj and zstd's ZstdDecompressor share."""

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...

    def decompress(self, data: bytes, max_length: int, /) -> bytes: ...


class _BrotliStream(Protocol):
    def process(self, data: bytes, output_buffer_limit: int = ...) -> bytes: ...

    def is_finished(self) -> bool: ...


class Decoder(ABC):
    """An incremental decoder for one body. Library errors become `ProtocolError` here."""

    __slots__ = ("_errors", "_failed", "_left", "_limit")

    def __init__(self, limit: int, errors: tuple[type[Exception], ...]) -> None:
        if limit < 0:
            raise ValueError(f"limit must not be negative: {limit}")
        self._limit = limit
        self._left = limit  # decoded bytes still allowed
        self._errors = errors  # what the library raises on data that does not decode
        self._failed = False

    def feed(self, data: bytes) -> bytes:
        """The decoded bytes for `data`; often b"" while the library buffers input."""
        if self._failed:
            raise ProtocolError("upstream body decoder used after a failure")
        if not data:
            return b""
        try:
            return self._decode(data)
        except GatewayError:
            self._failed = True
            raise
        except self._errors as exc:
            self._failed = True
            raise ProtocolError(f"upstream body does not decode ({type(exc).__name__})") from exc

    def finish(self) -> bytes:
        """The rest of the output at the end of the body; `ProtocolError` if it was cut short."""
        if self._failed:
            raise ProtocolError("upstream body decoder used after a failure")
        try:
            return self._end()
        except GatewayError:
            self._failed = True
            raise

    @abstractmethod
    def _decode(self, data: bytes) -> bytes: ...

    @abstractmethod
    def _end(self) -> bytes: ...

    def _take(self, out: bytes) -> bytes:
        n = len(out)
        if n > self._left:
            raise UpstreamTooLarge(f"upstream body over {self._limit} bytes decoded")
        self._left -= n
        return out


class _Members(Decoder):
    """gzip, deflate and zstd: a fresh decompressor per member (gzip member, zstd frame)."""

    __slots__ = ("_d", "_many", "_members", "_new")

    def __init__(
        self,
        limit: int,
        errors: tuple[type[Exception], ...],
        new: Callable[[], _Stream] | None,
        many: bool,
    ) -> None:
        super().__init__(limit, errors)
        self._new = new  # None until deflate has seen its first two bytes
        self._many = many  # may a new member follow the end of one
        self._d: _Stream | None = None  # created by the first non-empty feed
        self._members = 1

    def _decode(self, data: bytes) -> bytes:
        d = self._d
        if d is None:
            assert self._new is not None
            d = self._d = self._new()
        elif d.eof:
            d = self._next_member()
        # Asking for one byte more than the budget is what detects "over": a short answer means
        # the input was used up (zlib and zstd stop early only when the output is full).
        out = self._take(d.decompress(data, self._left + 1))
        if d.eof and d.unused_data:
            return self._more_members(out, d.unused_data)
        return out

    def _more_members(self, out: bytes, data: bytes) -> bytes:
        parts = [out]
        while True:
            d = self._next_member()
            parts.append(self._take(d.decompress(data, self._left + 1)))
            if not (d.eof and d.unused_data):
                return b"".join(parts)
            data = d.unused_data

    def _next_member(self) -> _Stream:
        if not self._many:
            raise ProtocolError("upstream body has data after its end")
        if self._members >= _MAX_MEMBERS:
            raise ProtocolError(f"upstream body has more than {_MAX_MEMBERS} members")
        self._members += 1
        assert self._new is not None
        d = self._d = self._new()
        return d

    def _end(self) -> bytes:
        if self._d is not None and not self._d.eof:
            raise ProtocolError("upstream body is truncated")
        return b""


class _Deflate(_Members):
    """RFC 9110 deflate is zlib-wrapped, but many servers send raw deflate: the header decides."""

    __slots__ = ("_head",)

    def __init__(self, limit: int) -> None:
        super().__init__(limit, (zlib.error,), None, many=False)
        self._head = b""  # a first byte, held until the second one arrives

    def _decode(self, data: bytes) -> bytes:
        if self._new is None:
            if self._head:
                data = self._head + data
            if len(data) < 2:
                self._head = data
                return b""
            self._head = b""
            b0, b1 = data[0], data[1]
            wrapped = (b0 & 0x0F) == 8 and (b0 << 8 | b1) % 31 == 0
            self._new = partial(zlib.decompressobj, zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        return super()._decode(data)

    def _end(self) -> bytes:
        if self._head:
            raise ProtocolError("upstream body is truncated")
        return super()._end()


class _Brotli(Decoder):
    """Brotli: one stream, no members; `output_buffer_limit` caps each call per output block."""

    __slots__ = ("_d",)

    def __init__(self, limit: int) -> None:
        super().__init__(limit, (brotli.error,))
        self._d: _BrotliStream | None = None

    def _decode(self, data: bytes) -> bytes:
        d = self._d
        if d is None:
            d = self._d = brotli.Decompressor()
        elif d.is_finished():
            raise ProtocolError("upstream body has data after its end")
        step = min(self._left + 1, _BROTLI_STEP)
        out = self._take(d.process(data, output_buffer_limit=step))
        if len(out) < step:  # the call was not stopped by the cap: all input used, all output out
            return out
        parts = [out]
        while len(out) >= step and not d.is_finished():
            step = min(self._left + 1, _BROTLI_STEP)
            out = self._take(d.process(b"", output_buffer_limit=step))
            parts.append(out)
        return b"".join(parts)

    def _end(self) -> bytes:
        if self._d is not None and not self._d.is_finished():
            raise ProtocolError("upstream body is truncated")
        return b""


_new_gzip = partial(zlib.decompressobj, _GZIP_WBITS)


def _gzip(limit: int) -> Decoder:
    return _Members(limit, (zlib.error,), _new_gzip, many=True)


_FACTORIES: dict[str, Callable[[int], Decoder]] = {"gzip": _gzip, "deflate": _Deflate}

if _HAS_BROTLI:
    _FACTORIES["br"] = _Brotli

if _HAS_ZSTD:
    # 2**23 = 8 MiB, the largest window RFC 9659 lets a zstd content-coding use.
    _ZSTD_OPTIONS: dict[int, int] = {zstd.DecompressionParameter.window_log_max: 23}
    _new_zstd = partial(zstd.ZstdDecompressor, options=_ZSTD_OPTIONS)

    def _zstd(limit: int) -> Decoder:
        return _Members(limit, (zstd.ZstdError,), _new_zstd, many=True)

    _FACTORIES["zstd"] = _zstd

DECODABLE: frozenset[str] = frozenset(_FACTORIES)
ACCEPT_ENCODING: str = ", ".join(_FACTORIES)  # insertion order: gzip, deflate, br, zstd


def make_decoder(coding: str, limit: int) -> Decoder:
    """A decoder for one body in `coding` (a lower-case token of DECODABLE), at most `limit`
    decoded bytes. ValueError for any other coding."""
    try:
        factory = _FACTORIES[coding]
    except KeyError:
        raise ValueError(f"not a decodable content-coding: {coding!r}") from None
    return factory(limit)

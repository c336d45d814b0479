"""The upstream HTTP client (aiohttp, chosen by measurement: docs/benchmarks.md), header hygiene
and error mapping. The only module that imports aiohttp.

Callers see only `gateway.errors`; every aiohttp / asyncio / OS exception is translated at one
boundary, `_map_errors`:

    asyncio / aiohttp timeouts (connect, read, total)        -> UpstreamTimeout       504
    refused, DNS, TLS, proxy, reset or closed (before the
      response, or mid-body: the answer was cut short)       -> UpstreamConnectError  502
    a body that arrived but does not decode (content-
      encoding errors), or a malformed HTTP response         -> ProtocolError         502
    more than `Limits.max_response_bytes` of decoded body    -> UpstreamTooLarge      502

Bodies are decoded (gzip, deflate, and br / zstd when their decoders are installed) before the
caller sees them; `Accept-Encoding` asks the upstream for exactly those. Redirects are never
followed: a proxy relays them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import http_exceptions
from yarl import URL

from gateway.errors import (
    GatewayError,
    ProtocolError,
    UpstreamConnectError,
    UpstreamTimeout,
    UpstreamTooLarge,
)

try:
    from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
except ImportError:  # pragma: no cover - older aiohttp: no br / zstd support at all
    HAS_BROTLI = HAS_ZSTD = False

Headers = list[tuple[str, str]]

# What aiohttp decodes (http_parser: exactly these tokens, one layer) and what we may ask for.
_DECODABLE = frozenset({"gzip", "deflate", "br", "zstd"})
ACCEPT_ENCODING = ", ".join(
    ["gzip", "deflate"] + (["br"] if HAS_BROTLI else []) + (["zstd"] if HAS_ZSTD else [])
)

# RFC 9110 §7.6.1 connection-specific fields, plus the de-facto ones proxies also strip.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
)
# Recomputed or replaced by the gateway on the way up.
_REQUEST_DROP = _HOP_BY_HOP | {"host", "content-length", "accept-encoding"}
_CLIENT_UNTRUSTED_PREFIX = "x-citewarden-"


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 10.0  # TCP (+TLS) connect
    read: float = 60.0  # between two reads from the socket; keeps slow SSE alive
    total: float = 300.0  # one whole exchange, body and stream included


@dataclass(frozen=True, slots=True)
class Limits:
    max_response_bytes: int = 16 * 1024 * 1024  # decoded bytes; streams count cumulatively
    pool_size: int = 256  # connections kept to the upstream


@dataclass(frozen=True, slots=True)
class UpstreamResponse:
    status: int
    headers: Headers  # as the upstream sent them; pass through `response_headers` to relay
    body: bytes  # decoded unless `content_encoding` names a coding we did not undo
    decoded: bool = False  # the upstream's content-encoding was removed from `body`
    content_encoding: str | None = None  # a coding still applied to `body` (None: plain bytes)


# -------------------------------------------------------------------------- header hygiene


def _str(x: str | bytes) -> str:
    return x.decode("latin-1") if isinstance(x, bytes) else x


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    return {
        tok.strip().lower()
        for name, value in headers
        if name == "connection"
        for tok in value.split(",")
        if tok.strip()
    }


def forward_request_headers(
    client_headers: Iterable[tuple[str | bytes, str | bytes]], request_id: str | None = None
) -> Headers:
    """The client's headers as they go upstream (names lower-cased).

    Dropped: hop-by-hop fields and any the client's `Connection` names, `proxy-*`, `host` and
    `content-length` (the client library recomputes them), `accept-encoding` (replaced by what
    the gateway can decode), and every `x-citewarden-*` field — the client must not be able to
    plant context or decisions. Everything else, `authorization`, `x-api-key`, `traceparent`,
    `tracestate`, `anthropic-*`, `openai-*` included, passes. `request_id`, when given, is sent
    as `x-request-id` in place of the client's.
    """
    pairs = [(_str(k).lower(), _str(v)) for k, v in client_headers]
    named = _connection_tokens(pairs)
    out = [
        (k, v)
        for k, v in pairs
        if k not in _REQUEST_DROP
        and k not in named
        and not k.startswith("proxy-")
        and not k.startswith(_CLIENT_UNTRUSTED_PREFIX)
        and not (request_id is not None and k == "x-request-id")
    ]
    out.append(("accept-encoding", ACCEPT_ENCODING))
    if request_id is not None:
        out.append(("x-request-id", request_id))
    return out


def response_headers(upstream_headers: Iterable[tuple[str, str]], decoded: bool) -> Headers:
    """The upstream's headers as they may go to the client (names lower-cased).

    Dropped: hop-by-hop fields and any the upstream's `Connection` names, `proxy-*`,
    `content-length` (the body may change; the server recomputes it), and `content-encoding`
    when `decoded` — the body the gateway holds is no longer encoded.
    """
    pairs = [(k.lower(), v) for k, v in upstream_headers]
    named = _connection_tokens(pairs)
    return [
        (k, v)
        for k, v in pairs
        if k not in _HOP_BY_HOP
        and k not in named
        and k != "content-length"
        and not (decoded and k == "content-encoding")
        and not k.startswith("proxy-")
    ]


# ---------------------------------------------------------------------------- error mapping


def _cut_short(exc: BaseException) -> bool:
    """A payload error whose cause is not a decoding failure: the connection ended early."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(
            cause, http_exceptions.ContentEncodingError | http_exceptions.DecompressSizeError
        ):
            return False
        cause = cause.__cause__ or cause.__context__
    return True


def _describe(exc: BaseException) -> str:
    # Formatting must never fail on the error path (some aiohttp errors format from fields).
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _map_exception(exc: BaseException) -> GatewayError | None:
    """The gateway error for a foreign exception; None for one that is not an upstream failure
    (a bug, or cancellation), which must propagate unchanged. Order matters: aiohttp's timeout
    classes are also OSError / ClientConnectionError subclasses."""
    if isinstance(exc, GatewayError):
        return exc
    # asyncio.TimeoutError is TimeoutError (3.11+); aiohttp's ServerTimeoutError family is both.
    if isinstance(exc, TimeoutError):
        return UpstreamTimeout(f"upstream timed out: {_describe(exc)}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        if _cut_short(exc):
            return UpstreamConnectError(f"upstream body cut short: {_describe(exc)}")
        return ProtocolError(f"upstream body does not decode: {_describe(exc)}")
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        return UpstreamConnectError(f"proxy refused the upstream connection: {_describe(exc)}")
    if isinstance(exc, aiohttp.ClientResponseError | http_exceptions.HttpProcessingError):
        return ProtocolError(f"malformed upstream response: {_describe(exc)}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamConnectError(f"upstream unreachable: {_describe(exc)}")
    return None


@contextmanager
def _map_errors() -> Iterator[None]:
    try:
        yield
    except GatewayError:
        raise
    except Exception as exc:
        mapped = _map_exception(exc)
        if mapped is None:
            raise
        raise mapped from exc


# ---------------------------------------------------------------------------------- client


def _encoding(resp: aiohttp.ClientResponse) -> tuple[bool, str | None]:
    """(decoded, residual coding) for a response, mirroring aiohttp's auto-decompress rule."""
    enc = resp.headers.get("content-encoding", "").lower()
    if enc in _DECODABLE:
        return True, None
    if enc in ("", "identity"):
        return False, None
    return False, enc


class UpstreamStream:
    """An open upstream response: status and headers now, decoded body bytes as they arrive."""

    __slots__ = ("_limit", "_resp", "content_encoding", "decoded", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, limit: int) -> None:
        self._resp = resp
        self._limit = limit
        self.status = resp.status
        self.headers: Headers = list(resp.headers.items())
        self.decoded, self.content_encoding = _encoding(resp)

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """Decoded chunks as soon as they arrive; UpstreamTooLarge once the total passes the
        limit, before the offending chunk is handed out."""
        content = self._resp.content
        total = 0
        while True:
            # `_map_errors` inlined: this runs once per chunk of every stream.
            try:
                chunk = await content.readany()
            except Exception as exc:
                mapped = _map_exception(exc)
                if mapped is None or mapped is exc:
                    raise
                raise mapped from exc
            if not chunk:
                return
            total += len(chunk)
            if total > self._limit:
                raise UpstreamTooLarge(f"upstream body over {self._limit} bytes")
            yield chunk

    async def read(self) -> bytes:
        """The whole (remaining) body, bounded by the limit while it is read."""
        resp = self._resp
        length = resp.content_length
        if length is not None and not self.decoded and self.content_encoding is None:
            # Plain body of declared size: refuse before reading, else one read (fast path).
            if length > self._limit:
                raise UpstreamTooLarge(f"upstream body of {length} bytes over {self._limit}")
            with _map_errors():
                return await resp.read()
        return b"".join([chunk async for chunk in self.iter_bytes()])


class Upstream:
    """One pooled aiohttp session per gateway, created lazily inside the running loop."""

    def __init__(
        self, base_url: str, timeouts: Timeouts | None = None, limits: Limits | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or Timeouts()
        self.limits = limits or Limits()
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            t = self.timeouts
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.limits.pool_size, ttl_dns_cache=60),
                # `connect` in aiohttp would also cover waiting for a pooled connection; only the
                # socket connect is bounded by it, the pool wait falls under `total`.
                timeout=aiohttp.ClientTimeout(
                    total=t.total, sock_connect=t.connect, sock_read=t.read
                ),
                auto_decompress=True,
                # One session serves every client: a cookie the upstream sets is relayed to
                # the client it was meant for, never kept and replayed on others' requests.
                cookie_jar=aiohttp.DummyCookieJar(),
                # The client's own User-Agent is forwarded; don't add aiohttp's.
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def _open(
        self, method: str, path_qs: str, headers: Headers, body: bytes
    ) -> aiohttp.ClientResponse:
        # encoded=True: the client's path and query go upstream byte for byte.
        url = URL(self.base_url + path_qs, encoded=True)
        with _map_errors():
            return await self._get_session().request(
                method, url, headers=headers, data=body or None, allow_redirects=False
            )

    async def request(
        self, method: str, path_qs: str, headers: Headers, body: bytes
    ) -> UpstreamResponse:
        """One exchange, the decoded body read whole (bounded by `max_response_bytes`)."""
        resp = await self._open(method, path_qs, headers, body)
        try:
            s = UpstreamStream(resp, self.limits.max_response_bytes)
            data = await s.read()
        except BaseException:
            resp.close()  # a half-read connection must not go back to the pool
            raise
        resp.release()
        return UpstreamResponse(s.status, s.headers, data, s.decoded, s.content_encoding)

    @asynccontextmanager
    async def stream(
        self, method: str, path_qs: str, headers: Headers, body: bytes
    ) -> AsyncIterator[UpstreamStream]:
        """The response as it arrives; the connection is released (or, if the body was not
        read to the end, closed) when the block exits."""
        resp = await self._open(method, path_qs, headers, body)
        try:
            yield UpstreamStream(resp, self.limits.max_response_bytes)
        finally:
            if resp.content.at_eof():
                resp.release()
            else:
                resp.close()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

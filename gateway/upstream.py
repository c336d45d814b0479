"""The upstream client's face to the gateway: `Upstream` (one exchange at a time, whole or
streamed), header hygiene in both directions. The HTTP/1.1 client itself is `gateway.http1`,
chosen by measurement over aiohttp and httpx (docs/benchmarks.md, "client choice").

Callers see only `gateway.errors`, raised where each failure is detected:

    connect, read and total timeouts                             -> UpstreamTimeout       504
    refused, DNS, TLS ("upstream TLS failure: <class>"), a proxy
      that refused its tunnel, reset or closed (before the
      response, or mid-body: the answer was cut short)            -> UpstreamConnectError  502
    a body that arrived but does not decode (content-encoding
      errors), a malformed HTTP response, an HTTP/2-only upstream -> ProtocolError         502
    more than `Limits.max_response_bytes` of decoded body         -> UpstreamTooLarge      502

Connections follow `gateway.upstream_tls.UpstreamNetwork` (proxy variables, CA bundle, client
certificate; by default the proxy variables of the process's environment). A query string in
the base URL (`?api-version=…`) is added to every request that does not carry its parameters.

Bodies are decoded (gzip, deflate, and br / zstd when their decoders are installed) before the
caller sees them; `Accept-Encoding` asks the upstream for exactly those. Redirects are never
followed: a proxy relays them. Cookies are never kept: an answer's cookies go to its own
client only.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from gateway.decoding import ACCEPT_ENCODING, DECODABLE
from gateway.http1 import Connection, Headers, Pool, with_body
from gateway.upstream_tls import UpstreamNetwork

__all__ = [
    "ACCEPT_ENCODING",
    "Headers",
    "Limits",
    "Timeouts",
    "Upstream",
    "UpstreamResponse",
    "UpstreamStream",
    "forward_request_headers",
    "response_headers",
    "verified_response_headers",
]

# RFC 9110 §7.6.1 connection-specific fields, plus the de-facto ones proxies also strip.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
)
# Recomputed or replaced by the gateway on the way up.
_REQUEST_DROP = _HOP_BY_HOP | {"host", "content-length", "accept-encoding"}
# The gateway's own header names: never taken from a client, never relayed from an upstream.
_OWN_PREFIX = "x-citewarden-"
# Methods whose empty body is sent without a content-length (RFC 9110 §8.6).
_BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "CONNECT", "TRACE"})


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
        # `x_citewarden_context` too: CGI-style stacks read `_` and `-` in a name alike.
        and not k.replace("_", "-").startswith(_OWN_PREFIX)
        and not (request_id is not None and k == "x-request-id")
    ]
    out.append(("accept-encoding", ACCEPT_ENCODING))
    if request_id is not None:
        out.append(("x-request-id", request_id))
    return out


def response_headers(upstream_headers: Iterable[tuple[str, str]], decoded: bool) -> Headers:
    """The upstream's headers as they may go to the client (names lower-cased).

    Dropped: hop-by-hop fields and any the upstream's `Connection` names, `proxy-*`,
    `content-length` (the body may change; the server recomputes it), `content-encoding`
    when `decoded` — the body the gateway holds is no longer encoded — and `x-citewarden-*`:
    a decision or policy header is the gateway's word, never the upstream's (a passthrough
    answer that said `released` would pass for a verified one).
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
        and not k.replace("_", "-").startswith(_OWN_PREFIX)
    ]


# What a verified route relays of the upstream's headers (DESIGN §7), each value in the shape
# its field has: a value that is not (free text, a second token) could carry answer text past
# verification, so it is dropped with its field.
# A provider's request id: `req_011CSLsW7mFqvHHnzrKdKjAE`, `req-upstream-123`, a UUID. At
# most three parts, so that no dotted or hyphen-joined sentence passes for one.
_ID = re.compile(
    r"(?=[A-Za-z0-9._:-]{1,128}$)(?:[A-Za-z0-9]+[._:-]){0,2}[A-Za-z0-9]+"
    r"|(?:[A-Za-z]{1,16}[_-])?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}"
    r"-[0-9a-fA-F]{12}"
)
_NUMBER = re.compile(r"\d{1,12}(?:\.\d{1,6})?")
_HTTP_DATE = r"[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT"
_RETRY_AFTER = re.compile(rf"\d{{1,10}}|{_HTTP_DATE}")
_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_RATE_LIMIT_FAMILY = re.compile(r"(?:x-ratelimit|anthropic-ratelimit)-([a-z0-9_-]{1,64})")
# A rate-limit header's name and value are upstream text too: the name's words come from the
# providers' vocabulary (`x-ratelimit-remaining-tokens_usage_based`,
# `anthropic-ratelimit-unified-5h-status`), so no sentence rides on a name; a value is a
# number, a duration (`6m0s`), a date, or one of the providers' status words.
_RATE_LIMIT_WORDS = frozenset({
    "limit", "limits", "remaining", "reset", "resets", "requests", "request", "req", "tokens",
    "token", "input", "output", "usage", "based", "unified", "status", "fallback", "percentage",
    "representative", "claim", "overage", "utilization", "priority", "batch", "project", "org",
    "organization", "images", "image", "audio", "day", "hour", "minute", "second", "month",
    "week", "5h", "7d", "1h", "1m", "1d", "per",
})
_RATE_LIMIT_VALUE = re.compile(
    r"\d{1,16}(?:\.\d{1,6})?"
    r"|(?:\d{1,6}(?:\.\d{1,6})?(?:ms|us|h|m|s)){1,4}"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?(?:Z|[+-]\d{2}:\d{2})"
    rf"|{_HTTP_DATE}"
    r"|allowed|allowed_warning|rejected|true|false"
    r"|five_hour|seven_day(?:_opus|_sonnet)?|overage"
)
# name -> (name relayed, value shape). The provider's x-request-id would collide with the
# gateway's own; Anthropic's request-id does not.
_VERIFIED_ALLOW: dict[str, tuple[str, re.Pattern[str]]] = {
    "retry-after": ("retry-after", _RETRY_AFTER),
    "retry-after-ms": ("retry-after-ms", _NUMBER),
    "x-request-id": ("x-upstream-request-id", _ID),
    "request-id": ("request-id", _ID),
    "openai-processing-ms": ("openai-processing-ms", _NUMBER),
    "traceparent": ("traceparent", _TRACEPARENT),
}


def verified_response_headers(upstream_headers: Iterable[tuple[str, str]]) -> Headers:
    """The upstream's headers as a verified route may relay them (names lower-cased): the
    allow-list of DESIGN §7 — `retry-after` (and `retry-after-ms`), the `x-ratelimit-*` /
    `anthropic-ratelimit-*` families, the provider's request id (`x-request-id` relayed as
    `x-upstream-request-id`, `request-id` as is), `openai-processing-ms`, `traceparent` — and
    only values of the field's shape. Everything else is dropped. `content-type` is the
    gateway's own: it writes the type of the body it sends."""
    out: Headers = []
    for name, value in upstream_headers:
        lname = name.lower()
        allowed = _VERIFIED_ALLOW.get(lname)
        if allowed is None:
            family = _RATE_LIMIT_FAMILY.fullmatch(lname)
            if family is None or not _RATE_LIMIT_WORDS.issuperset(
                re.split(r"[-_]", family.group(1))
            ):
                continue
            allowed = (lname, _RATE_LIMIT_VALUE)
        relayed, shape = allowed
        value = value.strip(" \t")
        if shape.fullmatch(value):
            out.append((relayed, value))
    return out


# ---------------------------------------------------------------------------------- client


def _encoding(coding: str) -> tuple[bool, str | None]:
    """(decoded, residual coding) for a response's content-encoding token."""
    if coding in DECODABLE:
        return True, None
    if coding in ("", "identity"):
        return False, None
    return False, coding


class UpstreamStream:
    """An open upstream response: status and headers now, decoded body bytes as they arrive."""

    __slots__ = ("_conn", "content_encoding", "decoded", "headers", "status")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.status = conn.status
        self.headers: Headers = conn.headers
        self.decoded, self.content_encoding = _encoding(conn.coding)

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """Decoded chunks as soon as they arrive; UpstreamTooLarge once the total passes the
        limit, before the offending chunk is handed out."""
        next_chunk = self._conn.next_chunk
        while chunk := await next_chunk():
            yield chunk

    async def read(self) -> bytes:
        """The whole (remaining) body, bounded by the limit while it is read."""
        return await self._conn.read_all()


def open_pool(
    base_url: str, timeouts: Timeouts, limits: Limits, network: UpstreamNetwork | None = None
) -> Pool:
    """A keep-alive pool to `base_url` with these timeouts and limits; `network` (proxy, CA
    bundle, client certificate) defaults to the process's proxy variables. The upstream client
    and the judge's each keep one."""
    return Pool(
        base_url.rstrip("/"),
        size=limits.pool_size,
        limit=limits.max_response_bytes,
        connect=timeouts.connect,
        read=timeouts.read,
        total=timeouts.total,
        network=network if network is not None else UpstreamNetwork.from_env(),
    )


class Upstream:
    """The gateway's client to its one upstream: a keep-alive pool, bound to the running loop."""

    def __init__(
        self,
        base_url: str,
        timeouts: Timeouts | None = None,
        limits: Limits | None = None,
        network: UpstreamNetwork | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeouts = timeouts or Timeouts()
        self.limits = limits or Limits()
        self._pool = open_pool(self.base_url, self.timeouts, self.limits, network)

    def _encode(self, method: str, path_qs: str, headers: Headers, body: bytes) -> bytes:
        """The request as it goes on the wire: the client's path and query byte for byte."""
        if body or method not in _BODILESS_METHODS:
            return with_body(self._pool.request_head(method, path_qs, headers), body)
        return self._pool.request_head(method, path_qs, headers, body=False)

    async def _open(
        self, method: str, path_qs: str, headers: Headers, body: bytes,
        meanwhile: Callable[[], object] | None,
    ) -> Connection:
        """A connection whose exchange has its final response head in."""
        request = self._encode(method, path_qs, headers, body)
        deadline = asyncio.get_running_loop().time() + self.timeouts.total
        # A reused keep-alive connection the upstream closed as the request went out is
        # retried once on a fresh one (DESIGN §11): the pool's `exchange` does it.
        return await self._pool.exchange(request, deadline, is_head=method == "HEAD",
                                         meanwhile=meanwhile)

    async def request(
        self, method: str, path_qs: str, headers: Headers, body: bytes,
        meanwhile: Callable[[], object] | None = None,
    ) -> UpstreamResponse:
        """One exchange, the decoded body read whole (bounded by `max_response_bytes`).
        `meanwhile` runs once the request is written, while the upstream answers."""
        conn = await self._open(method, path_qs, headers, body, meanwhile)
        try:
            data = await conn.read_all()
        finally:
            conn.finish()  # pooled if read to the end on a keep-alive connection, else closed
        decoded, residual = _encoding(conn.coding)
        return UpstreamResponse(conn.status, conn.headers, data, decoded, residual)

    @asynccontextmanager
    async def stream(
        self, method: str, path_qs: str, headers: Headers, body: bytes,
        meanwhile: Callable[[], object] | None = None,
    ) -> AsyncIterator[UpstreamStream]:
        """The response as it arrives; the connection is pooled (or, if the body was not read
        to the end, closed) when the block exits. `meanwhile` runs once the request is
        written, while the upstream answers."""
        conn = await self._open(method, path_qs, headers, body, meanwhile)
        if conn.error is not None:
            # The answer failed with its head (a body that does not decode, bad framing): the
            # caller learns it before it starts relaying, while a clean error can still be sent.
            conn.finish()
            raise conn.error
        try:
            yield UpstreamStream(conn)
        finally:
            conn.finish()

    @property
    def proxy(self) -> str | None:
        """The forward proxy connections go through (host and port, never credentials)."""
        return str(self._pool.proxy) if self._pool.proxy is not None else None

    async def aclose(self) -> None:
        """Close the idle connections; busy ones close as their exchanges end."""
        self._pool.close_idle()

"""The gateway's own failures. Small on purpose; foreign errors are mapped at one boundary.

    GatewayError                 status  kind (the audit line's reason)
    ├── PolicyError            invalid policy file (file, line, reason) — exit 2 at start-up
    ├── InputError             400  invalid_request_error   bad client or CLI input
    │   └── BodyTooLarge       413  request_too_large       client body over the limit
    ├── ProtocolError          502  bad_upstream_answer     an upstream head, body or stream
    │                                                       that does not parse or decode
    ├── UpstreamError          502  upstream_error          the upstream could not be used
    │   ├── UpstreamTimeout    504  upstream_timeout
    │   ├── UpstreamConnectError  502  upstream_error
    │   └── UpstreamTooLarge   502  upstream_too_large
    └── InternalError          502  internal_error          anything else, caught by the
                                                            last-resort guard of the proxy app

`map_exception` is the one translation of foreign exceptions (httptools, zlib / brotli /
zstd, orjson / json, UnicodeDecodeError, RecursionError, OSError / ssl, TimeoutError, ...)
into that tree, as httpx's `map_httpcore_exceptions` is; tests/test_boundary.py proves the
table complete. A gateway error's message is written by the gateway and names the problem;
it never quotes upstream content (a body, a header value, a parser's excerpt of either), so
it can go to the client and the log as it is. A foreign exception's own text is never used.
"""

from __future__ import annotations

import json
import ssl
import zlib
from collections.abc import Callable

import httptools
import orjson


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""

    status = 502  # never a bare 500: an unclassified gateway failure is a failed exchange
    kind = "internal_error"


class PolicyError(GatewayError):
    def __init__(self, file: str, line: int | None, message: str) -> None:
        self.file = file
        self.line = line
        self.message = message
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {message}")


class InputError(GatewayError):
    status = 400
    kind = "invalid_request_error"


class BodyTooLarge(InputError):
    status = 413
    kind = "request_too_large"


class ProtocolError(GatewayError):
    status = 502
    kind = "bad_upstream_answer"


class UpstreamError(GatewayError):
    status = 502
    kind = "upstream_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    kind = "upstream_timeout"


class UpstreamConnectError(UpstreamError):
    status = 502


class UpstreamTooLarge(UpstreamError):
    status = 502
    kind = "upstream_too_large"


class InternalError(GatewayError):
    """An exception nobody mapped: a bug, answered as a failed exchange, never a bare 500."""

    status = 502
    kind = "internal_error"


# ------------------------------------------------------------------------------ the boundary


def _decoders() -> tuple[type[Exception], ...]:
    """The exception classes of the content-coding libraries that are installed."""
    found: list[type[Exception]] = [zlib.error]
    try:
        import brotli  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - Brotli is a dependency
        pass
    else:
        found.append(brotli.error)
    try:
        from backports import zstd
    except ImportError:  # pragma: no cover - depends on the interpreter
        pass
    else:
        found.append(zstd.ZstdError)
    return tuple(found)


def _tls(exc: BaseException) -> GatewayError:
    # The library's reason is a fixed OpenSSL token (CERTIFICATE_VERIFY_FAILED), never peer data.
    reason = getattr(exc, "reason", None)
    named = reason if isinstance(reason, str) and reason.replace("_", "").isalnum() else None
    return UpstreamConnectError(
        "upstream TLS failure" + (f" ({named})" if named else f" ({type(exc).__name__})")
    )


def _fixed(cls: type[GatewayError], message: str) -> Callable[[BaseException], GatewayError]:
    def make(exc: BaseException) -> GatewayError:
        return cls(message)

    return make


# First match wins: subclasses before their bases (TimeoutError and SSLError are OSErrors,
# UnicodeDecodeError and the JSON errors are ValueErrors).
_Make = Callable[[BaseException], GatewayError]
_MAP: tuple[tuple[tuple[type[BaseException], ...], _Make], ...] = (
    ((TimeoutError,), _fixed(UpstreamTimeout, "upstream timed out")),
    ((ssl.SSLError, ssl.CertificateError), _tls),
    ((EOFError,), _fixed(UpstreamConnectError, "upstream closed the connection early")),
    ((OSError,), _fixed(UpstreamConnectError, "upstream connection failed")),
    ((httptools.HttpParserUpgrade,), _fixed(ProtocolError, "malformed upstream response: it "
                                                           "switched protocols")),
    ((httptools.HttpParserError,), _fixed(ProtocolError, "malformed upstream response")),
    (_decoders(), _fixed(ProtocolError, "upstream body does not decode")),
    ((RecursionError,), _fixed(ProtocolError, "upstream answer is nested too deeply")),
    ((UnicodeError,), _fixed(ProtocolError, "upstream answer is not valid UTF-8")),
    ((orjson.JSONDecodeError, json.JSONDecodeError),
     _fixed(ProtocolError, "upstream answer is not valid JSON")),
    ((ValueError,), _fixed(ProtocolError, "upstream answer is unusable")),
)


def map_exception(exc: BaseException) -> GatewayError:
    """The gateway error for `exc`: itself when it is one, else its mapping (the original is
    kept as `__cause__`, for a debugger, never for a message). Unknown kinds are an
    `InternalError`."""
    if isinstance(exc, GatewayError):
        return exc
    for kinds, make in _MAP:
        if isinstance(exc, kinds):
            err = make(exc)
            break
    else:
        err = InternalError("the gateway failed while handling this exchange")
    err.__cause__ = exc
    return err


def is_mapped(cls: type[BaseException]) -> bool:
    """Whether a foreign exception class has its own entry (is not an InternalError)."""
    return issubclass(cls, GatewayError) or any(issubclass(cls, kinds) for kinds, _ in _MAP)

"""The gateway's own failures. Small on purpose; foreign errors are mapped at one boundary.

    GatewayError
    ├── PolicyError            invalid policy file (file, line, reason) — exit 2 at start-up
    ├── InputError             bad client or CLI input (invalid JSON, …) — 400 / exit 2
    │   └── BodyTooLarge       client body over the limit — 413
    ├── ProtocolError          an upstream body or stream that does not parse — 502
    └── UpstreamError          the upstream could not be used (see gateway.upstream)
        ├── UpstreamTimeout    504
        ├── UpstreamConnectError  502
        └── UpstreamTooLarge   502
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class PolicyError(GatewayError):
    def __init__(self, file: str, line: int | None, message: str) -> None:
        self.file = file
        self.line = line
        self.message = message
        where = f"{file}:{line}" if line is not None else file
        super().__init__(f"{where}: {message}")


class InputError(GatewayError):
    pass


class BodyTooLarge(InputError):
    pass


class ProtocolError(GatewayError):
    pass


class UpstreamError(GatewayError):
    status = 502


class UpstreamTimeout(UpstreamError):
    status = 504


class UpstreamConnectError(UpstreamError):
    status = 502


class UpstreamTooLarge(UpstreamError):
    status = 502

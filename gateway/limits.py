"""The proxy port's HTTP/1.1 protocol: uvicorn's httptools protocol with the limits against slow
and huge clients that it lacks (DESIGN §7), as a small subclass.

Why a subclass: llhttp (via httptools) has no limit on a request head's size and uvicorn none on
the time a head may take, or on a connection that never sends a byte; both live below the ASGI
app, which sees a request only once its head is complete. An ASGI middleware cannot help, and
a second parser in front of httptools would parse every head twice. The subclass counts head
bytes as they arrive and keeps one timer per connection, armed only while a head is awaited:

    head over `max_head_bytes`                    -> 431, connection closed   (audited)
    head not complete `head_timeout` s after the
      connection opened or its first byte         -> 408 if a byte came, else closed (audited)
    a request on connection `max_connections` + 1 -> 503, connection closed   (audited)
    idle keep-alive                               -> closed after uvicorn's timeout_keep_alive

Refusals are the gateway's JSON error with `connection: close`, counted as `refused` on the
`unrouted` route, and audited like the proxy's own refusals.

The protocol also tells the app when its client hangs up: each request's scope carries the
connection's `Hangup` under `scope["extensions"][HANGUP]`, whose callbacks run when the
connection is lost. A watcher task per request awaiting `http.disconnect` does the same at
the cost of a task, an event and a few loop turns per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway import audit
from gateway.metrics import Metrics

MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT = 10.0
KEEP_ALIVE_TIMEOUT = 5.0
LIMIT_CONCURRENCY = 4096
HANGUP = "citewarden.hangup"


class Hangup:
    """One connection's hang-up: the callbacks of the exchanges to cancel when its client goes
    away. A callback registered after the hang-up runs at once."""

    __slots__ = ("_callbacks", "gone")

    def __init__(self) -> None:
        self.gone = False
        self._callbacks: set[Callable[[], None]] = set()

    def watch(self, callback: Callable[[], None]) -> None:
        if self.gone:
            callback()
        else:
            self._callbacks.add(callback)

    def unwatch(self, callback: Callable[[], None]) -> None:
        self._callbacks.discard(callback)

    def fire(self) -> None:
        self.gone = True
        callbacks, self._callbacks = self._callbacks, set()
        for callback in callbacks:
            callback()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """One client connection. Configure through `limited_protocol()`, not by hand."""

    max_head_bytes = MAX_HEAD_BYTES
    head_timeout = HEAD_TIMEOUT
    # Checked here rather than by uvicorn's own `limit_concurrency` (left unset), which counts
    # the connection asking as one of the limit and answers in plain text.
    max_connections: int | None = LIMIT_CONCURRENCY
    metrics: Metrics | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._refused = False
        self._in_head = True  # awaiting or reading a request head
        self._head_bytes = 0  # bytes received while in a head (an upper bound of its size)
        self._head_started = False  # a byte of the head arrived
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.head_timeout, self._head_timed_out
        )
        self._hangup = Hangup()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)
        self._hangup.fire()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        in_head = self._in_head
        if in_head:
            self._head_bytes += len(data)
            self._head_started = True
        super().data_received(data)
        if self._in_head and not self._refused:
            if self._head_bytes > self.max_head_bytes:
                # Still no end of the head: refused before it can grow any further.
                self._too_large()
            elif in_head and self._head_started and self._head_timer is None:
                # The first bytes of a keep-alive connection's next head, and not all of it:
                # its time runs from now. A head that arrives whole (the usual one) never
                # needs the timer, so it is armed only after the parser has seen the bytes.
                self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    # -- parser callbacks ------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
        given = next(
            (v.decode("latin-1") for n, v in self.headers if n.lower() == b"x-request-id"), None
        )
        if size > self.max_head_bytes:
            self._too_large(given)
            return
        self._in_head = False
        self._stop_head_timer()
        limit = self.max_connections
        if limit is not None and (len(self.connections) > limit or len(self.tasks) >= limit):
            self._refuse(
                503, "unavailable", "over_concurrency_limit", "too many connections, retry later",
                given,
            )
            return
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
        extensions[HANGUP] = self._hangup
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        # The next bytes on this connection begin the next head; its timer starts with them.
        self._in_head = True
        self._head_bytes = 0
        self._head_started = False

    # -- refusals --------------------------------------------------------------------------

    def _too_large(self, given: str | None = None) -> None:
        limit = self.max_head_bytes
        message = f"request head over {limit} bytes"
        self._refuse(431, "request_too_large", "head_too_large", message, given)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head behind a response still in progress: its time starts afresh.
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)
            return
        if self._head_started:
            message = f"request head not complete within {self.head_timeout:g} s"
            self._refuse(408, "request_timeout", "head_timeout", message)
        else:  # never a byte: no request to answer or audit
            self._refused = True
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # httptools could not parse the request (a bad request line, raw bytes outside ASCII in
        # the path, a malformed header, …): uvicorn's plain-text 400 becomes the gateway's own.
        if not self._refused:
            self._refuse(400, "bad_request", "malformed_request", "malformed HTTP request")

    def _refuse(
        self, status: int, kind: str, reason: str, message: str, given: str | None = None
    ) -> None:
        """Answer `status` with the gateway's JSON error of type `kind`, close, and audit. The
        answer and its audit line carry one request id: the client's (`given`, once its head
        was read) when it has the allowed shape, else a fresh one."""
        self._refused = True
        self._stop_head_timer()
        rid = audit.request_id(given)
        body = orjson.dumps(
            {"error": {"type": kind, "message": f"citewarden: {message}", "source": "citewarden"}}
        )
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
            "content-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
            f"x-request-id: {rid}\r\n"
            "connection: close\r\n\r\n"
        )
        if not self.transport.is_closing():
            self.transport.write(head.encode("ascii") + body)
            self.transport.close()
        if self.metrics is not None:
            self.metrics.observe_request("unrouted", "refused", False, 0.0, None)
        audit.audit_event(
            request_id=rid,
            route="unrouted",
            policy="-",
            status=status,
            decision="refused",
            reason=reason,
        )


def limited_protocol(
    *,
    max_head_bytes: int = MAX_HEAD_BYTES,
    head_timeout: float = HEAD_TIMEOUT,
    max_connections: int | None = LIMIT_CONCURRENCY,
    metrics: Metrics | None = None,
) -> type[LimitedHttpToolsProtocol]:
    """The protocol class for one server, its limits as class attributes (uvicorn builds each
    connection's protocol from `Config.http` with a fixed signature)."""
    attrs: dict[str, Any] = {
        "max_head_bytes": max_head_bytes,
        "head_timeout": head_timeout,
        "max_connections": max_connections,
        "metrics": metrics,
    }
    return type("ProxyHttpProtocol", (LimitedHttpToolsProtocol,), attrs)

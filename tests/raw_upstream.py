"""An upstream that answers with exact bytes, for what an ASGI upstream cannot send: malformed
heads, broken chunked framing, bodies that do not decode. It runs in a thread next to a real
gateway (tests/gateway_harness.py).

Each request picks its reply by its `x-test-scenario` header; a reply is a list of byte strings
written with a short pause between them (so a gateway can have started its answer before the
next part breaks it), and the connection is closed after it.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from tests.upstream_app import SCENARIO_HEADER


def chunked(*pieces: bytes) -> bytes:
    """`pieces` as HTTP/1.1 chunks, without the last (zero) chunk."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p)


LAST_CHUNK = b"0\r\n\r\n"


def head(status: int = 200, *fields: tuple[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in fields]
    return ("\r\n".join([*lines, "connection: close"]) + "\r\n\r\n").encode("latin-1")


class RawUpstream:
    """Replies by scenario key; records each request's head."""

    def __init__(self) -> None:
        self.replies: dict[str, tuple[Sequence[bytes], float]] = {}
        self.heads: list[bytes] = []
        self._lock = threading.Lock()

    def on(self, parts: Sequence[bytes], gap: float = 0.05) -> dict[str, str]:
        """Registers a reply; returns the request header that selects it."""
        key = uuid.uuid4().hex
        with self._lock:
            self.replies[key] = (parts, gap)
        return {SCENARIO_HEADER: key}

    def _reply_for(self, request_head: bytes) -> tuple[Sequence[bytes], float]:
        for line in request_head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == SCENARIO_HEADER:
                with self._lock:
                    return self.replies[value.strip()]
        return [head(404, ("content-length", "0"))], 0.0


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(5.0)
        # Each reply part goes out when it is written, as an upstream's would (no Nagle wait
        # for the gateway's delayed ACK between the parts).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        data = b""
        while b"\r\n\r\n" not in data:
            got = sock.recv(65536)
            if not got:
                return
            data += got
        request_head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in request_head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            got = sock.recv(65536)
            if not got:
                return
            body += got
        upstream = self.server.upstream
        upstream.heads.append(request_head)
        parts, gap = upstream._reply_for(request_head)
        with contextlib.suppress(OSError):  # the gateway may hang up first: that is its right
            for i, part in enumerate(parts):
                if i and gap:
                    time.sleep(gap)
                sock.sendall(part)
            sock.shutdown(socket.SHUT_WR)
            time.sleep(0.05)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    upstream: RawUpstream


@contextlib.contextmanager
def serve_raw() -> Iterator[tuple[RawUpstream, str]]:
    """A RawUpstream on 127.0.0.1 and a free port: (upstream, base URL)."""
    upstream = RawUpstream()
    server = _Server(("127.0.0.1", 0), _Handler)
    server.upstream = upstream
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="raw-upstream",
        daemon=True,
    )
    thread.start()
    try:
        yield upstream, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5.0)

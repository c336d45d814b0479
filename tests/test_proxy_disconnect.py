"""Clients that go away (DESIGN §7): a short body is never forwarded, and a client that hangs up
cancels the upstream request — its connection closed, no further reads, never pooled — as does
a progressive stream that ends in a block.

A raw-socket client against the gateway as `serve` runs it, in front of a raw-socket upstream
that streams slowly and records when the gateway closed its connection. Bounds are generous
(the 100 ms target is measured by bench/edge_bench.py).
"""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edge_harness import Proxy, RawUpstream, audits, chat_request, run_proxy, write_policies

BOUND = 2.0  # seconds from the client's hang-up to the upstream's connection closed



@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    up = RawUpstream(tick=0.05, ticks=400)  # a 20 s stream unless someone hangs up
    with up.running():
        yield up


@pytest.fixture
def proxy(tmp_path: Path, upstream: RawUpstream, audit_log: io.StringIO) -> Iterator[Proxy]:
    with run_proxy(upstream.url, write_policies(tmp_path)) as p:
        yield p




def _request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "host: gw", "content-type: application/json"]
    head += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    if body or method == "POST":
        head.append(f"content-length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _hang_up(sock: socket.socket) -> float:
    """Close abruptly (RST, as a killed client does); the moment it happened."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    t = time.monotonic()
    sock.close()
    return t


# ----------------------------------------------------------------------------------- bodies


def test_half_a_body_is_never_forwarded(
    proxy: Proxy, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    body = chat_request()
    request = _request("POST", "/v1/chat/completions", body)
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.sendall(request[: len(request) - len(body) // 2])
    time.sleep(0.2)  # the gateway has the head and half the body
    sock.close()
    (event,) = audits(audit_log)
    assert event["reason"] == "client_disconnected_mid_body"
    assert event["route"] == "chat"
    time.sleep(0.2)
    assert upstream.conns == []  # not a byte reached the upstream


def test_half_a_passthrough_body_is_never_forwarded(
    proxy: Proxy, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    body = b"x" * 10_000
    request = _request("PUT", "/v1/files/upload", body)
    sock = socket.create_connection(("127.0.0.1", proxy.port))
    sock.sendall(request[:-5000])
    time.sleep(0.2)
    _hang_up(sock)
    (event,) = audits(audit_log)
    assert event["reason"] == "client_disconnected_mid_body"
    assert event["route"] == "passthrough"
    time.sleep(0.2)
    assert upstream.conns == []


def test_a_whole_body_is_forwarded_after_a_short_one(
    proxy: Proxy, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    body = chat_request()
    with socket.create_connection(("127.0.0.1", proxy.port)) as sock:
        sock.sendall(_request("POST", "/v1/chat/completions", body)[:-10])
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(_request("POST", "/v1/chat/completions", body))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    assert len(upstream.conns) == 1
    assert bytes(upstream.conns[0].data).endswith(body)


# ---------------------------------------------------------------------------------- hang-ups


def _closed_after(upstream: RawUpstream, since: float) -> float:
    upstream.wait_for(lambda: upstream.conns and upstream.conns[-1].closed_at, timeout=BOUND + 3)
    closed = upstream.conns[-1].closed_at
    assert closed is not None
    return closed - since


@pytest.mark.parametrize(
    ("request_bytes", "wait_for_bytes"),
    [
        pytest.param(
            _request("POST", "/v1/chat/completions", chat_request(), x_scenario="slow-json"),
            False,
            id="buffered-json",
        ),
        pytest.param(
            _request("POST", "/v1/chat/completions", chat_request(True), x_scenario="slow-sse"),
            False,
            id="buffered-stream",
        ),
        pytest.param(
            _request(
                "POST",
                "/v1/chat/completions",
                chat_request(True),
                x_scenario="slow-sse",
                x_mode="progressive",
            ),
            True,
            id="progressive-stream",
        ),
        pytest.param(
            _request("GET", "/v1/files/big", x_scenario="slow-sse"), True, id="passthrough"
        ),
    ],
)
def test_a_client_that_hangs_up_cancels_the_upstream(
    proxy: Proxy,
    upstream: RawUpstream,
    audit_log: io.StringIO,
    request_bytes: bytes,
    wait_for_bytes: bool,
) -> None:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(request_bytes)
    upstream.wait_for(lambda: upstream.conns and b"\r\n\r\n" in upstream.conns[0].data)
    if wait_for_bytes:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    time.sleep(0.2)  # the upstream is mid-answer
    hung_up = _hang_up(sock)
    assert _closed_after(upstream, hung_up) < BOUND
    assert not upstream.conns[0].finished
    (event,) = audits(audit_log)
    assert event["reason"] == "client_disconnected"
    # The connection was not pooled: the next request opens a new one.
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as again:
        again.sendall(_request("POST", "/v1/chat/completions", chat_request()))
        assert again.recv(65536).startswith(b"HTTP/1.1 200")
    assert len(upstream.conns) == 2


def test_a_clean_close_after_the_request_cancels_the_upstream_too(
    proxy: Proxy, upstream: RawUpstream
) -> None:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.sendall(
        _request("POST", "/v1/chat/completions", chat_request(True), x_scenario="slow-sse")
    )
    upstream.wait_for(lambda: upstream.conns and b"\r\n\r\n" in upstream.conns[0].data)
    t = time.monotonic()
    sock.close()  # FIN, not RST
    assert _closed_after(upstream, t) < BOUND


def test_a_progressive_stream_that_ends_in_a_block_closes_the_upstream(
    proxy: Proxy, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(
            _request(
                "POST",
                "/v1/chat/completions",
                chat_request(True),
                x_scenario="block-sse",
                x_mode="progressive",
            )
        )
        received = b""
        started = time.monotonic()
        while not received.endswith(b"0\r\n\r\n") and time.monotonic() - started < 10:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        ended = time.monotonic()
        assert b"citation_verification_failed" in received
        assert b"zz:9" not in received.split(b"\r\n\r\n", 1)[1].split(b"error")[0]
        assert _closed_after(upstream, ended) < BOUND
        assert not upstream.conns[0].finished
    (event,) = audits(audit_log)
    assert event["decision"] == "blocked"

"""Limits against slow and huge clients (DESIGN §7; gateway/limits.py): head size (431), head
time (slowloris), idle keep-alive, connections served at once (503) — through the proxy port
as `citewarden serve` configures it, with timers scaled down; and their flags and env.
"""

from __future__ import annotations

import contextlib
import io
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import build_parser
from gateway.server import settings_from_args
from tests.edge_harness import (
    Proxy,
    RawUpstream,
    audits,
    body_of,
    raw_exchange,
    run_proxy,
    status_of,
    write_policies,
)

MODELS = b"GET /v1/models HTTP/1.1\r\nhost: gw\r\n\r\n"



@pytest.fixture
def upstream() -> Iterator[RawUpstream]:
    up = RawUpstream()
    with up.running():
        yield up


@contextlib.contextmanager
def gateway(tmp_path: Path, upstream: RawUpstream, **limits: float) -> Iterator[Proxy]:
    with run_proxy(upstream.url, write_policies(tmp_path), **limits) as p:
        yield p




def _read_until_closed(sock: socket.socket, timeout: float = 5.0) -> tuple[bytes, float]:
    """Everything until the gateway closes the connection, and how long that took."""
    sock.settimeout(timeout)
    t = time.monotonic()
    out = b""
    with contextlib.suppress(ConnectionError):
        while chunk := sock.recv(65536):
            out += chunk
    return out, time.monotonic() - t


# ------------------------------------------------------------------------------ head size


def test_a_head_over_64_kib_is_431(
    tmp_path: Path, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    with gateway(tmp_path, upstream) as gw:
        fields = b"".join(b"x-pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(70))
        response = raw_exchange(gw.port, b"GET /v1/models HTTP/1.1\r\n" + fields + b"\r\n")
        assert status_of(response) == 431
        assert body_of(response)["error"]["source"] == "citewarden"
        (event,) = audits(audit_log)
        assert event["status"] == 431 and event["reason"] == "head_too_large"
        # Just under the limit is served.
        fields = b"".join(b"x-pad-%d: %s\r\n" % (i, b"a" * 1000) for i in range(60))
        response = raw_exchange(gw.port, b"GET /v1/models HTTP/1.1\r\n" + fields + b"\r\n")
        assert status_of(response) == 200
    assert len(upstream.conns) == 1


def test_a_huge_request_line_is_431(tmp_path: Path, upstream: RawUpstream) -> None:
    with gateway(tmp_path, upstream) as gw:
        target = b"/v1/files/" + b"a" * 70_000
        response = raw_exchange(gw.port, b"GET " + target + b" HTTP/1.1\r\nhost: gw\r\n\r\n")
        assert status_of(response) == 431
    assert upstream.conns == []


def test_an_endless_head_is_cut_off_before_it_ends(tmp_path: Path, upstream: RawUpstream) -> None:
    with gateway(tmp_path, upstream) as gw, socket.create_connection(
        ("127.0.0.1", gw.port)
    ) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nx-big: ")
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < 8 * 1024 * 1024:
                sock.sendall(b"a" * 65536)
                sent += 65536
        response, _ = _read_until_closed(sock)
        assert status_of(response) == 431
        assert sent < 8 * 1024 * 1024  # refused long before the 8 MB were in
    assert upstream.conns == []


# ------------------------------------------------------------------------------ head time


def test_a_slowloris_head_is_timed_out_while_others_are_served(
    tmp_path: Path, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    with gateway(tmp_path, upstream, head_timeout=0.3) as gw:
        slow = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(20)]
        silent = socket.create_connection(("127.0.0.1", gw.port))
        for s in slow:
            s.sendall(b"GET /v1/models HTTP/1.1\r\n")
        for _ in range(3):
            time.sleep(0.05)
            for s in slow:
                with contextlib.suppress(ConnectionError):
                    s.sendall(b"x-drip: 1\r\n")
        assert status_of(raw_exchange(gw.port, MODELS)) == 200  # served meanwhile
        for s in slow:
            response, waited = _read_until_closed(s)
            assert status_of(response) == 408, response
            assert waited < 3.0
            s.close()
        response, waited = _read_until_closed(silent)
        assert response == b"" and waited < 3.0  # never a byte: closed, nothing to answer
        silent.close()
        events = audits(audit_log, n=21)
        assert sum(e["reason"] == "head_timeout" for e in events) == 20


def test_a_head_in_time_is_served_however_it_is_split(
    tmp_path: Path, upstream: RawUpstream
) -> None:
    with gateway(tmp_path, upstream, head_timeout=1.0) as gw, socket.create_connection(
        ("127.0.0.1", gw.port)
    ) as sock:
        for i in range(0, len(MODELS), 5):
            sock.sendall(MODELS[i : i + 5])
            time.sleep(0.01)
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


# ----------------------------------------------------------------------------- keep-alive


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (content-length or chunked), however the reads split it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, data
            body += chunk
    else:
        length = int(lowered.split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            chunk = sock.recv(65536)
            assert chunk, data
            body += chunk
    return head + b"\r\n\r\n" + body


def test_an_idle_keep_alive_connection_is_closed(tmp_path: Path, upstream: RawUpstream) -> None:
    with (
        gateway(tmp_path, upstream, keep_alive_timeout=0.5, head_timeout=5.0) as gw,
        socket.create_connection(("127.0.0.1", gw.port)) as sock,
    ):
        sock.settimeout(5)
        for _ in range(2):  # reused within the idle time
            sock.sendall(MODELS)
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
            time.sleep(0.05)
        response, waited = _read_until_closed(sock)
        assert response == b"" and waited < 3.0


def test_a_slow_next_head_on_a_kept_alive_connection_is_timed_out(
    tmp_path: Path, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    # The next head's time runs from its first byte, also when that byte comes alone.
    with (
        gateway(tmp_path, upstream, keep_alive_timeout=5.0, head_timeout=0.3) as gw,
        socket.create_connection(("127.0.0.1", gw.port)) as sock,
    ):
        sock.settimeout(5)
        sock.sendall(MODELS)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /v1/models HTTP/1.1\r\n")
        for _ in range(8):
            time.sleep(0.1)
            with contextlib.suppress(ConnectionError):
                sock.sendall(b"x-drip: 1\r\n")
        response, waited = _read_until_closed(sock)
        assert status_of(response) == 408, response
        assert waited < 3.0
        assert any(e["reason"] == "head_timeout" for e in audits(audit_log))


# ---------------------------------------------------------------------------- concurrency


def test_connections_past_the_limit_get_503(
    tmp_path: Path, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    with gateway(tmp_path, upstream, limit_concurrency=3) as gw:
        held = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(3)]
        time.sleep(0.1)
        response = raw_exchange(gw.port, MODELS)
        assert status_of(response) == 503
        assert body_of(response)["error"]["source"] == "citewarden"
        (event,) = audits(audit_log)
        assert event["reason"] == "over_concurrency_limit"
        held.pop().close()
        time.sleep(0.2)
        assert status_of(raw_exchange(gw.port, MODELS)) == 200
        for s in held:
            s.close()


# ---------------------------------------------------------------------------- flags, env


def test_limits_are_serve_flags_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITEWARDEN_HEAD_TIMEOUT", "2.5")
    monkeypatch.setenv("CITEWARDEN_LIMIT_CONCURRENCY", "77")
    args = build_parser().parse_args(
        ["serve", "--upstream", "http://u", "--max-head-bytes", "1000",
         "--keep-alive-timeout", "0.5"]
    )
    s = settings_from_args(args, "http://u", ["p.yaml"])
    assert (s.max_head_bytes, s.head_timeout, s.keep_alive_timeout, s.limit_concurrency) == (
        1000, 2.5, 0.5, 77
    )
    monkeypatch.delenv("CITEWARDEN_HEAD_TIMEOUT")
    defaults = settings_from_args(
        build_parser().parse_args(["serve", "--limit-concurrency", "0"]), "http://u", ["p"]
    )
    assert (defaults.max_head_bytes, defaults.head_timeout, defaults.keep_alive_timeout) == (
        64 * 1024, 10.0, 5.0
    )
    assert defaults.limit_concurrency == 0


# ------------------------------------------------------------------------------ request id


def _request_id(response: bytes) -> str | None:
    for line in response.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-request-id":
            return value.strip().decode()
    return None


@pytest.mark.parametrize(
    ("request_bytes", "status", "echoed"),
    [
        # Over the limit: found once the head is read (the client's id is known) or while
        # it still grows (no header read yet), as the bytes happen to arrive.
        (b"GET /v1/models HTTP/1.1\r\nx-request-id: client-7\r\n"
         + b"".join(b"x-pad-%d: %s\r\n" % (i, b"a" * 60) for i in range(1100)) + b"\r\n",
         431, None),
        (b"GET /v1/files/" + b"a" * 70_000 + b" HTTP/1.1\r\nx-request-id: client-7\r\n\r\n",
         431, None),
        # Unparseable: nothing of it is trusted.
        (b"GET /v1/models HTTP/1.1\r\nx-request-id: client-7\r\nbad header\r\n\r\n", 400, False),
    ],
    ids=["431-headers", "431-request-line", "400-malformed"],
)
def test_a_server_refusal_carries_the_request_id_of_its_audit_line(
    tmp_path: Path, upstream: RawUpstream, audit_log: io.StringIO,
    request_bytes: bytes, status: int, echoed: bool | None,
) -> None:
    """Every answer carries `x-request-id`, the id of its audit line (docs/http.md): the
    client's own when its head was read and the id is valid, else a fresh one."""
    with gateway(tmp_path, upstream) as gw:
        response = raw_exchange(gw.port, request_bytes)
    assert status_of(response) == status, response[:200]
    rid = _request_id(response)
    (event,) = audits(audit_log)
    assert rid is not None and event["request_id"] == rid
    if echoed is not None:
        assert (rid == "client-7") is echoed


def test_a_503_past_the_connection_limit_carries_the_clients_request_id(
    tmp_path: Path, upstream: RawUpstream, audit_log: io.StringIO
) -> None:
    with gateway(tmp_path, upstream, limit_concurrency=1) as gw:
        held = socket.create_connection(("127.0.0.1", gw.port))
        time.sleep(0.1)
        response = raw_exchange(
            gw.port, b"GET /v1/models HTTP/1.1\r\nhost: gw\r\nx-request-id: client-8\r\n\r\n"
        )
        held.close()
    assert status_of(response) == 503
    (event,) = audits(audit_log)
    assert _request_id(response) == event["request_id"] == "client-8"

"""Crafted requests (DESIGN §7): paths that walk out of a route or a passthrough entry or inject
into the upstream's request line, bodies shorter than their content-length, oversized heads and
request ids. None of them may reach the upstream; a bad request id is never echoed."""

from __future__ import annotations

import re
import socket
import time
from typing import Any

import pytest

from tests.attacks.harness import (
    MARKER,
    GatewayProcess,
    assert_no_leak,
    build_request,
    exchange,
    parse_response,
)
from tests.attacks.protocols import GOOD, QUESTION, REGISTRY
from tests.upstream_app import SCENARIO_HEADER, FakeUpstream, Json

BAD_PATHS: dict[str, bytes] = {
    "encoded-dot-dot": b"/v1/files/%2e%2e/%2e%2e/admin",
    "encoded-dot-dot-upper": b"/v1/files/%2E%2E/admin",
    "half-encoded-dot-dot": b"/v1/files/.%2e/admin",
    "dot-dot-encoded-slash": b"/v1/files/..%2F..%2Fadmin",
    "encoded-slash-dot-dot": b"/v1/files%2F..%2F..%2Fadmin",
    "raw-dot-dot": b"/v1/files/../../admin",
    "raw-dot": b"/v1/files/./x",
    "encoded-dot": b"/v1/files/%2e/x",
    "encoded-backslash": b"/v1/files/%5c..%5cadmin",
    "encoded-backslash-upper": b"/v1/files/x%5Cy",
    "encoded-nul": b"/v1/files/x%00",
    "encoded-crlf": b"/v1/files/x%0d%0aX-Injected:%20yes",
    "encoded-lf": b"/v1/files/x%0aGET%20/admin",
    "raw-non-ascii": b"/v1/files/caf\xc3\xa9",
    "raw-high-byte": b"/v1/files/\xff",
    "verified-route-dot-dot": b"/rag/%2e%2e/admin",
    "verified-route-dot-dot-slash": b"/rag/..%2F..%2Fadmin",
}


def _quiet(up: FakeUpstream) -> int:
    return len(up.requests)


@pytest.mark.parametrize("target", [pytest.param(v, id=k) for k, v in BAD_PATHS.items()])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_bad_path_is_400_and_never_forwarded(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], target: bytes, method: str
) -> None:
    _, up = upstream
    up.on("path-attack", Json({"leak": BAD}))
    before = _quiet(up)
    body = b'{"question": "x"}' if method == "POST" else None
    headers = [(SCENARIO_HEADER, "path-attack"), ("content-type", "application/json")]
    resp = gateway.send(method, target, headers=headers, body=body)
    assert resp.status == 400, f"{target!r}: {resp.status_line} {resp.body[:300]!r}"
    assert len(up.requests) == before, f"{target!r} reached the upstream as {up.paths[-1]!r}"
    assert_no_leak(resp)


BAD = f"{MARKER} says hello"


@pytest.mark.parametrize(
    "target",
    [
        pytest.param(b"/v1/models%20HTTP/1.0%20", id="request-line-injection"),
        pytest.param(b"/v1/files/x%20HTTP/1.0%0d%0aHost:%20evil", id="request-line-crlf"),
    ],
)
def test_request_line_injection_never_reaches_the_upstream_decoded(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], target: bytes
) -> None:
    """Forwarded byte for byte (DESIGN §7): the upstream sees the percent-encoding intact (one
    path segment with a space in it), or the gateway refuses the path; never a second request
    line or an `HTTP/1.0` version taken from the path."""
    _, up = upstream
    up.on("inject", Json({"ok": True}))
    before = _quiet(up)
    resp = gateway.send("GET", target, headers=[(SCENARIO_HEADER, "inject")])
    new = up.requests[before:]
    if resp.status in (400, 404):
        assert not new, [r.path for r in new]
        return
    assert len(new) == 1, f"{resp.status_line}: the upstream saw {[r.path for r in new]}"
    assert " HTTP/1.0 " in new[0].path or new[0].path.endswith(" HTTP/1.0 "), new[0].path


def test_good_passthrough_path_is_forwarded(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """The positive control: a clean path under the same passthrough entry is forwarded."""
    _, up = upstream
    up.on("files-ok", Json({"object": "file"}))
    before = _quiet(up)
    resp = gateway.send("GET", "/v1/files/file-123", headers=[(SCENARIO_HEADER, "files-ok")])
    assert resp.status == 200, resp.raw[:500]
    assert [r.path for r in up.requests[before:]] == ["/v1/files/file-123"]


def test_a_passthrough_answer_never_carries_the_gateways_own_headers(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """An upstream's `x-citewarden-decision: released` on a passthrough answer would pass for
    a verified one; the decision and policy headers are the gateway's word only."""
    _, up = upstream
    forged = {
        "x-citewarden-decision": "released",
        "x-citewarden-policy": "attacks@000000000000",
        "x_citewarden_mode": "enforce",
    }
    up.on("files-forged", Json({"object": "file"}, headers=forged))
    resp = gateway.send("GET", "/v1/files/file-1", headers=[(SCENARIO_HEADER, "files-forged")])
    assert resp.status == 200, resp.raw[:500]
    names = {k.lower().replace("_", "-") for k, _ in resp.headers}
    assert not any(n.startswith("x-citewarden-") for n in names), resp.headers


@pytest.mark.parametrize("name", ["x_citewarden_context", "x_citewarden_context_ids"])
def test_a_client_context_header_spelt_with_underscores_is_not_forwarded(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], name: str
) -> None:
    _, up = upstream
    up.on("files-underscore", Json({"object": "file"}))
    before = _quiet(up)
    resp = gateway.send(
        "GET", "/v1/files/file-1", headers=[(SCENARIO_HEADER, "files-underscore"), (name, "kb:404")]
    )
    assert resp.status == 200, resp.raw[:500]
    [forwarded] = up.requests[before:]
    assert forwarded.header(name) is None
    assert forwarded.header(name.replace("_", "-")) is None


def _short_body(gw: GatewayProcess, path: str, key: str, *, half_close: bool) -> bytes:
    body = b'{"question": "' + b"x" * 80
    request = build_request(
        "POST",
        path,
        host=gw.host,
        headers=[(SCENARIO_HEADER, key), ("content-type", "application/json")],
        body=body,
        content_length=1000,
    )
    sock = socket.create_connection(gw.address, timeout=5)
    try:
        sock.sendall(request)
        time.sleep(0.2)
        if not half_close:
            return b""
        sock.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            out += data
        return out
    finally:
        sock.close()


@pytest.mark.parametrize("half_close", [True, False], ids=["half-close", "close"])
@pytest.mark.parametrize("path", ["/rag/answer", "/v1/chat/completions", "/v1/files/upload"])
def test_short_body_is_never_forwarded(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], path: str, half_close: bool
) -> None:
    _, up = upstream
    key = f"short-{path}-{half_close}"
    up.on(key, Json({"answer": GOOD, "sources": []}))
    raw = _short_body(gateway, path, key, half_close=half_close)
    time.sleep(0.5)
    assert not [r for r in up.requests if r.header(SCENARIO_HEADER) == key], "short body sent"
    if raw:
        assert parse_response(raw).status >= 400


ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
BAD_IDS = {
    "oversized": "a" * 120 + MARKER,
    "oversized-plain": "r" * 129,
    "space": f"req {MARKER}",
    "markup": f"<script>{MARKER}</script>",
    "quote": f'"{MARKER}"',
    "slash": f"req/{MARKER}",
    "non-ascii": f"req-é-{MARKER}",
}


def _id_cases() -> list[Any]:
    return [
        pytest.param(route, value, id=f"{route}-{name}")
        for route in ("verified", "passthrough", "refused")
        for name, value in BAD_IDS.items()
    ]


def _send_with_id(
    gw: GatewayProcess, upstream: tuple[str, FakeUpstream], route: str, value: str
) -> Any:
    _, up = upstream
    headers = [("x-request-id", value)]
    if route == "verified":
        spec = REGISTRY["rag-json"]
        up.on("rid", Json(spec.body(GOOD)))
        return gw.post_json(
            spec.path, spec.request(QUESTION, False), [*headers, (SCENARIO_HEADER, "rid")]
        )
    if route == "passthrough":
        up.on("rid-pt", Json({"data": []}))
        return gw.send("GET", "/v1/models", headers=[*headers, (SCENARIO_HEADER, "rid-pt")])
    return gw.send("GET", "/nowhere", headers=headers)


@pytest.mark.parametrize(("route", "value"), _id_cases())
def test_bad_request_id_is_replaced_not_echoed(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], route: str, value: str
) -> None:
    resp = _send_with_id(gateway, upstream, route, value)
    assert_no_leak(resp)
    rid = resp.header("x-request-id")
    assert rid is not None and ID_RE.match(rid), rid
    assert rid != value


@pytest.mark.parametrize("route", ["verified", "passthrough", "refused"])
def test_good_request_id_is_propagated(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], route: str
) -> None:
    value = "req-2026.12:abc-" + "x" * 100
    resp = _send_with_id(gateway, upstream, route, value)
    assert resp.header("x-request-id") == value


def test_oversized_request_head_is_431(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    _, up = upstream
    up.on("big-head", Json({"data": []}))
    before = _quiet(up)
    headers = [(SCENARIO_HEADER, "big-head")] + [(f"x-pad-{i}", "a" * 8000) for i in range(10)]
    request = build_request("GET", "/v1/models", host=gateway.host, headers=headers)
    try:
        resp = exchange(gateway.address, request)
    except ConnectionResetError:
        pytest.fail("the gateway reset the connection instead of answering 431")
    assert resp.status == 431, resp.status_line
    assert len(up.requests) == before

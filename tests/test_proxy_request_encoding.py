"""A client body with a `content-encoding` (DESIGN §7). The gateway reads a request body as it
arrives, never decoded: on a verified route a body labelled anything but `identity` would be
read (its context, its question) as plain bytes the upstream is told mean something else, so it
is refused with 415 in the route's error envelope, audited `error` / `unsupported_media_type`,
never forwarded. A passthrough path relays the body and its label as they are."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.edge_harness import (
    Proxy,
    RawUpstream,
    audits,
    body_of,
    chat_request,
    raw_exchange,
    run_proxy,
    status_of,
    write_policies,
)


@pytest.fixture
def gw(tmp_path: Path, audit_log: io.StringIO) -> Iterator[tuple[Proxy, RawUpstream]]:
    upstream = RawUpstream()
    with upstream.running(), run_proxy(upstream.url, write_policies(tmp_path)) as proxy:
        yield proxy, upstream




def _post(port: int, path: bytes, body: bytes, *headers: bytes) -> bytes:
    head = b"".join(h + b"\r\n" for h in headers)
    return raw_exchange(port, b"POST " + path + b" HTTP/1.1\r\nhost: x\r\n"
                        b"content-type: application/json\r\n" + head
                        + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


PLAIN = chat_request()
CODINGS: dict[str, tuple[list[bytes], bytes]] = {
    "plain-labelled-gzip": ([b"content-encoding: gzip"], PLAIN),
    "gzip": ([b"content-encoding: gzip"], gzip.compress(PLAIN)),
    "deflate": ([b"content-encoding: deflate"], PLAIN),
    "br-upper": ([b"Content-Encoding: BR"], PLAIN),
    "identity-then-gzip": ([b"content-encoding: identity, gzip"], PLAIN),
    "two-lines": ([b"content-encoding: identity", b"content-encoding: gzip"], PLAIN),
    "unknown": ([b"content-encoding: x-custom"], PLAIN),
}


@pytest.mark.parametrize("case", list(CODINGS))
@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_an_encoded_request_body_on_a_verified_route_is_415(
    gw: tuple[Proxy, RawUpstream], audit_log: io.StringIO, case: str, mode: str
) -> None:
    proxy, upstream = gw
    labels, body = CODINGS[case]
    if mode == "progressive":
        labels = [*labels, b"x-mode: progressive"]
    response = _post(proxy.port, b"/v1/chat/completions", body, *labels)
    assert status_of(response) == 415, response
    error = body_of(response)["error"]  # the openai-chat envelope
    assert error["message"].startswith("citewarden: "), error
    assert "content-encoding" in error["message"], error
    assert upstream.conns == []
    (event,) = audits(audit_log)
    assert (event["decision"], event["reason"], event["status"]) == (
        "error", "unsupported_media_type", 415)


@pytest.mark.parametrize("label", [b"content-encoding: identity", b"Content-Encoding: Identity",
                                   b"content-encoding: identity, identity"])
def test_an_identity_request_body_still_goes_through(
    gw: tuple[Proxy, RawUpstream], label: bytes
) -> None:
    proxy, upstream = gw
    response = _post(proxy.port, b"/v1/chat/completions", PLAIN, label)
    assert status_of(response) == 200, response
    assert len(upstream.conns) == 1


def test_a_passthrough_body_keeps_its_coding(gw: tuple[Proxy, RawUpstream]) -> None:
    proxy, upstream = gw
    body = gzip.compress(b'{"purpose": "fine-tune"}')
    response = _post(proxy.port, b"/v1/files/upload", body, b"content-encoding: gzip")
    assert status_of(response) == 200, response
    (conn,) = upstream.conns
    assert b"content-encoding: gzip" in bytes(conn.data).lower()
    assert bytes(conn.data).endswith(body)

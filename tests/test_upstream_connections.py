"""Upstream connections, the rest of DESIGN §11: the keep-alive retry (a request that fails on a
reused connection before any answer byte is sent once more, on a fresh connection, POST
included; never after an answer byte, never for a fresh connection), the base URL's query
string (`?api-version=…`) added to forwarded requests, and HTTP/2-only upstreams answered with
"upstream speaks HTTP/2 only". Through a real gateway with the openai SDK, and the client alone
where the case is about connections."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway.errors import ProtocolError, UpstreamConnectError
from gateway.http1 import add_base_query, base_query, parse_base_url
from gateway.upstream import Timeouts, Upstream
from gateway.upstream_tls import UpstreamNetwork
from tests.gateway_harness import write_policy
from tests.net_harness import H2_SETTINGS, Origin, Pki, gateway, listening, make_pki
from tests.upstream_app import openai_body

TIMEOUTS = Timeouts(connect=2, read=3, total=5)
SYSTEM = '<chunk id="doc:1" version="2">The battery holds 62.5 kWh.</chunk>'
ANSWER = "The battery holds 62.5 kWh [doc:1]."
GOOD = orjson.dumps(openai_body(ANSWER))
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "capacity?"}]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


# ------------------------------------------------------------------------ keep-alive retry


def test_a_post_on_a_connection_the_upstream_closed_is_sent_again_on_a_fresh_one(
    tmp_path: Path,
) -> None:
    """The upstream answers once per connection and closes a reused one on reading its next
    request (an idle timeout that fired as the request went out): every SDK call still gets
    its answer, each second attempt on a connection of its own."""
    origin = Origin(body=GOOD, hang_up_reused=True)
    with listening(origin.handle) as port, gateway(
        f"http://127.0.0.1:{port}", [write_policy(tmp_path)]
    ) as gw, httpx.Client(trust_env=False) as http:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk", max_retries=0,
                               http_client=http)
        for _ in range(3):
            completion = client.chat.completions.create(model="m", messages=MESSAGES)
            assert completion.choices[0].message.content == ANSWER
    # conn 0 answers; each later call is cut on a reused connection, then answered on a new one
    assert [s.conn for s in origin.seen] == [0, 0, 1, 1, 2]
    assert {s.line for s in origin.seen} == {"POST /v1/chat/completions HTTP/1.1"}
    assert len({s.body for s in origin.seen}) == 1  # the same request each time


async def test_the_retry_opens_a_connection_rather_than_taking_another_idle_one() -> None:
    """Two pooled connections, both closed by the upstream under their next request: the
    retry goes to a new connection, not to the other stale one."""
    origin = Origin(body=b"ok", hang_up_reused=True)
    with listening(origin.handle) as port:
        up = Upstream(f"http://127.0.0.1:{port}", TIMEOUTS, network=UpstreamNetwork())
        try:
            first = [up.request("POST", f"/warm/{i}", [], b"{}") for i in range(2)]
            assert [r.body for r in await asyncio.gather(*first)] == [b"ok", b"ok"]
            assert origin.connections == 2
            assert (await up.request("POST", "/x", [], b"{}")).body == b"ok"
        finally:
            await up.aclose()
    assert [s.line.split()[1] for s in origin.seen][2:] == ["/x", "/x"]
    assert origin.seen[-1].conn == 2  # a new connection, not the second pooled one
    assert origin.connections == 3


def _answer_then(second: bytes) -> tuple[Callable[[socket.socket], None], list[bytes]]:
    """A connection that answers its first request and meets the second with `second` (some
    bytes of an answer) before it closes; and the requests it read."""
    seen: list[bytes] = []

    def serve_one(sock: socket.socket) -> None:
        for i in range(2):
            data = b""
            while not data.endswith(b"\r\n\r\n{}"):
                got = sock.recv(65536)
                if not got:
                    return
                data += got
            seen.append(data)
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" if i == 0 else second)

    return serve_one, seen


@pytest.mark.parametrize("second", [b"HTTP/1.1 200 OK\r\ncontent-le", b"H"])
async def test_no_retry_once_any_answer_byte_arrived(second: bytes) -> None:
    serve_one, seen = _answer_then(second)
    with listening(serve_one) as port:
        up = Upstream(f"http://127.0.0.1:{port}", TIMEOUTS, network=UpstreamNetwork())
        try:
            assert (await up.request("POST", "/1", [], b"{}")).body == b"ok"
            with pytest.raises((UpstreamConnectError, ProtocolError)):
                await up.request("POST", "/2", [], b"{}")
        finally:
            await up.aclose()
    assert len(seen) == 2  # the second request was sent once


async def test_no_retry_for_a_fresh_connection() -> None:
    accepted: list[int] = []

    def hang_up_at_once(sock: socket.socket) -> None:
        accepted.append(1)
        sock.recv(65536)

    with listening(hang_up_at_once) as port:
        up = Upstream(f"http://127.0.0.1:{port}", TIMEOUTS, network=UpstreamNetwork())
        try:
            with pytest.raises(UpstreamConnectError, match="before the response"):
                await up.request("POST", "/", [], b"{}")
        finally:
            await up.aclose()
    assert len(accepted) == 1


async def test_meanwhile_runs_once_the_request_is_on_the_wire_and_before_its_answer() -> None:
    """`meanwhile` (work that needs only the request, done while the upstream answers) is
    called once the upstream can read the request: it sees the request arrive while it runs,
    and the answer is sent only after it has returned."""
    arrived, answered = threading.Event(), threading.Event()
    seen: list[bytes] = []

    def serve_one(sock: socket.socket) -> None:
        data = b""
        while not data.endswith(b"\r\n\r\n{}"):
            data += sock.recv(65536)
        seen.append(data)
        arrived.set()
        answered.wait(5)
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    calls: list[bool] = []

    def meanwhile() -> None:
        calls.append(arrived.wait(5))  # blocks the loop: only a request already sent arrives
        answered.set()

    with listening(serve_one) as port:
        up = Upstream(f"http://127.0.0.1:{port}", TIMEOUTS, network=UpstreamNetwork())
        try:
            assert (await up.request("POST", "/", [], b"{}", meanwhile=meanwhile)).body == b"ok"
        finally:
            await up.aclose()
    assert calls == [True]
    assert len(seen) == 1


async def test_meanwhile_runs_once_when_the_request_is_sent_again() -> None:
    """The keep-alive retry sends the request a second time; `meanwhile` is not run twice."""
    origin = Origin(body=b"ok", hang_up_reused=True)
    calls: list[int] = []
    with listening(origin.handle) as port:
        up = Upstream(f"http://127.0.0.1:{port}", TIMEOUTS, network=UpstreamNetwork())
        try:
            assert (await up.request("POST", "/warm", [], b"{}")).body == b"ok"
            async with up.stream("POST", "/x", [], b"{}", meanwhile=lambda: calls.append(1)) as s:
                assert await s.read() == b"ok"
        finally:
            await up.aclose()
    assert [x.line.split()[1] for x in origin.seen] == ["/warm", "/x", "/x"]  # sent again
    assert calls == [1]


# ------------------------------------------------------------------------ base query string


@pytest.mark.parametrize(
    ("path_qs", "expected"),
    [
        ("/v1/chat", "/v1/chat?api-version=2024-06-01"),
        ("/v1/chat?", "/v1/chat?api-version=2024-06-01"),
        ("/v1/chat?x=1", "/v1/chat?x=1&api-version=2024-06-01"),
        ("/v1/chat?api-version=2025-01-01", "/v1/chat?api-version=2025-01-01"),  # the client's
        ("/v1/chat?api%2Dversion=2025", "/v1/chat?api%2Dversion=2025"),  # by decoded name
        ("/v1/chat?api-version", "/v1/chat?api-version"),  # present without a value
        ("/v1/chat?api-versions=1", "/v1/chat?api-versions=1&api-version=2024-06-01"),
    ],
)
def test_base_query_is_added_when_the_request_lacks_the_parameter(path_qs: str,
                                                                   expected: str) -> None:
    base = base_query("https://x.openai.azure.com/openai?api-version=2024-06-01")
    assert add_base_query(path_qs, base) == expected


def test_several_base_parameters_each_added_unless_present() -> None:
    base = base_query("http://h/p?a=1&b=%20two")
    assert add_base_query("/x?b=mine", base) == "/x?b=mine&a=1"
    assert add_base_query("/x", base) == "/x?a=1&b=%20two"  # as the base URL wrote it


def test_an_upstream_url_with_a_fragment_is_refused() -> None:
    with pytest.raises(ValueError, match="fragment"):
        parse_base_url("https://h/p?api-version=1#x")


def test_the_gateway_adds_azure_api_version_to_every_forwarded_request(tmp_path: Path) -> None:
    origin = Origin(body=GOOD)
    with listening(origin.handle) as port, gateway(
        f"http://127.0.0.1:{port}/openai/deployments/gpt?api-version=2024-06-01",
        [write_policy(tmp_path)],
    ) as gw, httpx.Client(trust_env=False) as http:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk", max_retries=0,
                               http_client=http)
        client.chat.completions.create(model="m", messages=MESSAGES)
        client.chat.completions.create(model="m", messages=MESSAGES,
                                       extra_query={"api-version": "2025-01-01"})
        http.get(gw.url + "/v1/models?limit=2")  # a passthrough path too
    assert [s.line for s in origin.seen] == [
        "POST /openai/deployments/gpt/v1/chat/completions?api-version=2024-06-01 HTTP/1.1",
        "POST /openai/deployments/gpt/v1/chat/completions?api-version=2025-01-01 HTTP/1.1",
        "GET /openai/deployments/gpt/v1/models?limit=2&api-version=2024-06-01 HTTP/1.1",
    ]


# ---------------------------------------------------------------------------- HTTP/2 only


@pytest.mark.parametrize(
    "answer",
    [H2_SETTINGS, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"HTTP/2 200\r\n\r\n",
     H2_SETTINGS[:4] + b"\x00" + H2_SETTINGS[5:] + b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"],
)
async def test_an_http2_answer_is_named(answer: bytes) -> None:
    def serve_one(sock: socket.socket) -> None:
        sock.recv(65536)
        sock.sendall(answer)

    with listening(serve_one) as port:
        up = Upstream(f"http://127.0.0.1:{port}", TIMEOUTS, network=UpstreamNetwork())
        try:
            with pytest.raises(ProtocolError, match="upstream speaks HTTP/2 only"):
                await up.request("POST", "/", [], b"{}")
        finally:
            await up.aclose()


def test_the_gateway_answers_an_h2_only_upstream_with_a_502_that_says_so(tmp_path: Path) -> None:
    origin = Origin(http2=True)
    with listening(origin.handle) as port, gateway(
        f"http://127.0.0.1:{port}", [write_policy(tmp_path)]
    ) as gw, httpx.Client(trust_env=False) as http:
        r = http.post(gw.url + "/v1/chat/completions", json={"model": "m", "messages": MESSAGES})
    assert r.status_code == 502
    assert "upstream speaks HTTP/2 only" in r.json()["error"]["message"]


async def test_a_tls_upstream_that_speaks_only_h2_is_named(pki: Pki) -> None:
    """The client offers ALPN http/1.1 only; an h2-only server either refuses the handshake
    (no_application_protocol) or goes on without ALPN and speaks HTTP/2: either way, named."""
    origin = Origin(tls=pki.server_context(alpn=["h2"]), http2=True)
    with listening(origin.handle) as port:
        up = Upstream(f"https://localhost:{port}", TIMEOUTS,
                      network=UpstreamNetwork(ca_file=str(pki.ca)))
        try:
            with pytest.raises(ProtocolError, match="upstream speaks HTTP/2 only"):
                await up.request("POST", "/", [], b"{}")
        finally:
            await up.aclose()

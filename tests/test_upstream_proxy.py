"""Forward proxies (DESIGN §11): `HTTPS_PROXY` / `HTTP_PROXY` / `NO_PROXY` and their lower-case
forms, a CONNECT tunnel for an https upstream (TLS inside it, end to end), absolute-form requests
for an http one, credentials from the proxy URL as `Proxy-Authorization: Basic` and never in a
log line or an error. Through a real forward proxy on loopback (tests/net_harness.py) that
records what it saw, with the client alone and with a whole gateway in front of an SDK."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway.errors import UpstreamConnectError
from gateway.upstream import Timeouts, Upstream
from gateway.upstream_tls import NoProxy, ProxyURL, UpstreamNetwork
from tests.gateway_harness import write_policy
from tests.net_harness import (
    PROXIED_HOST,
    ForwardProxy,
    Origin,
    Pki,
    basic,
    gateway,
    listening,
    make_pki,
)
from tests.upstream_app import openai_body

TIMEOUTS = Timeouts(connect=2, read=3, total=5)
H = PROXIED_HOST  # the upstream's name: only the proxy resolves it
USER, PASSWORD = "svc@corp", "s3cr:t/pw"  # both need percent-encoding in a URL
PROXY_AUTH = basic(USER, PASSWORD)
ENCODED = "svc%40corp:s3cr%3At%2Fpw"

SYSTEM = '<chunk id="doc:1" version="2">The battery holds 62.5 kWh.</chunk>'
GOOD = orjson.dumps(openai_body("The battery holds 62.5 kWh [doc:1]."))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def proxy() -> Iterator[tuple[ForwardProxy, int]]:
    fp = ForwardProxy(credentials=PROXY_AUTH)
    with listening(fp.handle) as port:
        yield fp, port


# --------------------------------------------------------------------------------- no_proxy


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "bypass"),
    [
        ("*", "api.openai.com", 443, True),
        ("localhost, *", "anything.example", 443, True),
        ("example.com", "example.com", 443, True),
        ("example.com", "api.example.com", 443, True),  # a name covers the names under it
        (".example.com", "example.com", 443, True),  # a leading dot changes nothing (curl)
        (".example.com", "api.example.com", 443, True),
        ("example.com", "notexample.com", 443, False),  # a suffix of the name, not a domain
        ("example.com", "example.com.evil.net", 443, False),
        ("EXAMPLE.com.", "Api.Example.COM", 443, True),  # case, trailing dot
        ("example.com:8443", "example.com", 8443, True),  # host:port: that port only
        ("example.com:8443", "example.com", 443, False),
        ("10.0.0.0/8", "10.1.2.3", 80, True),  # CIDR
        ("10.0.0.0/8", "11.1.2.3", 80, False),
        ("127.0.0.1", "127.0.0.1", 80, True),
        ("127.0.0.1", "localhost", 80, False),  # names are not resolved
        ("::1", "::1", 443, True),
        ("[::1]:8443", "::1", 8443, True),
        ("[::1]:8443", "::1", 443, False),
        ("fd00::/8", "fd12::1", 443, True),
        ("a.com b.com,c.com", "b.com", 443, True),  # blanks separate too
        ("", "example.com", 443, False),
        ("10.0.0.0/8", "ten.example", 443, False),  # an address entry never matches a name
    ],
)
def test_no_proxy_rules_are_curls(no_proxy: str, host: str, port: int, bypass: bool) -> None:
    assert NoProxy(no_proxy).matches(host, port) is bypass


def test_proxy_variables_lower_case_first_then_upper_then_all_proxy() -> None:
    env = {"https_proxy": "http://low:1", "HTTPS_PROXY": "http://up:2", "HTTP_PROXY": "up:3",
           "ALL_PROXY": "http://all:4"}
    net = UpstreamNetwork.from_env(env)
    assert net.proxy_for("https", "api.example", 443) == ProxyURL("low", 1)
    assert net.proxy_for("http", "api.example", 80) == ProxyURL("up", 3)  # no scheme: http
    net = UpstreamNetwork.from_env({"ALL_PROXY": "http://all:4"})
    assert net.proxy_for("https", "x", 443) == ProxyURL("all", 4)
    assert UpstreamNetwork.from_env({}).proxy_for("https", "x", 443) is None
    net = UpstreamNetwork.from_env({"HTTPS_PROXY": "http://p:1", "no_proxy": "x",
                                    "NO_PROXY": "y"})
    assert net.proxy_for("https", "x", 443) is None  # lower-case no_proxy wins
    assert net.proxy_for("https", "y", 443) == ProxyURL("p", 1)


def test_proxy_credentials_become_basic_and_never_print() -> None:
    proxy = ProxyURL.parse(f"http://{ENCODED}@proxy.corp:3128", "HTTPS_PROXY")
    assert proxy.authorization == PROXY_AUTH
    for shown in (str(proxy), repr(proxy)):
        assert PASSWORD not in shown and "s3cr" not in shown and PROXY_AUTH not in shown
    assert str(proxy) == "http://proxy.corp:3128 (with credentials)"


@pytest.mark.parametrize("url", ["https://proxy:443", "socks5://proxy:1080"])
def test_a_proxy_this_client_cannot_use_is_refused_not_bypassed(url: str) -> None:
    net = UpstreamNetwork.from_env({"HTTPS_PROXY": url})
    with pytest.raises(ValueError, match=r"HTTPS_PROXY: .* not supported"):
        net.check("https://api.example.com")
    # ...but only when it applies to the upstream
    UpstreamNetwork.from_env({"HTTPS_PROXY": url, "NO_PROXY": "api.example.com"}).check(
        "https://api.example.com")


# ------------------------------------------------------------------------------ the client


async def test_https_upstream_through_a_connect_tunnel(pki: Pki, proxy) -> None:
    fp, proxy_port = proxy
    origin = Origin(body=b"ok", tls=pki.server_context())
    with listening(origin.handle) as port:
        net = UpstreamNetwork.from_env(
            {"HTTPS_PROXY": f"http://{ENCODED}@127.0.0.1:{proxy_port}"}, ca_file=str(pki.ca))
        up = Upstream(f"https://{H}:{port}/base", TIMEOUTS, network=net)
        assert up.proxy == f"http://127.0.0.1:{proxy_port} (with credentials)"  # as logged
        try:
            for i in range(2):
                resp = await up.request("POST", f"/v1/x?n={i}", [], b"{}")
                assert (resp.status, resp.body) == (200, b"ok")
        finally:
            await up.aclose()
    # One tunnel, kept alive for both requests; credentials on the CONNECT only.
    assert fp.lines == [f"CONNECT {H}:{port} HTTP/1.1"]
    assert fp.heads[0].values("proxy-authorization") == [PROXY_AUTH]
    assert fp.heads[0].values("host") == [f"{H}:{port}"]
    assert [s.line for s in origin.seen] == ["POST /base/v1/x?n=0 HTTP/1.1",
                                             "POST /base/v1/x?n=1 HTTP/1.1"]
    assert all(s.values("proxy-authorization") == [] for s in origin.seen)
    assert origin.connections == 1


async def test_tls_inside_the_tunnel_is_verified_end_to_end(pki: Pki, proxy) -> None:
    """The proxy carries bytes; the upstream's certificate is still checked against the
    trust the gateway was given."""
    fp, proxy_port = proxy
    origin = Origin(body=b"ok", tls=pki.server_context())
    with listening(origin.handle) as port:
        net = UpstreamNetwork.from_env(
            {"https_proxy": f"http://{ENCODED}@127.0.0.1:{proxy_port}"},
            ca_file=str(pki.other_ca))
        up = Upstream(f"https://{H}:{port}", TIMEOUTS, network=net)
        try:
            with pytest.raises(UpstreamConnectError, match="TLS failure") as e:
                await up.request("GET", "/", [], b"")
        finally:
            await up.aclose()
    assert fp.lines == [f"CONNECT {H}:{port} HTTP/1.1"]
    assert origin.seen == []
    assert "through proxy" not in str(e.value) or PASSWORD not in str(e.value)


async def test_http_upstream_through_the_proxy_in_absolute_form(proxy) -> None:
    fp, proxy_port = proxy
    origin = Origin(body=b"ok")
    with listening(origin.handle) as port:
        net = UpstreamNetwork.from_env({"http_proxy": f"{ENCODED}@127.0.0.1:{proxy_port}"})
        up = Upstream(f"http://{H}:{port}/prefix", TIMEOUTS, network=net)
        try:
            resp = await up.request("GET", "/v1/models?a=1", [("x-api-key", "k")], b"")
        finally:
            await up.aclose()
    assert (resp.status, resp.body) == (200, b"ok")
    [head] = fp.heads
    assert head.line == f"GET http://{H}:{port}/prefix/v1/models?a=1 HTTP/1.1"
    assert head.values("host") == [f"{H}:{port}"]
    assert head.values("proxy-authorization") == [PROXY_AUTH]
    assert head.values("x-api-key") == ["k"]
    assert [s.line for s in origin.seen] == ["GET /prefix/v1/models?a=1 HTTP/1.1"]


@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("host", ["localhost", "127.0.0.1"])
async def test_a_loopback_upstream_is_never_proxied(pki: Pki, proxy, scheme: str,
                                                    host: str) -> None:
    """A sidecar's application on 127.0.0.1 stays on the pod whatever the environment says (as
    Go's net/http decides); no NO_PROXY needed."""
    fp, proxy_port = proxy
    origin = Origin(body=b"ok", tls=pki.server_context() if scheme == "https" else None)
    with listening(origin.handle) as port:
        net = UpstreamNetwork.from_env(
            {"HTTPS_PROXY": f"http://127.0.0.1:{proxy_port}",
             "HTTP_PROXY": f"http://127.0.0.1:{proxy_port}"},
            ca_file=str(pki.ca))
        up = Upstream(f"{scheme}://{host}:{port}", TIMEOUTS, network=net)
        assert up.proxy is None
        try:
            assert (await up.request("GET", "/", [], b"")).body == b"ok"
        finally:
            await up.aclose()
    assert fp.heads == []
    assert len(origin.seen) == 1


@pytest.mark.parametrize(
    ("no_proxy", "proxied"),
    [("", True), (H, False), (f".internal.test,{H}:1", False), (f"{H}:2", True), ("*", False)])
def test_no_proxy_decides_for_the_upstream(no_proxy: str, proxied: bool) -> None:
    net = UpstreamNetwork.from_env(
        {"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": no_proxy})
    up = Upstream(f"https://{H}:1", TIMEOUTS, network=net)
    assert (up.proxy == "http://proxy.corp:3128") is proxied


@pytest.mark.parametrize("given", [None, "wrong:pw"])
async def test_a_proxy_that_refuses_the_tunnel_is_a_502_that_says_so(pki: Pki, proxy,
                                                                     given: str | None) -> None:
    fp, proxy_port = proxy
    userinfo = f"{given}@" if given else ""
    net = UpstreamNetwork.from_env({"HTTPS_PROXY": f"http://{userinfo}127.0.0.1:{proxy_port}"},
                                   ca_file=str(pki.ca))
    up = Upstream(f"https://{H}:9", TIMEOUTS, network=net)
    try:
        with pytest.raises(UpstreamConnectError, match="refused the tunnel") as e:
            await up.request("POST", "/", [], b"{}")
    finally:
        await up.aclose()
    assert "(407)" in str(e.value)
    assert ("credentials were rejected" in str(e.value)) is (given is not None)
    assert "pw" not in str(e.value)
    assert fp.lines == [f"CONNECT {H}:9 HTTP/1.1"]


async def test_an_unreachable_proxy_names_the_proxy_not_its_credentials() -> None:
    with listening(lambda sock: None) as port:
        pass  # a port that was just free: nothing listens on it now
    net = UpstreamNetwork.from_env({"HTTPS_PROXY": f"http://{ENCODED}@127.0.0.1:{port}"})
    up = Upstream(f"https://{H}:9", TIMEOUTS, network=net)
    try:
        with pytest.raises(UpstreamConnectError, match=f"proxy http://127.0.0.1:{port}") as e:
            await up.request("GET", "/", [], b"")
    finally:
        await up.aclose()
    assert "s3cr" not in str(e.value)


# ----------------------------------------------------------------------- through the gateway


def _chat(client: openai.OpenAI) -> str:
    completion = client.chat.completions.create(
        model="m", messages=[{"role": "system", "content": SYSTEM},
                             {"role": "user", "content": "capacity?"}])
    return completion.choices[0].message.content or ""


def test_the_gateway_honours_https_proxy_from_its_environment(
    tmp_path: Path, pki: Pki, proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp, proxy_port = proxy
    origin = Origin(body=GOOD, tls=pki.server_context(), keep_alive=False)
    monkeypatch.setenv("HTTPS_PROXY", f"http://{ENCODED}@127.0.0.1:{proxy_port}")
    log = io.StringIO()
    with listening(origin.handle) as port, gateway(
        f"https://{H}:{port}", [write_policy(tmp_path)], log,
        upstream_ca_file=str(pki.ca),
    ) as gw, httpx.Client(trust_env=False) as http:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0,
                               http_client=http)
        assert _chat(client) == "The battery holds 62.5 kWh [doc:1]."
        # A proxy that now wants other credentials: a 502 that says why, and no secret
        # anywhere.
        fp.credentials = basic("someone", "else")
        r = http.post(gw.url + "/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "again"}]},
            headers={"authorization": "Bearer sk-test", "x-request-id": "proxy-refused"})
        time.sleep(0.2)  # the audit line follows the answer
    assert fp.lines[0] == f"CONNECT {H}:{port} HTTP/1.1"
    assert [s.line for s in origin.seen] == ["POST /v1/chat/completions HTTP/1.1"]
    assert origin.seen[0].values("authorization") == ["Bearer sk-test"]
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    assert "proxy" in message and "407" in message
    text = log.getvalue()
    assert "proxy-refused" in text  # the failed exchange was logged...
    for secret in (PASSWORD, "s3cr", PROXY_AUTH, PROXY_AUTH.split()[1], ENCODED):
        assert secret not in text  # ...without the proxy's credentials
        assert secret not in r.text


def test_the_gateway_sends_http_upstream_requests_to_the_proxy_in_absolute_form(
    tmp_path: Path, proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp, proxy_port = proxy
    origin = Origin(body=GOOD)
    monkeypatch.setenv("http_proxy", f"http://{ENCODED}@127.0.0.1:{proxy_port}")
    with listening(origin.handle) as port, gateway(
        f"http://{H}:{port}", [write_policy(tmp_path)]
    ) as gw, httpx.Client(trust_env=False) as http:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0,
                               http_client=http)
        assert _chat(client) == "The battery holds 62.5 kWh [doc:1]."
    assert fp.lines == [f"POST http://{H}:{port}/v1/chat/completions HTTP/1.1"]
    assert fp.heads[0].values("proxy-authorization") == [PROXY_AUTH]

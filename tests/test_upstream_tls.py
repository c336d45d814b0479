"""TLS to the upstream (DESIGN §11): `--upstream-ca-file` (a PEM bundle, in place of the system
store; `SSL_CERT_FILE` still works without it), `--upstream-client-cert` / `--upstream-client-key`
(mTLS) and their `CITEWARDEN_UPSTREAM_*` env forms, and TLS failures that say "TLS" and their
class in the 502 and the log. Against real TLS origins on loopback, one of them requiring a
client certificate signed by its own CA (tests/net_harness.py)."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from gateway import cli
from gateway.errors import UpstreamConnectError
from gateway.upstream import Timeouts, Upstream
from gateway.upstream_tls import UpstreamNetwork
from tests.gateway_harness import write_policy
from tests.net_harness import Origin, Pki, gateway, listening, make_pki
from tests.upstream_app import openai_body

TIMEOUTS = Timeouts(connect=2, read=3, total=5)
SYSTEM = '<chunk id="doc:1" version="2">The battery holds 62.5 kWh.</chunk>'
ANSWER = "The battery holds 62.5 kWh [doc:1]."
GOOD = orjson.dumps(openai_body(ANSWER))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)


async def _get(url: str, net: UpstreamNetwork) -> bytes:
    up = Upstream(url, TIMEOUTS, network=net)
    try:
        return (await up.request("POST", "/v1/x", [], b"{}")).body
    finally:
        await up.aclose()


# -------------------------------------------------------------------------------- trust


async def test_ca_file_trusts_a_private_ca(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    origin = Origin(body=b"ok", tls=pki.server_context())
    with listening(origin.handle) as port:
        assert await _get(f"https://localhost:{port}",
                          UpstreamNetwork(ca_file=str(pki.ca))) == b"ok"


async def test_ca_file_replaces_the_default_trust(pki: Pki,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle that does not hold the upstream's CA fails, even though SSL_CERT_FILE (the
    default store) would have trusted it: the operator's bundle is the whole trust."""
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    origin = Origin(body=b"ok", tls=pki.server_context())
    with listening(origin.handle) as port:
        assert await _get(f"https://localhost:{port}", UpstreamNetwork()) == b"ok"
        with pytest.raises(UpstreamConnectError) as e:
            await _get(f"https://localhost:{port}", UpstreamNetwork(ca_file=str(pki.other_ca)))
    assert str(e.value) == (
        "upstream TLS failure: the upstream's certificate did not verify: issuer not in the "
        "trusted CA bundle (--upstream-ca-file / SSL_CERT_FILE) (CERTIFICATE_VERIFY_FAILED)")
    assert len(origin.seen) == 1


async def test_a_hostname_the_certificate_does_not_name_is_a_tls_failure(pki: Pki) -> None:
    origin = Origin(body=b"ok", tls=pki.server_context(elsewhere=True))
    with listening(origin.handle) as port, pytest.raises(
        UpstreamConnectError, match=r"TLS failure.*did not verify"
    ) as e:
        await _get(f"https://localhost:{port}", UpstreamNetwork(ca_file=str(pki.ca)))
    assert "mismatch" in str(e.value).lower()


def _plain_http_400(sock: socket.socket) -> None:
    sock.recv(65536)  # a TLS hello, not a request
    sock.sendall(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")


async def test_tls_to_a_plain_http_port_says_so(pki: Pki) -> None:
    with listening(_plain_http_400) as port, pytest.raises(UpstreamConnectError,
                       match="upstream TLS failure: the upstream does not speak TLS"):
        await _get(f"https://localhost:{port}", UpstreamNetwork(ca_file=str(pki.ca)))


# ----------------------------------------------------------------------------------- mTLS


async def test_client_certificate_is_presented(pki: Pki) -> None:
    origin = Origin(body=b"ok", tls=pki.server_context(require_client_cert=True))
    net = UpstreamNetwork(ca_file=str(pki.ca), client_cert=str(pki.client_cert),
                          client_key=str(pki.client_key))
    with listening(origin.handle) as port:
        assert await _get(f"https://localhost:{port}", net) == b"ok"
    assert [s.peer_cn for s in origin.seen] == ["citewarden-gateway"]


async def test_key_and_certificate_in_one_file(pki: Pki, tmp_path: Path) -> None:
    both = tmp_path / "both.pem"
    both.write_bytes(pki.client_cert.read_bytes() + pki.client_key.read_bytes())
    origin = Origin(body=b"ok", tls=pki.server_context(require_client_cert=True))
    with listening(origin.handle) as port:
        assert await _get(f"https://localhost:{port}",
                          UpstreamNetwork(ca_file=str(pki.ca), client_cert=str(both))) == b"ok"


async def test_an_upstream_that_requires_a_client_certificate_says_so(pki: Pki) -> None:
    """Not "upstream closed the connection before the response": under TLS 1.3 the refusal
    arrives after the client's handshake, in place of the answer."""
    origin = Origin(body=b"ok", tls=pki.server_context(require_client_cert=True))
    with listening(origin.handle) as port, pytest.raises(UpstreamConnectError) as e:
        await _get(f"https://localhost:{port}", UpstreamNetwork(ca_file=str(pki.ca)))
    message = str(e.value)
    assert message.startswith("upstream TLS failure: the upstream requires a client certificate")
    assert "closed the connection" not in message
    assert origin.seen == []


async def test_a_client_certificate_from_the_wrong_ca_is_refused(pki: Pki, tmp_path: Path) -> None:
    # The server's own leaf, presented as a client certificate: signed by a CA the origin's
    # client-certificate trust does not hold.
    origin = Origin(body=b"ok", tls=pki.server_context(require_client_cert=True))
    net = UpstreamNetwork(ca_file=str(pki.ca), client_cert=str(pki.server_cert),
                          client_key=str(pki.server_key))
    with listening(origin.handle) as port, pytest.raises(
        UpstreamConnectError,
        match="upstream TLS failure: the upstream refused the client certificate",
    ):
        await _get(f"https://localhost:{port}", net)
    assert origin.seen == []


# ------------------------------------------------------------------------ through a gateway


def _chat(http: httpx.Client, url: str) -> httpx.Response:
    return http.post(url + "/v1/chat/completions", headers={"x-request-id": "tls-case"}, json={
        "model": "m", "messages": [{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": "capacity?"}]})


def test_gateway_with_mtls_settings_releases(pki: Pki, tmp_path: Path) -> None:
    origin = Origin(body=GOOD, tls=pki.server_context(require_client_cert=True))
    with listening(origin.handle) as port, gateway(
        f"https://localhost:{port}", [write_policy(tmp_path)],
        upstream_ca_file=str(pki.ca), upstream_client_cert=str(pki.client_cert),
        upstream_client_key=str(pki.client_key),
    ) as gw, httpx.Client(trust_env=False) as http:
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="sk", max_retries=0,
                               http_client=http)
        completion = client.chat.completions.create(
            model="m", messages=[{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": "capacity?"}])
    assert completion.choices[0].message.content == ANSWER
    assert [s.peer_cn for s in origin.seen] == ["citewarden-gateway"]


def test_gateway_without_the_client_certificate_answers_a_502_that_says_tls(
    pki: Pki, tmp_path: Path
) -> None:
    origin = Origin(body=GOOD, tls=pki.server_context(require_client_cert=True))
    log = io.StringIO()
    with listening(origin.handle) as port, gateway(
        f"https://localhost:{port}", [write_policy(tmp_path)], log,
        upstream_ca_file=str(pki.ca),
    ) as gw, httpx.Client(trust_env=False) as http:
        r = _chat(http, gw.url)
        time.sleep(0.2)  # the audit line follows the answer
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    assert "TLS" in message and "requires a client certificate" in message
    assert "closed the connection" not in message
    events = [json.loads(x) for x in log.getvalue().splitlines()]
    [audit] = [e for e in events if e.get("request_id") == "tls-case"]
    assert audit["decision"] == "error"
    [failed] = [e for e in events if e.get("event") == "upstream_connection_failed"]
    assert failed["error"] == message.removeprefix("citewarden: ")
    assert failed["upstream"] == f"localhost:{port}"


# ------------------------------------------------------------------------------------ CLI


def _serve(tmp_path: Path, *extra: str) -> list[str]:
    return ["serve", "--upstream", "https://llm.internal", "--policy",
            str(write_policy(tmp_path)), *extra]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--upstream-ca-file", "/nonexistent/ca.pem"],
         "--upstream-ca-file: no such file: /nonexistent/ca.pem"),
        (["--upstream-client-key", "KEY"], "--upstream-client-key needs --upstream-client-cert"),
        (["--upstream-client-cert", "CA"], "upstream TLS settings:"),  # a CA has no key
    ],
)
def test_unusable_tls_files_are_one_line_and_exit_2(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
    expected: str
) -> None:
    flags = [str(pki.client_key) if f == "KEY" else str(pki.ca) if f == "CA" else f
             for f in flags]
    assert cli.main(_serve(tmp_path, *flags)) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_tls_flags_read_their_env(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CITEWARDEN_UPSTREAM_CA_FILE", str(pki.ca))
    monkeypatch.setenv("CITEWARDEN_UPSTREAM_CLIENT_CERT", str(pki.client_cert))
    monkeypatch.setenv("CITEWARDEN_UPSTREAM_CLIENT_KEY", str(pki.client_key))
    args = cli.build_parser().parse_args(["serve"])
    assert (args.upstream_ca_file, args.upstream_client_cert, args.upstream_client_key) == (
        str(pki.ca), str(pki.client_cert), str(pki.client_key))
    from gateway.server import settings_from_args

    settings = settings_from_args(args, "https://x", ["p.yaml"])
    assert settings.upstream_client_key == str(pki.client_key)

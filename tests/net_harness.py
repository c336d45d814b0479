"""Loopback network pieces for the upstream-connection tests (DESIGN §11): a throwaway PKI, an
HTTP/1.1 origin (plain or TLS, optionally demanding a client certificate, or speaking HTTP/2
only), a forward proxy that tunnels CONNECT and relays absolute-form requests and records what
it saw, and a real gateway with any `Settings` fields.

Every server runs in a thread of its own, so a gateway (which runs in its own thread too) and a
test's own event loop can both use it.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import io
import ipaddress
import socket
import socketserver
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.audit import configure_logging, reset_logging
from gateway.server import Settings, build
from tests.gateway_harness import Gateway
from tests.upstream_app import serve

# A name only the test proxy resolves (to 127.0.0.1): loopback upstreams are never proxied.
PROXIED_HOST = "llm.internal.test"

# ----------------------------------------------------------------------------------------- PKI


@dataclass(frozen=True)
class Pki:
    ca: Path  # trusts `server`
    server_cert: Path  # localhost, PROXIED_HOST and 127.0.0.1
    server_key: Path
    client_ca: Path  # signed `client_cert`
    client_cert: Path  # CN=citewarden-gateway, clientAuth
    client_key: Path
    other_ca: Path  # signed nothing here: trusting it alone trusts no server of this PKI
    elsewhere_cert: Path  # signed by `ca` for elsewhere.example only
    elsewhere_key: Path

    def server_context(self, *, require_client_cert: bool = False,
                       alpn: list[str] | None = None, elsewhere: bool = False) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        if elsewhere:
            ctx.load_cert_chain(self.elsewhere_cert, self.elsewhere_key)
        else:
            ctx.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.client_ca)
        if alpn is not None:
            ctx.set_alpn_protocols(alpn)
        return ctx


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn)).issuer_name(_name(cn)).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=False, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, cn: str, *,
          server: bool, names: list[x509.GeneralName] | None = None,
          ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn)).issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(names or
            [x509.DNSName("localhost"), x509.DNSName(PROXIED_HOST),
             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(path: Path, *items: x509.Certificate | ec.EllipticCurvePrivateKey) -> Path:
    out = b""
    for item in items:
        if isinstance(item, x509.Certificate):
            out += item.public_bytes(serialization.Encoding.PEM)
        else:
            out += item.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())
    path.write_bytes(out)
    return path


def make_pki(d: Path) -> Pki:
    ca_key, ca = _ca("citewarden test CA")
    server_key, server = _leaf(ca_key, ca, "localhost", server=True)
    cca_key, cca = _ca("citewarden test client CA")
    client_key, client = _leaf(cca_key, cca, "citewarden-gateway", server=False)
    _, other = _ca("some other CA")
    elsewhere_key, elsewhere = _leaf(ca_key, ca, "elsewhere.example", server=True,
                                     names=[x509.DNSName("elsewhere.example")])
    return Pki(
        ca=_write(d / "ca.pem", ca),
        server_cert=_write(d / "server.pem", server),
        server_key=_write(d / "server.key", server_key),
        client_ca=_write(d / "client-ca.pem", cca),
        client_cert=_write(d / "client.pem", client),
        client_key=_write(d / "client.key", client_key),
        other_ca=_write(d / "other-ca.pem", other),
        elsewhere_cert=_write(d / "elsewhere.pem", elsewhere),
        elsewhere_key=_write(d / "elsewhere.key", elsewhere_key),
    )


# -------------------------------------------------------------------------------------- origin

# An HTTP/2 server's first frame: SETTINGS (type 4) on stream 0, empty; then GOAWAY (type 7).
H2_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
H2_GOAWAY = b"\x00\x00\x08\x07\x00\x00\x00\x00\x00" + b"\x00" * 4 + b"\x00\x00\x00\x01"


@dataclass
class Seen:
    conn: int
    head: bytes
    body: bytes
    peer_cn: str | None = None  # the client certificate's CN, on a TLS connection

    @property
    def line(self) -> str:
        return self.head.split(b"\r\n", 1)[0].decode("latin-1")

    def values(self, name: str) -> list[str]:
        out = []
        for line in self.head.decode("latin-1").split("\r\n")[1:]:
            n, _, v = line.partition(":")
            if n.strip().lower() == name:
                out.append(v.strip())
        return out


def _read_head(sock: socket.socket, data: bytes = b"") -> tuple[bytes, bytes] | None:
    while b"\r\n\r\n" not in data:
        got = sock.recv(65536)
        if not got:
            return None
        data += got
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


@dataclass
class Origin:
    """An HTTP/1.1 origin: answers every request with `body` on a keep-alive connection, or
    (`hang_up_reused`) closes a connection on reading its second request without a byte of
    answer — the keep-alive race, made deterministic — or (`http2`) answers as an HTTP/2 server
    that got an HTTP/1.1 request."""

    body: bytes = b'{"ok": true}'
    content_type: str = "application/json"
    tls: ssl.SSLContext | None = None
    hang_up_reused: bool = False
    http2: bool = False
    keep_alive: bool = True  # False: every answer says `connection: close` and closes
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    tls_failures: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, sock: socket.socket) -> None:
        with self._lock:
            conn, self.connections = self.connections, self.connections + 1
        peer_cn = None
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            try:
                sock.do_handshake()
            except (ssl.SSLError, OSError) as e:
                self.tls_failures.append(type(e).__name__)
                _linger(sock)
                return
            with sock:
                cert = sock.getpeercert()
                if cert:
                    peer_cn = dict(x[0] for x in cert["subject"])["commonName"]
                self._serve(sock, conn, peer_cn)
            return
        self._serve(sock, conn, peer_cn)

    def _serve(self, sock: socket.socket, conn: int, peer_cn: str | None) -> None:
        rest = b""
        served = 0
        while True:
            try:
                got = _read_head(sock, rest)
            except (ssl.SSLError, OSError) as e:  # TLS 1.3: a refused client cert lands here
                self.tls_failures.append(type(e).__name__)
                return
            if got is None:
                return
            head, rest = got
            length = 0
            for line in head.split(b"\r\n")[1:]:
                n, _, v = line.partition(b":")
                if n.strip().lower() == b"content-length":
                    length = int(v.strip())
            while len(rest) < length:
                more = sock.recv(65536)
                if not more:
                    return
                rest += more
            body, rest = rest[:length], rest[length:]
            self.seen.append(Seen(conn, head + b"\r\n\r\n", body, peer_cn))
            if self.http2:
                sock.sendall(H2_SETTINGS + H2_GOAWAY)
                return
            if self.hang_up_reused and served:
                return
            close = b"" if self.keep_alive else b"connection: close\r\n"
            sock.sendall(
                b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n%s\r\n%s"
                % (self.content_type.encode(), len(self.body), close, self.body))
            served += 1
            if not self.keep_alive:
                return


def _linger(sock: ssl.SSLSocket) -> None:
    """Close after a failed handshake as servers do (a lingering close): the alert already
    sent, read what the client still sends until it closes, so that no reset overtakes it."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_WR)
        sock.settimeout(1.0)
        while socket.socket.recv(sock, 65536):
            pass
    sock.close()


class _Threaded(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    serve_one: Callable[[socket.socket], None]


class _Handler(socketserver.BaseRequestHandler):
    server: _Threaded

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait between writes
        with contextlib.suppress(OSError):
            self.server.serve_one(sock)


@contextlib.contextmanager
def listening(serve_one: Callable[[socket.socket], None]) -> Iterator[int]:
    """`serve_one(sock)` for every connection to 127.0.0.1:<port>, in threads; yields the port."""
    server = _Threaded(("127.0.0.1", 0), _Handler)
    server.serve_one = serve_one
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
    )
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5.0)


# --------------------------------------------------------------------------------------- proxy


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@dataclass
class ForwardProxy:
    """A forward proxy: CONNECT host:port opens a tunnel, an absolute-form request is relayed
    in origin form (its `proxy-authorization` removed). With `credentials`, a request without
    that `Proxy-Authorization` gets 407. Records each connection's first head. It resolves
    PROXIED_HOST to 127.0.0.1 itself, as a corporate proxy resolves names its clients cannot."""

    credentials: str | None = None  # the expected Proxy-Authorization value
    heads: list[Seen] = field(default_factory=list)

    @property
    def lines(self) -> list[str]:
        return [h.line for h in self.heads]

    def handle(self, client: socket.socket) -> None:
        got = _read_head(client)
        if got is None:
            return
        head, rest = got
        seen = Seen(len(self.heads), head + b"\r\n\r\n", b"")
        self.heads.append(seen)
        method, target, _ = seen.line.split(" ", 2)
        if self.credentials is not None and seen.values("proxy-authorization") != [
                self.credentials]:
            client.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                           b"proxy-authenticate: Basic realm=\"test\"\r\ncontent-length: 0\r\n"
                           b"connection: close\r\n\r\n")
            return
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            upstream = socket.create_connection((_resolve(host.strip("[]")), int(port)), timeout=5)
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            first = rest
        else:
            assert target.startswith("http://"), target
            authority, _, path = target[len("http://"):].partition("/")
            host, _, port = authority.rpartition(":")
            upstream = socket.create_connection((_resolve(host), int(port)), timeout=5)
            lines = head.split(b"\r\n")
            kept = [b"%s /%s HTTP/1.1" % (method.encode(), path.encode())] + [
                x for x in lines[1:] if not x.lower().startswith(b"proxy-authorization:")]
            first = b"\r\n".join(kept) + b"\r\n\r\n" + rest
        with upstream:
            upstream.sendall(first)
            pump = threading.Thread(target=_pipe, args=(client, upstream), daemon=True)
            pump.start()
            _pipe(upstream, client)
            pump.join(5.0)


def _resolve(host: str) -> str:
    return "127.0.0.1" if host == PROXIED_HOST else host


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


# ------------------------------------------------------------------------------------- gateway


@contextlib.contextmanager
def gateway(upstream_url: str, policies: list[Path], log: io.StringIO | None = None,
            **fields: Any) -> Iterator[Gateway]:
    """A real gateway (proxy and admin apps on loopback) with these `Settings` fields; its log
    goes to `log` (JSON lines) or nowhere."""
    settings = Settings(upstream=upstream_url, policies=[str(p) for p in policies],
                        connect_timeout=2.0, read_timeout=5.0, total_timeout=10.0, **fields)
    configure_logging(stream=log if log is not None else io.StringIO())
    try:
        proxy, admin, store, metrics = build(settings)
        with serve(proxy, lifespan="on") as url, serve(admin) as admin_url:  # type: ignore[arg-type]
            yield Gateway(url, admin_url, metrics, store)
    finally:
        reset_logging()

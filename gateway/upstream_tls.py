"""How the gateway reaches an upstream: TLS trust, a client certificate, and a forward proxy.

`UpstreamNetwork` is the one settings object for it (DESIGN §11). The gateway's upstream pool
(`gateway.http1.Pool`) takes one; any other client of an upstream service (the judge pass) can
take the same one and ask it for the two things a connection needs:

* `ssl_context()`: the trust (`--upstream-ca-file`, else the default store, where
  `SSL_CERT_FILE` / `SSL_CERT_DIR` still apply), the client certificate and key (mTLS), ALPN
  `http/1.1`;
* `proxy_for(scheme, host, port)`: the forward proxy a connection to that origin goes through,
  or None — `https_proxy` / `http_proxy` / `all_proxy` (lower case first, then upper case), minus
  the hosts `no_proxy` names, with curl's rules (`NoProxy`), and minus loopback (`localhost`,
  `*.localhost`, 127.0.0.0/8, ::1) always, as Go's net/http does: a sidecar's application on
  127.0.0.1 is never sent through a remote proxy, whatever the pod's environment says.

Proxies are `http://[user:password@]host[:port]`; the credentials become a
`Proxy-Authorization: Basic` value and are never part of what `ProxyURL` prints. An `https://`
or `socks*://` proxy is refused at start-up rather than bypassed: traffic the operator routed
through a proxy never silently goes direct.

`tls_failure(exc)` names the class of a TLS failure (untrusted certificate, a client
certificate the upstream requires, a refused handshake, a peer that does not speak TLS) from
OpenSSL's fixed reason codes, never from peer data.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

__all__ = [
    "NoProxy",
    "ProxyURL",
    "UpstreamNetwork",
    "tls_failure",
]

HTTP2_ONLY = "upstream speaks HTTP/2 only (this gateway's upstream client speaks HTTP/1.1)"


@dataclass(frozen=True, slots=True)
class ProxyURL:
    """A forward proxy. `authorization` is the `Proxy-Authorization` value (or None); it is
    left out of repr and str, so a proxy can be logged as it is."""

    host: str
    port: int
    authorization: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}" + (" (with credentials)" if self.authorization else "")

    @classmethod
    def parse(cls, url: str, source: str) -> ProxyURL:
        """`url` as a proxy; ValueError naming `source` (the variable) when it is not usable.
        A URL without a scheme is http (as curl reads it)."""
        if "://" not in url:
            url = "http://" + url
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme != "http":
            raise ValueError(
                f"{source}: {scheme}:// proxies are not supported; use an http:// proxy "
                "(https upstreams still go through it encrypted, in a CONNECT tunnel)")
        if not parts.hostname:
            raise ValueError(f"{source}: no proxy host in the URL")
        try:
            port = parts.port or 80
        except ValueError:
            raise ValueError(f"{source}: bad proxy port") from None
        auth = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            auth = "Basic " + base64.b64encode(pair.encode("utf-8")).decode("ascii")
        return cls(parts.hostname, port, auth)


def _strip_host(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


class NoProxy:
    """A `no_proxy` value, matched as curl matches it: entries separated by commas (and
    blanks); `*` matches every host; a name matches itself and every name under it (a leading
    dot changes nothing: `.example.com` and `example.com` both match `example.com` and
    `api.example.com`); an IP address matches itself, a CIDR range (`10.0.0.0/8`) every
    address in it; `host:port` (`[v6]:port`) only that port. Case-insensitive; a trailing dot
    is ignored."""

    __slots__ = ("_entries", "value")

    def __init__(self, value: str) -> None:
        self.value = value
        self._entries = self._parse(value)

    @staticmethod
    def _parse(value: str) -> list[tuple[str, int | None]]:
        out: list[tuple[str, int | None]] = []
        for raw in value.replace(",", " ").split():
            entry, port = raw, None
            if entry.startswith("["):  # [v6] or [v6]:port
                close = entry.find("]")
                rest = entry[close + 1:]
                if close > 0 and rest.startswith(":") and rest[1:].isdigit():
                    port = int(rest[1:])
                entry = entry[1:close] if close > 0 else entry
            elif entry.count(":") == 1:  # name:port or v4:port (a bare v6 has several)
                name, _, p = entry.partition(":")
                if p.isdigit():
                    entry, port = name, int(p)
            entry = _strip_host(entry).lstrip(".")
            if entry:
                out.append((entry, port))
        return out

    def matches(self, host: str, port: int) -> bool:
        host = _strip_host(host)
        try:
            addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(
                host)
        except ValueError:
            addr = None
        for entry, entry_port in self._entries:
            if entry_port is not None and entry_port != port:
                continue
            if entry == "*":
                return True
            if addr is not None:
                try:
                    if addr in ipaddress.ip_network(entry, strict=False):
                        return True
                except ValueError:
                    continue  # a name entry never matches an address
            elif host == entry or host.endswith("." + entry):
                return True
        return False


def is_loopback(host: str) -> bool:
    """`localhost`, a name under `.localhost`, or a loopback address (never proxied)."""
    host = _strip_host(host)
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _env(environ: Mapping[str, str], *names: str) -> str | None:
    """The first of `names` set to a non-empty value (lower case is listed first, as curl and
    Python's urllib prefer it)."""
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


@dataclass(frozen=True)
class UpstreamNetwork:
    """TLS and proxy settings for connections to an upstream (see the module docstring)."""

    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    http_proxy: str | None = None  # the proxy URLs as given; parsed by proxy_for
    https_proxy: str | None = None
    no_proxy: str = ""
    http_proxy_source: str = "http_proxy"
    https_proxy_source: str = "https_proxy"

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        ca_file: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
    ) -> UpstreamNetwork:
        """The proxy variables of `environ` (default: the process's) and these TLS files."""
        env = os.environ if environ is None else environ

        def pick(*names: str) -> tuple[str | None, str]:
            for name in names:
                value = env.get(name, "").strip()
                if value:
                    return value, name
            return None, names[0]

        http, http_src = pick("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")
        https, https_src = pick("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")
        return cls(
            ca_file=ca_file or None,
            client_cert=client_cert or None,
            client_key=client_key or None,
            http_proxy=http,
            https_proxy=https,
            no_proxy=_env(env, "no_proxy", "NO_PROXY") or "",
            http_proxy_source=http_src,
            https_proxy_source=https_src,
        )

    # -------------------------------------------------------------------------------- proxy

    def proxy_for(self, scheme: str, host: str, port: int) -> ProxyURL | None:
        """The proxy for a connection to scheme://host:port, or None (direct). ValueError
        when the variable that applies names a proxy this client cannot use."""
        if scheme == "https":
            url, source = self.https_proxy, self.https_proxy_source
        else:
            url, source = self.http_proxy, self.http_proxy_source
        if url is None or is_loopback(host) or NoProxy(self.no_proxy).matches(host, port):
            return None
        return ProxyURL.parse(url, source)

    # ---------------------------------------------------------------------------------- TLS

    def ssl_context(self) -> ssl.SSLContext:
        """A client context: verified, hostname-checked, ALPN http/1.1, with the client
        certificate when one is set. OSError / ssl.SSLError / ValueError when a file cannot be
        used (`check` turns these into one line at start-up)."""
        if self.client_key and not self.client_cert:
            raise ValueError("--upstream-client-key needs --upstream-client-cert")
        # With a CA file, that bundle is the whole trust (as curl --cacert); without one, the
        # default store, where SSL_CERT_FILE / SSL_CERT_DIR apply.
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.set_alpn_protocols(["http/1.1"])
        if self.client_cert:
            ctx.load_cert_chain(self.client_cert, self.client_key, password=_no_password)
        return ctx

    def check(self, base_url: str) -> None:
        """Everything a connection to `base_url` will need, loaded once: ValueError with one
        line naming the problem (an unreadable or invalid file, an unusable proxy)."""
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        self.proxy_for(parts.scheme, host, parts.port or (443 if tls else 80))
        for flag, path in (("--upstream-ca-file", self.ca_file),
                           ("--upstream-client-cert", self.client_cert),
                           ("--upstream-client-key", self.client_key)):
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{flag}: no such file: {path}")
        if tls or self.ca_file or self.client_cert:
            try:
                self.ssl_context()
            except ssl.SSLError as e:
                raise ValueError(f"upstream TLS settings: {tls_reason(e)}") from None
            except OSError as e:
                raise ValueError(f"upstream TLS settings: {e.strerror or e}") from None


def _no_password() -> str:
    raise ValueError("the client key is encrypted; give it unencrypted (mounted from a Secret)")


# ------------------------------------------------------------------------------ TLS failures


def tls_reason(exc: ssl.SSLError) -> str:
    """OpenSSL's reason code (CERTIFICATE_VERIFY_FAILED, …), or the exception's class."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, str) and reason.replace("_", "").isalnum():
        return reason
    return type(exc).__name__


# OpenSSL's X509_V_ERR_* codes, in words (never the peer's text).
_VERIFY_CODES = {
    9: "certificate not yet valid",
    10: "certificate expired",
    18: "self-signed certificate",
    19: "self-signed certificate in the chain",
    20: "issuer not in the trusted CA bundle (--upstream-ca-file / SSL_CERT_FILE)",
    21: "issuer not in the trusted CA bundle (--upstream-ca-file / SSL_CERT_FILE)",
    62: "hostname mismatch: the certificate does not name the upstream's host",
    64: "IP address mismatch: the certificate does not name the upstream's address",
}
_REFUSED_CERT = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "UNSUPPORTED_CERTIFICATE",
                 "CERTIFICATE_REVOKED", "CERTIFICATE_EXPIRED", "ACCESS_DENIED")


def tls_failure(exc: ssl.SSLError) -> tuple[str, bool]:
    """(message, http2_only) for a TLS failure on an upstream connection: "upstream TLS
    failure: <class> (<reason>)". `http2_only` when the peer refused ALPN http/1.1."""
    reason = tls_reason(exc)
    if isinstance(exc, ssl.SSLCertVerificationError):
        what = "the upstream's certificate did not verify"
        detail = _VERIFY_CODES.get(getattr(exc, "verify_code", 0))
        if detail:
            what = f"{what}: {detail}"
    elif "NO_APPLICATION_PROTOCOL" in reason:
        return f"{HTTP2_ONLY}: it refused ALPN http/1.1 ({reason})", True
    elif "CERTIFICATE_REQUIRED" in reason:
        what = "the upstream requires a client certificate (--upstream-client-cert)"
    elif "ALERT" in reason and any(r in reason for r in _REFUSED_CERT):
        what = "the upstream refused the client certificate"
    elif "ALERT" in reason:
        what = "the upstream refused the handshake"
    elif reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        what = "the upstream does not speak TLS on that port"
    else:
        what = "handshake failed"
    return f"upstream TLS failure: {what} ({reason})", False

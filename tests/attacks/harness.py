"""Plumbing for the adversarial matrix: a real gateway subprocess (`citewarden serve`) with real
policy files, a raw HTTP/1.1 client that keeps every byte the gateway sent, and a scanner that
looks for the planted marker everywhere in it.

The scanner reads the status line, every header, the raw body bytes, the body with its
transfer-encoding undone and its content-encoding decoded, and every string (keys and values) of
every JSON document in it (the body, or each SSE `data:` payload), so a marker hidden behind a
JSON escape or a compression layer is still found.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MARKER = "ZQXMARKER"
"""The planted word: it occurs only inside claims or fields that must never be released."""

REPO = Path(__file__).resolve().parents[2]
POLICIES = Path(__file__).resolve().parent / "policies"


# --------------------------------------------------------------------------------------------
# Raw HTTP
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawResponse:
    """Everything one exchange put on the wire, plus its decoded body."""

    raw: bytes
    status: int
    status_line: str
    headers: tuple[tuple[str, str], ...]
    body: bytes  # transfer- and content-decoded
    decode_error: str | None = None

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)

    def header_all(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    def json(self) -> Any:
        return json.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    i = 0
    while True:
        end = data.find(b"\r\n", i)
        if end < 0:
            raise ValueError("truncated chunk size line")
        size = int(data[i:end].split(b";")[0].strip() or b"0", 16)
        i = end + 2
        if size == 0:
            return bytes(out)
        if i + size > len(data):
            raise ValueError("truncated chunk")
        out += data[i : i + size]
        i += size + 2


def _decompress(data: bytes, encoding: str) -> bytes:
    for coding in reversed([c.strip().lower() for c in encoding.split(",") if c.strip()]):
        if coding in ("gzip", "x-gzip"):
            data = gzip.decompress(data)
        elif coding == "deflate":
            try:
                data = zlib.decompress(data)
            except zlib.error:
                data = zlib.decompress(data, -zlib.MAX_WBITS)
        elif coding == "br":
            import brotli

            data = brotli.decompress(data)
        elif coding == "zstd":
            from backports import zstd

            data = zstd.decompress(data)
        elif coding != "identity":
            raise ValueError(f"unknown content-encoding {coding!r}")
    return data


def parse_response(raw: bytes) -> RawResponse:
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep:
        raise AssertionError(f"no complete response head in {raw[:200]!r}")
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0]
    parts = status_line.split(" ", 2)
    status = int(parts[1])
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip().lower(), value.strip()))
    hmap = dict(headers)
    body = rest
    error = None
    try:
        if "chunked" in hmap.get("transfer-encoding", "").lower():
            body = _dechunk(body)
        elif "content-length" in hmap:
            body = body[: int(hmap["content-length"])]
        if hmap.get("content-encoding"):
            body = _decompress(body, hmap["content-encoding"])
    except (ValueError, OSError, zlib.error) as exc:
        error = f"{type(exc).__name__}: {exc}"
    return RawResponse(raw, status, status_line, tuple(headers), body, error)


def build_request(
    method: str,
    target: bytes | str,
    *,
    host: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
    content_length: int | None = None,
) -> bytes:
    """An HTTP/1.1 request with `Connection: close`; `target` goes on the wire as given."""
    target_b = target if isinstance(target, bytes) else target.encode("latin-1")
    lines = [method.encode() + b" " + target_b + b" HTTP/1.1", f"host: {host}".encode()]
    lines += [f"{k}: {v}".encode("latin-1") for k, v in headers]
    if body is not None or content_length is not None:
        length = len(body or b"") if content_length is None else content_length
        lines.append(f"content-length: {length}".encode())
    lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")


def exchange(address: tuple[str, int], request: bytes, *, timeout: float = 15.0) -> RawResponse:
    """Send `request` on a fresh connection and read until the gateway closes it."""
    with socket.create_connection(address, timeout=timeout) as sock:
        # The gateway may refuse before reading it all; its answer may still be there.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        chunks = []
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway did not close the connection")
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                if not chunks:
                    raise
                break
            if not data:
                break
            chunks.append(data)
    return parse_response(b"".join(chunks))


# --------------------------------------------------------------------------------------------
# The scan
# --------------------------------------------------------------------------------------------


def _json_strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            out.append(str(k))
            _json_strings(v, out)
    elif isinstance(value, list):
        for v in value:
            _json_strings(v, out)


EVENTSTREAM = "application/vnd.amazon.eventstream"


def eventstream_messages(body: bytes) -> list[tuple[dict[str, str], bytes]]:
    """The (headers, payload) of each AWS event-stream message in `body`, read leniently (no
    CRC check, a short tail ignored) and independently of the gateway's own decoder. Header
    values that are not strings are shown as their repr."""
    out: list[tuple[dict[str, str], bytes]] = []
    i = 0
    while i + 16 <= len(body):
        total, hlen = struct.unpack_from(">II", body, i)
        if total < 16 or i + total > len(body) or hlen > total - 16:
            break
        headers: dict[str, str] = {}
        h, end = i + 12, i + 12 + hlen
        while h < end:
            n = body[h]
            name = body[h + 1 : h + 1 + n].decode("utf-8", "replace")
            h += 1 + n
            kind = body[h]
            h += 1
            fixed = {0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16}
            if kind in (6, 7):
                (size,) = struct.unpack_from(">H", body, h)
                raw = body[h + 2 : h + 2 + size]
                headers[name] = raw.decode("utf-8", "replace") if kind == 7 else repr(raw)
                h += 2 + size
            elif kind in fixed:
                headers[name] = repr(body[h : h + fixed[kind]])
                h += fixed[kind]
            else:
                break
        out.append((headers, body[end : i + total - 4]))
        i += total
    return out


def _documents(body: bytes, content_type: str = "") -> list[Any]:
    docs: list[Any] = []
    if EVENTSTREAM in content_type:
        # Each message's headers (a JSON-like object) and its payload as JSON where it is.
        for headers, payload in eventstream_messages(body):
            docs.append(headers)
            with contextlib.suppress(ValueError):
                docs.append(json.loads(payload.decode("utf-8", "replace")))
        return docs
    text = body.decode("utf-8", "replace")
    with contextlib.suppress(ValueError):
        docs.append(json.loads(text))
        return docs
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line.startswith("data:"):
            payload = line[5:].strip()
            with contextlib.suppress(ValueError):
                docs.append(json.loads(payload))
    return docs


def leaks(response: RawResponse, marker: str = MARKER) -> list[str]:
    """Where `marker` occurs in the response (case-insensitive); empty when nowhere."""
    m = marker.lower()
    found = []
    if m in response.status_line.lower():
        found.append("status line")
    for name, value in response.headers:
        if m in name.lower() or m in value.lower():
            found.append(f"header {name}")
    if m.encode() in response.raw.lower():
        found.append("raw bytes")
    if m in response.body.decode("utf-8", "replace").lower():
        found.append("decoded body")
    docs = _documents(response.body, response.header("content-type") or "")
    for doc in docs:
        strings: list[str] = []
        _json_strings(doc, strings)
        if any(m in s.lower() for s in strings):
            found.append("a JSON string")
            break
    # A stream spreads one text over many frames: join each JSON path's strings across the
    # frames, in order, so a marker cut into pieces ("ZQXM" + "ARKER") is found whole.
    # The same with list indices collapsed: a marker spread over list items (logprob tokens,
    # content parts) is found too.
    by_path: dict[tuple[str, ...], list[str]] = {}
    by_shape: dict[tuple[str, ...], list[str]] = {}
    for doc in docs:
        _path_strings(doc, (), by_path)
    for path, parts in by_path.items():
        shape = tuple("*" if p.isdigit() else p for p in path)
        by_shape.setdefault(shape, []).extend(parts)
    joined = [*by_path.values(), *by_shape.values()]
    if any(m in "".join(parts).lower() for parts in joined):
        found.append("a streamed text")
    return found


def _path_strings(value: Any, path: tuple[str, ...], out: dict[tuple[str, ...], list[str]]) -> None:
    if isinstance(value, str):
        out.setdefault(path, []).append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _path_strings(v, (*path, str(k)), out)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _path_strings(v, (*path, str(i)), out)


def assert_no_leak(response: RawResponse, marker: str = MARKER) -> None:
    where = leaks(response, marker)
    assert not where, (
        f"{marker} reached the client ({', '.join(where)}): "
        f"{response.status_line} {response.raw[:3000]!r}"
    )


# --------------------------------------------------------------------------------------------
# The gateway subprocess
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GatewayProcess:
    """`citewarden serve` in a subprocess; its stdout+stderr (the structlog log) go to a file."""

    upstream: str
    policies: Sequence[Path]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    port: int = 0
    admin_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
        self.port, self.admin_port = free_port(), free_port()
        args = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--upstream",
            self.upstream,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--admin-port",
            str(self.admin_port),
            "--connect-timeout",
            "2",
            "--read-timeout",
            "5",
            "--total-timeout",
            "10",
            "--reload-interval",
            "0",
            *self.extra_args,
        ]
        for p in self.policies:
            args += ["--policy", str(p)]
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("CITEWARDEN_")},
            "PYTHONPATH": str(REPO),
            **self.env,
        }
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise RuntimeError(f"the gateway exited with {code}: {self.log()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.admin_port), timeout=1) as s:
                    s.sendall(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                    if s.recv(64).startswith(b"HTTP/1.1 200"):
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the gateway was not ready within {timeout}s: {self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def log(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def send(
        self,
        method: str,
        target: bytes | str,
        *,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        timeout: float = 15.0,
    ) -> RawResponse:
        request = build_request(method, target, host=self.host, headers=headers, body=body)
        return exchange(self.address, request, timeout=timeout)

    def post_json(
        self, path: str, payload: Any, headers: Sequence[tuple[str, str]] = ()
    ) -> RawResponse:
        body = json.dumps(payload).encode()
        all_headers = [("content-type", "application/json"), *headers]
        return self.send("POST", path, headers=all_headers, body=body)


@contextlib.contextmanager
def running_gateway(
    upstream: str,
    policies: Sequence[Path],
    log_path: Path,
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(upstream, policies, log_path, dict(env or {}), extra_args)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()

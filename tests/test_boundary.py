"""The failure boundary (DESIGN §7, gateway/errors.py): every foreign exception maps to a gateway
error, and every failure — a malformed upstream head, a body that does not decode, broken
framing, a frame nested too deeply, a bug — is answered with the protocol's error envelope
(the gateway's JSON error on passthrough and unrouted paths) at 502 / 504 with decision
`error` and exactly one audit line; a stream that had begun ends with the protocol's error
event, never a clean end. Real gateway, an upstream writing exact bytes, httpx as the client.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import ssl
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import brotli  # type: ignore[import-untyped]
import httptools
import httpx
import orjson
import pytest
from backports import zstd

from gateway.audit import configure_logging, reset_logging
from gateway.errors import (
    GatewayError,
    InternalError,
    ProtocolError,
    UpstreamTimeout,
    is_mapped,
    map_exception,
)
from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.raw_upstream import LAST_CHUNK, RawUpstream, chunked, head, serve_raw
from tests.test_proxy_faults import ANTHROPIC, GOOD, OPENAI, RAG, Proto, read_stream
from tests.upstream_app import anthropic_sse, openai_sse

MARKER = "ZQXMARKERZQX"

# ------------------------------------------------------------------------- the mapping table


def _subclasses(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    yield cls
    for sub in cls.__subclasses__():
        yield from _subclasses(sub)


def foreign_exceptions() -> list[type[BaseException]]:
    """Every exception class the upstream client, its parser, the decoders and the JSON / text
    parsers the gateway runs on upstream bytes can raise."""
    found: set[type[BaseException]] = {
        o for o in vars(httptools).values() if isinstance(o, type) and issubclass(o, Exception)
    }
    found |= {zlib.error, brotli.error, zstd.ZstdError}
    found |= {orjson.JSONDecodeError, json.JSONDecodeError, UnicodeError, UnicodeDecodeError}
    found |= {RecursionError, ValueError}
    found |= {TimeoutError, asyncio.TimeoutError, asyncio.IncompleteReadError, EOFError}
    found |= {
        c
        for c in _subclasses(OSError)
        if c.__module__ in ("builtins", "socket", "_socket", "ssl", "_ssl")
    }
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def instance(cls: type[BaseException]) -> BaseException:
    """An instance of `cls` whose text carries MARKER (as upstream bytes quoted by a parser)."""
    if issubclass(cls, UnicodeDecodeError):
        return cls("utf-8", MARKER.encode() + b"\xff", len(MARKER), len(MARKER) + 1, "invalid")
    if issubclass(cls, json.JSONDecodeError):
        return cls(f"unexpected {MARKER}", MARKER, 0)
    if issubclass(cls, asyncio.IncompleteReadError):
        return cls(MARKER.encode(), 100)
    if issubclass(cls, ssl.SSLError):
        return cls(1, f"[SSL: {MARKER}] {MARKER}")
    if issubclass(cls, OSError):
        return cls(5, MARKER)
    return cls(MARKER)


@pytest.mark.parametrize("cls", foreign_exceptions(), ids=lambda c: c.__qualname__)
def test_every_foreign_exception_is_mapped(cls: type[BaseException]) -> None:
    exc = instance(cls)
    assert is_mapped(cls), cls
    err = map_exception(exc)
    assert isinstance(err, GatewayError)
    assert not isinstance(err, InternalError), (cls, err)
    assert err.status in (502, 504)
    assert err.__cause__ is exc
    # The message is the gateway's own, whatever the foreign text said.
    assert MARKER not in str(err) and str(err)


def test_timeouts_are_504_and_parse_failures_are_protocol_errors() -> None:
    assert isinstance(map_exception(TimeoutError()), UpstreamTimeout)
    assert map_exception(TimeoutError()).status == 504
    assert isinstance(map_exception(RecursionError()), ProtocolError)
    assert isinstance(map_exception(httptools.HttpParserError("x")), ProtocolError)
    assert "TLS" in str(map_exception(ssl.SSLCertVerificationError(1, "x")))


def test_gateway_errors_map_to_themselves_and_the_unknown_to_an_internal_error() -> None:
    own = ProtocolError("upstream stream ended early")
    assert map_exception(own) is own
    for exc in (KeyError(MARKER), TypeError(MARKER), AttributeError(MARKER), ZeroDivisionError()):
        err = map_exception(exc)
        assert isinstance(err, InternalError)
        assert err.status == 502 and err.kind == "internal_error"
        assert MARKER not in str(err)
        assert not is_mapped(type(exc))


# ------------------------------------------------------------------------------- the gateway


@dataclass
class Env:
    raw: RawUpstream
    log: io.StringIO
    gateways: dict[str, Gateway]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    log = io.StringIO()
    configure_logging(stream=log)
    policy_dir: Path = tmp_path_factory.mktemp("policies")
    try:
        with contextlib.ExitStack() as stack:
            raw, url = stack.enter_context(serve_raw())
            gateways = {
                mode: stack.enter_context(
                    run_gateway(
                        url,
                        [write_policy(policy_dir, streaming=mode, filename=f"{mode}.yaml")],
                        read_timeout=2.0,
                    )
                )
                for mode in ("buffer", "progressive")
            }
            yield Env(raw, log, gateways)
    finally:
        reset_logging()


def audit_lines(env: Env, request_id: str) -> list[dict[str, Any]]:
    """The audit lines written for `request_id` (waiting for the first, then a little more)."""
    deadline = time.monotonic() + 5.0
    found: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        found = [
            e
            for line in env.log.getvalue().splitlines()
            if request_id in line and (e := json.loads(line)).get("event") == "audit"
        ]
        if found:
            time.sleep(0.1)
            break
        time.sleep(0.01)
    return [
        e
        for line in env.log.getvalue().splitlines()
        if request_id in line and (e := json.loads(line)).get("event") == "audit"
    ]


def assert_one_error_audit(env: Env, request_id: str, status: int) -> dict[str, Any]:
    lines = audit_lines(env, request_id)
    assert len(lines) == 1, lines
    [line] = lines
    assert line["decision"] == "error", line
    assert line["status"] == status, line
    return line


@dataclass(frozen=True)
class Route:
    """One way to reach the upstream: a passthrough path, or a protocol as JSON or SSE."""

    name: str
    proto: Proto | None = None  # None: the passthrough path
    stream: bool = False
    mode: str = "buffer"

    @property
    def progressive(self) -> bool:
        return self.stream and self.mode == "progressive"

    def send(self, env: Env, headers: dict[str, str]) -> tuple[httpx.Response, str]:
        rid = "rid-" + uuid.uuid4().hex
        gw = env.gateways[self.mode]
        headers = {**headers, "x-request-id": rid}
        if self.proto is None:
            return httpx.get(gw.url + "/v1/models", headers=headers, timeout=10.0), rid
        body = self.proto.request("What about the battery?", self.stream)
        return httpx.post(gw.url + self.proto.path, json=body, headers=headers, timeout=10.0), rid

    def assert_failed(self, env: Env, r: httpx.Response, rid: str, status: int = 502) -> None:
        """Answered at `status` with this route's error envelope, audited once as an error."""
        assert r.status_code == status, r.text
        assert r.headers["content-type"].startswith("application/json")
        assert "traceback" not in r.text.lower()
        body = r.json()
        if self.proto is None:
            assert body["error"]["message"].startswith("citewarden:")
        else:
            error = self.proto.assert_envelope(body)
            assert error["message"].startswith("citewarden:")
            assert r.headers["x-citewarden-decision"] == "error"
        assert r.headers["x-request-id"] == rid
        assert_one_error_audit(env, rid, status)

    def assert_error_end(self, env: Env, r: httpx.Response, rid: str) -> None:
        """A begun stream that ended with the protocol's error event and no clean end."""
        assert self.proto is not None
        assert r.status_code == 200, r.text
        seen = read_stream(self.proto, r.content)
        assert seen.error is not None, r.text
        self.proto.assert_envelope(seen.error)
        assert not seen.clean_end, r.text
        assert b"[DONE]" not in r.content and b"message_stop" not in r.content
        assert_one_error_audit(env, rid, 200)


PASSTHROUGH = Route("passthrough")
JSON_ROUTES = [Route(f"{p.name}-json", p) for p in (OPENAI, ANTHROPIC, RAG)]
SSE_ROUTES = [
    Route(f"{p.name}-sse-{m}", p, True, m)
    for p in (OPENAI, ANTHROPIC)
    for m in ("buffer", "progressive")
]
ALL_ROUTES = [PASSTHROUGH, *JSON_ROUTES, *SSE_ROUTES]
PROGRESSIVE = [r for r in SSE_ROUTES if r.progressive]


def routes(items: list[Route]) -> Any:
    return pytest.mark.parametrize("route", items, ids=[r.name for r in items])


def frame_list(route: Route, text: str = GOOD) -> list[bytes]:
    assert route.proto is not None
    make = openai_sse if route.proto is OPENAI else anthropic_sse
    return make(text, chunk_size=5)


def frames(route: Route, text: str = GOOD) -> bytes:
    return b"".join(frame_list(route, text))


def content_type(route: Route) -> tuple[str, str]:
    return ("content-type", "text/event-stream" if route.stream else "application/json")


MALFORMED_HEADS = {
    "bad-field": b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    "bad-status": b"HTTP/1.1 2x0 OK\r\ncontent-length: 0\r\n\r\n",
    "not-http": b"SSH-2.0-OpenSSH_9.6 " + MARKER.encode() + b"\r\n\r\n",
    "two-lengths": b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 9\r\n\r\nok",
    "obs-fold": b"HTTP/1.1 200 OK\r\nx-a: 1\r\n "
    + MARKER.encode()
    + b"\r\ncontent-length: 0\r\n\r\n",
    # Three digits the parser takes but HTTP has no status for: nothing could relay them.
    "status-600": b"HTTP/1.1 600 X\r\ncontent-length: 2\r\n\r\n{}",
    "status-999": b"HTTP/1.1 999 " + MARKER.encode() + b"\r\ncontent-length: 2\r\n\r\n{}",
}


@pytest.mark.parametrize("kind", list(MALFORMED_HEADS))
@routes(ALL_ROUTES)
def test_malformed_upstream_head_is_502(env: Env, route: Route, kind: str) -> None:
    r, rid = route.send(env, env.raw.on([MALFORMED_HEADS[kind]]))
    route.assert_failed(env, r, rid)
    assert MARKER not in r.text


def _bad_bodies(route: Route) -> dict[str, bytes]:
    ctype = content_type(route)
    garbage = b"\x8b\x1f not compressed " + MARKER.encode()
    length = ("content-length", str(len(garbage)))
    out = {
        coding: head(200, ctype, ("content-encoding", coding), length) + garbage
        for coding in ("gzip", "br", "zstd", "deflate")
    }
    truncated = zlib.compress(b'{"a": 1}' * 50)[:-9]
    out["gzip-truncated"] = (
        head(200, ctype, ("content-encoding", "deflate"), ("content-length", str(len(truncated))))
        + truncated
    )
    out["bad-chunk-size"] = head(200, ctype, ("transfer-encoding", "chunked")) + b"zz\r\n" + garbage
    return out


BAD_BODY_KINDS = ["gzip", "br", "zstd", "deflate", "gzip-truncated", "bad-chunk-size"]


@pytest.mark.parametrize("kind", BAD_BODY_KINDS)
@routes(ALL_ROUTES)
def test_body_that_does_not_decode_is_502(env: Env, route: Route, kind: str) -> None:
    r, rid = route.send(env, env.raw.on([_bad_bodies(route)[kind]]))
    route.assert_failed(env, r, rid)
    assert MARKER not in r.text


BAD_JSON = {
    "invalid-utf8": b'{"answer": "' + MARKER.encode() + b'\xff\xfe"}',
    "deep-nesting": b'{"answer": "' + MARKER.encode() + b'", "x": ' + b"[" * 100_000 + b"]",
}


@pytest.mark.parametrize("kind", list(BAD_JSON))
@routes(JSON_ROUTES)
def test_invalid_utf8_and_deep_nesting_in_a_body_are_502(env: Env, route: Route, kind: str) -> None:
    body = BAD_JSON[kind]
    parts = [head(200, content_type(route), ("content-length", str(len(body)))) + body]
    r, rid = route.send(env, env.raw.on(parts))
    route.assert_failed(env, r, rid)
    assert MARKER not in r.text


@routes(SSE_ROUTES)
def test_a_100000_level_json_frame_in_a_stream(env: Env, route: Route) -> None:
    body = _deep_frame() + frames(route)
    parts = [head(200, content_type(route), ("content-length", str(len(body)))) + body]
    r, rid = route.send(env, env.raw.on(parts))
    if route.progressive:
        route.assert_error_end(env, r, rid)
    else:
        route.assert_failed(env, r, rid)
    # orjson refuses nesting beyond 1,024 levels as invalid JSON (a ProtocolError, no foreign
    # cause); a frame the standard library parses (one holding a 19-digit number) hits
    # RecursionError, and the audit line names that class, never its text.
    assert [e.get("cause") for e in audit_lines(env, rid)] in ([None], ["RecursionError"])


@routes(SSE_ROUTES)
def test_a_deep_frame_parsed_by_the_standard_library_is_a_mapped_recursion_error(
    env: Env, route: Route
) -> None:
    # A 30-digit number sends the frame to the standard library's parser.
    deep = b'data: {"n":' + b"1" * 30 + b',"a":' + b'{"a":' * 100_000 + b"1" + b"}" * 100_001
    body = deep + b"\n\n" + frames(route)
    parts = [head(200, content_type(route), ("content-length", str(len(body)))) + body]
    r, rid = route.send(env, env.raw.on(parts))
    if route.progressive:
        route.assert_error_end(env, r, rid)
    else:
        route.assert_failed(env, r, rid)
    assert [e["cause"] for e in audit_lines(env, rid)] == ["RecursionError"]


def _deep_frame() -> bytes:
    return b"data: " + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"\n\n"


def _breakages(route: Route) -> dict[str, list[bytes]]:
    """A stream that starts well (its first claim complete) and then breaks."""
    good = frame_list(route)
    first, rest = b"".join(good[: len(good) // 2]), b"".join(good[len(good) // 2 :])
    plain = head(200, content_type(route), ("transfer-encoding", "chunked"))
    gz = zlib.compressobj(wbits=31)
    gz_first = gz.compress(first) + gz.flush(zlib.Z_SYNC_FLUSH)
    gz_head = head(
        200, content_type(route), ("transfer-encoding", "chunked"), ("content-encoding", "gzip")
    )
    return {
        "bad-chunk-framing": [plain + chunked(first), b"zz\r\n" + MARKER.encode()],
        "gzip-garbage": [gz_head + chunked(gz_first), chunked(b"\x00garbage" + MARKER.encode())],
        "deep-json-frame": [plain + chunked(first), chunked(_deep_frame() + rest) + LAST_CHUNK],
        "reset": [plain + chunked(first), b"5\r\nab"],
    }


@pytest.mark.parametrize("kind", ["bad-chunk-framing", "gzip-garbage", "deep-json-frame", "reset"])
@routes(SSE_ROUTES)
def test_stream_that_breaks_after_it_began(env: Env, route: Route, kind: str) -> None:
    r, rid = route.send(env, env.raw.on(_breakages(route)[kind], gap=0.2))
    if route.progressive:
        route.assert_error_end(env, r, rid)
    else:
        status = r.status_code
        assert status == 502, r.text
        route.assert_failed(env, r, rid)
    assert MARKER.encode() not in r.content


@pytest.mark.parametrize("kind", ["bad-chunk-framing", "gzip-garbage"])
def test_passthrough_body_that_breaks_after_it_began_is_cut(env: Env, kind: str) -> None:
    # The status went out with the start of the body: the client must not get a complete
    # answer, so the connection is cut before the body's end; the audit line says error.
    sse = Route("x", OPENAI, True)
    parts = _breakages(sse)[kind]
    with pytest.raises(httpx.HTTPError):
        PASSTHROUGH.send(env, {**env.raw.on(parts, gap=0.2)})
    rid = next(
        h.split(b":", 1)[1].strip().decode()
        for h in env.raw.heads[-1].split(b"\r\n")
        if h.lower().startswith(b"x-request-id:")
    )
    assert_one_error_audit(env, rid, 200)


@routes(ALL_ROUTES)
def test_a_good_answer_through_the_raw_upstream_is_served(env: Env, route: Route) -> None:
    # The control: the same upstream and gateways serve a well-formed answer.
    if route.proto is None:
        body = b'{"object": "list", "data": []}'
    elif route.stream:
        body = frames(route)
    else:
        body = json.dumps(route.proto.body(GOOD)).encode()
    reply = head(200, content_type(route), ("content-length", str(len(body)))) + body
    r, rid = route.send(env, env.raw.on([reply]))
    assert r.status_code == 200, r.text
    if route.stream:
        assert route.proto is not None
        seen = read_stream(route.proto, r.content)
        assert seen.clean_end and seen.text == GOOD
    lines = audit_lines(env, rid)
    assert len(lines) == 1 and lines[0]["decision"] in ("released", "passthrough"), lines


_CONTEXT_HEADERS = {
    # JSON, but no text can hold a lone surrogate: the digest of the audit line once failed.
    "lone-surrogate": b'[{"id":"kb:7","text":"a\\udfff"}]',
    "repeated-key": b'[{"id":"doc:9","id":"kb:1","text":"x"}]',
}


@pytest.mark.parametrize("kind", list(_CONTEXT_HEADERS))
@routes([*JSON_ROUTES, *SSE_ROUTES])
def test_an_ambiguous_context_header_is_502_and_audited(
    env: Env, route: Route, kind: str
) -> None:
    value = base64.urlsafe_b64encode(_CONTEXT_HEADERS[kind]).decode().rstrip("=")
    body = frames(route) if route.stream else json.dumps(route.proto.body(GOOD)).encode()  # type: ignore[union-attr]
    reply = head(200, content_type(route), ("x-citewarden-context", value),
                 ("content-length", str(len(body)))) + body
    r, rid = route.send(env, env.raw.on([reply]))
    route.assert_failed(env, r, rid)


# ------------------------------------------------------------------- the last-resort guard


def _good_reply(route: Route) -> list[bytes]:
    assert route.proto is not None
    body = frames(route) if route.stream else json.dumps(route.proto.body(GOOD)).encode()
    return [head(200, content_type(route), ("content-length", str(len(body)))) + body]


@routes([*JSON_ROUTES, *SSE_ROUTES])
def test_a_bug_while_judging_is_an_error_answer(
    env: Env, route: Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.pipeline import RoutePipeline

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError(MARKER)

    # The judge itself never raises (it turns failures into verdicts); its callers might.
    monkeypatch.setattr(RoutePipeline, "safe_judge", broken)
    r, rid = route.send(env, env.raw.on(_good_reply(route)))
    if route.progressive:
        route.assert_error_end(env, r, rid)
    else:
        route.assert_failed(env, r, rid)
    assert MARKER not in r.text


@routes([*JSON_ROUTES, *SSE_ROUTES])
def test_a_bug_while_reading_the_requests_context_is_an_error_answer(
    env: Env, route: Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request's context is read while the upstream answers, outside every await of the
    exchange: a failure there is kept and raised where the context is needed, so the answer
    is never judged against a context missing its request's part."""
    import gateway.pipeline

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError(MARKER)

    monkeypatch.setattr(gateway.pipeline, "request_context", broken)
    before = len(env.raw.heads)
    r, rid = route.send(env, env.raw.on(_good_reply(route)))
    # A progressive stream too is refused before it begins: its context is needed first.
    route.assert_failed(env, r, rid)
    raw = b"%d %s\r\n" % (r.status_code, r.reason_phrase.encode())
    raw += b"".join(k + b": " + v + b"\r\n" for k, v in r.headers.raw) + b"\r\n" + r.content
    assert MARKER.encode() not in raw  # status line, headers, body
    assert len(env.raw.heads) == before + 1  # forwarded before its context was read


def test_a_bug_before_routing_is_a_gateway_json_error(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.policy import PolicySet

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(MARKER)

    monkeypatch.setattr(PolicySet, "match", broken)
    r, rid = PASSTHROUGH.send(env, {})
    PASSTHROUGH.assert_failed(env, r, rid)
    assert MARKER not in r.text
    line = assert_one_error_audit(env, rid, 502)
    assert (line["reason"], line["cause"]) == ("internal_error", "TypeError")


def test_a_bug_while_relaying_a_passthrough_answer(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gateway.app

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError(MARKER)

    monkeypatch.setattr(gateway.app, "response_headers", broken)
    body = b"{}"
    reply = head(200, ("content-type", "application/json"), ("content-length", "2")) + body
    r, rid = PASSTHROUGH.send(env, env.raw.on([reply]))
    PASSTHROUGH.assert_failed(env, r, rid)
    assert MARKER not in r.text


@routes([PASSTHROUGH, JSON_ROUTES[0], PROGRESSIVE[0]])
def test_a_bug_inside_a_parser_callback_is_an_error_answer(
    env: Env, route: Route, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gateway.http1

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise LookupError(MARKER)

    # httptools wraps what a callback raises; the client maps what it finds inside.
    monkeypatch.setattr(gateway.http1.Connection, "on_header", broken)
    r, rid = route.send(env, env.raw.on([head(200, content_type(route), ("content-length", "2"))]))
    route.assert_failed(env, r, rid)
    assert MARKER not in r.text

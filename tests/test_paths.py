"""The request path (DESIGN §7): refused before routing when it could mean one thing here and
another upstream, routed segment by segment, forwarded byte for byte.

Unit tests of gateway/paths.py, then the same through the gateway as `serve` runs it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway import paths
from gateway.paths import Glob, refusal, segments
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

ATTACKS = [
    b"/v1/files/../admin",
    b"/v1/files/./x",
    b"/v1/files/%2e%2e/admin",
    b"/v1/files/%2E%2e/admin",
    b"/v1/files/.%2e/admin",
    b"/v1/files/..%2Fadmin",
    b"/v1/files/..%2fadmin",
    b"/v1/files/%2e/x",
    b"/v1/files/%252e%252e/admin",  # `..` to an upstream that decodes twice
    b"/v1/files/..;/admin",  # `..` to servlet containers
    b"/v1/files/..",
    b"/..",
    b"/v1/files/a%5c..%5cadmin",
    b"/v1/files/a%5Cb",
    b"/v1/files/a\\b",
    b"/v1/files/a%00",
    b"/v1/files/a%0d%0aX-Injected:%201",
    b"/v1/files/a%0A",
    b"/v1/files/a%09b",
    b"/v1/files/a%7f",
    b"/v1/files/a%2500",  # NUL after a second decoding
    b"/v1/files/a%zz",
    b"/v1/files/a%2",
    b"/v1/files/\xff",
    b"/v1/files/caf\xc3\xa9",
    b"/v1/files/a b",
    b"v1/files/a",
    b"*",
    b"",
]

ACCEPTED = [
    b"/v1/chat/completions",
    b"/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Acustom-model%2Fmy-model/converse",
    b"/v1beta/models/gemini-1.5-pro:streamGenerateContent",
    b"/v1/files/x%20HTTP/1.0%20",
    b"/v1/files/a%2Fb",
    b"/v1/files/.well-known",
    b"/v1/files/...",
    b"/v1/files/a..b",
    b"/v1/files/%2e%2e%2e",
    b"/v1/files/",
    b"/",
    b"//double",
    b"/caf%C3%A9",
]


@pytest.mark.parametrize("path", ATTACKS, ids=lambda p: p.decode("latin-1") or "empty")
def test_attack_paths_are_refused(path: bytes) -> None:
    assert refusal(path) is not None


@pytest.mark.parametrize("path", ACCEPTED, ids=lambda p: p.decode("latin-1"))
def test_ordinary_paths_are_accepted(path: bytes) -> None:
    assert refusal(path) is None


@pytest.mark.parametrize("query", [b"a=\xff", b"a=b c", b"a=\r\n", b"a=\x00"])
def test_raw_bytes_outside_printable_ascii_in_the_query_are_refused(query: bytes) -> None:
    assert refusal(b"/v1/models", query) is not None


def test_encoded_query_bytes_are_left_to_the_upstream() -> None:
    assert refusal(b"/v1/models", b"q=%0d%0a&key=%2e%2e") is None


def test_segments_split_at_literal_slashes_only() -> None:
    arn = "/model/arn%3Aaws%3Abedrock%3Aus%2Fmy-model/converse?x=1"
    assert segments(arn) == ("", "model", "arn:aws:bedrock:us/my-model", "converse")
    assert segments(b"/v1/models") == ("", "v1", "models")
    assert segments("/a//b/") == ("", "a", "", "b", "")


_SEGMENT = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12
).filter(lambda s: s not in (".", ".."))


@given(st.lists(_SEGMENT, min_size=1, max_size=5))
def test_encoded_segments_decode_to_themselves(parts: list[str]) -> None:
    raw = "/" + "/".join(quote(p, safe="") for p in parts)
    assert segments(raw) == ("", *parts)
    if not any(ord(c) < 0x20 or c in "\x7f\\" for p in parts for c in p):
        assert refusal(raw.encode()) is None


@given(st.binary(max_size=40))
def test_refusal_never_raises_and_what_it_accepts_is_safe(tail: bytes) -> None:
    path = b"/" + tail
    if refusal(path) is not None:
        return
    assert all(0x21 <= b <= 0x7E for b in path)
    for seg in segments(path):
        assert seg.split(";")[0] not in (".", "..")
        assert not any(ord(c) < 0x20 or c in "\x7f\\" for c in seg)
        assert ".." not in seg.split("/") and "." not in seg.split("/")


AZURE = "/openai/deployments/*/chat/completions"
GEMINI = "/v1beta/models/*:streamGenerateContent"


def _matches(pattern: str, path: str, kind: str = "glob") -> bool:
    return Glob(pattern, kind).matches(segments(path))


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        (AZURE, "/openai/deployments/gpt4o/chat/completions", True),
        (AZURE, "/openai/deployments/a/b/chat/completions", False),
        (AZURE, "/openai/deployments/a%2Fb/chat/completions", True),
        (GEMINI, "/v1beta/models/gemini-pro:streamGenerateContent", True),
        (GEMINI, "/v1beta/models/gemini-pro:generateContent", False),
        ("/v1/files/*", "/v1/files/abc", True),
        ("/v1/files/*", "/v1/files/", True),
        ("/v1/files/*", "/v1/files/a/b", False),
        ("/v1/files/*", "/v1/files", False),
        ("/v1/files/**", "/v1/files/a/b/c", True),
        ("/v1/files/**", "/v1/files/abc", True),
        ("/v1/files/**", "/v1/filesx/abc", False),
        ("/a/**/z", "/a/z", True),
        ("/a/**/z", "/a/b/c/z", True),
        ("/a/**/z", "/a/b/c/y", False),
        ("/a/[b]", "/a/b", False),  # only `*` is special
        ("/a/[b]", "/a/%5Bb%5D", True),
        ("/model/*/converse", "/model/arn%3Aaws%3Abedrock%3Aus%2Fmy-model/converse", True),
    ],
)
def test_globs_match_segment_by_segment(pattern: str, path: str, expected: bool) -> None:
    assert _matches(pattern, path) is expected


def test_prefixes_match_as_strings_within_segments_but_never_across_an_encoded_slash() -> None:
    assert _matches("/rag/", "/rag/x", "prefix")
    assert not _matches("/rag/", "/rag", "prefix")
    assert _matches("/v1/chat", "/v1/chat/completions", "prefix")
    assert not _matches("/rag/", "/rag%2Fx", "prefix")
    assert not _matches("/v1/chat/completions", "/v1/chat%2Fcompletions", "path")
    assert _matches("/v1/chat/completions", "/v1/%63hat/completions", "path")


@given(st.lists(_SEGMENT.filter(lambda s: "*" not in s), min_size=1, max_size=4),
       st.lists(_SEGMENT, max_size=3))
def test_double_star_covers_the_tree_and_a_literal_only_itself(
    parts: list[str], below: list[str]
) -> None:
    base = "/" + "/".join(quote(p, safe="") for p in parts)
    tree = Glob(base + "/**")
    here = segments(base + "".join("/" + quote(b, safe="") for b in below))
    assert tree.matches(here)
    assert Glob(base).matches(here) is (not below)


# ------------------------------------------------------------------- through the gateway



@pytest.fixture
def gw(tmp_path: Path, audit_log: io.StringIO) -> Iterator[tuple[Proxy, RawUpstream]]:
    upstream = RawUpstream()
    with upstream.running(), run_proxy(upstream.url, write_policies(tmp_path)) as proxy:
        yield proxy, upstream




def _post(target: bytes, body: bytes) -> bytes:
    return (
        b"POST " + target + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


def _request_lines(upstream: RawUpstream) -> list[bytes]:
    return [
        line
        for conn in upstream.conns
        for line in bytes(conn.data).split(b"\r\n")
        if line.endswith(b" HTTP/1.1")
    ]


@pytest.mark.parametrize("path", [p for p in ATTACKS if p.startswith(b"/") and b" " not in p],
                         ids=lambda p: p.decode("latin-1"))
def test_the_gateway_refuses_attack_paths_with_400_audited(
    gw: tuple[Proxy, RawUpstream], audit_log: io.StringIO, path: bytes
) -> None:
    proxy, upstream = gw
    response = raw_exchange(proxy.port, b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status_of(response) == 400, response
    error = body_of(response)["error"]
    assert error["source"] == "citewarden" and error["type"] == "bad_request"
    assert upstream.conns == []
    (event,) = audits(audit_log)
    # Raw bytes outside ASCII stop httptools itself: the gateway's 400 all the same.
    assert event["status"] == 400 and event["reason"] in ("bad_path", "malformed_request")


def test_nul_in_a_verified_route_path_is_400_not_500(gw: tuple[Proxy, RawUpstream]) -> None:
    proxy, upstream = gw
    body = chat_request()
    response = raw_exchange(proxy.port, _post(b"/v1/chat/completions%00", body))
    assert status_of(response) == 400
    assert upstream.conns == []


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/files/a%2Fb%3Ac?x=%20y&key=%2e%2e",
        b"/v1/files/x%20HTTP/1.0%20",
        b"/v1/files/%7Euser/My%20File.txt",
        b"/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Acustom-model%2Fm/invoke",
    ],
)
def test_passthrough_paths_are_forwarded_byte_for_byte(
    gw: tuple[Proxy, RawUpstream], target: bytes
) -> None:
    proxy, upstream = gw
    response = raw_exchange(proxy.port, b"GET " + target + b" HTTP/1.1\r\nhost: x\r\n\r\n")
    assert status_of(response) == 200, response
    assert _request_lines(upstream) == [b"GET " + target + b" HTTP/1.1"]


def test_a_passthrough_tree_is_not_escaped_by_encoded_dot_segments(
    gw: tuple[Proxy, RawUpstream],
) -> None:
    proxy, upstream = gw
    for target in (b"/v1/files/..%2F..%2Fv1%2Fchat%2Fcompletions", b"/v1/files/%2e%2e/%2e%2e/x"):
        response = raw_exchange(proxy.port, b"GET " + target + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        assert status_of(response) == 400
    assert upstream.conns == []


def test_a_one_segment_passthrough_entry_is_not_a_tree(gw: tuple[Proxy, RawUpstream]) -> None:
    proxy, upstream = gw
    assert status_of(raw_exchange(proxy.port, b"GET /raw/a HTTP/1.1\r\nhost: x\r\n\r\n")) == 200
    assert status_of(raw_exchange(proxy.port, b"GET /raw/a/b HTTP/1.1\r\nhost: x\r\n\r\n")) == 404
    assert len(_request_lines(upstream)) == 1


def test_a_bedrock_model_arn_routes_through_a_glob_and_is_forwarded_raw(
    gw: tuple[Proxy, RawUpstream],
) -> None:
    proxy, upstream = gw
    target = b"/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Acustom-model%2Fmy-model/converse"
    body = chat_request()
    response = raw_exchange(proxy.port, _post(target, body))
    assert status_of(response) == 200, response
    assert b"x-citewarden-decision: released" in response
    assert _request_lines(upstream) == [b"POST " + target + b" HTTP/1.1"]


def test_an_encoded_slash_does_not_make_a_route_path(gw: tuple[Proxy, RawUpstream]) -> None:
    proxy, upstream = gw
    body = chat_request()
    response = raw_exchange(proxy.port, _post(b"/v1/chat%2Fcompletions", body))
    assert status_of(response) == 404
    assert upstream.conns == []


@settings(max_examples=300, deadline=None)
@example("/..", b"")
@example("/a/./b", b"")
@example("/%2e%2e/x", b"")
@example("/a\\b", b"")
@example("/v1/x", b"a b")
@given(
    st.lists(st.sampled_from(["/", "a", "Z", "0", "-", "_", ".", "..", "%2e", "%", "\\", "\x00",
                              " ", "~", ";"]), max_size=12).map("".join),
    st.sampled_from([b"", b"a=1", b"a b"]),
)
def test_the_plain_path_shortcut_decides_as_the_full_checks(path: str, query: bytes) -> None:
    raw = path.encode()
    full = re.compile(rb"(?!)")  # matches nothing: every path takes the full checks
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(paths, "_PLAIN", full)
        expected = paths.refusal(raw, query)
    assert paths.refusal(raw, query) == expected


TREE_POLICY = """\
name: tree
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat
passthrough: [/v1/**]
citations: {format: doc-chunk}
release: {on_unverified: block}
"""


@pytest.fixture
def tree_gw(tmp_path: Path) -> Iterator[tuple[Proxy, RawUpstream]]:
    policy = tmp_path / "tree.yaml"
    policy.write_text(TREE_POLICY)
    upstream = RawUpstream()
    with upstream.running(), run_proxy(upstream.url, [policy]) as proxy:
        yield proxy, upstream


@pytest.mark.parametrize(
    "target",
    [
        b"/v1//chat/completions",
        b"/v1/chat//completions",
        b"/v1/chat/completions/",
        b"/v1/chat/completions;x=1",
        b"/v1/Chat/Completions",
        b"/v1/chat%2Fcompletions",  # ASGI servers route on the decoded path
        b"/v1/chat%2fcompletions/",
        # Decoded twice (the rounds the dot-segment check reads through): the route again.
        b"/v1/chat/%2563ompletions",
        b"/v1/chat/completions%252F",
        b"/v1/chat%252Fcompletions",
        b"/v1/chat%25252Fcompletions",
    ],
)
def test_another_spelling_of_a_route_under_a_passthrough_tree_is_refused(
    tree_gw: tuple[Proxy, RawUpstream], target: bytes
) -> None:
    """Lenient upstream stacks serve these as /v1/chat/completions: relayed through the tree,
    the answer would skip the route's verification."""
    proxy, upstream = tree_gw
    response = raw_exchange(proxy.port, _post(target, chat_request()))
    assert status_of(response) == 400, response
    assert body_of(response)["error"]["type"] == "bad_request"
    assert upstream.conns == []


def test_the_rest_of_a_passthrough_tree_is_forwarded(tree_gw: tuple[Proxy, RawUpstream]) -> None:
    proxy, upstream = tree_gw
    for target in (b"/v1/models", b"/v1/files/file-1/", b"/v1//models"):
        response = raw_exchange(proxy.port, b"GET " + target + b" HTTP/1.1\r\nhost: x\r\n\r\n")
        assert status_of(response) == 200, (target, response)
    assert len(_request_lines(upstream)) == 3


def test_an_oversize_passthrough_body_is_413_audited_as_an_error(
    tmp_path: Path, audit_log: io.StringIO
) -> None:
    """Refused before anything went upstream: not a passthrough in the audit line or the
    metrics, and the message is the gateway's own."""
    upstream = RawUpstream()
    with upstream.running(), run_proxy(
        upstream.url, write_policies(tmp_path), max_request_bytes=1000
    ) as proxy:
        body = b"x" * 5000
        request = (b"POST /v1/files/upload HTTP/1.1\r\nhost: x\r\ncontent-length: "
                   + str(len(body)).encode() + b"\r\n\r\n" + body)
        response = raw_exchange(proxy.port, request)
    assert status_of(response) == 413, response
    assert body_of(response)["error"]["message"].startswith("citewarden: request body over")
    assert upstream.conns == []
    (event,) = audits(audit_log)
    assert (event["decision"], event["reason"], event["status"]) == (
        "error", "request_too_large", 413)


NATIVE_POLICY = """
name: native
routes:
  - {name: messages, match: {path: /v1/messages}, protocol: anthropic-messages}
  - {name: converse, match: {path_glob: "/model/*/converse"}, protocol: bedrock-converse}
citations: {format: doc-chunk}
"""


@pytest.mark.parametrize(
    ("request_head", "status", "reason"),
    [
        (b"TRACE /v1/messages HTTP/1.1\r\nhost: x\r\n\r\n", 405, "method"),
        (b"GET /v1/messages HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
         b"connection: upgrade\r\n\r\n", 403, "websocket"),
        (b"TRACE /model/m/converse HTTP/1.1\r\nhost: x\r\n\r\n", 405, "method"),
        (b"GET /model/m/converse HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\n"
         b"connection: upgrade\r\n\r\n", 403, "websocket"),
    ],
)
def test_a_refusal_on_a_routed_path_is_in_the_routes_error_envelope(
    tmp_path: Path, audit_log: io.StringIO, request_head: bytes, status: int, reason: str
) -> None:
    """Refused before anything is read, but on a route's path: the client's SDK reads the
    protocol's envelope (Anthropic's `type: error`, Bedrock's `x-amzn-ErrorType`)."""
    policy = tmp_path / "native.yaml"
    policy.write_text(NATIVE_POLICY)
    upstream = RawUpstream()
    with upstream.running(), run_proxy(upstream.url, [policy]) as proxy:
        response = raw_exchange(proxy.port, request_head)
    assert status_of(response) == status, response
    body = body_of(response)
    head = response.split(b"\r\n\r\n", 1)[0].lower()
    if b"/v1/messages" in request_head:
        assert body["type"] == "error" and body["error"]["message"].startswith("citewarden:")
    else:
        assert set(body) == {"message"} and body["message"].startswith("citewarden:")
        assert b"x-amzn-errortype:" in head
    assert upstream.conns == []
    (event,) = audits(audit_log)
    assert (event["decision"], event["reason"], event["status"]) == ("refused", reason, status)
    assert event["route"] in ("messages", "converse")


@pytest.mark.parametrize("method", [b"TRACE", b"CONNECT", b"PROPFIND"])
def test_methods_the_fronted_apis_do_not_use_are_refused(
    gw: tuple[Proxy, RawUpstream], audit_log: io.StringIO, method: bytes
) -> None:
    """TRACE would echo the request, credentials included; CONNECT asks for a tunnel."""
    proxy, upstream = gw
    request = method + b" /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-1\r\n\r\n"
    response = raw_exchange(proxy.port, request)
    assert status_of(response) == 405, response
    assert b"sk-1" not in response
    assert upstream.conns == []
    (event,) = audits(audit_log)
    assert event["status"] == 405 and event["reason"] == "method"

"""`citewarden verify` says what the proxy does: the same exchange (real YAML policy, the same
request and upstream bytes) through the real proxy, in front of an upstream that writes exact
bytes, and through the real CLI; status and body must agree.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway import cli
from tests.gateway_harness import run_gateway
from tests.raw_upstream import RawUpstream, head, serve_raw

SYSTEM = (
    "Answer from the context.\n"
    '<chunk id="hr:leave" version="2">Full-time employees receive 25 days of paid annual '
    "leave per year.</chunk>\n"
    '<chunk id="hr:remote">Employees may work remotely up to 3 days per week.</chunk>'
)
GOOD = "Employees get 25 days of paid annual leave per year [hr:leave]."
BAD = "Employees get 40 days of leave on the Moon [hr:moon]."

POLICY = """\
name: parity
mode: {mode}
routes:
  - name: chat
    match: {{path: /v1/chat/completions}}
    protocol: openai-chat
  - name: gemini
    match: {{path_glob: "/v1beta/models/*:generateContent"}}
    protocol: gemini
  - name: gemini-stream
    match: {{path_glob: "/v1beta/models/*:streamGenerateContent"}}
    protocol: gemini
citations: {{format: doc-chunk}}
context: {{from: [request, header]}}
release: {{on_unverified: {on_unverified}}}
streaming: {{mode: {streaming}}}
"""


def _policy(
    tmp_path: Path, *, mode: str = "enforce", on_unverified: str = "block",
    streaming: str = "buffer",
) -> Path:
    path = tmp_path / f"parity-{mode}-{on_unverified}-{streaming}.yaml"
    path.write_text(POLICY.format(mode=mode, on_unverified=on_unverified, streaming=streaming))
    return path


def chat_request(stream: bool = False) -> dict[str, object]:
    body: dict[str, object] = {
        "model": "m",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "How much leave?"},
        ],
    }
    if stream:
        body["stream"] = True
    return body


def chat_json(text: str, created: str = "1735689600") -> bytes:
    return (
        '{"id": "chatcmpl-1", "object": "chat.completion", "created": ' + created + ', '
        '"model": "m", "choices": [{"index": 0, "message": {"role": "assistant", '
        '"content": ' + json.dumps(text) + '}, "finish_reason": "stop"}]}'
    ).encode()


def chat_sse(*deltas: str) -> bytes:
    frames = []
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1735689600,
            "model": "m"}
    frames.append({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                              "content": ""},
                                        "finish_reason": None}]})
    for d in deltas:
        frames.append({**base, "choices": [{"index": 0, "delta": {"content": d},
                                            "finish_reason": None}]})
    frames.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    out = b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames)
    return out + b"data: [DONE]\n\n"


@dataclass
class Outcome:
    status: int
    body: bytes
    headers: dict[str, str]


@dataclass
class Verified:
    code: int
    report: dict[str, object]
    stderr: str


def run_verify(
    policy: Path, protocol: str, request: Path, response: Path, *extra: str,
    capsys: pytest.CaptureFixture[str],
) -> Verified:
    capsys.readouterr()
    code = cli.main([
        "verify", "--policy", str(policy), "--protocol", protocol,
        "--request", str(request), "--response", str(response), "--format", "json", *extra,
    ])
    out, err = capsys.readouterr()
    return Verified(code, json.loads(out) if out.strip() else {}, err)


@contextlib.contextmanager
def proxy(policy: Path) -> Iterator[tuple[RawUpstream, str]]:
    with serve_raw() as (raw, url), run_gateway(url, [policy]) as gw:
        yield raw, gw.url


def through_proxy(
    policy: Path, path: str, request: dict[str, object], body: bytes,
    content_type: str = "application/json", headers: Sequence[tuple[str, str]] = (),
) -> Outcome:
    with proxy(policy) as (raw, url):
        selector = raw.on([
            head(200, ("content-type", content_type), ("content-length", str(len(body))),
                 *headers),
            body,
        ], gap=0)
        # The request id verify writes into error texts, so the two bodies can be compared.
        r = httpx.post(url + path, json=request, headers={**selector, "x-request-id": "offline"},
                       timeout=10.0)
        return Outcome(r.status_code, r.content, dict(r.headers))


def files(tmp_path: Path, request: dict[str, object], body: bytes, name: str) -> tuple[Path, Path]:
    req = tmp_path / "request.json"
    req.write_text(json.dumps(request))
    resp = tmp_path / name
    resp.write_bytes(body)
    return req, resp


def client_body(v: Verified) -> bytes:
    """The bytes the report says the client receives."""
    body = v.report["body"]
    if isinstance(body, str):
        return body.encode()
    return json.dumps(body).encode()


# -- f1 / f5: one JSON reader --------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"\xef\xbb\xbf" + chat_json(GOOD, created="12345678901234567890123"),
        chat_json(GOOD, created="NaN").replace(b'"id"', b'"x": 1234567890123456789012, "id"'),
        chat_json(GOOD, created="12345678901234567890123").replace(b"].", b"].\\ud800"),
        chat_json(GOOD, created="Infinity, " + '"n": 1' + "9" * 20),
    ],
    ids=["bom", "nan", "lone-surrogate", "infinity"],
)
def test_bodies_the_proxy_refuses_are_refused_by_verify(
    tmp_path: Path, body: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path)
    seen = through_proxy(policy, "/v1/chat/completions", chat_request(), body)
    assert seen.status == 502
    req, resp = files(tmp_path, chat_request(), body, "response.json")
    v = run_verify(policy, "openai-chat", req, resp, capsys=capsys)
    assert v.code == 2, v.report
    assert "502" in v.stderr


def test_a_long_integer_is_read_as_the_proxy_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A partial answer is re-rendered: what `created` becomes must be what the proxy sends.
    policy = _policy(tmp_path, on_unverified="strip")
    body = chat_json(GOOD + " " + BAD, created="123456789012345678901234567890")
    seen = through_proxy(policy, "/v1/chat/completions", chat_request(), body)
    assert seen.status == 200
    req, resp = files(tmp_path, chat_request(), body, "response.json")
    v = run_verify(policy, "openai-chat", req, resp, capsys=capsys)
    assert v.code == 1
    assert v.report["body"] == json.loads(seen.body)


# -- f2: JSON or stream is the request's choice, as in the proxy ------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json-request", "stream-request"])
def test_a_capture_of_the_other_kind_is_refused_as_the_proxy_refuses_it(
    tmp_path: Path, stream: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path)
    # The capture is the other kind than the request explicitly asked for.
    body, ctype, name = (
        (chat_json(GOOD), "application/json", "response.json") if stream
        else (chat_sse("Employees get 25 days ", "of paid annual leave per year [hr:leave]."),
              "text/event-stream", "response.sse")
    )
    request = {**chat_request(stream), "stream": stream}
    seen = through_proxy(policy, "/v1/chat/completions", request, body, ctype)
    assert seen.status == 502, seen.body
    req, resp = files(tmp_path, request, body, name)
    v = run_verify(policy, "openai-chat", req, resp, capsys=capsys)
    assert v.code == 2, v.report
    assert "502" in v.stderr


@pytest.mark.parametrize("kind", ["json", "sse"])
def test_a_request_that_does_not_say_takes_the_captures_kind(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """DESIGN §1: RESP is a JSON body or an `.sse` capture; a request without `stream` (or a
    Gemini request without --path) does not contradict either, so the capture decides."""
    policy = _policy(tmp_path)
    if kind == "json":
        body, name = chat_json(GOOD), "response.json"
    else:
        body = chat_sse("Employees get 25 days ", "of paid annual leave per year [hr:leave].")
        name = "response.sse"
    req, resp = files(tmp_path, chat_request(), body, name)
    v = run_verify(policy, "openai-chat", req, resp, capsys=capsys)
    assert (v.code, v.report["decision"]) == (0, "released"), (v.report, v.stderr)
    assert (v.report["streaming"] is None) is (kind == "json")


GEMINI_REQUEST: dict[str, object] = {
    "systemInstruction": {"parts": [{"text": SYSTEM}]},
    "contents": [{"role": "user", "parts": [{"text": "How much leave?"}]}],
}


def gemini_sse(*texts: str) -> bytes:
    out = b""
    for i, t in enumerate(texts):
        cand: dict[str, object] = {"content": {"role": "model", "parts": [{"text": t}]},
                                   "index": 0}
        if i == len(texts) - 1:
            cand["finishReason"] = "STOP"
        out += b"data: " + json.dumps({"candidates": [cand], "modelVersion": "g"}).encode()
        out += b"\r\n\r\n"
    return out


def test_gemini_streams_when_its_path_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path)
    body = gemini_sse("Employees get 25 days of ", "paid annual leave per year [hr:leave].")
    req, resp = files(tmp_path, GEMINI_REQUEST, body, "response.sse")
    # A non-stream path: the proxy reads the body as JSON, and refuses it.
    seen = through_proxy(policy, "/v1beta/models/g:generateContent", GEMINI_REQUEST, body,
                         "text/event-stream")
    assert seen.status == 502
    v = run_verify(policy, "gemini", req, resp, "--path", "/v1beta/models/g:generateContent",
                   capsys=capsys)
    assert v.code == 2 and "502" in v.stderr, v.report
    # Without --path the request does not say: the capture does (DESIGN §1).
    v = run_verify(policy, "gemini", req, resp, capsys=capsys)
    assert v.report["decision"] == "released", (v.report, v.stderr)
    assert v.report["streaming"] is not None
    # The stream path: verify picks the route the proxy routes it to, and reads a stream.
    path = "/v1beta/models/g:streamGenerateContent?alt=sse"
    seen = through_proxy(policy, path, GEMINI_REQUEST, body, "text/event-stream")
    assert seen.status == 200
    v = run_verify(policy, "gemini", req, resp, "--path", path, capsys=capsys)
    assert v.report["route"] == "gemini-stream"
    assert client_body(v) == seen.body
    assert v.report["decision"] == "released", (v.report, v.stderr)
    v = run_verify(policy, "gemini", req, resp, "--route", "gemini-stream", capsys=capsys)
    assert client_body(v) == seen.body, (v.report, v.stderr)


def test_a_path_no_route_takes_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path)
    req, resp = files(tmp_path, chat_request(), chat_json(GOOD), "response.json")
    v = run_verify(policy, "openai-chat", req, resp, "--path", "/v2/other", capsys=capsys)
    assert v.code == 2 and "no route" in v.stderr


# -- f6: the upstream's response headers -----------------------------------------------------


def test_response_headers_give_context_and_are_relayed_as_the_proxy_relays_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import base64

    policy = _policy(tmp_path)
    chunks = [{"id": "kb:7", "text": "The canteen opens at 8 am."}]
    header_ctx = base64.urlsafe_b64encode(json.dumps(chunks).encode()).decode().rstrip("=")
    up_headers = [
        ("x-citewarden-context", header_ctx),
        ("x-ratelimit-remaining-requests", "99"),
        ("x-request-id", "req_abc123"),
        ("x-internal-secret", "s3cr3t"),
    ]
    body = chat_json("The canteen opens at 8 am [kb:7].")
    seen = through_proxy(policy, "/v1/chat/completions", chat_request(), body,
                         headers=up_headers)
    assert seen.status == 200
    req, resp = files(tmp_path, chat_request(), body, "response.json")
    dump = tmp_path / "headers.txt"  # as `curl -D` writes it
    dump.write_text(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in up_headers) + "\r\n"
    )
    v = run_verify(policy, "openai-chat", req, resp, "--response-headers", str(dump),
                   capsys=capsys)
    assert v.code == 0, (v.report, v.stderr)
    assert client_body(v) == seen.body
    relayed = v.report["headers"]
    assert isinstance(relayed, dict)
    for name, value in relayed.items():
        assert seen.headers[name] == value
    assert relayed["x-ratelimit-remaining-requests"] == "99"
    assert relayed["x-upstream-request-id"] == "req_abc123"
    assert "x-internal-secret" not in relayed and "x-internal-secret" not in seen.headers
    # Without them the chunk is unknown: the claim is hallucinated.
    v = run_verify(policy, "openai-chat", req, resp, capsys=capsys)
    assert v.code == 1 and v.report["decision"] == "blocked"
    bad = tmp_path / "bad-headers.txt"
    bad.write_text("no colon here\n")
    v = run_verify(policy, "openai-chat", req, resp, "--response-headers", str(bad),
                   capsys=capsys)
    assert v.code == 2 and "bad-headers.txt" in v.stderr


# -- f3: shadow mode -------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_shadow_mode_reports_the_upstream_answer_the_client_gets(
    tmp_path: Path, stream: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = _policy(tmp_path, mode="shadow")
    body, ctype, name = (
        (chat_sse(GOOD + " ", BAD), "text/event-stream", "response.sse") if stream
        else (chat_json(GOOD + " " + BAD), "application/json", "response.json")
    )
    seen = through_proxy(policy, "/v1/chat/completions", chat_request(stream), body, ctype)
    assert seen.status == 200 and seen.body == body
    assert seen.headers["x-citewarden-decision"] == "blocked"
    req, resp = files(tmp_path, chat_request(stream), body, name)
    v = run_verify(policy, "openai-chat", req, resp, capsys=capsys)
    assert v.report["mode"] == "shadow"
    assert v.report["decision"] == "blocked"  # what enforce would have done, as audited
    assert v.report["status"] == 200 and v.report["unchanged"] is True
    assert client_body(v) == seen.body if stream else v.report["body"] == json.loads(body)
    assert v.code == 1  # the policy would not release it


# -- f4: progressive release -----------------------------------------------------------------


@pytest.mark.parametrize("on_unverified", ["block", "strip", "abstain"])
@pytest.mark.parametrize(
    "deltas",
    [
        ("Employees get 25 days ", "of paid annual leave per year [hr:leave]. ", BAD),
        (BAD + " ", GOOD),
        ("Employees get 25 days ", "of paid annual leave per year [hr:leave]."),
    ],
    ids=["good-then-bad", "bad-first", "all-good"],
)
def test_progressive_release_is_rendered_as_the_proxy_sends_it(
    tmp_path: Path, on_unverified: str, deltas: tuple[str, ...],
    capsys: pytest.CaptureFixture[str],
) -> None:
    policy = _policy(tmp_path, on_unverified=on_unverified, streaming="progressive")
    body = chat_sse(*deltas)
    seen = through_proxy(policy, "/v1/chat/completions", chat_request(True), body,
                         "text/event-stream")
    assert seen.status == 200
    req, resp = files(tmp_path, chat_request(True), body, "response.sse")
    v = run_verify(policy, "openai-chat", req, resp, capsys=capsys)
    assert client_body(v) == seen.body
    assert v.report["status"] == 200
    assert v.report["unchanged"] is (seen.body == body)
    assert v.code == (0 if seen.body == body else 1)

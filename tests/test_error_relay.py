"""Upstream non-2xx answers and upstream response headers on verified routes (DESIGN §7).

A 4xx body is relayed only if it is the protocol's error envelope, rebuilt from its known
fields with the message capped at 512 characters; every other field, every non-envelope body
and every 5xx body is replaced. Only allow-listed, well-shaped upstream headers reach the
client, in every decision and both streaming modes. The upstream plants a marker everywhere
the gateway must not relay; each case scans the whole raw response for it.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.test_proxy_faults import (
    ALL_CASES,
    ANTHROPIC,
    BAD,
    GOOD,
    JSON_CASES,
    OPENAI,
    SYSTEM,
    Case,
    read_stream,
)
from tests.upstream_app import (
    SCENARIO_HEADER,
    Behaviour,
    FakeUpstream,
    Html,
    Json,
    Stream,
    create_upstream,
    serve,
)

MARKER = "ZQXMARKERZQX"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
HTTP_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"


@dataclass
class Stack:
    upstream: FakeUpstream
    gateways: dict[str, Gateway]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    policy_dir: Path = tmp_path_factory.mktemp("policies")
    upstream = create_upstream()
    with contextlib.ExitStack() as exits:
        url = exits.enter_context(serve(upstream))
        gateways = {}
        for name, mode, streaming in [
            ("buffer", "enforce", "buffer"),
            ("progressive", "enforce", "progressive"),
            ("shadow", "shadow", "buffer"),
        ]:
            policy = write_policy(
                policy_dir, mode=mode, streaming=streaming, filename=f"{name}.yaml"
            )
            gateways[name] = exits.enter_context(run_gateway(url, [policy], read_timeout=2.0))
        yield Stack(upstream, gateways)


def scenario(stack: Stack, behaviour: Behaviour) -> dict[str, str]:
    key = uuid.uuid4().hex
    stack.upstream.on(key, behaviour)
    return {SCENARIO_HEADER: key}


def send(
    stack: Stack, case: Case, behaviour: Behaviour, gateway: str | None = None
) -> httpx.Response:
    gw = stack.gateways[gateway or case.mode]
    return httpx.post(
        gw.url + case.proto.path,
        json=case.proto.request("What about the battery?", case.stream),
        headers=scenario(stack, behaviour),
        timeout=10.0,
    )


def raw_response(r: httpx.Response) -> bytes:
    """Everything the client received: status line, every header, the body."""
    lines = [f"HTTP/1.1 {r.status_code} {r.reason_phrase}".encode()]
    lines += [k + b": " + v for k, v in r.headers.raw]
    return b"\r\n".join(lines) + b"\r\n\r\n" + r.content


def assert_no_marker(r: httpx.Response) -> None:
    raw = raw_response(r)
    assert MARKER.encode() not in raw, raw[:2000]
    assert MARKER.lower().encode() not in raw.lower()


# ------------------------------------------------------------------------ error bodies


def _envelope(case: Case, message: str) -> dict[str, Any]:
    """The protocol's error envelope, with extra fields and odd values planted in it."""
    if case.proto is ANTHROPIC:
        return {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": message, "hint": MARKER},
            "request_id": MARKER,
            "details": {"text": MARKER},
        }
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages[0].content",
            "code": f"{MARKER} with spaces",
            "internal": MARKER,
        },
        "debug": MARKER,
    }


def _expected(case: Case, message: str) -> dict[str, Any]:
    if case.proto is ANTHROPIC:
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    if case.proto is OPENAI:
        fields = {"type": "invalid_request_error", "param": "messages[0].content", "code": None}
        return {"error": {"message": message, **fields}}
    return {"error": {"message": message, "type": "invalid_request_error", "code": None}}


@pytest.mark.parametrize("status", [400, 404, 422, 429])
@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_4xx_envelope_is_rebuilt_from_its_known_fields(
    stack: Stack, case: Case, status: int
) -> None:
    body = _envelope(case, "max_tokens is too large")
    r = send(stack, case, Json(body, status=status))
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    assert r.headers["x-citewarden-decision"] == "error"
    assert r.json() == _expected(case, "max_tokens is too large")
    assert_no_marker(r)


@pytest.mark.parametrize("case", JSON_CASES, ids=[c.id for c in JSON_CASES])
def test_4xx_message_is_capped_at_512_characters(stack: Stack, case: Case) -> None:
    message = "m" * 512 + MARKER + "n" * 4000
    r = send(stack, case, Json(_envelope(case, message), status=400))
    assert r.status_code == 400
    assert r.json() == _expected(case, "m" * 512)
    assert_no_marker(r)


@pytest.mark.parametrize(
    "body",
    [
        {"detail": MARKER},
        {"error": MARKER},
        {"error": {"message": 42, "text": MARKER}},
        {"message": MARKER},
        [MARKER],
        f"<html><body>{MARKER}</body></html>",
        f"plain {MARKER}",
        f'{{"error": {{"message": "{MARKER}"',
    ],
    ids=["detail", "string-error", "no-message", "bare-message", "list", "html", "text", "cut"],
)
@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_4xx_body_that_is_no_envelope_is_replaced(stack: Stack, case: Case, body: Any) -> None:
    payload = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    r = send(stack, case, Json(payload, status=403, content_type="text/html"))
    assert r.status_code == 403
    error = case.proto.assert_envelope(r.json())
    assert error["message"] == "citewarden: upstream answered 403"
    assert_no_marker(r)


def test_anthropic_envelope_must_say_type_error(stack: Stack) -> None:
    body = {"type": MARKER, "error": {"type": "invalid_request_error", "message": "x"}}
    r = send(stack, Case(ANTHROPIC), Json(body, status=400))
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("citewarden:")
    assert_no_marker(r)


@pytest.mark.parametrize("status", [500, 502, 503, 529])
@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_5xx_body_is_always_replaced(stack: Stack, case: Case, status: int) -> None:
    # Even the protocol's own envelope: a 5xx message is the upstream's, not the client's.
    r = send(stack, case, Json(_envelope(case, f"overloaded {MARKER}"), status=status))
    assert r.status_code == status
    error = case.proto.assert_envelope(r.json())
    assert error["message"] == f"citewarden: upstream answered {status}"
    assert r.headers["x-citewarden-decision"] == "error"
    assert_no_marker(r)


def test_openai_sdk_sees_the_relayed_error(stack: Stack) -> None:
    envelope = {"error": {"message": "bad model", "type": "invalid_request_error",
                          "param": "model", "code": "model_not_found", "x": MARKER}}
    client = openai.OpenAI(
        base_url=stack.gateways["buffer"].url + "/v1",
        api_key="sk-test",
        max_retries=0,
        default_headers=scenario(stack, Json(envelope, status=404)),
    )
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="m",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}],
        )
    assert info.value.body == {
        "message": "bad model", "type": "invalid_request_error", "param": "model",
        "code": "model_not_found",
    }
    assert MARKER not in str(info.value)


def test_anthropic_sdk_sees_the_relayed_error(stack: Stack) -> None:
    envelope = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"},
                "request_id": MARKER}
    client = anthropic.Anthropic(
        base_url=stack.gateways["buffer"].url,
        api_key="sk-ant-test",
        max_retries=0,
        default_headers=scenario(stack, Json(envelope, status=429, headers={"retry-after": "1"})),
    )
    with pytest.raises(anthropic.RateLimitError) as info:
        client.messages.create(
            model="claude-m", max_tokens=64, system=SYSTEM,
            messages=[{"role": "user", "content": "q"}],
        )
    assert info.value.body == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}
    }
    assert info.value.response.headers["retry-after"] == "1"


# ---------------------------------------------------------------------- response headers

PLANTED = {
    "x-custom": MARKER,
    "server": MARKER,
    "x-powered-by": MARKER,
    "set-cookie": f"session={MARKER}; Path=/",
    "location": f"https://{MARKER}.example/",
    f"x-{MARKER}": "1",
    "x-ratelimit-note": f"see {MARKER}",  # an allow-listed family, a value of the wrong shape
    # ... a name of words no provider uses, a hyphen-joined sentence as the value
    f"x-ratelimit-the-pump-was-built-in-1887-by-{MARKER.lower()}": "1",
    "anthropic-ratelimit-requests-limit": f"The-pump-was-built-by-{MARKER}",
    "retry-after": MARKER,  # ditto
    "traceparent-x": MARKER,
}
ALLOWED = {
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-reset-tokens": "6m0s",
    "anthropic-ratelimit-requests-reset": "2024-05-01T12:00:00Z",
    "x-request-id": "req_upstream-123",
    "request-id": "req_011CAnthropic",
    "openai-processing-ms": "42",
    "traceparent": TRACEPARENT,
}
# What the client sees of ALLOWED: the provider's x-request-id under another name.
RELAYED = {
    **{k: v for k, v in ALLOWED.items() if k != "x-request-id"},
    "x-upstream-request-id": "req_upstream-123",
}


def _headers() -> dict[str, str]:
    return {**PLANTED, **ALLOWED}


def _answer(case: Case, text: str) -> Behaviour:
    if case.stream:
        return Stream(case.proto.frames(text), max_piece=48, headers=_headers())
    return Json(case.proto.body(text), headers=_headers())


ANSWERS = {
    "released": lambda case: _answer(case, GOOD),
    "blocked": lambda case: _answer(case, BAD),
    "error-4xx": lambda case: Json(_envelope(case, "bad"), status=400, headers=_headers()),
    "error-5xx": lambda case: Html(status=503, headers=_headers()),
    "unusable": lambda case: Json(b"{not json", headers=_headers()),
}


@pytest.mark.parametrize("answer", list(ANSWERS))
@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_only_allow_listed_upstream_headers_reach_the_client(
    stack: Stack, case: Case, answer: str
) -> None:
    r = send(stack, case, ANSWERS[answer](case))
    assert_no_marker(r)
    assert "set-cookie" not in r.headers
    assert r.headers["x-request-id"] != "req_upstream-123"  # the gateway's own id
    if answer == "unusable" and case.progressive:
        seen = read_stream(case.proto, r.content)  # the stream began: it ends in an error
        assert seen.error is not None and not seen.clean_end
    elif answer == "unusable":
        # The gateway's own failure (an answer it cannot use): nothing of the upstream's.
        assert r.status_code == 502 and "x-upstream-request-id" not in r.headers
        return
    for name, value in RELAYED.items():
        assert r.headers.get(name) == value, (name, dict(r.headers))
    if answer == "released" and case.stream:
        assert read_stream(case.proto, r.content).text == GOOD


# Shadow mode serves streams buffered: its progressive cases are the buffer ones.
SHADOW_CASES = [c for c in ALL_CASES if not c.progressive]


@pytest.mark.parametrize("case", SHADOW_CASES, ids=[c.id for c in SHADOW_CASES])
def test_shadow_mode_relays_only_allow_listed_headers_too(stack: Stack, case: Case) -> None:
    r = send(stack, case, _answer(case, BAD), gateway="shadow")
    assert r.status_code == 200
    assert r.headers["x-citewarden-mode"] == "shadow"
    assert_no_marker(r)
    for name, value in RELAYED.items():
        assert r.headers.get(name) == value, name


@pytest.mark.parametrize(
    ("name", "value", "relayed"),
    [
        ("Retry-After", HTTP_DATE, ("retry-after", HTTP_DATE)),
        ("retry-after", "120", ("retry-after", "120")),
        ("retry-after", "soon", None),
        ("retry-after-ms", "1500.5", ("retry-after-ms", "1500.5")),
        ("X-RateLimit-Reset-Tokens", "6m0s", ("x-ratelimit-reset-tokens", "6m0s")),
        ("x-ratelimit-limit", "60, 100", None),
        ("anthropic-ratelimit-unified-status", "allowed", ("anthropic-ratelimit-unified-status",
                                                           "allowed")),
        ("x-request-id", "r" * 128, ("x-upstream-request-id", "r" * 128)),
        ("x-request-id", "r" * 129, None),
        ("request-id", "req 1", None),
        ("openai-processing-ms", "12ms", None),
        ("traceparent", TRACEPARENT, ("traceparent", TRACEPARENT)),
        ("traceparent", TRACEPARENT.upper(), None),
        ("x-ratelimitx", "1", None),
        ("x-ratelimit-remaining-tokens_usage_based", "159976",
         ("x-ratelimit-remaining-tokens_usage_based", "159976")),
        ("x-ratelimit-reset-requests", "12ms", ("x-ratelimit-reset-requests", "12ms")),
        ("anthropic-ratelimit-unified-reset", "1756000000",
         ("anthropic-ratelimit-unified-reset", "1756000000")),
        ("x-ratelimit-the-pump-was-built-in-1887", "1", None),
        ("x-ratelimit-limit-requests", "The-pump-was-built-in-1887", None),
        ("x-ratelimit-limit-requests", "built.by.zqx", None),
        ("anthropic-ratelimit-unified-status", "approved", None),
        ("request-id", "req_011CSLsW7mFqvHHnzrKdKjAE",
         ("request-id", "req_011CSLsW7mFqvHHnzrKdKjAE")),
        ("x-request-id", "36562039-1ae4-48e6-ae28-1e517e3d2d12",
         ("x-upstream-request-id", "36562039-1ae4-48e6-ae28-1e517e3d2d12")),
        ("x-request-id", "the.pump.station.was.built.in.1887", None),
        ("request-id", "built-by-the-zqx-company", None),
        ("ratelimit-remaining", "1", None),
        ("content-type", "text/html", None),
    ],
)
def test_verified_response_headers(name: str, value: str, relayed: tuple[str, str] | None) -> None:
    from gateway.upstream import verified_response_headers

    assert verified_response_headers([(name, value)]) == ([relayed] if relayed else [])

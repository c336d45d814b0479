"""Credentials are never logged, and x-request-id is propagated only in its safe shape
(DESIGN §7). Every log line of a real gateway is captured across success, error, refusal and
passthrough paths and scanned for planted secrets; the Redactor is checked on its own too.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from gateway.audit import configure_logging, redact_query, reset_logging
from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.test_proxy_faults import ALL_CASES, BAD, GOOD, Case
from tests.upstream_app import (
    SCENARIO_HEADER,
    Behaviour,
    FakeUpstream,
    Html,
    InvalidJson,
    Json,
    Stream,
    create_upstream,
    serve,
)

SECRET = "sEcReT-9f8e7d6c"
# Every credential of DESIGN §7, each with its own secret so a leak says which one.
CREDENTIALS = {
    "authorization": f"Bearer sk-{SECRET}-auth",
    "x-api-key": f"ak-{SECRET}-xapikey",
    "api-key": f"{SECRET}-azure",
    "x-goog-api-key": f"AIza{SECRET}-goog",
    "x-amz-security-token": f"{SECRET}-amz",
    "cookie": f"session={SECRET}-cookie",
    "proxy-authorization": f"Basic {SECRET}-proxy",
}
QUERY = f"?key={SECRET}-query&alt=sse"


# ---------------------------------------------------------------------------------- unit


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    configure_logging(stream=buf)
    try:
        yield buf
    finally:
        reset_logging()


def _flush() -> None:
    time.sleep(0.01)  # outside a loop, lines are written at once; this is for the handler


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/v1beta/models/g:generateContent?key=abc123&alt=sse",
         "/v1beta/models/g:generateContent?key=REDACTED&alt=sse"),
        ("key=abc", "key=REDACTED"),
        ("https://h/x?alt=sse&key=abc#frag", "https://h/x?alt=sse&key=REDACTED#frag"),
        ("https://h/x?api_key=abc&access_token=def&x=1",
         "https://h/x?api_key=REDACTED&access_token=REDACTED&x=1"),
        ("/p?KEY=abc", "/p?KEY=REDACTED"),
        ("/p?monkey=1", "/p?monkey=REDACTED"),  # fail closed: any name ending in key
        ("/p?keyword=1&a=b", "/p?keyword=1&a=b"),
        ("no query here", "no query here"),
        # Names an upstream decodes before reading them.
        ("/p?%6Bey=abc&alt=sse", "/p?%6Bey=REDACTED&alt=sse"),
        ("/p?alt=sse&ke%79=abc", "/p?alt=sse&ke%79=REDACTED"),
        ("/p?api%5Fkey=abc", "/p?api%5Fkey=REDACTED"),
        ("/p?access%5ftoken=abc&x=1", "/p?access%5ftoken=REDACTED&x=1"),
        ("/p?api+key=abc", "/p?api+key=REDACTED"),
        ("/p?q=a+b&%61lt=sse", "/p?q=a+b&%61lt=sse"),
    ],
)
def test_redact_query(text: str, expected: str) -> None:
    assert redact_query(text) == expected


def test_every_credential_is_masked_wherever_it_is_logged(log: io.StringIO) -> None:
    logger = structlog.get_logger("t")
    headers = list(CREDENTIALS.items())
    logger.info(
        "probe",
        headers=headers,
        raw=[(k.encode(), v.encode()) for k, v in headers],
        as_dict=dict(CREDENTIALS),
        nested={"upstream": {"headers": dict(CREDENTIALS)}},
        path="/v1beta/models/g:streamGenerateContent" + QUERY,
        url="https://upstream.example/v1" + QUERY,
        urls=["https://a.example/" + QUERY],
        **{k.replace("-", "_"): v for k, v in CREDENTIALS.items()},
    )
    # A stdlib record (uvicorn's own loggers stop propagating once a server configured them).
    logging.getLogger("gateway.probe").warning("GET /v1/models%s 502", QUERY)
    _flush()
    out = log.getvalue()
    assert '"probe"' in out and "gateway.probe" in out
    assert SECRET not in out, out
    assert "key=REDACTED" in out


# ------------------------------------------------------------------------ a real gateway


@dataclass
class Env:
    upstream: FakeUpstream
    log: io.StringIO
    gateways: dict[str, Gateway]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    buf = io.StringIO()
    configure_logging(stream=buf)
    policy_dir: Path = tmp_path_factory.mktemp("policies")
    try:
        upstream = create_upstream()
        with contextlib.ExitStack() as exits:
            url = exits.enter_context(serve(upstream))
            gateways = {
                mode: exits.enter_context(
                    run_gateway(
                        url,
                        [write_policy(policy_dir, streaming=mode, filename=f"{mode}.yaml")],
                        read_timeout=2.0,
                    )
                )
                for mode in ("buffer", "progressive")
            }
            yield Env(upstream, buf, gateways)
    finally:
        reset_logging()


def scenario(env: Env, behaviour: Behaviour) -> dict[str, str]:
    key = uuid.uuid4().hex
    env.upstream.on(key, behaviour)
    return {SCENARIO_HEADER: key}


def wait_for_audit(env: Env, request_id: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in env.log.getvalue().splitlines() if request_id in x]
        if any(e.get("event") == "audit" for e in lines):
            return lines
        time.sleep(0.01)
    raise AssertionError(f"no audit line for {request_id}")


def leaked(env: Env) -> list[str]:
    return [line for line in env.log.getvalue().splitlines() if SECRET in line]


def _answers(case: Case) -> dict[str, Behaviour]:
    cookie = {"set-cookie": f"s={SECRET}-setcookie"}
    good = (
        Stream(case.proto.frames(GOOD), max_piece=48, headers=cookie)
        if case.stream
        else Json(case.proto.body(GOOD), headers=cookie)
    )
    bad = (
        Stream(case.proto.frames(BAD), max_piece=48)
        if case.stream
        else Json(case.proto.body(BAD))
    )
    return {
        "released": good,
        "blocked": bad,
        "upstream-5xx": Html(status=503, headers=cookie),
        "upstream-4xx": Json({"error": {"message": "no"}}, status=401, headers=cookie),
        "unusable": InvalidJson(),
    }


ANSWERS = ["released", "blocked", "upstream-5xx", "upstream-4xx", "unusable"]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("case", ALL_CASES, ids=[c.id for c in ALL_CASES])
def test_no_credential_reaches_the_log_on_verified_routes(
    env: Env, case: Case, answer: str
) -> None:
    rid = "rid-" + uuid.uuid4().hex
    headers = {**CREDENTIALS, "x-request-id": rid, **scenario(env, _answers(case)[answer])}
    r = httpx.post(
        env.gateways[case.mode].url + case.proto.path + QUERY,
        json=case.proto.request("What about the battery?", case.stream),
        headers=headers,
        timeout=10.0,
    )
    assert r.status_code in (200, 401, 422, 502, 503), r.text
    lines = wait_for_audit(env, rid)
    [audit] = [e for e in lines if e["event"] == "audit"]
    assert audit["path"] == case.proto.path + "?key=REDACTED&alt=sse"  # logged, redacted
    assert leaked(env) == []
    # The credentials went upstream all the same (DESIGN §7: they pass through).
    forwarded = env.upstream.requests[-1]
    assert forwarded.header("x-goog-api-key") == CREDENTIALS["x-goog-api-key"]
    assert SECRET in (forwarded.query or "")


@pytest.mark.parametrize("name", ["%6Bey", "ke%79", "api%5Fkey", "access%5ftoken"])
def test_a_credential_under_an_escaped_name_is_redacted_in_the_log(env: Env, name: str) -> None:
    rid = "rid-" + uuid.uuid4().hex
    headers = {**CREDENTIALS, "x-request-id": rid, **scenario(env, Json({"data": []}))}
    r = httpx.get(env.gateways["buffer"].url + f"/v1/models?alt=sse&{name}={SECRET}-escaped",
                  headers=headers)
    assert r.status_code == 200, r.text
    [audit] = [e for e in wait_for_audit(env, rid) if e["event"] == "audit"]
    assert audit["path"] == f"/v1/models?alt=sse&{name}=REDACTED"
    assert leaked(env) == []
    assert SECRET in (env.upstream.requests[-1].query or "")  # forwarded as sent


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),  # passthrough
        ("POST", "/v1/unknown", b"{}"),  # refused
        ("POST", "/v1/chat/completions", b"{not json " + SECRET.encode() + b"}"),  # bad JSON
        ("POST", "/v1/chat/completions", b"[]"),  # not an object
    ],
    ids=["passthrough", "refused", "invalid-json", "not-an-object"],
)
def test_no_credential_reaches_the_log_off_the_verified_path(
    env: Env, method: str, path: str, body: bytes | None
) -> None:
    rid = "rid-" + uuid.uuid4().hex
    cookie = {"set-cookie": f"s={SECRET}-setcookie"}
    upstream = scenario(env, Json({"data": []}, headers=cookie))
    headers = {**CREDENTIALS, "x-request-id": rid, **upstream}
    r = httpx.request(
        method, env.gateways["buffer"].url + path + QUERY, content=body, headers=headers
    )
    assert r.status_code in (200, 400, 404), r.text
    [audit] = [e for e in wait_for_audit(env, rid) if e["event"] == "audit"]
    assert audit["path"] == path + "?key=REDACTED&alt=sse"
    assert leaked(env) == []


# --------------------------------------------------------------------------- x-request-id


@pytest.mark.parametrize(
    "given",
    [
        "r" * 129,
        f"id with spaces {SECRET}",
        f"<script>{SECRET}</script>",
        f"{SECRET}/slash",
        f"{SECRET}\u00e9",
        f"{SECRET};x=1",
    ],
    ids=["129-chars", "spaces", "markup", "slash", "non-ascii", "semicolon"],
)
def test_an_invalid_request_id_is_replaced_never_echoed_nor_logged(env: Env, given: str) -> None:
    case = ALL_CASES[0]
    headers = {"x-request-id": given, **scenario(env, Json(case.proto.body(GOOD)))}
    r = httpx.post(
        env.gateways["buffer"].url + case.proto.path,
        json=case.proto.request("What about the battery?", False),
        headers={k: v.encode("utf-8") for k, v in headers.items()},
        timeout=10.0,
    )
    assert r.status_code == 200, r.text
    fresh = r.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", fresh), fresh
    assert env.upstream.requests[-1].header("x-request-id") == fresh
    wait_for_audit(env, fresh)
    raw = b"".join(k + v for k, v in r.headers.raw) + r.content
    assert given.encode("utf-8") not in raw and b"r" * 129 not in raw
    assert "r" * 129 not in env.log.getvalue()
    assert leaked(env) == []


@pytest.mark.parametrize("given", ["a" * 128, "req_01H.x:y-z", "0"])
def test_a_valid_request_id_is_propagated(env: Env, given: str) -> None:
    case = ALL_CASES[0]
    headers = {"x-request-id": given, **scenario(env, Json(case.proto.body(GOOD)))}
    r = httpx.post(
        env.gateways["buffer"].url + case.proto.path,
        json=case.proto.request("What about the battery?", False),
        headers=headers,
        timeout=10.0,
    )
    assert r.headers["x-request-id"] == given
    assert env.upstream.requests[-1].header("x-request-id") == given

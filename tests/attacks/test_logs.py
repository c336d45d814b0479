"""The gateway's own log is a channel too (DESIGN §7, §8): credentials are never logged, nor is
draft text (`audit.include_text` is off), nor a bad request id. A gateway of its own, so the log
holds only this module's traffic."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.attacks.harness import MARKER, POLICIES, GatewayProcess, running_gateway
from tests.attacks.protocols import BAD, GOOD, QUESTION, REGISTRY
from tests.upstream_app import SCENARIO_HEADER, FakeUpstream, Json

SECRET = "ZQXSECRET"
CREDENTIALS = [
    ("authorization", f"Bearer sk-{SECRET}-1"),
    ("x-api-key", f"{SECRET}-2"),
    ("api-key", f"{SECRET}-3"),
    ("x-goog-api-key", f"{SECRET}-4"),
    ("x-amz-security-token", f"{SECRET}-5"),
    ("cookie", f"session={SECRET}-6"),
    ("proxy-authorization", f"Basic {SECRET}-7"),
]


# A well-formed id the model made up out of a sentence: draft text, not a chunk's name.
INVENTED_ID = f"kb:The_Orbit_pump_was_designed_by_{MARKER}_in_1931"
INVENTED = f"The pump is blue [{INVENTED_ID}]."


@pytest.fixture(scope="module")
def logged(
    upstream: tuple[str, FakeUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GatewayProcess, Path]]:
    log = tmp_path_factory.mktemp("logs") / "gateway.log"
    policies = [POLICIES / "progressive.yaml", POLICIES / "base.yaml"]
    with running_gateway(upstream[0], policies, log) as gw:
        _, up = upstream
        up.on("log-bad", Json(REGISTRY["openai-chat"].body(f"{GOOD} {BAD}")))
        up.on("log-models", Json({"data": []}))
        up.on("log-5xx", Json(REGISTRY["openai-chat"].error_envelope(BAD), status=500))
        up.on("log-invented", Json(REGISTRY["openai-chat"].body(f"{GOOD} {INVENTED}")))
        spec = REGISTRY["openai-chat"]
        gw.post_json(spec.path, spec.request(QUESTION, False),
                     [(SCENARIO_HEADER, "log-invented"), ("x-request-id", "log-invented")])
        for key in ("log-bad", "log-5xx"):
            gw.post_json(
                spec.path,
                spec.request(QUESTION, False),
                [(SCENARIO_HEADER, key), ("x-request-id", f"id {MARKER}"), *CREDENTIALS],
            )
        gw.send(
            "GET",
            f"/v1/models?key={SECRET}-8&alt=json",
            headers=[(SCENARIO_HEADER, "log-models"), *CREDENTIALS],
        )
        gw.send("GET", f"/nowhere?key={SECRET}-9", headers=CREDENTIALS)
        time.sleep(0.5)  # audit lines are written just after the answer
        yield gw, log


def test_log_has_an_audit_line_per_request(logged: tuple[GatewayProcess, Path]) -> None:
    """The positive control: the log really holds this traffic."""
    gw, _ = logged
    assert gw.log().count("chat") >= 2, gw.log()[-2000:]


def test_credentials_are_never_logged(logged: tuple[GatewayProcess, Path]) -> None:
    gw, _ = logged
    text = gw.log()
    assert SECRET not in text, [line for line in text.splitlines() if SECRET in line][:3]


def test_draft_text_and_bad_request_ids_are_never_logged(
    logged: tuple[GatewayProcess, Path],
) -> None:
    gw, _ = logged
    text = gw.log()
    assert MARKER not in text, [line for line in text.splitlines() if MARKER in line][:3]


def test_an_invented_citation_id_is_logged_as_a_digest(
    logged: tuple[GatewayProcess, Path],
) -> None:
    """The audit line names each claim's cited ids (DESIGN §8): an id of a context chunk as it
    is, an id the model invented (here a sentence written with underscores) as a digest, so
    repeats can be counted without the draft text reaching the log."""
    gw, _ = logged
    (line,) = [json.loads(x) for x in gw.log().splitlines()
               if '"audit"' in x and '"log-invented"' in x]
    digest = "sha256:" + hashlib.sha256(INVENTED_ID.encode()).hexdigest()[:16]
    assert [c["cited"] for c in line["claims"]] == [["kb:1"], [digest]]
    assert line["claims"][1]["reason"] == "hallucinated_citation"

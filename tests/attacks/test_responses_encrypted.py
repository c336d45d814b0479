"""A Responses reasoning item's `encrypted_content` goes out only to a client that asked for it
(`include: ["reasoning.encrypted_content"]`, as the API itself answers it only then). Its shape
check cannot tell words joined by `_` (or CamelCase) from base64, so an unasked blob is
withheld in every mode, whatever it holds (a client that asks gets it:
tests/attacks/test_openai_fields_more.py::test_responses_real_encrypted_content_asked_for_is_kept)."""

from __future__ import annotations

from typing import Any

import pytest

import tests.attacks.protocols  # noqa: F401  (import order)
from gateway.demo import responses_wire as rw
from tests.attacks.conftest import gateway, run_case, upstream  # noqa: F401
from tests.attacks.harness import MARKER, assert_no_leak
from tests.attacks.protocols import GOOD, QUESTION
from tests.attacks.responses_spec import RESPONSES, body, events, framed
from tests.upstream_app import Json, Stream

PROSE_BLOB = f"The_Orbit_pump_was_designed_by_{MARKER}_in_1931"
CAMEL_BLOB = f"TheOrbitPumpWasDesignedBy{MARKER}In1931"
REAL_BLOB = "gAAAAABo" + "Zk9xQ2-_" * 40 + "Ab/+Yz=="
MODES = ["json", "buffer", "progressive"]


def _behaviour(mode: str, blob: str) -> Json | Stream:
    b = body(GOOD, before=(rw.reasoning_item(None, id="rs_x", encrypted=blob),))
    return Json(b) if mode == "json" else Stream(framed(events(b)))


def _request(mode: str, include: list[str] | None) -> dict[str, Any]:
    req = RESPONSES.request(QUESTION, mode != "json")
    if include is not None:
        req["include"] = include
    return req


@pytest.mark.parametrize("blob", [PROSE_BLOB, CAMEL_BLOB], ids=["underscored", "camel-case"])
@pytest.mark.parametrize("mode", MODES)
def test_unasked_encrypted_content_never_goes_out(
    gateway: Any, upstream: Any, mode: str, blob: str  # noqa: F811
) -> None:
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(mode, blob),
                    request=_request(mode, None))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", MODES)
def test_unasked_encrypted_content_is_withheld_even_when_opaque(
    gateway: Any, upstream: Any, mode: str  # noqa: F811
) -> None:
    resp = run_case(gateway, upstream, RESPONSES, mode, _behaviour(mode, REAL_BLOB),
                    request=_request(mode, ["file_search_call.results"]))
    assert resp.status == 200, resp.raw[:800]
    assert REAL_BLOB.encode() not in resp.raw
    assert b"Orbit" in resp.raw  # the answer itself went out

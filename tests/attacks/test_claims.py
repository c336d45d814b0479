"""Claims that try to escape checking (DESIGN §4): exemptions that match only a prefix, numbers
written as words, in scientific notation, with superscripts or leading zeros, headings, tables,
malformed or look-alike citations. The marker sits in the failing claim; it must never reach
the client, in any protocol or streaming mode. Positive controls show the same gateway still
releases correct answers in the same shapes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.attacks.conftest import run_case
from tests.attacks.harness import GatewayProcess, assert_no_leak
from tests.attacks.protocols import ESCAPES, RAG_CLAIMS_PATH, REGISTRY, RELEASED, Mode, ProtocolSpec
from tests.upstream_app import FakeUpstream, Json


def _cases(texts: dict[str, str]) -> list[Any]:
    return [
        pytest.param(spec, mode, name, id=f"{spec.name}-{mode}-{name}")
        for spec in REGISTRY.values()
        for mode in spec.mode_free
        for name in texts
    ]


@pytest.mark.parametrize(("spec", "mode", "name"), _cases(ESCAPES))
def test_escaping_claim_is_checked(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    behaviour = spec.good(ESCAPES[name]).behaviour(mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status != 500, resp.raw[:1000]
    assert_no_leak(resp)


@pytest.mark.parametrize(("spec", "mode", "name"), _cases(RELEASED))
def test_correct_answer_in_the_same_shapes_is_released(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    text = RELEASED[name]
    behaviour = spec.good(text).behaviour(mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:1000]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.headers
    assert spec.answer_text(resp) == text


def test_structured_claims_lose_their_numbering(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """DESIGN §4: "1. Choose …" must not fail number_mismatch on a correct claim because of
    its list number."""
    spec = REGISTRY["rag-json"]
    claims = [
        {"text": "1. The Orbit pump moves 40 litres per minute.", "citations": ["kb:1"]},
        {"text": "2) Its flow is 40 litres per minute.", "citations": ["kb:1"]},
    ]
    body = {
        "claims": claims,
        "sources": [
            {"id": "kb:1", "text": "The Orbit pump moves 40 litres per minute.", "version": "2"}
        ],
    }
    resp = run_case(gateway, upstream, spec, "json", Json(body), path=RAG_CLAIMS_PATH)
    assert resp.status == 200, resp.raw[:1000]
    assert resp.header("x-citewarden-decision") == "released", resp.body[:1000]

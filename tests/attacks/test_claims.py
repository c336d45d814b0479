"""Claims that try to escape checking (DESIGN §4): exemptions that match only a prefix, numbers
written as words, in scientific notation, with superscripts or leading zeros, headings, tables,
malformed or look-alike citations. The marker sits in the failing claim; it must never reach
the client, in any protocol or streaming mode. Positive controls show the same gateway still
releases correct answers in the same shapes."""

from __future__ import annotations

import pytest

from tests.attacks.conftest import assert_text_checked, assert_text_released, run_case, text_cases
from tests.attacks.harness import GatewayProcess
from tests.attacks.protocols import ESCAPES, RAG_CLAIMS_PATH, REGISTRY, RELEASED, Mode, ProtocolSpec
from tests.upstream_app import FakeUpstream, Json


@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(ESCAPES))
def test_escaping_claim_is_checked(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_checked(gateway, upstream, spec, mode, ESCAPES[name])


@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(RELEASED))
def test_correct_answer_in_the_same_shapes_is_released(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_released(gateway, upstream, spec, mode, RELEASED[name])


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

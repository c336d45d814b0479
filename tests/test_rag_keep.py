"""rag-json's field table: the answer, claims and context are kept, `rag.keep` envelope fields
are kept in every decision's body when they are scalar metadata (a number, a boolean, null or
a token-shaped string: a sentence is not metadata), everything else is dropped,
and a body with a duplicate key fails closed. A real gateway in front of a real upstream."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.errors import ProtocolError
from gateway.policy import load_policy
from gateway.protocols.fields import loads_unique
from gateway.types import Chunk
from tests.gateway_harness import run_gateway
from tests.upstream_app import Json, create_upstream, rag_body, serve

MARKER = "ZEBRA-MARKER-7"
CHUNKS = [Chunk("kb:1", "The Orbit pump moves 40 litres per minute.", "2")]
GOOD = "The Orbit pump moves 40 litres per minute [kb:1]."
BAD = "The Orbit pump was designed on Mars [kb:404]."

POLICY = """\
name: keep
mode: enforce
routes:
  - name: kb
    match: {{path_prefix: /rag/}}
    protocol: rag-json
    rag:
      answer: /answer
      context: /sources
      keep: [/status, /trace_id, /meta/region, /nested, /long, /note, /spaced, /count, /cached,
             /missing]
citations: {{format: doc-chunk}}
context: {{from: [response]}}
checks: [missing_citation, malformed_citation, hallucinated_citation, stale_source,
  quote_mismatch, number_mismatch]
release:
  on_unverified: {on_unverified}
  on_infrastructure_failure: abstain
"""


def _envelope(answer: str) -> dict[str, Any]:
    body = rag_body(answer, CHUNKS)
    body.update(
        {
            "status": "ok",
            "trace_id": "t-123",
            "meta": {"region": "eu", "debug": MARKER},
            "nested": {"note": MARKER},  # kept pointer, but not a scalar: dropped
            "long": "x" * 129,  # kept pointer, but longer than any token: dropped
            # kept pointers holding a sentence: metadata is token-shaped, so dropped
            "note": f"The Orbit pump was designed by {MARKER} in 1931.",
            "spaced": f"{MARKER} ok",
            "count": 3,
            "cached": False,
            "unlisted": MARKER,
            "followups": [MARKER],
        }
    )
    return body


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    both = f"{GOOD} {BAD}"
    up = create_upstream(
        {
            "good": Json(_envelope(GOOD)),
            "mixed": Json(_envelope(both)),
            "bad": Json(_envelope(BAD)),
            "plain": Json(rag_body(GOOD, CHUNKS)),
            "dupe": Json(
                b'{"answer": "'
                + GOOD.encode()
                + b'", "sources": [], "trace_id": "a", "trace_id": "'
                + MARKER.encode()
                + b'"}'
            ),
        }
    )
    with serve(up) as url:
        yield url


def _policy(tmp_path: Path, on_unverified: str) -> Path:
    path = tmp_path / f"keep-{on_unverified}.yaml"
    path.write_text(POLICY.format(on_unverified=on_unverified))
    return path


def _expect_kept(body: dict[str, Any]) -> None:
    assert body["status"] == "ok"
    assert body["trace_id"] == "t-123"
    assert body["meta"] == {"region": "eu"}
    assert body["count"] == 3 and body["cached"] is False
    for dropped in ("nested", "long", "note", "spaced", "unlisted", "followups", "missing"):
        assert dropped not in body


@pytest.mark.parametrize(
    ("question", "on_unverified", "status", "decision"),
    [
        ("good", "block", 200, "released"),
        ("mixed", "strip", 200, "partial"),
        ("bad", "strip", 200, "abstained"),
        ("bad", "abstain", 200, "abstained"),
        ("bad", "review", 200, "review"),
        ("bad", "block", 422, "blocked"),
    ],
)
def test_kept_fields_in_every_decision(
    tmp_path: Path, upstream_url: str, question: str, on_unverified: str, status: int, decision: str
) -> None:
    with run_gateway(upstream_url, [_policy(tmp_path, on_unverified)]) as gw:
        r = httpx.post(gw.url + "/rag/answer", json={"question": question})
    assert r.status_code == status
    assert r.headers["x-citewarden-decision"] == decision
    assert MARKER not in r.text
    body = r.json()
    _expect_kept(body)
    if decision == "blocked":
        assert body["error"]["type"] == "citation_verification_failed"
        assert body["citewarden"]["reason"] == "hallucinated_citation"
    else:
        assert body["sources"][0]["id"] == "kb:1"  # the context list is kept
    if decision == "released":
        assert body["answer"] == GOOD


def test_released_body_without_extras_is_the_upstreams_bytes(
    tmp_path: Path, upstream_url: str
) -> None:
    with run_gateway(upstream_url, [_policy(tmp_path, "block")]) as gw:
        r = httpx.post(gw.url + "/rag/answer", json={"question": "plain"})
    assert r.headers["x-citewarden-decision"] == "released"
    assert r.content == json.dumps(rag_body(GOOD, CHUNKS)).encode()


def test_duplicate_key_fails_closed(tmp_path: Path, upstream_url: str) -> None:
    with run_gateway(upstream_url, [_policy(tmp_path, "block")]) as gw:
        r = httpx.post(gw.url + "/rag/answer", json={"question": "dupe"})
    assert r.status_code == 502
    assert MARKER not in r.text
    assert "error" in r.json()


def test_keep_does_not_override_the_block_envelope(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.format(on_unverified="block").replace("/missing", "/error"))
    body = {**rag_body(BAD, CHUNKS), "error": "upstream-said-" + MARKER}
    up = create_upstream({"bad": Json(body)})
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        r = httpx.post(gw.url + "/rag/answer", json={"question": "bad"})
    assert r.status_code == 422
    assert MARKER not in r.text
    assert r.json()["error"]["type"] == "citation_verification_failed"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1, "a": 2}',
        b'{"x": {"b": 1, "b": 1}}',
        b'{"l": [{"c": 1}, {"c": 2, "c": 3}]}',
    ],
)
def test_duplicate_keys_fail_closed(raw: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        loads_unique(raw)
    assert "repeats a key" in str(info.value)


def test_distinct_keys_pass() -> None:
    loads_unique(b'{"a": 1, "b": {"a": 2}, "c": [{"a": 3}, {"a": 4}]}')


@pytest.mark.parametrize("pointer", ["", "status", "/bad~2escape"])
def test_keep_entries_must_be_field_pointers(tmp_path: Path, pointer: str) -> None:
    from gateway.errors import PolicyError

    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.format(on_unverified="block").replace("/missing", json.dumps(pointer)))
    with pytest.raises(PolicyError) as info:
        load_policy(policy)
    assert "keep" in str(info.value)


@pytest.mark.parametrize("pointer", ["/answer", "/answer/x", "/sources/0/text", "/sources"])
def test_a_keep_entry_never_names_the_answer_or_the_context(tmp_path: Path, pointer: str) -> None:
    """Kept fields go out in every decision, the blocked envelope too: one that is or holds
    the answer would carry it unchecked; so would one inside the context."""
    from gateway.errors import PolicyError

    policy = tmp_path / "p.yaml"
    policy.write_text(POLICY.format(on_unverified="block").replace("/missing", pointer))
    with pytest.raises(PolicyError) as info:
        load_policy(policy)
    assert "keep" in str(info.value) and "overlaps" in str(info.value)
    assert "p.yaml:" in str(info.value)  # file:line


@pytest.mark.parametrize(
    ("rag", "named"),
    [
        ("{claims: /claims, context: /claims}", "claims"),
        ("{answer: /results/0/text, context: /results}", "answer"),
        ("{answer: /answer, context: /answer/sources}", "answer"),
        ("{answer: /a, claims: /out, context: /out/0/refs}", "claims"),
    ],
)
def test_the_context_never_names_the_answer_or_the_claims(
    tmp_path: Path, rag: str, named: str
) -> None:
    """The model's own text as its context would let a claim cite itself and verify."""
    from gateway.errors import PolicyError

    policy = tmp_path / "p.yaml"
    policy.write_text(
        "name: overlap\nroutes:\n  - name: kb\n    match: {path_prefix: /rag/}\n"
        f"    protocol: rag-json\n    rag: {rag}\n"
    )
    with pytest.raises(PolicyError) as info:
        load_policy(policy)
    message = str(info.value)
    assert "p.yaml:6:" in message and "rag.context" in message and f"rag.{named}" in message


def test_shipped_rag_policy_documents_keep() -> None:
    loaded = load_policy(Path(__file__).parent.parent / "policies" / "rag-json.yaml")
    rag = loaded.policy.routes[0].rag
    assert rag is not None
    assert rag.keep  # the example policy shows the envelope fields it keeps


@pytest.mark.parametrize(("question", "decision"), [
    ("Can I install and stack K7 units myself?", None),
    ("Give me a fully hallucinated answer", "abstained"),
])  # fmt: skip
def test_demo_rag_route_keeps_its_envelope(question: str, decision: str | None) -> None:
    from gateway.demo.app import create_demo_app
    from gateway.server import DEMO_POLICIES

    with serve(create_demo_app()) as url, run_gateway(url, list(DEMO_POLICIES)) as gw:
        r = httpx.post(gw.url + "/rag/answer", json={"question": question})
    assert r.status_code == 200
    if decision is not None:
        assert r.headers["x-citewarden-decision"] == decision
    body = r.json()
    assert body["status"] == "ok"
    assert len(body["trace_id"]) == 16
    assert body["model"] == "citewarden-demo"
    assert "retrieval" not in body

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.audit import audit_event, configure_logging, reset_logging
from gateway.report import percentile, run, summarise
from gateway.types import Claim, ClaimReport, Decision, Outcome, Report


def audit(route: str, decision: str, ms: float | None, reasons: list[str], **kw: object) -> str:
    event: dict[str, object] = {
        "event": "audit",
        "level": "info",
        "request_id": "r",
        "route": route,
        "policy": kw.pop("policy", "support-bot@v1"),
        "decision": decision,
        "reasons": reasons,
        "timings": {"upstream_ms": 100.0, "verification_ms": ms, "total_ms": 101.0},
        **kw,
    }
    return json.dumps(event)


FIXTURE = [
    audit("chat", "released", 0.2, []),
    audit("chat", "released", 0.4, []),
    audit("chat", "blocked", 0.6, ["hallucinated_citation", "number_mismatch"]),
    audit("chat", "partial", 0.8, ["hallucinated_citation"]),
    audit("kb", "abstained", 10.0, ["timeout"], policy="kb@v2"),
    audit("kb", "review", 20.0, ["unsupported"], policy="kb@v2"),
    audit("kb", "released", None, [], mode="shadow", shadow_decision="blocked"),
    audit("unrouted", "refused", None, ["no_route"]),
    json.dumps({"event": "upstream_request", "level": "info"}),
    json.dumps({"event": "review_requested", "route": "kb"}),
    "INFO:     Uvicorn running on http://0.0.0.0:8080",
    "{truncated",
    "",
    "[1, 2]",
    json.dumps({"event": "audit", "route": "chat"}),  # no decision: not a usable audit event
    "2024-05-01T10:00:00.000Z " + audit("chat", "released", 0.3, []),  # kubectl --timestamps
]


@pytest.fixture
def fixture_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    path.write_text("\n".join(FIXTURE) + "\n", encoding="utf-8")
    return path


def test_summary(fixture_file: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert run(fixture_file, out, err) == 0
    assert err.getvalue() == ""
    s = json.loads(out.getvalue())
    assert s["total"] == 9
    assert s["decisions"] == {
        "released": 4,
        "blocked": 1,
        "partial": 1,
        "abstained": 1,
        "review": 1,
        "refused": 1,
    }
    assert s["decision_rates"]["released"] == pytest.approx(4 / 9, abs=1e-4)
    assert s["decision_rates"]["blocked"] == pytest.approx(1 / 9, abs=1e-4)
    assert s["failure_reasons"] == {
        "hallucinated_citation": 2,
        "number_mismatch": 1,
        "timeout": 1,
        "unsupported": 1,
        "no_route": 1,
    }
    assert s["policies"] == ["kb@v2", "support-bot@v1"]
    assert s["skipped_lines"] == 2
    assert s["unparseable_lines"] == 4
    assert s["shadow_decisions"] == {"blocked": 1}
    # Overall latency: [0.2, 0.3, 0.4, 0.6, 0.8, 10, 20]; events without a timing are left out.
    assert s["verification_ms"] == {"count": 7, "p50": 0.6, "p95": 17.0, "p99": 19.4}

    chat = s["routes"]["chat"]
    assert chat["requests"] == 5
    assert chat["decisions"] == {"released": 3, "blocked": 1, "partial": 1}
    assert chat["block_rate"] == 0.2
    assert chat["strip_rate"] == 0.2
    assert chat["abstention_rate"] == 0.0
    assert chat["top_reasons"] == [["hallucinated_citation", 2], ["number_mismatch", 1]]
    assert chat["verification_ms"] == {"count": 5, "p50": 0.4, "p95": 0.76, "p99": 0.792}
    assert "shadow_decisions" not in chat

    kb = s["routes"]["kb"]
    assert kb["requests"] == 3
    assert kb["abstention_rate"] == pytest.approx(0.3333)
    assert kb["review_rate"] == pytest.approx(0.3333)
    assert kb["block_rate"] == 0.0
    assert kb["shadow_decisions"] == {"blocked": 1}
    assert kb["verification_ms"] == {"count": 2, "p50": 15.0, "p95": 19.5, "p99": 19.9}
    assert set(s["routes"]) == {"chat", "kb", "unrouted"}
    assert s["routes"]["unrouted"]["verification_ms"] == {
        "count": 0,
        "p50": None,
        "p95": None,
        "p99": None,
    }


def test_empty_input() -> None:
    s = summarise([])
    assert s["total"] == 0
    assert s["decisions"] == {} and s["routes"] == {} and s["policies"] == []
    assert s["verification_ms"] == {"count": 0, "p50": None, "p95": None, "p99": None}


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.5
    assert percentile(values, 99) == 99.01
    assert percentile(values, 100) == 100.0


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    missing = tmp_path / "nope.jsonl"
    assert run(missing, out, err) == 2
    assert out.getvalue() == ""
    assert f"cannot read {missing}" in err.getvalue()
    assert "No such file" in err.getvalue()
    err = io.StringIO()
    assert run(tmp_path, io.StringIO(), err) == 2  # a directory
    assert "cannot read" in err.getvalue()


def test_undecodable_bytes_do_not_abort(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\xff\xfe garbage\n" + audit("chat", "released", 1.0, []).encode() + b"\n")
    out = io.StringIO()
    assert run(path, out, io.StringIO()) == 0
    s = json.loads(out.getvalue())
    assert s["total"] == 1 and s["unparseable_lines"] == 1


@pytest.fixture
def _logging() -> Iterator[None]:
    yield
    reset_logging()


@pytest.mark.usefixtures("_logging")
def test_round_trip_from_real_audit_events(tmp_path: Path) -> None:
    path = tmp_path / "gateway.log"
    claim = Claim(0, 0, "text", 0, 4)
    failed = Report(
        (ClaimReport(claim, "failed", reason="stale_source", check="stale_source"),), "f", 0.0007
    )
    with path.open("w", encoding="utf-8") as f:
        configure_logging(stream=f)
        for _ in range(3):
            audit_event(
                request_id="a",
                route="chat",
                policy="p@1",
                status=422,
                report=failed,
                outcome=Outcome(Decision.BLOCKED, reason="stale_source", claim_index=0),
            )
        audit_event(
            request_id="b",
            route="chat",
            policy="p@1",
            status=200,
            report=Report((ClaimReport(claim, "verified"),), "f", 0.0001),
            outcome=Outcome(Decision.RELEASED),
        )
        reset_logging()
    out = io.StringIO()
    assert run(path, out, io.StringIO()) == 0
    s = json.loads(out.getvalue())
    assert s["total"] == 4
    assert s["decisions"] == {"blocked": 3, "released": 1}
    assert s["routes"]["chat"]["block_rate"] == 0.75
    assert s["failure_reasons"] == {"stale_source": 3}
    assert s["verification_ms"]["p50"] == 0.7
    assert s["policies"] == ["p@1"]
    assert s["unparseable_lines"] == 0

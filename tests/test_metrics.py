from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gateway.checks.judge import JudgeStats
from gateway.judge.client import CallRecord
from gateway.metrics import ROUTE_OVERFLOW, Metrics
from gateway.types import Claim, ClaimReport, Decision, Report


def claim_report(index: int, verdict: str, **kw: str) -> ClaimReport:
    claim = Claim(index=index, channel=0, text=f"claim {index}", start=0, end=7)
    return ClaimReport(claim=claim, verdict=verdict, **kw)  # type: ignore[arg-type]


def scrape(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body, content_type = m.render()
    assert content_type.startswith("text/plain")
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def m() -> Metrics:
    return Metrics(CollectorRegistry())


def test_exposed_names_types_and_labels(m: Metrics) -> None:
    m.observe_verification(
        "chat", Report(claims=(claim_report(0, "verified"),), context="x")
    )
    m.observe_request("chat", Decision.RELEASED, False, 0.01, 0.005)
    m.observe_upstream("chat", 0.2)
    with m.inflight("chat"):
        pass
    m.observe_tokens("chat", True, {"input_tokens": 1, "output_tokens": 1})
    m.observe_verification(
        "chat",
        Report(
            claims=(
                claim_report(0, "failed", reason="missing_citation", check="missing_citation"),
                claim_report(1, "errored", check="support", error_kind="timeout"),
            ),
            context="x",
        ),
    )
    m.policy_reloaded("success")
    m.set_policies([("support-bot", "abc")])
    m.observe_context_rejected("chat", {"unsigned": 1})
    m.observe_fields_dropped("chat", {"message": 2, "made-up level": 1})
    judged = JudgeStats("default-x", "m", [CallRecord("ok", 0.2, {"prompt": 9})], {"YES": 1}, 1, 1)
    m.observe_judge("chat", judged)

    text = m.render()[0].decode()
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    expected = {
        "citewarden_requests_total": ("counter", {"route", "decision"}),
        "citewarden_claims_total": ("counter", {"route", "verdict"}),
        "citewarden_check_failures_total": ("counter", {"route", "reason"}),
        "citewarden_verifier_errors_total": ("counter", {"route", "check", "kind"}),
        "citewarden_verification_seconds": ("histogram", {"route"}),
        "citewarden_upstream_seconds": ("histogram", {"route"}),
        "citewarden_request_seconds": ("histogram", {"route", "streaming"}),
        "citewarden_first_byte_seconds": ("histogram", {"route", "streaming"}),
        "citewarden_inflight_requests": ("gauge", {"route"}),
        "citewarden_upstream_tokens_total": ("counter", {"route", "outcome", "kind"}),
        "citewarden_policy_reloads_total": ("counter", {"outcome"}),
        "citewarden_fields_dropped_total": ("counter", {"route", "level"}),
        "citewarden_policy_info": ("gauge", {"name", "version"}),
        "citewarden_context_rejected_total": ("counter", {"route", "why"}),
        "citewarden_judge_calls_total": ("counter", {"route", "outcome"}),
        "citewarden_judge_seconds": ("histogram", {"route"}),
        "citewarden_judge_verdicts_total": ("counter", {"route", "verdict"}),
        "citewarden_judge_cache_total": ("counter", {"route", "result"}),
        "citewarden_judge_circuit_open": ("gauge", {"route"}),
        "citewarden_judge_tokens_total": ("counter", {"route", "kind"}),
    }
    for name, (kind, labels) in expected.items():
        assert types[name] == kind, name
        sample_name = f"{name}_count" if kind == "histogram" else name
        lines = re.findall(rf"^{sample_name}\{{([^}}]*)\}} ", text, re.M)
        assert lines, name
        for line in lines:
            assert set(re.findall(r'(\w+)="', line)) == labels, (name, line)
    # prometheus_client's per-series `_created` timestamps aside, nothing else is ours.
    ours = {f for f in types if f.startswith("citewarden_") and not f.endswith("_created")}
    assert ours == set(expected)


def test_verification_counts_claims_reasons_errors_and_time(m: Metrics) -> None:
    report = Report(
        claims=(
            claim_report(0, "verified"),
            claim_report(1, "verified"),
            claim_report(2, "exempt"),
            claim_report(
                3, "failed", reason="hallucinated_citation", check="hallucinated_citation"
            ),
            claim_report(
                4, "failed", reason="hallucinated_citation", check="hallucinated_citation"
            ),
            claim_report(5, "failed", reason="number_mismatch", check="number_mismatch"),
            claim_report(6, "errored", check="support", error_kind="timeout"),
        ),
        context="f",
        seconds=0.0003,
    )
    m.observe_verification("kb", report)
    s = scrape(m)
    assert value(s, "citewarden_claims_total", route="kb", verdict="verified") == 2
    assert value(s, "citewarden_claims_total", route="kb", verdict="exempt") == 1
    assert value(s, "citewarden_claims_total", route="kb", verdict="failed") == 3
    assert value(s, "citewarden_claims_total", route="kb", verdict="errored") == 1
    assert (
        value(s, "citewarden_check_failures_total", route="kb", reason="hallucinated_citation") == 2
    )
    assert value(s, "citewarden_check_failures_total", route="kb", reason="number_mismatch") == 1
    assert (
        value(s, "citewarden_verifier_errors_total", route="kb", check="support", kind="timeout")
        == 1
    )
    assert value(s, "citewarden_verification_seconds_count", route="kb") == 1
    assert value(s, "citewarden_verification_seconds_sum", route="kb") == pytest.approx(0.0003)
    # Sub-millisecond resolution: 300µs lands in le=0.0005 but not in le=0.00025.
    assert value(s, "citewarden_verification_seconds_bucket", route="kb", le="0.00025") == 0
    assert value(s, "citewarden_verification_seconds_bucket", route="kb", le="0.0005") == 1
    assert value(s, "citewarden_verification_seconds_bucket", route="kb", le="5e-05") == 0


def test_buckets_span_the_documented_ranges(m: Metrics) -> None:
    m.observe_verification("r", Report(claims=(), context="f"))
    m.observe_upstream("r", 1.0)
    s = scrape(m)
    vb = {dict(k[1])["le"] for k in s if k[0] == "citewarden_verification_seconds_bucket"}
    ub = {dict(k[1])["le"] for k in s if k[0] == "citewarden_upstream_seconds_bucket"}
    assert min(float(b) for b in vb) == 0.00005
    assert max(float(b) for b in vb if b != "+Inf") == 1.0
    assert min(float(b) for b in ub) == 0.005
    assert max(float(b) for b in ub if b != "+Inf") == 60.0


def test_requests_decisions_streaming_and_first_byte(m: Metrics) -> None:
    m.observe_request("chat", Decision.BLOCKED, False, 0.02, 0.02)
    m.observe_request("chat", "released", True, 1.5, 0.3)
    m.observe_request("chat", "released", True, 0.5, None)
    m.observe_request("passthrough", "passthrough", False, 0.004)
    s = scrape(m)
    assert value(s, "citewarden_requests_total", route="chat", decision="blocked") == 1
    assert value(s, "citewarden_requests_total", route="chat", decision="released") == 2
    assert value(s, "citewarden_requests_total", route="chat", decision="partial") == 0
    assert value(s, "citewarden_requests_total", route="passthrough", decision="passthrough") == 1
    assert value(s, "citewarden_request_seconds_count", route="chat", streaming="true") == 2
    assert value(s, "citewarden_request_seconds_sum", route="chat", streaming="true") == 2.0
    assert value(s, "citewarden_request_seconds_count", route="chat", streaming="false") == 1
    # A request that never sent a byte has no first-byte observation.
    assert value(s, "citewarden_first_byte_seconds_count", route="chat", streaming="true") == 1
    assert value(s, "citewarden_first_byte_seconds_sum", route="chat", streaming="true") == 0.3
    assert (
        value(s, "citewarden_first_byte_seconds_count", route="passthrough", streaming="false") == 0
    )


def test_upstream_and_inflight(m: Metrics) -> None:
    m.observe_upstream("chat", 0.25)
    with m.inflight("chat"):
        with m.inflight("chat"):
            assert value(scrape(m), "citewarden_inflight_requests", route="chat") == 2
        assert value(scrape(m), "citewarden_inflight_requests", route="chat") == 1
    with pytest.raises(RuntimeError), m.inflight("chat"):
        raise RuntimeError("boom")
    s = scrape(m)
    assert value(s, "citewarden_inflight_requests", route="chat") == 0
    assert value(s, "citewarden_upstream_seconds_count", route="chat") == 1
    assert value(s, "citewarden_upstream_seconds_bucket", route="chat", le="0.25") == 1
    assert value(s, "citewarden_upstream_seconds_bucket", route="chat", le="0.1") == 0


def test_tokens_served_and_withheld(m: Metrics) -> None:
    m.observe_tokens("chat", True, {"input_tokens": 100, "output_tokens": 20})
    m.observe_tokens("chat", False, {"input_tokens": 50, "output_tokens": 7, "total_tokens": 57})
    m.observe_tokens("chat", False, {"prompt_tokens": 5, "completion_tokens": 3})
    m.observe_tokens("chat", True, {})
    s = scrape(m)
    assert (
        value(s, "citewarden_upstream_tokens_total", route="chat", outcome="served", kind="input")
        == 100
    )
    assert (
        value(s, "citewarden_upstream_tokens_total", route="chat", outcome="served", kind="output")
        == 20
    )
    assert (
        value(s, "citewarden_upstream_tokens_total", route="chat", outcome="withheld", kind="input")
        == 55
    )
    assert (
        value(
            s, "citewarden_upstream_tokens_total", route="chat", outcome="withheld", kind="output"
        )
        == 10
    )


def test_tokens_ignore_insane_usage(m: Metrics) -> None:
    m.observe_tokens("chat", True, {"input_tokens": -4, "output_tokens": True})
    m.observe_tokens("chat", True, {"input_tokens": "9"})  # type: ignore[dict-item]
    s = scrape(m)
    assert (
        value(s, "citewarden_upstream_tokens_total", route="chat", outcome="served", kind="input")
        == 0
    )
    assert (
        value(s, "citewarden_upstream_tokens_total", route="chat", outcome="served", kind="output")
        == 0
    )


def test_policy_info_replaces_old_versions(m: Metrics) -> None:
    m.set_policies([("support-bot", "v1"), ("kb", "k1")])
    m.policy_reloaded("success")
    m.set_policies([("support-bot", "v2"), ("kb", "k1")])
    m.policy_reloaded("failure")
    m.policy_reloaded("success")
    s = scrape(m)
    info = {k[1]: v for k, v in s.items() if k[0] == "citewarden_policy_info"}
    assert info == {
        (("name", "kb"), ("version", "k1")): 1.0,
        (("name", "support-bot"), ("version", "v2")): 1.0,
    }
    assert value(s, "citewarden_policy_reloads_total", outcome="success") == 2
    assert value(s, "citewarden_policy_reloads_total", outcome="failure") == 1


def test_route_label_cardinality_is_bounded() -> None:
    m = Metrics(CollectorRegistry(), max_routes=3)
    for i in range(10):
        m.observe_request(f"r{i}", "released", False, 0.01)
    s = scrape(m)
    routes = {dict(k[1])["route"] for k in s if k[0] == "citewarden_requests_total"}
    assert routes == {"r0", "r1", "r2", ROUTE_OVERFLOW}
    assert value(s, "citewarden_requests_total", route=ROUTE_OVERFLOW, decision="released") == 7


def test_default_registry_is_private_and_has_process_metrics() -> None:
    a, b = Metrics(), Metrics()  # would raise on duplicate registration if both used the global
    a.observe_request("chat", "released", False, 0.01)
    body = b.render()[0].decode()
    assert 'citewarden_requests_total{decision="released",route="chat"}' not in body
    assert "python_info" in a.render()[0].decode()


def test_openmetrics_negotiation(m: Metrics) -> None:
    m.observe_request("chat", "released", False, 0.01)
    body, content_type = m.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.endswith(b"# EOF\n")
    assert b'citewarden_requests_total{decision="released",route="chat"} 1.0' in body
    plain, plain_type = m.render("text/plain")
    assert plain_type.startswith("text/plain")
    assert b"# EOF" not in plain

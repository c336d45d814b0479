"""The Grafana dashboard shipped with the chart: valid JSON, unique ids, and PromQL that only
names metrics (and label values) of the DESIGN §8 contract, so a rename breaks this test."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DASHBOARD = (
    Path(__file__).resolve().parents[1] / "helm" / "citewarden" / "dashboards" / "citewarden.json"
)

# DESIGN §8: name -> (type, labels).
METRICS: dict[str, tuple[str, frozenset[str]]] = {
    "citewarden_requests_total": ("counter", frozenset({"route", "decision"})),
    "citewarden_claims_total": ("counter", frozenset({"route", "verdict"})),
    "citewarden_check_failures_total": ("counter", frozenset({"route", "reason"})),
    "citewarden_verifier_errors_total": ("counter", frozenset({"route", "check", "kind"})),
    "citewarden_verification_seconds": ("histogram", frozenset({"route"})),
    "citewarden_upstream_seconds": ("histogram", frozenset({"route"})),
    "citewarden_request_seconds": ("histogram", frozenset({"route", "streaming"})),
    "citewarden_first_byte_seconds": ("histogram", frozenset({"route", "streaming"})),
    "citewarden_inflight_requests": ("gauge", frozenset({"route"})),
    "citewarden_upstream_tokens_total": ("counter", frozenset({"route", "outcome", "kind"})),
    "citewarden_policy_reloads_total": ("counter", frozenset({"outcome"})),
    "citewarden_policy_info": ("gauge", frozenset({"name", "version"})),
}
# Labels Prometheus attaches at scrape time (Kubernetes service discovery included).
TARGET_LABELS = frozenset({"namespace", "pod", "job", "instance", "service", "container"})
# Label values fixed by the contract: (metric, label) -> values. Besides the five release
# decisions, requests_total records proxy outcomes that never reach verification and, for
# shadow-mode policies, the would-be decision as shadow_<decision> (gateway/metrics.py).
DECISIONS = frozenset({"released", "partial", "abstained", "blocked", "review"})
LABEL_VALUES = {
    ("citewarden_requests_total", "decision"): DECISIONS
    | {"passthrough", "refused", "error"}
    | {f"shadow_{d}" for d in DECISIONS}
    | {"shadow_.*"},
    ("citewarden_claims_total", "verdict"): {"verified", "failed", "errored", "exempt"},
    ("citewarden_upstream_tokens_total", "outcome"): {"served", "withheld"},
    ("citewarden_policy_reloads_total", "outcome"): {"success", "error"},
}

_METRIC_RE = re.compile(r"\bcitewarden_[a-z0-9_]+")
_SELECTOR_RE = re.compile(r"\b(citewarden_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def series_names() -> dict[str, str]:
    """Every series name a query may use -> the contract metric it belongs to."""
    names: dict[str, str] = {}
    for name, (kind, _labels) in METRICS.items():
        if kind == "histogram":
            for suffix in ("_bucket", "_sum", "_count"):
                names[name + suffix] = name
        else:
            names[name] = name
    return names


def promql_problems(expr: str, *, extra_labels: frozenset[str] = TARGET_LABELS) -> list[str]:
    """Names, label keys and fixed label values in `expr` that the metric contract lacks."""
    known = series_names()
    problems: list[str] = []
    used = _METRIC_RE.findall(expr)
    if not used:
        problems.append(f"no citewarden_ metric in {expr!r}")
    problems += [f"unknown metric {name}" for name in used if name not in known]
    for name, matchers in _SELECTOR_RE.findall(expr):
        if name not in known:
            continue
        labels = METRICS[known[name]][1] | extra_labels
        if name.endswith("_bucket"):
            labels |= {"le"}
        for key, op, value in _MATCHER_RE.findall(matchers):
            if key not in labels:
                problems.append(f"{name} has no label {key!r}")
            allowed = LABEL_VALUES.get((known[name], key))
            if allowed is None:
                continue
            values = value.split("|") if op in ("=~", "!~") else [value]
            problems += [
                f"{name}: {key}={v!r} is not a contract value" for v in values if v not in allowed
            ]
    return problems


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def _exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]


def test_dashboard_identity_and_unique_ids(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "citewarden-overview"
    assert dashboard["title"]
    panels = list(_panels(dashboard["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    uids = [p["uid"] for p in panels if "uid" in p] + [dashboard["uid"]]
    assert len(uids) == len(set(uids)), "uids must be unique"
    variables = [v["name"] for v in dashboard["templating"]["list"]]
    assert len(variables) == len(set(variables))
    for panel in panels:
        for target in panel.get("targets", []):
            assert target["refId"], panel["title"]
        ref_ids = [t["refId"] for t in panel.get("targets", [])]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]


def test_panels_do_not_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in _panels(dashboard["panels"]):
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_every_query_uses_only_contract_metrics(dashboard: dict[str, Any]) -> None:
    exprs = _exprs(dashboard)
    assert len(exprs) >= 20
    problems = [f"{title}: {p}" for title, expr in exprs for p in promql_problems(expr)]
    assert not problems, "\n".join(problems)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert not promql_problems(variable["definition"]), variable["name"]


def test_queries_use_the_templated_datasource(dashboard: dict[str, Any]) -> None:
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_dashboard_covers_the_operational_questions(dashboard: dict[str, Any]) -> None:
    exprs = [expr for _title, expr in _exprs(dashboard)]
    joined = "\n".join(exprs)
    for q in ("0.5", "0.95", "0.99"):
        quantile = f"histogram_quantile({q}, sum by (route, le) (rate("
        assert quantile + "citewarden_verification_seconds_bucket" in joined
    assert "citewarden_upstream_seconds_bucket" in joined
    assert "sum by (decision) (rate(citewarden_requests_total" in joined
    assert 'decision="abstained"' in joined and 'decision="partial"' in joined
    assert "citewarden_verifier_errors_total" in joined
    assert "citewarden_inflight_requests" in joined
    withheld = [e for e in exprs if "citewarden_upstream_tokens_total" in e and "withheld" in e]
    assert withheld, "a panel must show the token cost of withheld answers"
    assert 'decision=~"shadow_.*"' in joined, "shadow-mode roll-outs need a panel"
    # Ratios are over verified answers only: passthrough, refusals and shadow traffic would
    # dilute them.
    verified = 'decision=~"released|partial|abstained|blocked|review"'
    for expr in exprs:
        if "citewarden_requests_total" in expr and " / " in expr:
            assert verified in expr.split(" / ", 1)[1], expr
    tables = [p for p in _panels(dashboard["panels"]) if p["type"] == "table"]
    assert any("citewarden_policy_info" in t["targets"][0]["expr"] for t in tables)


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("rate(citewarden_request_total[5m])", "unknown metric citewarden_request_total"),
        (
            "rate(citewarden_verification_seconds[5m])",
            "unknown metric citewarden_verification_seconds",
        ),
        ('citewarden_requests_total{decision="stripped"}', "'stripped' is not a contract value"),
        (
            'citewarden_requests_total{decision=~"abstained|denied"}',
            "'denied' is not a contract value",
        ),
        ('citewarden_inflight_requests{tenant="acme"}', "has no label 'tenant'"),
        ("sum(rate(http_requests_total[5m]))", "no citewarden_ metric"),
    ],
)
def test_checker_rejects_off_contract_queries(expr: str, needle: str) -> None:
    assert any(needle in p for p in promql_problems(expr)), promql_problems(expr)

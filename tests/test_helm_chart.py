"""The Helm chart: lint, offline render (Helm's Go SDK via helm-python-sdk), and every rendered
manifest validated in strict mode against Kubernetes schemas; CRDs are checked structurally."""

from __future__ import annotations

import copy
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from gateway.policy import Policy
from tests.test_dashboard import promql_problems

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "citewarden"
# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest with schemas.
KUBE_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
NAMESPACE = "llm"
RELEASE = "cw"

Manifest = dict[str, Any]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


BASE: dict[str, Any] = yaml.safe_load((CHART / "ci" / "default-values.yaml").read_text())
SIDECAR = _merge(
    BASE, {"standalone": {"enabled": False}, "sidecar": {"example": {"enabled": True}}}
)
ALL = _merge(
    BASE,
    {
        "autoscaling": {"enabled": True, "targetMemoryUtilizationPercentage": 80},
        "podDisruptionBudget": {"enabled": True},
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus"}},
            "prometheusRule": {"enabled": True, "runbookBaseUrl": "https://example.org/ops"},
            "dashboard": {"enabled": True},
        },
        "sidecar": {"example": {"enabled": True}},
        "extraEnv": [{"name": "CITEWARDEN_LOG_LEVEL", "value": "info"}],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/name": "citewarden"}
                            },
                        },
                    }
                ]
            }
        },
    },
)
SCENARIOS = {"default": BASE, "sidecar": SIDECAR, "all-features": ALL}
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any] | None) -> list[Manifest]:
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def one(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def kinds(docs: list[Manifest]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def gateway_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod_spec["containers"] if c["name"] == "citewarden"]
    return container


def env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


# --- lint -----------------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_chart_lints_clean(scenario: str) -> None:
    report = helm.lint(
        CHART, SCENARIOS[scenario], strict=True, kube_version=f"v{KUBE_VERSIONS[-1]}"
    )
    assert report["errors"] == []
    # Only the informational "icon is recommended" may remain.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "two"}, "/replicaCount"),
        ({"replicaCas": 2}, "additional properties 'replicaCas' not allowed"),
        ({"image": {"tag": "1", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"policies": {"../evil.yaml": "name: x"}}, "invalid propertyName '../evil.yaml'"),
        ({"metrics": {"prometheusRule": {"abstentionDecisions": "stripped"}}}, "abstention"),
    ],
)
def test_schema_rejects_bad_values(chart: helm.Chart, values: dict[str, Any], message: str) -> None:
    bad = _merge(BASE, values)
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        chart.render(bad, name=RELEASE, namespace=NAMESPACE)
    report = helm.lint(CHART, bad, strict=True, kube_version=f"v{KUBE_VERSIONS[-1]}")
    assert any(message in err for err in report["errors"]), report


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"upstream": {"url": ""}}, "upstream.url is required"),
        ({"terminationGracePeriodSeconds": 25}, "must exceed preStopSleepSeconds"),
        (
            {"policyOptions": {"existingConfigMap": "platform-policies"}},
            "policyOptions.files must list",
        ),
        (
            {"service": {"exposeAdmin": False}, "metrics": {"serviceMonitor": {"enabled": True}}},
            "needs service.exposeAdmin",
        ),
    ],
)
def test_chart_refuses_unsafe_or_incomplete_settings(
    chart: helm.Chart, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        chart.render(_merge(BASE, values), name=RELEASE, namespace=NAMESPACE)


# --- strict Kubernetes validation -----------------------------------------------------------


def check_crd(doc: Manifest) -> None:
    """kubernetes-validate has no schemas for prometheus-operator CRDs: check their shape."""
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert doc["metadata"]["name"] and doc["metadata"]["namespace"] == NAMESPACE
    spec = doc["spec"]
    if doc["kind"] == "ServiceMonitor":
        assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel"}
        assert spec["selector"]["matchLabels"]
        for endpoint in spec["endpoints"]:
            assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}
            assert re.fullmatch(r"\d+[smh]", endpoint["interval"])
        return
    assert set(spec) == {"groups"}
    for group in spec["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["rules"]
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            assert re.fullmatch(r"Citewarden[A-Za-z]+", rule["alert"])
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert {"summary", "description"} <= set(rule["annotations"])
            assert "for" not in rule or re.fullmatch(r"\d+[smh]", rule["for"])
            assert (
                rule["labels"]["severity"] == "info" or "for" in rule or "increase(" in rule["expr"]
            )
            expr = rule["expr"]
            assert expr.count("(") == expr.count(")"), rule["alert"]
            assert expr.count("{") == expr.count("}"), rule["alert"]
            assert promql_problems(expr) == [], (rule["alert"], promql_problems(expr))


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_rendered_manifests_are_valid(chart: helm.Chart, scenario: str, kube_version: str) -> None:
    docs = render(chart, SCENARIOS[scenario])
    assert docs
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            check_crd(doc)
            continue
        kubernetes_validate.validate(doc, kube_version, strict=True)
        assert doc["metadata"]["namespace"] == NAMESPACE


def test_strict_validation_can_fail(chart: helm.Chart) -> None:
    deployment = one(render(chart, BASE), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)


def test_scenarios_render_the_expected_objects(chart: helm.Chart) -> None:
    assert kinds(render(chart, BASE)) == ["ConfigMap", "Deployment", "Service", "ServiceAccount"]
    assert kinds(render(chart, SIDECAR)) == ["ConfigMap", "Deployment"]
    assert kinds(render(chart, ALL)) == [
        "ConfigMap",
        "ConfigMap",
        "Deployment",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]


# --- the Deployment ---------------------------------------------------------------------------


def test_deployment_is_locked_down(chart: helm.Chart) -> None:
    pod = one(render(chart, BASE), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    sc = gateway_container(pod)["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsNonRoot"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # /tmp is the only writable path.
    mounts = {m["mountPath"]: m for m in gateway_container(pod)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert all(m.get("readOnly") for path, m in mounts.items() if path != "/tmp")


def test_probes_hit_the_admin_port(chart: helm.Chart) -> None:
    container = gateway_container(
        one(render(chart, BASE), "Deployment")["spec"]["template"]["spec"]
    )
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "admin": 9090}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    variables = env(container)
    assert variables["CITEWARDEN_PORT"] == "8080"
    assert variables["CITEWARDEN_ADMIN_PORT"] == "9090"
    assert variables["CITEWARDEN_HOST"] == "0.0.0.0"
    assert variables["CITEWARDEN_UPSTREAM"] == BASE["upstream"]["url"]


def test_policies_are_mounted_from_the_configmap_in_load_order(chart: helm.Chart) -> None:
    policies = {
        "20-kb.yaml": {
            "name": "kb",
            "routes": [
                {
                    "name": "kb",
                    "match": {"path_prefix": "/rag/"},
                    "protocol": "rag-json",
                    "rag": {"answer": "/answer", "context": "/sources"},
                }
            ],
        },
        "10-chat.yaml": (
            "name: chat\nroutes:\n  - name: chat\n"
            "    match: {path: /v1/chat/completions}\n    protocol: openai-chat\n"
        ),
    }
    docs = render(chart, _merge(BASE, {"policies": policies}))
    configmap = one(docs, "ConfigMap")
    assert sorted(configmap["data"]) == ["10-chat.yaml", "20-kb.yaml"]
    assert configmap["data"]["10-chat.yaml"] == policies["10-chat.yaml"]
    assert yaml.safe_load(configmap["data"]["20-kb.yaml"]) == policies["20-kb.yaml"]
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = gateway_container(pod)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "citewarden-policies"]
    # A directory mount (no subPath), so ConfigMap updates reach the pod for hot reload.
    assert "subPath" not in mount
    (volume,) = [v for v in pod["volumes"] if v["name"] == "citewarden-policies"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert env(container)["CITEWARDEN_POLICY"] == ":".join(
        f"{mount['mountPath']}/{name}" for name in ("10-chat.yaml", "20-kb.yaml")
    )
    for text in configmap["data"].values():
        Policy.model_validate(yaml.safe_load(text))


def test_default_policy_is_a_valid_enforcing_policy(chart: helm.Chart) -> None:
    data = one(render(chart, BASE), "ConfigMap")["data"]
    assert list(data) == ["default.yaml"]
    policy = Policy.model_validate(yaml.safe_load(data["default.yaml"]))
    assert policy.mode == "enforce"
    # The chart starts with the repository's shipped default policy.
    shipped = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text(encoding="utf-8"))
    assert yaml.safe_load(data["default.yaml"]) == shipped


def _checksum(docs: list[Manifest]) -> str | None:
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    value = annotations.get("checksum/policies")
    return None if value is None else str(value)


def test_policy_checksum_rolls_pods_on_policy_change(chart: helm.Chart) -> None:
    default = _checksum(render(chart, BASE))
    assert default is not None and re.fullmatch(r"[0-9a-f]{64}", default)
    assert _checksum(render(chart, BASE)) == default
    changed = _merge(BASE, {"policies": {"default.yaml": "name: other\nroutes: []\n"}})
    assert _checksum(render(chart, changed)) not in (None, default)
    hot_reload_only = _merge(BASE, {"policyOptions": {"rolloutOnChange": False}})
    assert _checksum(render(chart, hot_reload_only)) is None


def test_existing_configmap_is_mounted_without_rendering_one(chart: helm.Chart) -> None:
    values = _merge(
        BASE,
        {
            "policyOptions": {
                "existingConfigMap": "platform-policies",
                "files": ["b.yaml", "a.yaml"],
            }
        },
    )
    docs = render(chart, values)
    assert "ConfigMap" not in kinds(docs)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "citewarden-policies"]
    assert volume["configMap"]["name"] == "platform-policies"
    assert env(gateway_container(pod))["CITEWARDEN_POLICY"] == (
        "/etc/citewarden/policies/b.yaml:/etc/citewarden/policies/a.yaml"
    )
    assert _checksum(docs) is None


def test_termination_grace_outlasts_the_drain(chart: helm.Chart) -> None:
    pod = one(render(chart, BASE), "Deployment")["spec"]["template"]["spec"]
    container = gateway_container(pod)
    drain = int(env(container)["CITEWARDEN_SHUTDOWN_GRACE"])
    sleep = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > drain + sleep


def test_topology_spread_and_autoscaling(chart: helm.Chart) -> None:
    docs = render(chart, ALL)
    deployment = one(docs, "Deployment", f"{RELEASE}-citewarden")
    spec = deployment["spec"]
    assert "replicas" not in spec, "the HPA owns the replica count"
    selector = spec["selector"]["matchLabels"]
    spread = spec["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }
    assert all(c["labelSelector"]["matchLabels"] == selector for c in spread)
    assert spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"] == selector
    service = one(docs, "Service")
    assert service["spec"]["selector"] == selector
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "http": "http",
        "admin": "admin",
    }
    monitor = one(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == selector
    assert monitor["spec"]["endpoints"][0]["port"] == "admin"


def test_prometheus_rule_alerts(chart: helm.Chart) -> None:
    rules = one(render(chart, ALL), "PrometheusRule")["spec"]["groups"][0]["rules"]
    by_name = {r["alert"]: r for r in rules}
    assert set(by_name) == {
        "CitewardenAbstentionSpike",
        "CitewardenVerifierErrors",
        "CitewardenPolicyReloadFailed",
        "CitewardenPolicyVersionSkew",
        "CitewardenVerificationLatencyHigh",
        "CitewardenShadowModeActive",
    }
    spike = by_name["CitewardenAbstentionSpike"]["expr"]
    assert 'citewarden_requests_total{decision=~"abstained|blocked|review"}' in spike
    verified = 'citewarden_requests_total{decision=~"released|partial|abstained|blocked|review"}'
    assert spike.count(verified) == 2, "ratio and traffic floor count verified answers only"
    assert "citewarden_verifier_errors_total" in by_name["CitewardenVerifierErrors"]["expr"]
    assert "citewarden_policy_reloads_total" in by_name["CitewardenPolicyReloadFailed"]["expr"]
    assert "citewarden_policy_info" in by_name["CitewardenPolicyVersionSkew"]["expr"]
    latency = by_name["CitewardenVerificationLatencyHigh"]["expr"]
    assert "histogram_quantile(0.99" in latency
    assert "citewarden_verification_seconds_bucket" in latency
    for rule in rules:
        # Prometheus templating survives Helm's.
        assert "{{ $labels." in rule["annotations"]["summary"]
        assert rule["annotations"]["runbook_url"].startswith("https://example.org/ops#")


def test_dashboard_configmap_ships_the_dashboard_file(chart: helm.Chart) -> None:
    docs = render(chart, ALL)
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap" and "citewarden.json" in d["data"]]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(configmap["data"]["citewarden.json"])
    assert shipped == json.loads((CHART / "dashboards" / "citewarden.json").read_text())


def test_image_tag_defaults_to_app_version(chart: helm.Chart) -> None:
    container = gateway_container(
        one(render(chart, BASE), "Deployment")["spec"]["template"]["spec"]
    )
    assert container["image"] == f"citewarden:{chart.metadata['appVersion']}"
    digest = "sha256:" + "a" * 64
    pinned = render(chart, _merge(BASE, {"image": {"digest": digest}}))
    pinned_pod = one(pinned, "Deployment")["spec"]["template"]["spec"]
    assert gateway_container(pinned_pod)["image"] == f"citewarden@{digest}"


# --- sidecar ----------------------------------------------------------------------------------


def test_sidecar_example_injects_the_gateway(chart: helm.Chart) -> None:
    docs = render(chart, SIDECAR)
    configmap = one(docs, "ConfigMap")
    pod_template = one(docs, "Deployment")["spec"]["template"]
    pod = pod_template["spec"]
    assert [c["name"] for c in pod["containers"]] == ["app", "citewarden"]
    gateway = gateway_container(pod)
    assert env(gateway)["CITEWARDEN_UPSTREAM"] == "http://127.0.0.1:8000"
    assert gateway["securityContext"]["readOnlyRootFilesystem"] is True
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "citewarden-policies"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert re.fullmatch(
        r"[0-9a-f]{64}", pod_template["metadata"]["annotations"]["checksum/policies"]
    )


APP_CHART = """\
apiVersion: v2
name: support-bot
version: 1.0.0
dependencies:
  - name: citewarden
    version: 0.1.0
    repository: file://../citewarden
"""
APP_VALUES = """\
citewarden:
  standalone:
    enabled: false
  policies:
    support.yaml:
      name: support-bot
      routes:
        - name: chat
          match: {path: /v1/chat/completions}
          protocol: openai-chat
"""
# The snippet docs/operations.md tells app charts to use.
APP_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-support-bot
spec:
  selector:
    matchLabels: {app: support-bot}
  template:
    metadata:
      labels: {app: support-bot}
      annotations:
        app.example.com/owner: support
        {{- include "citewarden.sidecar.podAnnotations" (dict "root" $ "values" .Values.citewarden) | nindent 8 }}
    spec:
      terminationGracePeriodSeconds: {{ .Values.citewarden.terminationGracePeriodSeconds }}
      containers:
        - name: app
          image: support-bot:1.0.0
          ports: [{containerPort: 8000}]
        {{- include "citewarden.sidecar.container" (dict "root" $ "values" .Values.citewarden "upstream" "http://127.0.0.1:8000") | nindent 8 }}
      volumes:
        {{- include "citewarden.sidecar.volumes" (dict "root" $ "values" .Values.citewarden) | nindent 8 }}
"""  # noqa: E501


def test_app_chart_includes_the_sidecar_templates(tmp_path: Path) -> None:
    app = tmp_path / "support-bot"
    (app / "templates").mkdir(parents=True)
    (app / "Chart.yaml").write_text(APP_CHART)
    (app / "values.yaml").write_text(APP_VALUES)
    (app / "templates" / "deployment.yaml").write_text(APP_DEPLOYMENT)
    shutil.copytree(CHART, app / "charts" / "citewarden")
    with helm.Chart.load(app) as loaded:
        docs = render(loaded, None)
    assert kinds(docs) == ["ConfigMap", "Deployment"]
    configmap = one(docs, "ConfigMap")
    assert configmap["metadata"]["name"] == f"{RELEASE}-citewarden-policies"
    Policy.model_validate(yaml.safe_load(configmap["data"]["support.yaml"]))
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    gateway = gateway_container(pod)
    assert env(gateway)["CITEWARDEN_POLICY"] == "/etc/citewarden/policies/support.yaml"
    assert gateway["image"] == "citewarden:0.1.0"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "citewarden-policies"]
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"app.example.com/owner", "checksum/policies"}
    for kube_version in KUBE_VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, kube_version, strict=True)

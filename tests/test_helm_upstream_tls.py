"""The chart's extra volumes and mounts (DESIGN §11: a CA bundle or client certificate from a
Secret) and its upstream TLS values: rendered with Helm's Go SDK, validated strictly against the
Kubernetes schemas, refused by values.schema.json or the templates when wrong — and the example
docs/operations.md gives renders as it says."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from tests.test_helm_chart import (
    BASE,
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    SIDECAR,
    _merge,
    env,
    gateway_container,
    one,
    render,
)

ROOT = Path(__file__).resolve().parents[1]
TLS = {
    "extraVolumes": [
        {"name": "upstream-tls", "secret": {"secretName": "llm-upstream-tls",
                                            "defaultMode": 0o440}},
    ],
    "extraVolumeMounts": [
        {"name": "upstream-tls", "mountPath": "/etc/citewarden/upstream-tls", "readOnly": True},
    ],
    "upstream": {
        "caFile": "/etc/citewarden/upstream-tls/ca.crt",
        "clientCert": "/etc/citewarden/upstream-tls/tls.crt",
        "clientKey": "/etc/citewarden/upstream-tls/tls.key",
    },
}


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def _pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_a_secret_is_mounted_and_named_to_the_gateway(chart: helm.Chart,
                                                      kube_version: str) -> None:
    docs = render(chart, _merge(BASE, TLS))
    for doc in docs:
        if doc["kind"] in ("Deployment", "ConfigMap", "Service"):
            kubernetes_validate.validate(doc, kube_version, strict=True)
    pod = _pod(docs)
    assert {"name": "upstream-tls", "secret": {"secretName": "llm-upstream-tls",
                                               "defaultMode": 0o440}} in pod["volumes"]
    container = gateway_container(pod)
    assert {"name": "upstream-tls", "mountPath": "/etc/citewarden/upstream-tls",
            "readOnly": True} in container["volumeMounts"]
    variables = env(container)
    assert variables["CITEWARDEN_UPSTREAM_CA_FILE"] == "/etc/citewarden/upstream-tls/ca.crt"
    assert variables["CITEWARDEN_UPSTREAM_CLIENT_CERT"] == "/etc/citewarden/upstream-tls/tls.crt"
    assert variables["CITEWARDEN_UPSTREAM_CLIENT_KEY"] == "/etc/citewarden/upstream-tls/tls.key"
    # The built-in mounts are still there, and the root filesystem still read-only.
    names = [m["name"] for m in container["volumeMounts"]]
    assert names[:2] == ["citewarden-policies", "citewarden-tmp"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_without_them_nothing_changes(chart: helm.Chart) -> None:
    pod = _pod(render(chart, BASE))
    assert [v["name"] for v in pod["volumes"]] == ["citewarden-policies", "citewarden-tmp"]
    assert not any(k.startswith("CITEWARDEN_UPSTREAM_")
                   for k in env(gateway_container(pod)))


def test_the_sidecar_gets_them_too(chart: helm.Chart) -> None:
    docs = render(chart, _merge(SIDECAR, TLS))
    deployment = one(docs, "Deployment")
    kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    pod = deployment["spec"]["template"]["spec"]
    assert "upstream-tls" in [v["name"] for v in pod["volumes"]]
    container = gateway_container(pod)
    assert "upstream-tls" in [m["name"] for m in container["volumeMounts"]]
    assert "CITEWARDEN_UPSTREAM_CA_FILE" in env(container)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"extraVolumeMounts": [{"name": "x"}]}, "missing property 'mountPath'"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "etc/x"}]}, "/extraVolumeMounts/0"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "/tmp"}]}, "/extraVolumeMounts/0"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "/x", "readonly": True}]},
         "additional properties 'readonly' not allowed"),
        ({"extraVolumes": [{"name": "citewarden-tmp", "emptyDir": {}}]}, "/extraVolumes/0/name"),
        ({"extraVolumes": [{"name": "only-a-name"}]}, "/extraVolumes/0"),
        ({"extraVolumes": [{"secret": {"secretName": "s"}}]}, "missing property 'name'"),
        ({"extraVolumes": {"name": "x"}}, "/extraVolumes"),
        ({"upstream": {"caFile": "relative/ca.pem"}}, "/upstream/caFile"),
    ],
)
def test_schema_rejects_bad_volume_values(chart: helm.Chart, values: dict[str, Any],
                                          message: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        chart.render(_merge(BASE, values), name=RELEASE, namespace=NAMESPACE)


def test_a_mount_of_an_undefined_volume_is_refused(chart: helm.Chart) -> None:
    values = _merge(BASE, {"extraVolumeMounts": [{"name": "nowhere", "mountPath": "/x"}]})
    with pytest.raises(helm.HelmRenderError, match="extraVolumeMounts: \"nowhere\" mounts a "
                                                   "volume that extraVolumes does not define"):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_the_documented_example_renders_as_documented(chart: helm.Chart) -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "extraVolumes" in b]
    assert len(blocks) == 1, "docs/operations.md: one yaml example with extraVolumes"
    example = yaml.safe_load(blocks[0])
    pod = _pod(render(chart, _merge(BASE, example)))
    kubernetes_validate.validate(
        one(render(chart, _merge(BASE, example)), "Deployment"), KUBE_VERSIONS[-1], strict=True)
    container = gateway_container(pod)
    mounted = {m["mountPath"] for m in container["volumeMounts"]}
    variables = env(container)
    for key in ("CITEWARDEN_UPSTREAM_CA_FILE", "CITEWARDEN_UPSTREAM_CLIENT_CERT",
                "CITEWARDEN_UPSTREAM_CLIENT_KEY"):
        assert any(variables[key].startswith(m + "/") for m in mounted), key
    assert "HTTPS_PROXY" in variables and "NO_PROXY" in variables

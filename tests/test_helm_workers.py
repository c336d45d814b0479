"""The chart's `workers` value: wired to CITEWARDEN_WORKERS in the standalone and sidecar
containers, and a value below 1 refused by the schema."""

from __future__ import annotations

from collections.abc import Iterator

import helm_python as helm
import pytest

from tests.test_helm_chart import (
    BASE,
    CHART,
    NAMESPACE,
    RELEASE,
    SIDECAR,
    _merge,
    env,
    gateway_container,
    one,
    render,
)


@pytest.fixture(scope="module")
def loaded() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as c:
        yield c


def test_workers_default_to_one_process(loaded: helm.Chart) -> None:
    pod = one(render(loaded, BASE), "Deployment")["spec"]["template"]["spec"]
    assert env(gateway_container(pod))["CITEWARDEN_WORKERS"] == "1"


@pytest.mark.parametrize("values", [BASE, SIDECAR], ids=["standalone", "sidecar"])
def test_workers_value_reaches_the_gateway(loaded: helm.Chart, values: dict[str, object]) -> None:
    docs = render(loaded, _merge(values, {"workers": 2}))
    pods = [d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"]
    gateways = [c for p in pods for c in p["containers"] if c["name"] == "citewarden"]
    assert gateways and all(env(c)["CITEWARDEN_WORKERS"] == "2" for c in gateways)


def test_schema_refuses_fewer_than_one_worker(loaded: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="workers"):
        loaded.render(_merge(BASE, {"workers": 0}), name=RELEASE, namespace=NAMESPACE)

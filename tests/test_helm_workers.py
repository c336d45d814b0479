"""The chart's removed `workers` value: the gateway runs one process per container and scales
with replicas (DESIGN §9), so the chart sets no CITEWARDEN_WORKERS and refuses a `workers` above
1 with a message that points at replicaCount / autoscaling, standalone and sidecar alike."""

from __future__ import annotations

import re
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


def test_one_process_per_container_and_no_workers_variable(loaded: helm.Chart) -> None:
    pod = one(render(loaded, BASE), "Deployment")["spec"]["template"]["spec"]
    assert "CITEWARDEN_WORKERS" not in env(gateway_container(pod))


def test_workers_1_from_an_older_values_file_still_renders(loaded: helm.Chart) -> None:
    pod = one(render(loaded, _merge(BASE, {"workers": 1})), "Deployment")["spec"]["template"]
    assert "CITEWARDEN_WORKERS" not in env(gateway_container(pod["spec"]))


@pytest.mark.parametrize("values", [BASE, SIDECAR], ids=["standalone", "sidecar"])
def test_more_workers_are_refused_pointing_at_replicas(loaded: helm.Chart,
                                                       values: dict[str, object]) -> None:
    with pytest.raises(helm.HelmRenderError,
                       match=re.escape("workers was removed") + ".*replicaCount or autoscaling"):
        loaded.render(_merge(values, {"workers": 2}), name=RELEASE, namespace=NAMESPACE)


def test_schema_refuses_fewer_than_one_worker(loaded: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="workers"):
        loaded.render(_merge(BASE, {"workers": 0}), name=RELEASE, namespace=NAMESPACE)

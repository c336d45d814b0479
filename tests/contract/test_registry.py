"""Every registered adapter is an `Adapter` under its own name, and has contract samples."""

from __future__ import annotations

from gateway.protocols import ADAPTERS, Adapter
from tests.contract.helpers import Case
from tests.contract.samples import SAMPLES


def test_every_registered_adapter_has_samples() -> None:
    missing = sorted(set(ADAPTERS) - set(SAMPLES))
    assert not missing, f"registered without samples in tests/contract/samples.py: {missing}"
    assert not set(SAMPLES) - set(ADAPTERS), "samples for an adapter that is not registered"


def test_adapter_is_registered_under_its_name(case: Case) -> None:
    assert isinstance(case.adapter, Adapter)
    assert case.adapter.name == case.name
    assert case.sample.route.protocol == case.name

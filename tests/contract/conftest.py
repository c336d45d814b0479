"""The contract suite's one fixture: every registered adapter, with its protocol's samples.

uvicorn's `tests/conftest.py` is the model: one parametrised fixture over the registry, so a
newly registered adapter runs through every contract test (and fails them until it has samples).
"""

from __future__ import annotations

import pytest

from gateway.protocols import ADAPTERS
from tests.contract.helpers import Case
from tests.contract.samples import SAMPLES


@pytest.fixture(params=list(ADAPTERS), ids=str)
def case(request: pytest.FixtureRequest) -> Case:
    name: str = request.param
    sample = SAMPLES.get(name)
    if sample is None:
        pytest.fail(f"adapter {name!r} is registered without samples in tests/contract/samples.py")
    return Case(name, ADAPTERS[name], sample)

"""Hypothesis profiles. `ci` (the default) has no deadline, so a shared, loaded machine never
turns a slow example into a failure, and is derandomized, so a run is reproducible; each fuzz
test bounds its own examples. `HYPOTHESIS_PROFILE=fuzz` runs many more examples with random
seeds, for a long local hunt. And `audit_log`: the gateway's log lines, read by
`tests.edge_harness.audits`."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from gateway.audit import configure_logging, reset_logging

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    deadline=None,
    max_examples=5000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def fuzz_examples(default: int) -> int:
    """A fuzz test's example count: `default` under `ci`, the profile's under `fuzz`."""
    return default if os.environ.get("HYPOTHESIS_PROFILE", "ci") == "ci" else 5000


@pytest.fixture
def audit_log() -> Iterator[io.StringIO]:
    """The gateway's log (audit events included) for this test, in memory."""
    buf = io.StringIO()
    configure_logging(stream=buf)
    yield buf
    reset_logging()

"""The judge pass (DESIGN §10) under the matrix: a claim that cites a real chunk, passes every
lexical check (ids, version, numbers) and is refused by the judge must not reach the client in
any byte of the raw response, in every protocol and streaming mode, progressive streams
included (claims there wait for their verdicts). The supported claim beside it still goes out,
and a judge that says yes releases the whole answer: the control that the refusal, not a
broken route, kept the marker out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.attacks.conftest import run_case
from tests.attacks.harness import (
    MARKER,
    POLICIES,
    GatewayProcess,
    assert_no_leak,
    running_gateway,
)
from tests.attacks.protocols import GOOD, REGISTRY, Mode, ProtocolSpec
from tests.judge_server import JudgeScript, run_judge
from tests.upstream_app import FakeUpstream

# The scripted judge answers NO to a claim holding "unsupported" (tests/judge_server.py).
REFUSED = f"The Orbit pump is unsupported by {MARKER} and moves 40 litres per minute [kb:1]."


def _judged(policy: Path, judge: str, out: Path) -> Path:
    """`policy` with the `unsupported` check added and every claim left to the judge."""
    doc: dict[str, Any] = yaml.safe_load(policy.read_text())
    doc["name"] += "-judged"
    doc["checks"] = [*doc["checks"], "unsupported"]
    doc["support"] = {
        "lexical": {"pass_above": 1.0, "fail_below": 0.0},
        "judge": {
            "url": f"{judge}/v1",
            "model": "judge-model",
            "timeout": "2s",
            "deadline": "4s",
            "retries": 0,
            "cache": {"entries": 0},
        },
    }
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def judged(
    upstream: tuple[str, FakeUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("judged")
    with run_judge(JudgeScript()) as judge:
        policies = [
            _judged(POLICIES / "progressive.yaml", judge, tmp / "progressive.yaml"),
            _judged(POLICIES / "base.yaml", judge, tmp / "base.yaml"),
        ]
        with running_gateway(upstream[0], policies, tmp / "gateway.log") as gw:
            yield gw


CASES = [
    pytest.param(spec, mode, id=f"{spec.name}-{mode}")
    for spec in REGISTRY.values()
    for mode in spec.modes
]


@pytest.mark.parametrize(("spec", "mode"), CASES)
def test_a_claim_the_judge_refuses_reaches_no_byte_of_the_response(
    judged: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: ProtocolSpec, mode: Mode
) -> None:
    behaviour = spec.good(f"{GOOD} {REFUSED}").behaviour(mode)
    assert behaviour is not None
    resp = run_case(judged, upstream, spec, mode, behaviour)
    assert_no_leak(resp)
    assert resp.status == 200, resp.raw[:1000]
    assert spec.answer_text(resp).startswith(GOOD)


@pytest.mark.parametrize(("spec", "mode"), CASES)
def test_claims_the_judge_supports_are_released(
    judged: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: ProtocolSpec, mode: Mode
) -> None:
    supported = REFUSED.replace("unsupported by", "designed by")
    behaviour = spec.good(f"{GOOD} {supported}").behaviour(mode)
    assert behaviour is not None
    resp = run_case(judged, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:1000]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.headers
    assert spec.answer_text(resp) == f"{GOOD} {supported}"

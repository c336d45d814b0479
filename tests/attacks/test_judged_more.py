"""The judge pass (DESIGN §10) against a judge whose answer writes a JSON key twice, its first
value refusing a claim and its last passing it: in the verdict text (a label, the verdicts list,
a verdict's id), in the chat completion around it (the message content), or in a TEI score list
(the label twice in two cases, a score key twice). Which value the judge meant is ambiguous, so
the claim is an infrastructure error (DESIGN §2, §10) and its marker reaches no byte of the
response, under `strip` and `block`, buffered and progressive. Controls: the same judge
answering each key once still refuses the claim (stripped or blocked) and passes a supported one.
"""

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
    RawResponse,
    assert_no_leak,
    running_gateway,
)
from tests.attacks.protocols import GOOD, REGISTRY, Mode, ProtocolSpec
from tests.judge_server import JudgeScript, run_judge
from tests.upstream_app import FakeUpstream

# The scripted judge refuses a claim holding "unsupported" (NO, or an entailment score of 0.1).
REFUSED = f"The Orbit pump is unsupported by {MARKER} and moves 40 litres per minute [kb:1]."
SUPPORTED = REFUSED.replace("unsupported by", "designed by")

BACKENDS = ("chat", "tei")
RELEASES = ("strip", "block")
# Which of this module's policies a request takes: f"{backend}-{release}".
SELECT = "x-judge-variant"


def _variant(policy: Path, judge: str, backend: str, release: str, out: Path) -> Path:
    """`policy` with every claim left to the judge `backend`, releasing by `release`, and its
    routes taken only by requests naming this variant."""
    doc: dict[str, Any] = yaml.safe_load(policy.read_text())
    variant = f"{backend}-{release}"
    doc["name"] += f"-judged-{variant}"
    for route in doc["routes"]:
        route["name"] += f"-{variant}"
        route["match"].setdefault("header", {})[SELECT] = variant
    doc["checks"] = [*doc["checks"], "unsupported"]
    if release == "block":
        doc["release"] = {"on_unverified": "block", "on_infrastructure_failure": "block"}
    judge_spec: dict[str, Any] = {
        "url": f"{judge}/v1",
        "model": "judge-model",
        "timeout": "2s",
        "deadline": "4s",
        "retries": 0,
        "cache": {"entries": 0},
    }
    if backend == "tei":
        judge_spec.update({"backend": "tei", "url": judge, "model": ""})
    doc["support"] = {"lexical": {"pass_above": 1.0, "fail_below": 0.0}, "judge": judge_spec}
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@pytest.fixture(scope="module")
def script() -> JudgeScript:
    return JudgeScript()


@pytest.fixture(scope="module")
def judged(
    upstream: tuple[str, FakeUpstream],
    tmp_path_factory: pytest.TempPathFactory,
    script: JudgeScript,
) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("judged_more")
    with run_judge(script) as judge:
        policies = [
            _variant(POLICIES / base, judge, backend, release, tmp / f"{backend}-{release}-{base}")
            for base in ("progressive.yaml", "base.yaml")  # progressive routes first, as usual
            for backend in BACKENDS
            for release in RELEASES
        ]
        with running_gateway(upstream[0], policies, tmp / "gateway.log") as gw:
            yield gw


PROTOCOLS = ("openai-chat", "anthropic-messages")
CASES = [
    pytest.param(REGISTRY[name], mode, release, id=f"{name}-{mode}-{release}")
    for name in PROTOCOLS
    for mode in REGISTRY[name].modes
    for release in RELEASES
]


def _ask(
    gw: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    variant: str,
    text: str,
) -> RawResponse:
    behaviour = spec.good(text).behaviour(mode)
    assert behaviour is not None
    return run_case(gw, upstream, spec, mode, behaviour, headers=[(SELECT, variant)])


def _refused(
    resp: RawResponse, spec: ProtocolSpec, mode: Mode, release: str, errored: bool
) -> None:
    """The refused claim reached no byte; buffered, the decision says why."""
    assert_no_leak(resp)
    if mode == "progressive":
        return  # the decision header went out before the verdicts; the bytes are what count
    if errored:  # an infrastructure error: abstain under strip, block under block
        expected = "abstained" if release == "strip" else "blocked"
    else:
        expected = "partial" if release == "strip" else "blocked"
    assert resp.header("x-citewarden-decision") == expected, resp.raw[:1000]
    if expected == "partial":
        assert spec.answer_text(resp).startswith(GOOD)


CHAT_DUPLICATES = ["dup_label", "dup_verdicts", "dup_id", "dup_key"]
TEI_DUPLICATES = ["dup_label", "dup_key"]


@pytest.mark.parametrize("step", CHAT_DUPLICATES)
@pytest.mark.parametrize(("spec", "mode", "release"), CASES)
def test_a_chat_judge_writing_a_key_twice_never_releases_the_claim_it_refused(
    judged: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    script: JudgeScript,
    spec: ProtocolSpec,
    mode: Mode,
    release: str,
    step: str,
) -> None:
    script.then = step
    try:
        resp = _ask(judged, upstream, spec, mode, f"chat-{release}", f"{GOOD} {REFUSED}")
    finally:
        script.then = "ok"
    _refused(resp, spec, mode, release, errored=True)


@pytest.mark.parametrize("step", TEI_DUPLICATES)
@pytest.mark.parametrize(("spec", "mode", "release"), CASES)
def test_a_tei_judge_scoring_the_label_twice_never_releases_the_claim_it_refused(
    judged: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    script: JudgeScript,
    spec: ProtocolSpec,
    mode: Mode,
    release: str,
    step: str,
) -> None:
    script.then = step
    try:
        resp = _ask(judged, upstream, spec, mode, f"tei-{release}", f"{GOOD} {REFUSED}")
    finally:
        script.then = "ok"
    _refused(resp, spec, mode, release, errored=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("spec", "mode", "release"), CASES)
def test_control_a_clean_refusal_fails_the_claim_and_a_clean_yes_releases_it(
    judged: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    script: JudgeScript,
    spec: ProtocolSpec,
    mode: Mode,
    release: str,
    backend: str,
) -> None:
    script.then = "ok"
    variant = f"{backend}-{release}"
    resp = _ask(judged, upstream, spec, mode, variant, f"{GOOD} {REFUSED}")
    _refused(resp, spec, mode, release, errored=False)
    resp = _ask(judged, upstream, spec, mode, variant, f"{GOOD} {SUPPORTED}")
    assert resp.status == 200, resp.raw[:1000]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.headers
    assert spec.answer_text(resp) == f"{GOOD} {SUPPORTED}"

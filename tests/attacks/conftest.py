"""One scripted upstream and one gateway subprocess per session for the whole matrix.

`gateway` loads policies/progressive.yaml then policies/base.yaml (contract defaults, buffered
streams, `strip`); `hardened` loads policies/hardened.yaml (signed chunks only, untrusted
document blocks, `claims.code: check`), the documented configuration for deployments where end
users reach the gateway directly.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from tests.attacks.harness import POLICIES, GatewayProcess, RawResponse, running_gateway
from tests.attacks.protocols import QUESTION, Mode, ProtocolSpec
from tests.upstream_app import (
    SCENARIO_HEADER,
    Behaviour,
    FakeUpstream,
    Stream,
    create_upstream,
    serve,
)

SIGNING_KEY = b"attacks-signing-key-0123456789"
SIGNING_ENV = "ATTACKS_CONTEXT_KEY"

_cases = itertools.count()


@pytest.fixture(scope="session")
def upstream() -> Iterator[tuple[str, FakeUpstream]]:
    up = create_upstream()
    with serve(up) as url:
        yield url, up


@pytest.fixture(scope="session")
def gateway(
    upstream: tuple[str, FakeUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    policies = [POLICIES / "progressive.yaml", POLICIES / "base.yaml"]
    with running_gateway(upstream[0], policies, log) as gw:
        yield gw


@pytest.fixture(scope="session")
def hardened(
    upstream: tuple[str, FakeUpstream], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("hardened") / "gateway.log"
    env = {SIGNING_ENV: SIGNING_KEY.decode()}
    with running_gateway(upstream[0], [POLICIES / "hardened.yaml"], log, env=env) as gw:
        yield gw


def run_case(
    gw: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    behaviour: Behaviour,
    *,
    request: dict[str, Any] | None = None,
    path: str | None = None,
    headers: Sequence[tuple[str, str]] = (),
) -> RawResponse:
    """Play `behaviour` as the upstream's answer to one client request through `gw`; checks that
    the upstream really was asked (so a refused request cannot pass a leak test vacuously)."""
    _, up = upstream
    key = f"attack-{next(_cases)}"
    if isinstance(behaviour, Stream) and spec.stream_content_type is not None:
        behaviour = dataclasses.replace(behaviour, content_type=spec.stream_content_type)
    up.on(key, behaviour)
    req = request if request is not None else spec.request(QUESTION, mode != "json")
    hdrs = [(SCENARIO_HEADER, key), *headers]
    if mode == "progressive":
        hdrs.append(("x-attack-mode", "progressive"))
    if path is None and mode != "json" and spec.stream_path is not None:
        path = spec.stream_path  # gemini: the path, not the body, asks for a stream
    resp = gw.post_json(path or spec.path, req, hdrs)
    asked = [r for r in up.requests if r.header(SCENARIO_HEADER) == key]
    assert asked, f"the upstream was never asked: {resp.status_line} {resp.body[:500]!r}"
    return resp


# -- answer texts in every protocol and mode ---------------------------------------------------


def text_cases(texts: dict[str, str]) -> list[Any]:
    """(spec, mode, name) of every protocol, every mode it has, and every text of `texts`."""
    from tests.attacks.protocols import REGISTRY

    return [
        pytest.param(spec, mode, name, id=f"{spec.name}-{mode}-{name}")
        for spec in REGISTRY.values()
        for mode in spec.mode_free
        for name in texts
    ]


def assert_text_checked(
    gw: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: ProtocolSpec, mode: Mode,
    text: str,
) -> None:
    """The answer `text` (its marker in a claim that must fail) leaks nothing, and no 500."""
    from tests.attacks.harness import assert_no_leak

    behaviour = spec.good(text).behaviour(mode)
    assert behaviour is not None
    resp = run_case(gw, upstream, spec, mode, behaviour)
    assert resp.status != 500, resp.raw[:1000]
    assert_no_leak(resp)


def assert_text_released(
    gw: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: ProtocolSpec, mode: Mode,
    text: str,
) -> None:
    """The correct answer `text` goes out whole."""
    behaviour = spec.good(text).behaviour(mode)
    assert behaviour is not None
    resp = run_case(gw, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:1000]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.headers
    assert spec.answer_text(resp) == text

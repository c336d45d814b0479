"""The judge pass connects as the upstream client does: the proxy and TLS settings of
DESIGN §11 that `serve` builds once reach the judge's connections too."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.judge import client
from gateway.upstream import Limits, Timeouts
from gateway.upstream_tls import UpstreamNetwork

JUDGE = "https://judge.example/v1"


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    client.use_network(None)


def test_judge_connections_take_the_configured_proxy() -> None:
    client.use_network(UpstreamNetwork.from_env({"HTTPS_PROXY": "http://proxy.corp:3128"}))
    up = client._default_upstream(JUDGE, Timeouts(), Limits())
    assert str(up.proxy) == "http://proxy.corp:3128"


def test_no_proxy_still_applies_to_the_judge() -> None:
    env = {"HTTPS_PROXY": "http://proxy.corp:3128", "NO_PROXY": "judge.example"}
    client.use_network(UpstreamNetwork.from_env(env))
    assert client._default_upstream(JUDGE, Timeouts(), Limits()).proxy is None


def test_without_settings_the_judge_connects_directly() -> None:
    assert client._default_upstream(JUDGE, Timeouts(), Limits()).proxy is None

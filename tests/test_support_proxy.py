"""The lexical support tier through a real gateway (the `openai` SDK as client, a real upstream
on loopback): markup a markdown client does not show cannot lend a sentence the cited chunk's
words. The hidden words raise the sentence's score as written above the threshold; as shown it
stays below, and the lower score counts."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway_harness import Gateway, run_gateway
from tests.upstream_app import (
    SCENARIO_HEADER,
    Json,
    Stream,
    create_upstream,
    openai_body,
    openai_sse,
    serve,
)

CONTEXT = '<chunk id="rx:1">The Hadley reactor near Oslo was commissioned in 1971.</chunk>'
MARKER = "ZEBRAFISH"
# As shown: {zebrafish, built, hadley, reactor, secret}, 2 of 5 in the chunk (0.4).
# As written, the hidden words add {near, oslo, commissioned}: 5 of 8 (0.625).
HIDDEN = {
    "comment": f"{MARKER} built the Hadley reactor in secret "
    "<!-- near Oslo, commissioned --> [rx:1].",
    "link": f"{MARKER} built the Hadley [reactor](https://x.example/near-oslo-commissioned) "
    "in secret [rx:1].",
    "tag": f'{MARKER} built the <span title="near Oslo, commissioned">Hadley reactor</span> '
    "in secret [rx:1].",
}
SUPPORTED = "The Hadley reactor is near Oslo [rx:1]."

POLICY = """\
name: lexical
routes:
  - {name: chat, match: {path: /v1/chat/completions}, protocol: openai-chat}
citations: {format: doc-chunk}
checks: [missing_citation, malformed_citation, hallucinated_citation, number_mismatch, unsupported]
support: {threshold: 0.5}
release: {on_unverified: block}
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    up = create_upstream()
    for key, text in [*HIDDEN.items(), ("supported", SUPPORTED)]:
        up.on(key, Json(openai_body(text)))
        up.on(f"{key}-sse", Stream(openai_sse(text, chunk_size=4), seed=5))
    policy = tmp_path_factory.mktemp("lexical") / "policy.yaml"
    policy.write_text(POLICY)
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        yield gw


def _post(gw: Gateway, key: str, stream: bool) -> httpx.Response:
    body = {
        "model": "m",
        "stream": stream,
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": "?"}],
    }
    scenario = f"{key}-sse" if stream else key
    return httpx.post(
        f"{gw.url}/v1/chat/completions", json=body, headers={SCENARIO_HEADER: scenario}
    )


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("key", sorted(HIDDEN))
def test_hidden_words_lend_no_support(gateway: Gateway, key: str, stream: bool) -> None:
    r = _post(gateway, key, stream)
    raw = "".join(f"{k}: {v}\n" for k, v in r.headers.items()).encode() + r.content
    assert r.status_code == 422, r.text
    assert r.json()["citewarden"]["reason"] == "unsupported"
    assert MARKER.encode() not in raw


def test_a_supported_sentence_is_released(gateway: Gateway) -> None:
    with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="k", max_retries=0) as client:
        r = client.chat.completions.create(
            model="m",
            messages=[
                {"role": "system", "content": CONTEXT},
                {"role": "user", "content": "Where is it?"},
            ],
            extra_headers={SCENARIO_HEADER: "supported"},
        )
    assert r.choices[0].message.content == SUPPORTED

"""Claims that used to escape checking, through a real gateway, with the `openai` SDK as client.

A real upstream on loopback scripts each answer (its SSE split at random byte boundaries); the
policy files are real YAML. Each case is one DESIGN §4 rule: an abstention prefix does not
exempt a claim, headings beyond a title and (with `claims.code: check`) fenced code are claims,
numbers are compared by value in every written form, and list labels are no numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.upstream_app import (
    SCENARIO_HEADER,
    FakeUpstream,
    Json,
    Stream,
    create_upstream,
    openai_body,
    openai_sse,
    serve,
)

CHUNK = (
    "The base has 41 reactors and stores 12,000 litres of water. "
    "Choose the 5 kW mode for the night shift."
)
CONTEXT = f'<chunk id="base:1">{CHUNK}</chunk>'

# key -> (answer text, decision, reason when blocked)
CASES: dict[str, tuple[str, str, str | None]] = {
    # An abstention in front of a claim is no exemption.
    "abstain-prefix": (
        "I don't know, but the base has 42 reactors.", "blocked", "missing_citation",
    ),
    "abstain-whole": ("I don't know.", "released", None),
    # A number written as words is a number.
    "words-wrong": ("The base has forty-two reactors [base:1].", "blocked", "number_mismatch"),
    "words-right": ("The base has forty-one reactors [base:1].", "released", None),
    # Scientific notation is read by value, on both sides.
    "sci-right": ("The base stores 1.2×10^4 litres of water [base:1].", "released", None),
    "sci-wrong": ("The base stores 1.2e5 litres of water [base:1].", "blocked", "number_mismatch"),
    # A heading with a digit (or too many words) is a claim; a title is not.
    "heading-claim": (
        "## The base has 42 reactors\n\nThe base has 41 reactors [base:1].",
        "blocked",
        "missing_citation",
    ),
    "heading-title": ("## Reactors\n\nThe base has 41 reactors [base:1].", "released", None),
    # List numbering is not a number of the claim; a bare "[1]" is no number either.
    "steps-numbered": (
        "Steps:\n1. Choose the 5 kW mode [base:1].\n2) Choose the 5 kW mode [base:1].",
        "blocked",  # "Steps:" has no citation
        "missing_citation",
    ),
    "labels-only": (
        "1. Choose the 5 kW mode [base:1].\n(b) Choose the 5 kW mode, see [2] [base:1].",
        "released",
        None,
    ),
    # Fenced code: exempt by default, a claim with `claims.code: check`.
    "fence": (
        "The base has 41 reactors [base:1].\n```\nThe base has 42 reactors.\n```",
        "released",  # for the default policy; blocked under claims.code: check
        None,
    ),
}


def _upstream() -> FakeUpstream:
    up = create_upstream()
    for key, (text, _, _) in CASES.items():
        up.on(f"json-{key}", Json(openai_body(text)))
        up.on(f"sse-{key}", Stream(openai_sse(text, chunk_size=3), seed=len(key)))
    rag = {
        "claims": [
            {"text": "1. Choose the 5 kW mode.", "citations": ["base:1"]},
            {"text": "(ii) The base has 41 reactors.", "citations": ["base:1"]},
        ],
        "sources": [{"id": "base:1", "text": CHUNK}],
    }
    up.on("rag-numbered", Json(rag))
    wrong = json.loads(json.dumps(rag))
    wrong["claims"][1]["text"] = "(ii) The base has forty-two reactors."
    up.on("rag-words", Json(wrong))
    return up


def _policy(directory: Path, *, streaming: str = "buffer", code: str | None = None) -> Path:
    path = write_policy(directory, streaming=streaming)
    text = path.read_text()
    text = text.replace(
        "rag: {answer: /answer, context: /sources}",
        "rag: {answer: /answer, claims: /claims, context: /sources}",
    )
    if code is not None:
        text += f"claims: {{code: {code}}}\n"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Gateway]]:
    up = _upstream()
    with (
        serve(up) as url,
        run_gateway(url, [_policy(tmp_path_factory.mktemp("b"))]) as buffer,
        run_gateway(url, [_policy(tmp_path_factory.mktemp("p"), streaming="progressive")]) as prog,
        run_gateway(url, [_policy(tmp_path_factory.mktemp("c"), code="check")]) as check,
    ):
        yield {"buffer": buffer, "progressive": prog, "check": check}


def _client(gw: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)


def _messages(key: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}]


@pytest.mark.parametrize("key", sorted(CASES))
def test_json_answers(gateways: dict[str, Gateway], key: str) -> None:
    text, decision, reason = CASES[key]
    with _client(gateways["buffer"]) as client:
        if decision == "released":
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=_messages(f"json-{key}")  # type: ignore[arg-type]
            )
            assert raw.headers["x-citewarden-decision"] == "released"
            assert raw.parse().choices[0].message.content == text
            return
        with pytest.raises(openai.UnprocessableEntityError) as err:
            client.chat.completions.create(model="m", messages=_messages(f"json-{key}"))  # type: ignore[arg-type]
    assert err.value.response.json()["citewarden"]["reason"] == reason
    for leaked in ("42 reactors", "forty-two", "1.2e5"):
        assert leaked not in err.value.response.text


@pytest.mark.parametrize("key", sorted(CASES))
@pytest.mark.parametrize("mode", ["buffer", "progressive"])
def test_streamed_answers(gateways: dict[str, Gateway], key: str, mode: str) -> None:
    text, decision, reason = CASES[key]
    with _client(gateways[mode]) as client:
        if decision == "blocked" and mode == "buffer":
            with pytest.raises(openai.UnprocessableEntityError) as err:
                client.chat.completions.create(
                    model="m", messages=_messages(f"sse-{key}"), stream=True  # type: ignore[arg-type]
                )
            assert err.value.response.json()["citewarden"]["reason"] == reason
            return
        got = ""
        failed = False
        try:
            stream = client.chat.completions.create(
                model="m", messages=_messages(f"sse-{key}"), stream=True  # type: ignore[arg-type]
            )
            for chunk in stream:
                for choice in chunk.choices:
                    got += choice.delta.content or ""
        except openai.APIError:  # a progressive block ends the stream with an error event
            failed = True
    if decision == "released":
        assert (got, failed) == (text, False)
    else:
        assert failed
        assert "42 reactors" not in got and "forty-two" not in got


def test_code_fences_are_claims_with_code_check(gateways: dict[str, Gateway]) -> None:
    with _client(gateways["check"]) as client:
        with pytest.raises(openai.UnprocessableEntityError) as err:
            client.chat.completions.create(model="m", messages=_messages("json-fence"))  # type: ignore[arg-type]
        assert err.value.response.json()["citewarden"]["reason"] == "missing_citation"
        with pytest.raises(openai.UnprocessableEntityError):
            client.chat.completions.create(
                model="m", messages=_messages("sse-fence"), stream=True  # type: ignore[arg-type]
            )


def test_structured_claims_lose_their_labels(gateways: dict[str, Gateway]) -> None:
    url = gateways["buffer"].url + "/rag/ask"
    ok = httpx.post(url, json={"q": "mode?"}, headers={SCENARIO_HEADER: "rag-numbered"})
    assert ok.status_code == 200, ok.text
    assert ok.headers["x-citewarden-decision"] == "released"
    bad = httpx.post(url, json={"q": "mode?"}, headers={SCENARIO_HEADER: "rag-words"})
    assert bad.status_code == 422
    assert bad.json()["citewarden"]["reason"] == "number_mismatch"

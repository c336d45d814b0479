"""gemini through the real gateway: the real `google-genai` SDK (`models.generate_content`,
`models.generate_content_stream`) against a scripted upstream on loopback whose streams arrive
cut at random byte boundaries. Every decision, the field table, grounding supports re-indexed
in non-ASCII text, thoughts and function calls, retry, and the API key kept out of the logs.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from gateway.audit import configure_logging, reset_logging
from tests.gateway_harness import Gateway, run_gateway
from tests.upstream_app import (
    SCENARIO_HEADER,
    FakeUpstream,
    Json,
    Stream,
    create_upstream,
    serve,
)

FIXTURES = Path(__file__).parent / "fixtures" / "gemini"
SECRET = "AIzaSECRET-9f3c"
MODEL = "gemini-2.5-flash"
PLANTED = "PLANTED"
TITLE = "TITLE-MARKER"
DISCLOSURE = "parts of this answer were removed"
ABSTAIN = "I can't provide a verified answer"

POLICY = """\
name: {name}
routes:
  - name: {name}-gen
    match: {{path_glob: "/v1beta/models/*:generateContent"{header}}}
    protocol: gemini
  - name: {name}-stream
    match: {{path_glob: "/v1beta/models/*:streamGenerateContent"{header}}}
    protocol: gemini
citations: {{format: doc-chunk}}
context: {{from: [request, response, header]}}
checks: [missing_citation, malformed_citation, hallucinated_citation, stale_source,
         quote_mismatch, number_mismatch]
channels: {{tool_calls: verify, reasoning: withhold}}
release: {{on_unverified: {on_unverified}, retry: {retry}}}
streaming: {{mode: {streaming}}}
"""

# (file name, x-policy header value or None, on_unverified, streaming, retry); first match wins.
POLICIES = [
    ("strip", "strip", "strip", "buffer", 0),
    ("abstain", "abstain", "abstain", "buffer", 0),
    ("review", "review", "review", "buffer", 0),
    ("prog", "prog", "strip", "progressive", 0),
    ("progblock", "progblock", "block", "progressive", 0),
    ("retry", "retry", "block", "buffer", 1),
    ("block", None, "block", "buffer", 0),
]


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


REQUEST = fixture("request.json")
SYSTEM = REQUEST["systemInstruction"]["parts"][0]["text"]
BODIES = {
    name: fixture(f"{name}.json")
    for name in (
        "good", "hallucinated", "grounded", "grounded_partial", "segment_mismatch",
        "thought_tool", "two_candidates", "unknown_field",
    )
}


def frames(body: dict[str, Any], size: int = 7) -> bytes:
    """A body as a stream: its answer text in pieces of `size` characters, grounding chunks in
    the first chunk, supports re-sent accumulated, finish reason and usage in the last."""
    out: list[dict[str, Any]] = []
    head = {k: body[k] for k in ("modelVersion", "responseId")}
    for cand in body["candidates"]:
        index = cand["index"]
        gm = cand.get("groundingMetadata")
        first = True
        for part in cand["content"]["parts"]:
            text = part.get("text")
            pieces = [text[i : i + size] for i in range(0, len(text), size)] if text else [None]
            for piece in pieces:
                p = dict(part) if piece is None else {**part, "text": piece}
                c: dict[str, Any] = {"content": {"role": "model", "parts": [p]}, "index": index}
                if gm is not None and first:
                    c["groundingMetadata"] = {"groundingChunks": gm["groundingChunks"]}
                first = False
                out.append({"candidates": [c], **head})
        last: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": ""}]},
                                "index": index, "finishReason": cand["finishReason"]}
        if gm is not None:
            last["groundingMetadata"] = gm
        out.append({"candidates": [last], **head})
    out[-1]["usageMetadata"] = body["usageMetadata"]
    return b"".join(
        b"data: " + json.dumps(c, ensure_ascii=False).encode() + b"\r\n\r\n" for c in out
    )


@dataclass
class Sequenced:
    """Plays its behaviours in turn, one per request (the last one repeats)."""

    steps: list[Any]
    calls: list[int] = field(default_factory=lambda: [0])

    async def respond(self, scope: Any, receive: Any, send: Any) -> None:
        i = min(self.calls[0], len(self.steps) - 1)
        self.calls[0] += 1
        await self.steps[i].respond(scope, receive, send)


def _upstream() -> FakeUpstream:
    up = create_upstream()
    for key, body in BODIES.items():
        up.on(key, Json(body))
        up.on(f"{key}-sse", Stream(frames(body), seed=len(key), max_piece=37))
    lf = frames(BODIES["good"]).replace(b"\r\n", b"\n")
    up.on("good-lf-sse", Stream(lf, seed=3, max_piece=29))
    up.on("good-comment-sse", Stream(b": keep-alive\n\n" + lf, seed=4, max_piece=29))
    up.on("truncated-sse", Stream((FIXTURES / "truncated.sse").read_bytes(), max_piece=20))
    up.on("error-sse", Stream((FIXTURES / "error_midstream.sse").read_bytes(), max_piece=20))
    up.on("bad-request", Json({"error": {"code": 400, "message": "API key not valid.",
                                         "status": "INVALID_ARGUMENT",
                                         "details": [{"reason": PLANTED}]}}, status=400))
    up.on("retry", Sequenced([Json(BODIES["hallucinated"]), Json(BODIES["good"])]))
    return up


@dataclass
class Env:
    gw: Gateway
    up: FakeUpstream
    log: io.StringIO
    client: genai.Client


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    directory = tmp_path_factory.mktemp("gemini")
    paths: list[Path] = []
    for name, header, on_unverified, streaming, retry in POLICIES:
        path = directory / f"{name}.yaml"
        path.write_text(
            POLICY.format(
                name=name,
                header=f", header: {{x-policy: {header}}}" if header else "",
                on_unverified=on_unverified,
                streaming=streaming,
                retry=retry,
            )
        )
        paths.append(path)
    buf = io.StringIO()
    configure_logging(stream=buf)
    up = _upstream()
    try:
        with contextlib.ExitStack() as stack:
            up_url = stack.enter_context(serve(up))
            gw = stack.enter_context(run_gateway(up_url, paths))
            client = genai.Client(
                api_key=SECRET,
                http_options=types.HttpOptions(base_url=gw.url, api_version="v1beta"),
            )
            stack.callback(client.close)
            yield Env(gw, up, buf, client)
    finally:
        reset_logging()


def _config(scenario: str, policy: str | None = None) -> types.GenerateContentConfig:
    headers = {SCENARIO_HEADER: scenario}
    if policy:
        headers["x-policy"] = policy
    return types.GenerateContentConfig(
        system_instruction=SYSTEM,
        http_options=types.HttpOptions(api_version="v1beta", headers=headers),
    )


def generate(env: Env, scenario: str, policy: str | None = None) -> types.GenerateContentResponse:
    return env.client.models.generate_content(
        model=MODEL, contents="Tell me about the K7.", config=_config(scenario, policy)
    )


def stream(env: Env, scenario: str, policy: str | None = None) -> list[Any]:
    return list(
        env.client.models.generate_content_stream(
            model=MODEL, contents="Tell me about the K7.", config=_config(scenario, policy)
        )
    )


def raw(env: Env, scenario: str, policy: str | None = None, *, streamed: bool = False,
        body: dict[str, Any] | None = None) -> httpx.Response:
    verb = "streamGenerateContent?alt=sse&" if streamed else "generateContent?"
    headers = {SCENARIO_HEADER: scenario, "x-goog-api-key": SECRET}
    if policy:
        headers["x-policy"] = policy
    return httpx.post(
        f"{env.gw.url}/v1beta/models/{MODEL}:{verb}key={SECRET}",
        json=body or REQUEST,
        headers=headers,
        timeout=10.0,
    )


def streamed_text(chunks: Sequence[Any]) -> str:
    return "".join(c.text or "" for c in chunks)


def check_supports(text: str, supports: Sequence[Any]) -> list[str]:
    """Every segment's byte offsets slice the answer text to its `text`; the slices."""
    data = text.encode()
    out = []
    for s in supports:
        seg = s.segment
        sliced = data[seg.start_index or 0 : seg.end_index].decode()
        assert sliced == seg.text
        out.append(sliced)
    return out


# -- released --------------------------------------------------------------------------------


def test_released_json_is_the_upstream_bytes(env: Env) -> None:
    r = raw(env, "good")
    assert r.status_code == 200
    assert r.headers["x-citewarden-decision"] == "released"
    assert r.content == json.dumps(BODIES["good"]).encode()
    resp = generate(env, "good")
    assert resp.text == BODIES["good"]["candidates"][0]["content"]["parts"][0]["text"]
    assert resp.usage_metadata is not None and resp.usage_metadata.total_token_count == 60


def test_released_grounded_answer_keeps_valid_byte_offsets_and_drops_titles(env: Env) -> None:
    r = raw(env, "grounded")
    assert r.headers["x-citewarden-decision"] == "released"
    assert TITLE not in r.text and "K7 home" not in r.text
    assert "k7 capacity" not in r.text  # webSearchQueries: withheld
    assert "per K7 unit" not in r.text  # the retrieved text: context, not relayed
    resp = generate(env, "grounded")
    gm = resp.candidates[0].grounding_metadata
    assert [c.retrieved_context.uri for c in gm.grounding_chunks[:2]] == [
        "gs://kb/k7-spec.pdf", "gs://kb/k7-warranty.pdf"]
    assert check_supports(resp.text, gm.grounding_supports) == [
        "Café ⚡ edition: the K7 stores 13.5 kWh.", "保証: its warranty lasts ten years 🔋."]


def test_released_stream_split_at_random_bytes(env: Env) -> None:
    chunks = stream(env, "grounded-sse")
    text = streamed_text(chunks)
    assert text == BODIES["grounded"]["candidates"][0]["content"]["parts"][0]["text"]
    gm = [c.candidates[0].grounding_metadata for c in chunks if c.candidates[0].grounding_metadata]
    assert gm and check_supports(text, gm[-1].grounding_supports)
    r = raw(env, "grounded-sse", streamed=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert TITLE not in r.text


def test_a_clean_lf_stream_is_relayed_as_the_upstream_bytes(env: Env) -> None:
    lf = frames(BODIES["good"]).replace(b"\r\n", b"\n")
    r = raw(env, "good-lf-sse", streamed=True)
    assert r.headers["x-citewarden-decision"] == "released"
    assert r.content == lf
    reframed = raw(env, "good-comment-sse", streamed=True)
    assert b"keep-alive" not in reframed.content
    text = "".join(
        part["text"]
        for line in reframed.text.splitlines() if line.startswith("data: ")
        for cand in json.loads(line[6:]).get("candidates", [])
        for part in cand["content"]["parts"]
    )
    assert text == BODIES["good"]["candidates"][0]["content"]["parts"][0]["text"]


def test_thoughts_are_withheld_signatures_and_function_calls_kept(env: Env) -> None:
    for resp in (generate(env, "thought_tool"), *stream(env, "thought_tool-sse")[-1:]):
        parts = resp.candidates[0].content.parts
        assert all(not (p.thought and p.text) for p in parts)
    resp = generate(env, "thought_tool")
    assert resp.function_calls[0].name == "lookup"
    assert resp.function_calls[0].args == {"model": "K7"}
    r = raw(env, "thought_tool")
    assert "call lookup" not in r.text and "c2lnbmF0dXJl" in r.text
    streamed = raw(env, "thought_tool-sse", streamed=True)
    assert "call lookup" not in streamed.text and '"lookup"' in streamed.text


def test_planted_fields_never_reach_the_client(env: Env) -> None:
    r = raw(env, "unknown_field")
    assert r.headers["x-citewarden-decision"] == "released"
    assert PLANTED not in r.text and "executableCode" not in r.text
    assert "k7:capacity" in r.text
    assert PLANTED not in raw(env, "unknown_field-sse", streamed=True).text


# -- partial, abstained, review --------------------------------------------------------------


def test_partial_reindexes_supports_json_and_stream(env: Env) -> None:
    for resp_text, supports in (
        (lambda r: (r.text, r.candidates[0].grounding_metadata.grounding_supports))(
            generate(env, "grounded_partial", "strip")),
        (lambda cs: (streamed_text(cs), [
            c for c in cs if c.candidates[0].grounding_metadata
        ][-1].candidates[0].grounding_metadata.grounding_supports))(
            stream(env, "grounded_partial-sse", "strip")),
    ):
        assert "Moon" not in resp_text and DISCLOSURE in resp_text
        assert check_supports(resp_text, supports) == [
            "Café ⚡ edition: the K7 stores 13.5 kWh.", "保証: its warranty lasts ten years 🔋."]
    assert raw(env, "grounded_partial", "strip").headers["x-citewarden-decision"] == "partial"


def test_partial_second_candidate(env: Env) -> None:
    resp = generate(env, "two_candidates", "strip")
    texts = [c.content.parts[0].text for c in resp.candidates]
    assert "Moon" not in texts[1] and DISCLOSURE in texts[1]
    assert texts[0] == BODIES["good"]["candidates"][0]["content"]["parts"][0]["text"]


@pytest.mark.parametrize(("policy", "decision"), [("abstain", "abstained"), ("review", "review")])
def test_abstained_and_review_are_normal_answers(env: Env, policy: str, decision: str) -> None:
    resp = generate(env, "hallucinated", policy)
    assert "Moon" not in resp.text
    if decision == "abstained":
        assert ABSTAIN in resp.text
    chunks = stream(env, "hallucinated-sse", policy)
    assert "Moon" not in streamed_text(chunks) and streamed_text(chunks) == resp.text
    assert raw(env, "hallucinated", policy).headers["x-citewarden-decision"] == decision


# -- blocked and errors ----------------------------------------------------------------------


@pytest.mark.parametrize("scenario", ["hallucinated", "segment_mismatch", "grounded_partial"])
def test_blocked_raises_the_sdk_error(env: Env, scenario: str) -> None:
    with pytest.raises(errors.ClientError) as caught:
        generate(env, scenario)
    assert caught.value.code == 422
    with pytest.raises(errors.ClientError):
        stream(env, f"{scenario}-sse")
    r = raw(env, scenario)
    body = r.json()
    assert r.status_code == 422 and "Moon" not in r.text
    assert set(body["error"]) == {"code", "message", "status"}
    assert body["error"]["code"] == 422
    assert body["citewarden"]["reason"] in ("hallucinated_citation", "malformed_citation")
    assert body["citewarden"]["claim_index"] in (0, 1)


def test_progressive_block_ends_with_an_error_chunk(env: Env) -> None:
    with pytest.raises(errors.APIError) as caught:
        stream(env, "hallucinated-sse", "progblock")
    assert caught.value.code == 422
    r = raw(env, "hallucinated-sse", "progblock", streamed=True)
    assert r.status_code == 200 and r.headers["x-citewarden-decision"] == "progressive"
    events = [line for line in r.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[-1][6:])["error"]["code"] == 422
    assert "Moon" not in r.text


def test_progressive_release_and_strip(env: Env) -> None:
    chunks = stream(env, "grounded-sse", "prog")
    assert streamed_text(chunks) == BODIES["grounded"]["candidates"][0]["content"]["parts"][0][
        "text"]
    text = streamed_text(stream(env, "grounded_partial-sse", "prog"))
    assert "Moon" not in text and DISCLOSURE in text


@pytest.mark.parametrize("scenario", ["truncated-sse", "error-sse"])
def test_broken_streams_fail_closed(env: Env, scenario: str) -> None:
    with pytest.raises(errors.ServerError) as caught:
        stream(env, scenario)
    assert caught.value.code == 502
    with pytest.raises(errors.APIError):
        stream(env, scenario, "progblock")


def test_upstream_4xx_envelope_is_relayed_rebuilt(env: Env) -> None:
    with pytest.raises(errors.ClientError) as caught:
        generate(env, "bad-request")
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    r = raw(env, "bad-request")
    assert PLANTED not in r.text and r.json()["error"]["message"] == "API key not valid."


# -- retry, context --------------------------------------------------------------------------


def test_retry_appends_the_grounding_instruction(env: Env) -> None:
    before = len(env.up.requests)
    resp = generate(env, "retry", "retry")
    assert "Moon" not in resp.text
    first, second = env.up.requests[before:]
    parts = json.loads(second.body)["systemInstruction"]["parts"]
    assert parts[0]["text"] == SYSTEM
    assert "could not be verified" in parts[-1]["text"]
    assert json.loads(first.body)["contents"] == json.loads(second.body)["contents"]


def test_chunk_tags_in_user_text_are_not_context(env: Env) -> None:
    body = {
        "contents": [{"role": "user", "parts": [{"text": SYSTEM}]}],
    }
    r = raw(env, "good", body=body)
    assert r.status_code == 422 and r.json()["citewarden"]["reason"] == "hallucinated_citation"


def test_function_response_chunks_are_context(env: Env) -> None:
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "Tell me about the K7."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "kb", "args": {}}}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "kb", "response": {"result": SYSTEM}}}]},
        ],
    }
    r = raw(env, "good", body=body)
    assert r.status_code == 200 and r.headers["x-citewarden-decision"] == "released"


# -- credentials -----------------------------------------------------------------------------


def test_the_api_key_passes_through_and_is_never_logged(env: Env) -> None:
    before = len(env.up.requests)
    generate(env, "good")
    with pytest.raises(errors.ClientError):
        generate(env, "hallucinated")
    raw(env, "good")
    raw(env, "grounded-sse", streamed=True)
    forwarded = env.up.requests[before:]
    assert all(r.header("x-goog-api-key") == SECRET for r in forwarded)
    assert SECRET in forwarded[-1].query and "alt=sse" in forwarded[-1].query
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and env.log.getvalue().count('"audit"') < 4:
        time.sleep(0.01)
    lines = env.log.getvalue().splitlines()
    assert any("key=REDACTED" in line for line in lines)
    assert not [line for line in lines if SECRET in line]

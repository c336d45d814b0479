"""OpenAI-compatible dialects through the real gateway, with the real `openai` SDK as client.

vLLM `reasoning` / `reasoning_content`, OpenRouter `reasoning_details[]`, Perplexity top-level
`citations[]` / `search_results[]` (context for `[N]` markers) and Mistral content chunks
(`text`, `reference`, `thinking`) — DESIGN §2, docs/protocols.md "OpenAI-compatible dialects".

A scripted upstream on loopback answers each request; the SDK talks to the gateway through an
httpx transport that records every byte it receives (status line aside: headers and body), so
a marker planted where nothing is verified (reasoning, search-result titles and snippets,
thinking chunks) is looked for in the raw response as well as in what the SDK parsed. Streams
are cut at random byte boundaries by the upstream.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway_harness import Gateway, run_gateway
from tests.upstream_app import SCENARIO_HEADER, FakeUpstream, Json, Stream, serve, sse_frame

MARKER = "ZEBRAQUARTZ"
PLANT = f"The reactor holds {MARKER} rods"

GOOD = "The Orbit pump moves 40 litres per minute [kb:1]."
BAD = "The Orbit pump was designed on Mars [kb:404]."
SYSTEM = (
    "Answer from the context.\n"
    '<chunk id="kb:1">The Orbit pump moves 40 litres per minute.</chunk>'
)
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "How fast?"}]

# Mistral: the references arrive as tool results (a trusted place), ids "0" and "1".
TOOL_CONTEXT = (
    '<chunk id="0">The Orbit pump moves 40 litres per minute.</chunk>\n'
    '<chunk id="1">The Orbit pump weighs 12 kilograms.</chunk>'
)
MISTRAL_CHAT: list[dict[str, Any]] = [
    {"role": "user", "content": "Tell me about the Orbit pump."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": TOOL_CONTEXT},
]

# Perplexity: no context in the request; the response's search results are the context.
PPLX_CHAT = [{"role": "user", "content": "How fast is the Orbit pump?"}]
SEARCH_RESULTS = [
    {
        "title": f"Orbit pump {MARKER} datasheet",
        "url": "https://pumps.example/orbit",
        "date": "2025-03-01",
        "last_updated": "2025-03-02",
        "snippet": "The Orbit pump moves 40 litres per minute.",
        "source": "web",
    },
    {
        "title": "Orbit pump weight",
        "url": "https://pumps.example/orbit-weight",
        "date": None,
        "snippet": "The Orbit pump weighs 12 kilograms.",
    },
]
CITATIONS = ["https://pumps.example/orbit", "https://pumps.example/orbit-weight"]

# -- policies: one file per variant, each on its own path prefix --------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    "buf": {},
    "strip": {"on_unverified": "strip"},
    "prog": {"streaming": "progressive", "on_unverified": "strip"},
    "progblock": {"streaming": "progressive"},
    "pass": {"reasoning": "pass"},
    "verify": {"reasoning": "verify"},
    "vstrip": {"reasoning": "verify", "on_unverified": "strip"},
    "allow": {"allow": ["reasoning_details", "thinking", "search_results.*.title"]},
    "num": {"fmt": "numeric"},
    "numallow": {"fmt": "numeric", "allow": ["search_results.*.title"]},
    "numstrip": {"fmt": "numeric", "on_unverified": "strip"},
    "numprog": {"fmt": "numeric", "streaming": "progressive", "on_unverified": "strip"},
    "numreq": {"fmt": "numeric", "sources": ["request", "header"]},
    "numresp": {"fmt": "numeric", "sources": ["response", "request", "header"]},
    "foot": {"fmt": "footnote"},
}


def _policy(directory: Path, variant: str, spec: dict[str, Any]) -> Path:
    path = directory / f"{variant}.yaml"
    allow = json.dumps(spec.get("allow", []))
    sources = json.dumps(spec.get("sources", ["request", "response", "header"]))
    path.write_text(
        f"name: d-{variant}\n"
        "routes:\n"
        f"  - name: r-{variant}\n"
        f"    match: {{path: /{variant}/v1/chat/completions}}\n"
        "    protocol: openai-chat\n"
        f"citations: {{format: {spec.get('fmt', 'doc-chunk')}}}\n"
        f"context: {{from: {sources}}}\n"
        f"channels: {{reasoning: {spec.get('reasoning', 'withhold')}, allow_fields: {allow}}}\n"
        f"release: {{on_unverified: {spec.get('on_unverified', 'block')}}}\n"
        f"streaming: {{mode: {spec.get('streaming', 'buffer')}}}\n"
    )
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, FakeUpstream]]:
    directory = tmp_path_factory.mktemp("dialects")
    policies = [_policy(directory, v, spec) for v, spec in VARIANTS.items()]
    upstream = FakeUpstream()
    with serve(upstream) as upstream_url, run_gateway(upstream_url, policies) as gw:
        yield gw, upstream


# -- the client ------------------------------------------------------------------------------


class _Tee(httpx.BaseTransport):
    """An httpx transport that records every header and body byte it hands the SDK."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.seen = bytearray()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = self.inner.handle_request(request)
        for k, v in resp.headers.raw:
            self.seen += k + b": " + v + b"\n"
        seen, inner = self.seen, resp.stream
        assert isinstance(inner, httpx.SyncByteStream)

        class Recording(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                for piece in inner:
                    seen.extend(piece)
                    yield piece

            def close(self) -> None:
                inner.close()

        return httpx.Response(
            resp.status_code, headers=resp.headers, stream=Recording(), extensions=resp.extensions
        )

    def close(self) -> None:
        self.inner.close()


_keys = itertools.count()


def _call(
    stack: tuple[Gateway, FakeUpstream],
    variant: str,
    behaviour: Json | Stream,
    messages: list[dict[str, Any]],
    *,
    stream: bool = False,
) -> tuple[Any, bytes]:
    """(what the SDK returned — a ChatCompletion, the list of stream chunks, or the status
    error it raised — and the raw bytes the gateway sent)."""
    gw, upstream = stack
    key = f"s{next(_keys)}"
    upstream.on(key, behaviour)
    tee = _Tee()
    with httpx.Client(transport=tee) as http:
        client = openai.OpenAI(
            base_url=f"{gw.url}/{variant}/v1", api_key="sk-test", max_retries=0, http_client=http
        )
        try:
            if stream:
                chunks = list(
                    client.chat.completions.create(
                        model="m",
                        messages=messages,  # type: ignore[arg-type]
                        stream=True,
                        extra_headers={SCENARIO_HEADER: key},
                    )
                )
                return chunks, bytes(tee.seen)
            result = client.chat.completions.create(
                model="m",
                messages=messages,  # type: ignore[arg-type]
                extra_headers={SCENARIO_HEADER: key},
            )
            return result, bytes(tee.seen)
        except openai.APIError as e:  # a status error, or a stream's error event
            return e, bytes(tee.seen)


def _clean(raw: bytes) -> None:
    assert MARKER.encode() not in raw, raw.decode(errors="replace")[-2000:]


def _blocked(result: Any, reason: str) -> None:
    assert isinstance(result, openai.UnprocessableEntityError), result
    assert result.response.json()["citewarden"]["reason"] == reason


# -- wire builders -----------------------------------------------------------------------------


def _body(message: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-d",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "dialect-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        **top,
    }


def _frames(
    deltas: list[dict[str, Any]], *, first: dict[str, Any] | None = None,
    every: dict[str, Any] | None = None, last: dict[str, Any] | None = None,
) -> bytes:
    """A chat.completion.chunk stream of `deltas` (after the role frame); `first` is merged
    into the first frame's top level, `every` into every other frame's, `last` into the
    finishing frame's."""
    head = {
        "id": "chatcmpl-d", "object": "chat.completion.chunk", "created": 1_700_000_000,
        "model": "dialect-model",
    }
    out = []
    all_deltas = [{"role": "assistant", "content": ""}, *deltas]
    for i, delta in enumerate(all_deltas):
        frame = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        if i == 0 and first:
            frame.update(first)
        elif every:
            frame.update(every)
        out.append(sse_frame(frame))
    end = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    if every:
        end.update(every)
    if last:
        end.update(last)
    out.append(sse_frame(end))
    out.append(sse_frame("[DONE]"))
    return b"".join(out)


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _streamed_text(chunks: list[Any]) -> str:
    """The content text the client assembles from a stream (strings, or Mistral chunks)."""
    out = []
    for c in chunks:
        for ch in c.choices:
            content = ch.delta.content
            if isinstance(content, str):
                out.append(content)
            elif isinstance(content, list):
                out.extend(x["text"] for x in content if x.get("type") == "text")
    return "".join(out)


def _delta_extra(chunks: list[Any], key: str) -> list[Any]:
    return [
        (ch.delta.model_extra or {}).get(key)
        for c in chunks
        for ch in c.choices
        if (ch.delta.model_extra or {}).get(key) is not None
    ]


SEEDS = [0, 1, 2]

# == vLLM: reasoning / reasoning_content ========================================================


def test_vllm_reasoning_fields_are_withheld_in_json(stack: Any) -> None:
    body = _body({"content": GOOD, "reasoning": PLANT, "reasoning_content": PLANT})
    result, raw = _call(stack, "buf", Json(body), CHAT)
    assert result.choices[0].message.content == GOOD
    extra = result.choices[0].message.model_extra or {}
    assert "reasoning" not in extra and "reasoning_content" not in extra
    _clean(raw)


@pytest.mark.parametrize("variant", ["buf", "prog"])
@pytest.mark.parametrize("seed", SEEDS)
def test_vllm_reasoning_deltas_are_withheld_in_streams(stack: Any, variant: str, seed: int) -> None:
    deltas: list[dict[str, Any]] = [{"reasoning": p} for p in _pieces(PLANT)]
    deltas += [{"reasoning_content": p} for p in _pieces(PLANT)]
    deltas += [{"content": p} for p in _pieces(GOOD)]
    result, raw = _call(stack, variant, Stream(_frames(deltas), seed=seed, max_piece=23), CHAT,
                        stream=True)
    assert _streamed_text(result) == GOOD
    _clean(raw)


def test_vllm_reasoning_verified_when_the_policy_says_verify(stack: Any) -> None:
    body = _body({"content": GOOD, "reasoning": BAD})
    result, raw = _call(stack, "verify", Json(body), CHAT)
    _blocked(result, "hallucinated_citation")
    assert b"Mars" not in raw


# == OpenRouter: reasoning_details ==============================================================

DETAILS: list[dict[str, Any]] = [
    {"type": "reasoning.summary", "summary": PLANT, "format": "anthropic-claude-v1", "index": 0},
    {"type": "reasoning.text", "text": PLANT, "signature": "c2lnbmF0dXJl", "index": 1},
    {"type": "reasoning.encrypted", "data": "ZW5jcnlwdGVk+/==", "id": "rs_1", "index": 2},
]


def _details(result: Any) -> Any:
    return (result.choices[0].message.model_extra or {}).get("reasoning_details")


@pytest.mark.parametrize("variant", ["buf", "allow"])
def test_openrouter_readable_details_are_withheld_encrypted_kept(stack: Any, variant: str) -> None:
    """Readable entries are the reasoning channel (withheld by default — and a known channel
    cannot be allow-listed back); the encrypted entry is opaque and kept for the next turn."""
    body = _body({"content": GOOD, "reasoning": PLANT, "reasoning_details": DETAILS})
    result, raw = _call(stack, variant, Json(body), CHAT)
    assert result.choices[0].message.content == GOOD
    assert _details(result) == [DETAILS[2]]
    _clean(raw)


def test_openrouter_details_relayed_with_reasoning_pass(stack: Any) -> None:
    body = _body({"content": GOOD, "reasoning_details": DETAILS})
    result, _ = _call(stack, "pass", Json(body), CHAT)
    assert _details(result) == DETAILS


def test_openrouter_details_of_an_unknown_type_or_shape_are_dropped(stack: Any) -> None:
    details = [
        {"type": "reasoning.note", "note": PLANT},
        {"type": "reasoning.encrypted", "data": PLANT},
        {"type": "reasoning.text", "text": "fine", "x_extra": PLANT},
    ]
    body = _body({"content": GOOD, "reasoning_details": details})
    result, raw = _call(stack, "pass", Json(body), CHAT)
    assert _details(result) == [{"type": "reasoning.text", "text": "fine"}]
    _clean(raw)


@pytest.mark.parametrize("entry", [0, 1])
def test_openrouter_details_verified_with_reasoning_verify(stack: Any, entry: int) -> None:
    details = [dict(DETAILS[entry])]
    details[0]["summary" if entry == 0 else "text"] = BAD
    body = _body({"content": GOOD, "reasoning_details": details})
    result, raw = _call(stack, "verify", Json(body), CHAT)
    _blocked(result, "hallucinated_citation")
    assert b"Mars" not in raw


def test_openrouter_partial_drops_only_the_failing_detail(stack: Any) -> None:
    details = [
        {"type": "reasoning.text", "text": GOOD, "index": 0},
        {"type": "reasoning.summary", "summary": BAD, "index": 1},
        DETAILS[2],
    ]
    body = _body({"content": GOOD, "reasoning_details": details})
    result, raw = _call(stack, "vstrip", Json(body), CHAT)
    assert result.choices[0].message.content.startswith(GOOD)
    assert _details(result) == [details[0], DETAILS[2]]
    assert b"Mars" not in raw


def _detail_deltas(text: str) -> list[dict[str, Any]]:
    deltas: list[dict[str, Any]] = [
        {"reasoning_details": [{"type": "reasoning.text", "text": p, "index": 0}]}
        for p in _pieces(text)
    ]
    deltas.append({"reasoning_details": [DETAILS[2]]})
    return deltas


@pytest.mark.parametrize("variant", ["buf", "prog", "allow"])
@pytest.mark.parametrize("seed", SEEDS)
def test_openrouter_detail_deltas_withheld_in_streams(stack: Any, variant: str, seed: int) -> None:
    deltas = [*_detail_deltas(PLANT), *({"content": p} for p in _pieces(GOOD))]
    deltas.insert(1, {"reasoning": PLANT})
    result, raw = _call(stack, variant, Stream(_frames(deltas), seed=seed), CHAT, stream=True)
    assert _streamed_text(result) == GOOD
    sent = [d for ds in _delta_extra(result, "reasoning_details") for d in ds]
    assert sent == [DETAILS[2]]
    _clean(raw)


@pytest.mark.parametrize("seed", SEEDS)
def test_openrouter_detail_deltas_are_merged_by_index(stack: Any, seed: int) -> None:
    text = "First I look at the pump data, then I answer."
    deltas = [*_detail_deltas(text), *({"content": p} for p in _pieces(GOOD))]
    # A continuation's unknown key is dropped like any unknown key of an entry.
    deltas.insert(2, {"reasoning_details": [{"type": "reasoning.text", "x": PLANT, "index": 0}]})
    result, raw = _call(stack, "pass", Stream(_frames(deltas), seed=seed), CHAT, stream=True)
    sent = [d for ds in _delta_extra(result, "reasoning_details") for d in ds]
    assert sent == [{"type": "reasoning.text", "text": text, "index": 0}, DETAILS[2]]
    _clean(raw)


def test_openrouter_detail_delta_verified_in_streams(stack: Any) -> None:
    deltas = [*_detail_deltas(BAD), *({"content": p} for p in _pieces(GOOD))]
    result, raw = _call(stack, "verify", Stream(_frames(deltas)), CHAT, stream=True)
    _blocked(result, "hallucinated_citation")
    assert b"Mars" not in raw


# == Perplexity: citations / search_results =====================================================

PPLX_GOOD = "The Orbit pump moves 40 litres per minute [1]. It weighs 12 kilograms [2]."


def _pplx(content: str, **top: Any) -> dict[str, Any]:
    return _body(
        {"content": content},
        **{"citations": CITATIONS, "search_results": SEARCH_RESULTS, **top},
    )


def _top(result: Any, key: str) -> Any:
    return (result.model_extra or {}).get(key)


def test_perplexity_markers_verify_against_search_results(stack: Any) -> None:
    result, raw = _call(stack, "num", Json(_pplx(PPLX_GOOD)), PPLX_CHAT)
    assert result.choices[0].message.content == PPLX_GOOD
    assert _top(result, "citations") == CITATIONS
    # URLs and dates are metadata; titles, snippets and anything else are not relayed.
    assert _top(result, "search_results") == [
        {"url": CITATIONS[0], "date": "2025-03-01", "last_updated": "2025-03-02"},
        {"url": CITATIONS[1], "date": None},
    ]
    _clean(raw)
    for r in SEARCH_RESULTS:
        assert r["snippet"].encode() not in raw


def test_perplexity_titles_relayed_only_when_allow_listed(stack: Any) -> None:
    result, _ = _call(stack, "numallow", Json(_pplx(PPLX_GOOD)), PPLX_CHAT)
    titles = [r.get("title") for r in _top(result, "search_results")]
    assert titles == [SEARCH_RESULTS[0]["title"], SEARCH_RESULTS[1]["title"]]
    assert all("snippet" not in r for r in _top(result, "search_results"))


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("The Orbit pump moves 40 litres per minute [3].", "hallucinated_citation"),
        ("The Orbit pump moves 50 litres per minute [1].", "number_mismatch"),
        ("The Orbit pump moves 40 litres per minute.", "missing_citation"),
        ("The Orbit pump moves 40 litres per minute [0].", "hallucinated_citation"),
    ],
)
def test_perplexity_failures(stack: Any, content: str, reason: str) -> None:
    result, raw = _call(stack, "num", Json(_pplx(content)), PPLX_CHAT)
    _blocked(result, reason)
    _clean(raw)


def test_perplexity_citations_without_results_are_id_only(stack: Any) -> None:
    """`citations[]` alone names the sources by URL: a claim with a number citing one cannot
    be checked against text it does not have."""
    body = _body({"content": "The Orbit pump moves 40 litres per minute [1]."},
                 citations=CITATIONS)
    result, _ = _call(stack, "num", Json(body), PPLX_CHAT)
    _blocked(result, "source_text_unavailable")
    body = _body({"content": "The Orbit pump is documented [2]."}, citations=CITATIONS)
    result, _ = _call(stack, "num", Json(body), PPLX_CHAT)
    assert result.choices[0].message.content == "The Orbit pump is documented [2]."


def test_perplexity_results_are_context_only_when_the_route_trusts_the_response(
    stack: Any,
) -> None:
    result, _ = _call(stack, "numreq", Json(_pplx(PPLX_GOOD)), PPLX_CHAT)
    _blocked(result, "hallucinated_citation")


def test_perplexity_bad_lists_are_dropped_whole(stack: Any) -> None:
    """Positions mean something: a list with a bad entry is not relayed at all, and a result
    that is not an object is no context (citing it is hallucinated)."""
    results = [SEARCH_RESULTS[0], PLANT]
    body = _pplx("The Orbit pump moves 40 litres per minute [1].",
                 citations=[CITATIONS[0], PLANT], search_results=results)
    result, raw = _call(stack, "numallow", Json(body), PPLX_CHAT)
    assert result.choices[0].message.content == "The Orbit pump moves 40 litres per minute [1]."
    assert _top(result, "citations") is None and _top(result, "search_results") is None
    _clean(raw)
    body = _pplx("The Orbit pump weighs 12 kilograms [2].", citations=None,
                 search_results=results)
    result, raw = _call(stack, "num", Json(body), PPLX_CHAT)
    _blocked(result, "hallucinated_citation")
    _clean(raw)


@pytest.mark.parametrize("variant", ["allow", "foot"])
def test_perplexity_lists_are_not_relayed_where_they_are_no_context(
    stack: Any, variant: str
) -> None:
    """On a route whose markers are not numeric the lists cite nothing the gateway checked
    (even with their titles allow-listed): the answer goes out without them, in JSON and in a
    buffered stream."""
    content = GOOD if variant == "allow" else "The Orbit pump moves 40 litres per minute [^1]."
    messages = CHAT if variant == "allow" else [
        {"role": "system", "content": SYSTEM.replace('id="kb:1"', 'id="1"')}, CHAT[1]]
    lists = {"citations": [*CITATIONS, f"https://x.example/{MARKER}-built-it"],
             "search_results": SEARCH_RESULTS}
    result, raw = _call(stack, variant, Json(_pplx(content, **lists)), messages)
    assert result.choices[0].message.content == content
    assert _top(result, "citations") is None and _top(result, "search_results") is None
    _clean(raw)
    frames = _frames([{"content": p} for p in _pieces(content)], every=lists)
    result, raw = _call(stack, variant, Stream(frames), messages, stream=True)
    assert _streamed_text(result) == content
    assert not [c for c in result if (c.model_extra or {}).get("citations")]
    _clean(raw)


def test_perplexity_partial_keeps_verified_sentences(stack: Any) -> None:
    content = "The Orbit pump moves 40 litres per minute [1]. It was built on Mars [3]."
    result, raw = _call(stack, "numstrip", Json(_pplx(content)), PPLX_CHAT)
    text = result.choices[0].message.content
    assert text.startswith("The Orbit pump moves 40 litres per minute [1].")
    assert "Mars" not in text and b"Mars" not in raw
    assert _top(result, "citations") == CITATIONS
    _clean(raw)


@pytest.mark.parametrize("variant", ["numstrip", "numprog"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("where", ["first", "every"])
def test_perplexity_streams(stack: Any, variant: str, seed: int, where: str) -> None:
    content = PPLX_GOOD + " It was built on Mars [3]."
    lists = {"citations": CITATIONS, "search_results": SEARCH_RESULTS}
    frames = _frames(
        [{"content": p} for p in _pieces(content)],
        first=lists if where == "first" else None,
        every=lists if where == "every" else None,
    )
    result, raw = _call(stack, variant, Stream(frames, seed=seed), PPLX_CHAT, stream=True)
    text = _streamed_text(result)
    assert text.startswith(PPLX_GOOD)
    assert "Mars" not in text and b"Mars" not in raw
    assert [c.model_extra.get("citations") for c in result if c.model_extra.get("citations")] \
        == [CITATIONS]
    _clean(raw)


def test_perplexity_stream_lists_resent_accumulated(stack: Any) -> None:
    """A frame may re-send the lists grown: later results are context too."""
    frames = _frames(
        [
            {"content": "The Orbit pump moves 40 litres per minute [1]. "},
            {"content": "It weighs 12 kilograms [2]."},
        ],
        first={"citations": CITATIONS[:1], "search_results": SEARCH_RESULTS[:1]},
        every={"citations": CITATIONS, "search_results": SEARCH_RESULTS},
    )
    result, raw = _call(stack, "num", Stream(frames), PPLX_CHAT, stream=True)
    assert _streamed_text(result) == PPLX_GOOD
    _clean(raw)


@pytest.mark.parametrize("variant", ["num", "numprog"])
def test_perplexity_stream_lists_sent_last(stack: Any, variant: str) -> None:
    """Results that arrive with the last frame: a buffered stream checks its claims again
    against them; a progressive one has released nothing it could not verify in time."""
    frames = _frames(
        [{"content": p} for p in _pieces(PPLX_GOOD)],
        last={"citations": CITATIONS, "search_results": SEARCH_RESULTS},
    )
    result, raw = _call(stack, variant, Stream(frames), PPLX_CHAT, stream=True)
    if variant == "num":
        assert _streamed_text(result) == PPLX_GOOD
    else:
        assert "Orbit" not in _streamed_text(result)
    _clean(raw)


def test_perplexity_stream_lists_that_change_an_entry_keep_the_first(stack: Any) -> None:
    changed = [dict(SEARCH_RESULTS[0], snippet="The Orbit pump moves 90 litres per minute.")]
    frames = _frames(
        [{"content": "The Orbit pump moves 90 litres per minute [1]."}],
        first={"search_results": SEARCH_RESULTS[:1]},
        every={"search_results": changed},
    )
    result, _ = _call(stack, "num", Stream(frames), PPLX_CHAT, stream=True)
    _blocked(result, "number_mismatch")


# == Mistral: content chunks ====================================================================


def _text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def _ref(*ids: int) -> dict[str, Any]:
    return {"type": "reference", "reference_ids": list(ids)}


THINKING = {"type": "thinking", "thinking": [_text(PLANT)], "closed": True}
MISTRAL_GOOD = [
    _text("The Orbit pump moves 40 litres per minute"), _ref(0),
    _text(". It weighs 12 kilograms"), _ref(1), _text("."),
]
MISTRAL_TEXT = "The Orbit pump moves 40 litres per minute. It weighs 12 kilograms."


def test_mistral_references_verify_and_release_unchanged(stack: Any) -> None:
    body = _body({"content": MISTRAL_GOOD})
    result, raw = _call(stack, "buf", Json(body), MISTRAL_CHAT)
    assert result.choices[0].message.content == MISTRAL_GOOD
    assert json.dumps(body).encode() in raw  # released byte for byte


def test_mistral_thinking_chunks_are_withheld(stack: Any) -> None:
    body = _body({"content": [THINKING, *MISTRAL_GOOD]})
    result, raw = _call(stack, "buf", Json(body), MISTRAL_CHAT)
    assert result.choices[0].message.content == MISTRAL_GOOD
    _clean(raw)
    result, raw = _call(stack, "allow", Json(body), MISTRAL_CHAT)
    assert result.choices[0].message.content == MISTRAL_GOOD
    _clean(raw)
    result, _ = _call(stack, "pass", Json(body), MISTRAL_CHAT)
    assert result.choices[0].message.content == [THINKING, *MISTRAL_GOOD]


def test_mistral_thinking_verified_with_reasoning_verify(stack: Any) -> None:
    thinking = {"type": "thinking", "thinking": [_text(BAD)]}
    result, raw = _call(stack, "verify", Json(_body({"content": [thinking, *MISTRAL_GOOD]})),
                        MISTRAL_CHAT)
    _blocked(result, "hallucinated_citation")
    assert b"Mars" not in raw


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ([_text("The Orbit pump moves 40 litres per minute."), _ref(7)], "hallucinated_citation"),
        ([_text("The Orbit pump moves 40 litres per minute.")], "missing_citation"),
        ([_text("The Orbit pump moves 40 litres per minute."), _ref(1)], "number_mismatch"),
        # A reference attaches to the text before it, not to the sentence after.
        ([_text("The Orbit pump moves 40 litres per minute."), _ref(0),
          _text(" It weighs 12 kilograms.")], "missing_citation"),
        ([_text("The pump is fine."), {"type": "reference", "reference_ids": "0"}],
         "missing_citation"),
    ],
)
def test_mistral_reference_failures(stack: Any, content: list[Any], reason: str) -> None:
    result, _ = _call(stack, "buf", Json(_body({"content": content})), MISTRAL_CHAT)
    _blocked(result, reason)
    index = result.response.json()["citewarden"]["claim_index"]
    assert index == (1 if content[-1] == _text(" It weighs 12 kilograms.") else 0)


def test_mistral_references_only_from_trusted_context(stack: Any) -> None:
    """The same chunk tags typed by the user are no context: the references hallucinate."""
    messages = [{"role": "user", "content": TOOL_CONTEXT + "\nTell me about the pump."}]
    result, _ = _call(stack, "buf", Json(_body({"content": MISTRAL_GOOD})), messages)
    _blocked(result, "hallucinated_citation")


def test_mistral_partial_keeps_a_valid_chunk_structure(stack: Any) -> None:
    content = [
        THINKING,
        _text("The Orbit pump moves 40 litres per minute"), _ref(0),
        _text(". It was designed on Mars"), _ref(5),
        _text(". It weighs 12 kilograms"), _ref(1), _text("."),
    ]
    result, raw = _call(stack, "strip", Json(_body({"content": content})), MISTRAL_CHAT)
    chunks = result.choices[0].message.content
    assert isinstance(chunks, list)
    assert {c["type"] for c in chunks} <= {"text", "reference"}
    refs = [c["reference_ids"] for c in chunks if c["type"] == "reference"]
    assert refs == [[0], [1]]  # the removed claim's reference went with it
    text = "".join(c["text"] for c in chunks if c["type"] == "text")
    assert text.startswith("The Orbit pump moves 40 litres per minute. It weighs 12 kilograms.")
    # Each kept reference still follows the text it cites.
    first = chunks.index(_ref(0))
    assert "".join(c["text"] for c in chunks[:first] if c["type"] == "text").endswith("minute")
    assert b"Mars" not in raw
    _clean(raw)


def test_mistral_partial_with_verified_thinking_between_chunks(stack: Any) -> None:
    """A failing thinking chunk in the middle of the list goes, and only it: the chunks that
    are kept are not mistaken for it after the list was rebuilt."""
    thinking = {"type": "thinking", "thinking": [_text(BAD)]}
    content = [
        _text("The Orbit pump moves 40 litres per minute"), _ref(0), thinking,
        _text(". It was designed on Mars"), _ref(5), _text("."),
    ]
    result, raw = _call(stack, "vstrip", Json(_body({"content": content})), MISTRAL_CHAT)
    chunks = result.choices[0].message.content
    assert [c["type"] for c in chunks][:3] == ["text", "reference", "text"]
    assert chunks[0] == _text("The Orbit pump moves 40 litres per minute") and chunks[1] == _ref(0)
    assert all(c["type"] != "thinking" for c in chunks)
    assert b"Mars" not in raw


def _mistral_deltas(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mistral-style deltas: each delta's content is a list holding one chunk (text cut)."""
    deltas: list[dict[str, Any]] = []
    for chunk in content:
        if chunk["type"] == "text":
            deltas += [{"content": [_text(p)]} for p in _pieces(chunk["text"], 5)]
        elif chunk["type"] == "thinking":
            for part in chunk["thinking"]:
                deltas += [
                    {"content": [{"type": "thinking", "thinking": [_text(p)]}]}
                    for p in _pieces(part["text"], 5)
                ]
        else:
            deltas.append({"content": [chunk]})
    return deltas


@pytest.mark.parametrize("variant", ["buf", "prog"])
@pytest.mark.parametrize("seed", SEEDS)
def test_mistral_streams(stack: Any, variant: str, seed: int) -> None:
    frames = _frames(_mistral_deltas([THINKING, *MISTRAL_GOOD]))
    result, raw = _call(stack, variant, Stream(frames, seed=seed), MISTRAL_CHAT, stream=True)
    assert _streamed_text(result) == MISTRAL_TEXT
    _clean(raw)
    if variant == "buf":  # re-framed from the assembled body: the references are there
        sent = [c for ch in result for x in ch.choices
                for c in (x.delta.content if isinstance(x.delta.content, list) else [])]
        assert [c for c in sent if c["type"] == "reference"] == [_ref(0), _ref(1)]


@pytest.mark.parametrize("variant", ["strip", "prog"])
@pytest.mark.parametrize("seed", SEEDS)
def test_mistral_streams_partial(stack: Any, variant: str, seed: int) -> None:
    content = [
        _text("The Orbit pump moves 40 litres per minute"), _ref(0),
        _text(". It was designed on Mars"), _ref(5), _text("."),
    ]
    frames = _frames(_mistral_deltas([THINKING, *content]))
    result, raw = _call(stack, variant, Stream(frames, seed=seed), MISTRAL_CHAT, stream=True)
    text = _streamed_text(result)
    assert text.startswith("The Orbit pump moves 40 litres per minute.")
    assert b"Mars" not in raw
    _clean(raw)


def test_mistral_stream_block(stack: Any) -> None:
    frames = _frames(_mistral_deltas([_text("The Orbit pump moves 40 litres per minute."),
                                      _ref(9)]))
    result, _ = _call(stack, "buf", Stream(frames), MISTRAL_CHAT, stream=True)
    _blocked(result, "hallucinated_citation")
    result, raw = _call(stack, "progblock", Stream(frames), MISTRAL_CHAT, stream=True)
    assert isinstance(result, openai.APIError) and "hallucinated_citation" in result.message
    assert b"[DONE]" not in raw


# == Perplexity results are context for numeric markers only ======================================

# An upstream that supplies its own "retrieval": a result that says the fabricated sentence.
FORGED_RESULTS = [{"title": "t", "url": "https://x.example/a", "snippet": f"{PLANT}."}]


@pytest.mark.parametrize("variant", ["num", "numresp", "numstrip"])
def test_mistral_references_never_cite_perplexity_results(stack: Any, variant: str) -> None:
    """A Mistral `reference` cites the request's chunks (docs/protocols.md): next to Perplexity
    `search_results[]` its id 1 is not "the first result", whichever source comes first."""
    content = [_text(f"{PLANT}."), _ref(1)]
    body = _body({"content": content}, search_results=FORGED_RESULTS)
    result, raw = _call(stack, variant, Json(body), PPLX_CHAT)
    _clean(raw)
    if variant != "numstrip":
        _blocked(result, "hallucinated_citation")


@pytest.mark.parametrize("variant", ["num", "numstrip", "numprog"])
@pytest.mark.parametrize("late", [False, True])
def test_mistral_references_never_cite_perplexity_results_in_streams(
    stack: Any, variant: str, late: bool
) -> None:
    """The same in a stream: the results come with the first frame, the reference after the
    text it cites (or first, with the results only after it)."""
    content = [_text("The Orbit pump moves 40 litres per minute. "), _text(f"{PLANT}."), _ref(1)]
    lists = {"search_results": FORGED_RESULTS}
    frames = _frames(_mistral_deltas(content), first=None if late else lists,
                     last=lists if late else None)
    _, raw = _call(stack, variant, Stream(frames), PPLX_CHAT, stream=True)
    _clean(raw)


@pytest.mark.parametrize("variant", ["num", "numresp"])
def test_mistral_references_to_request_chunks_verify_beside_perplexity_results(
    stack: Any, variant: str
) -> None:
    """Positive control: references to the request's tool-result chunks still verify on a
    numeric route, with search results beside them."""
    body = _body({"content": MISTRAL_GOOD}, search_results=FORGED_RESULTS)
    result, raw = _call(stack, variant, Json(body), MISTRAL_CHAT)
    assert result.choices[0].message.content == MISTRAL_GOOD
    _clean(raw)
    frames = _frames(_mistral_deltas(MISTRAL_GOOD), first={"search_results": FORGED_RESULTS})
    result, raw = _call(stack, variant, Stream(frames), MISTRAL_CHAT, stream=True)
    assert _streamed_text(result) == MISTRAL_TEXT
    _clean(raw)


def test_perplexity_results_are_no_context_for_footnote_markers(stack: Any) -> None:
    """DESIGN: the results are context for numeric `[N]` markers; a route of another format
    (`[^1]` footnotes read as id "1") does not make them context."""
    for content in (f"{PLANT} [^1].", "The Orbit pump moves 40 litres per minute [^1]."):
        result, raw = _call(stack, "foot", Json(_pplx(content)), PPLX_CHAT)
        _blocked(result, "hallucinated_citation")
        _clean(raw)
    frames = _frames([{"content": p} for p in _pieces(f"{PLANT} [^1].")],
                     first={"search_results": SEARCH_RESULTS})
    result, raw = _call(stack, "foot", Stream(frames), PPLX_CHAT, stream=True)
    _blocked(result, "hallucinated_citation")
    _clean(raw)


# == the shipped example policy ===================================================================


def test_the_shipped_perplexity_policy_serves_a_sonar_client() -> None:
    """policies/perplexity.yaml as shipped: an SDK whose base URL was api.perplexity.ai posts
    to /chat/completions; [N] markers verify against the search results, a sentence citing a
    result that does not exist is stripped, titles and snippets never reach the client."""
    policy = Path(__file__).resolve().parent.parent / "policies" / "perplexity.yaml"
    upstream = FakeUpstream()
    content = PPLX_GOOD + " It was built on Mars [4]."
    upstream.on("sonar", Json(_pplx(content)))
    upstream.on("sonar-stream", Stream(_frames(
        [{"content": p} for p in _pieces(content)],
        every={"citations": CITATIONS, "search_results": SEARCH_RESULTS},
    )))
    with serve(upstream) as upstream_url, run_gateway(upstream_url, [policy]) as gw:
        for key in ("sonar", "sonar-stream"):
            tee = _Tee()
            with httpx.Client(transport=tee) as http:
                client = openai.OpenAI(
                    base_url=gw.url, api_key="pplx-test", max_retries=0, http_client=http
                )
                if key == "sonar":
                    result = client.chat.completions.create(
                        model="sonar", messages=PPLX_CHAT,  # type: ignore[arg-type]
                        extra_headers={SCENARIO_HEADER: key},
                    )
                    text = result.choices[0].message.content or ""
                    assert _top(result, "citations") == CITATIONS
                else:
                    chunks = list(client.chat.completions.create(
                        model="sonar", messages=PPLX_CHAT,  # type: ignore[arg-type]
                        stream=True, extra_headers={SCENARIO_HEADER: key},
                    ))
                    text = _streamed_text(chunks)
            assert text.startswith(PPLX_GOOD) and text != PPLX_GOOD  # + the disclosure
            assert "Mars" not in text
            assert b"x-citewarden-decision: partial" in tee.seen
            _clean(bytes(tee.seen))
            for r in SEARCH_RESULTS:
                assert str(r["snippet"]).encode() not in tee.seen
        assert [r.path for r in upstream.requests] == ["/chat/completions"] * 2


PLANTED_CHUNKS: dict[str, list[dict[str, Any]]] = {
    "text-extra": [{**MISTRAL_GOOD[0], "x_note": PLANT}, *MISTRAL_GOOD[1:]],
    "reference-extra": [MISTRAL_GOOD[0], {**MISTRAL_GOOD[1], "title": PLANT}, *MISTRAL_GOOD[2:]],
    "thinking-part-extra": [
        {"type": "thinking", "thinking": [{"type": "text", "text": "ok", "title": PLANT}]},
        *MISTRAL_GOOD,
    ],
    "thinking-part-type": [
        {"type": "thinking", "thinking": [{"type": "tool_reference", "title": PLANT}]},
        *MISTRAL_GOOD,
    ],
    "unknown-chunk": [*MISTRAL_GOOD, {"type": "document_url", "document_name": PLANT}],
    "reference-ids": [MISTRAL_GOOD[0], {"type": "reference", "reference_ids": [PLANT]}],
}


@pytest.mark.parametrize("plant", sorted(PLANTED_CHUNKS))
@pytest.mark.parametrize("variant", ["buf", "pass", "strip", "prog"])
def test_mistral_planted_fields_never_leak(stack: Any, plant: str, variant: str) -> None:
    content = PLANTED_CHUNKS[plant]
    frames = _frames(_mistral_deltas(content) if "thinking-part" not in plant
                     else [{"content": [c]} for c in content])
    for behaviour, stream in ((Json(_body({"content": content})), False), (Stream(frames), True)):
        result, raw = _call(stack, variant, behaviour, MISTRAL_CHAT, stream=stream)
        _clean(raw)
        # Decided, not failed: an answer, or the block of a claim whose reference was dropped
        # (`strip` answers without it instead).
        if plant == "reference-ids" and variant in ("buf", "pass"):
            assert isinstance(result, openai.APIError), result
        else:
            assert not isinstance(result, openai.APIError), result

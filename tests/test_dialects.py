"""The openai-chat adapter's OpenAI-compatible dialects, unit by unit (the proxy-level tests
are in test_proxy_dialects.py): Perplexity search results as context, positional lists, Mistral
chunk rebuilding, OpenRouter detail merging, and the captured fixtures through the real
`citewarden verify` with numeric markers."""

from __future__ import annotations

import contextvars
import copy
import itertools
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.context import build_context
from gateway.policy import ContextSpec, Match, Policy, Route
from gateway.policy.model import Citations
from gateway.protocols.base import rebuild_with_map
from gateway.protocols.fields import FieldLog, Items, Meta, Obj, Positional, clean, is_url
from gateway.protocols.openai_chat import (
    OpenAIChat,
    OpenAIStreamParser,
    parse_body,
    search_chunks,
)
from gateway.protocols.openai_chat.chunks import chunks_text, rebuild_chunks
from gateway.sse import SSEEvent
from gateway.types import Chunk, Claim, ContextSet

FIXTURES = Path(__file__).parent / "fixtures" / "openai_chat"
T = TypeVar("T")


def _body(message: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "id": "c", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", **message},
                     "finish_reason": "stop"}],
        **top,
    }


# -- Perplexity ------------------------------------------------------------------------------


def test_search_chunks_number_results_from_one() -> None:
    body = {
        "search_results": [
            {"url": "https://a.example/1", "snippet": "one", "title": "T"},
            "not an object",
            {"url": "javascript:alert(1)", "snippet": "  "},
        ],
        "citations": ["https://a.example/1", "https://b.example/2", 7, "ftp://x"],
    }
    chunks = search_chunks(body)
    assert chunks[:2] == [
        Chunk(id="1", text="one", source="https://a.example/1"),
        Chunk(id="3", text=None, source=None),
    ]
    assert Chunk(id="2", source="https://b.example/2") in chunks
    assert {c.id for c in chunks} == {"1", "2", "3"}


def _on_route(fmt: str, fn: Callable[[], T]) -> T:
    """`fn` in a fresh exchange whose request was forwarded on a route of citation format
    `fmt` (the adapter learns the route's format there, as the proxy and `verify` do)."""

    def run() -> T:
        pattern = r"\{(?P<id>\d+)\}" if fmt == "regex" else None
        cites = Citations(format=fmt, pattern=pattern)  # type: ignore[arg-type]
        route = Route(name="c", match=Match(path="/v1/chat/completions"), protocol="openai-chat")
        policy = Policy(name="t", routes=[route], citations=cites)
        OpenAIChat().forward_body(b"{}", "/v1/chat/completions", policy)
        return fn()

    return contextvars.Context().run(run)


def test_response_context_comes_only_with_from_response() -> None:
    body = _body({"content": "x [1]"}, citations=["https://a.example/"])
    with_response = _on_route(
        "numeric", lambda: build_context("openai-chat", ContextSpec(), response=body))
    assert set(with_response.chunks) == {"1"}
    without = _on_route("numeric", lambda: build_context(
        "openai-chat", ContextSpec.model_validate({"from": ["request", "header"]}), response=body))
    assert without.chunks == {}


@pytest.mark.parametrize("fmt", ["doc-chunk", "footnote", "regex", None])
def test_search_results_are_context_only_for_numeric_markers(fmt: str | None) -> None:
    """DESIGN: the results are context "for numeric [N] markers"; on a route of any other
    format (or outside an exchange, where the format is unknown) they are not context."""
    body = _body({"content": "x [^1]"}, search_results=[{"url": "https://a.example/",
                                                          "snippet": "one"}])
    if fmt is None:
        ctx = contextvars.Context().run(
            lambda: build_context("openai-chat", ContextSpec(), response=body))
    else:
        ctx = _on_route(fmt, lambda: build_context("openai-chat", ContextSpec(), response=body))
    assert ctx.chunks == {}


def test_search_results_are_no_context_of_an_answer_with_mistral_references() -> None:
    """A Mistral reference cites the request's chunks: an answer that carries reference
    chunks (in any choice) gets no context from Perplexity lists beside them, so a reference
    id can never land on "the N-th result"."""
    results = [{"url": "https://a.example/", "snippet": "one"}]
    body = _body({"content": [_t("A is one."), _r(1)]}, search_results=results)
    body["choices"].insert(0, {"index": 1, "message": {"role": "assistant", "content": "x [1]"},
                               "finish_reason": "stop"})
    ctx = _on_route("numeric", lambda: build_context("openai-chat", ContextSpec(), response=body))
    assert ctx.chunks == {}
    plain = _body({"content": [_t("A is one [1].")]}, search_results=results)
    ctx = _on_route("numeric", lambda: build_context("openai-chat", ContextSpec(), response=plain))
    assert set(ctx.chunks) == {"1"}


def _stream_ctx(deltas: list[dict[str, Any]], first: dict[str, Any],
                ctx: ContextSet) -> OpenAIStreamParser:
    parser = OpenAIStreamParser()
    parser.bind_context(ctx, ContextSpec())
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    for i, d in enumerate(deltas):
        top = first if i == 0 else {}
        parser.feed(SSEEvent(data=json.dumps(
            {**head, **top, "choices": [{"index": 0, "delta": d, "finish_reason": None}]})))
    return parser


def test_stream_reference_withdraws_search_results_already_in_the_context() -> None:
    """Results come with the first frame and join the context; a reference chunk later in the
    stream makes it a Mistral answer: the results leave the context again (an id-only chunk
    they had upgraded gets its own entry back) and claims are checked again at the end."""
    lists = {"search_results": [{"url": "https://a.example/", "snippet": "one"},
                                {"url": "https://b.example/", "snippet": "two"}]}
    earlier = Chunk(id="2")  # e.g. an id-only header chunk
    kept = Chunk(id="kb:1", text="request text")

    def run() -> tuple[ContextSet, OpenAIStreamParser, set[str]]:
        ctx = ContextSet()
        ctx.extend([kept, earlier])
        parser = _stream_ctx([{"content": [_t("A is one.")]}], lists, ctx)
        during = set(ctx.chunks)
        _stream_ctx_more(parser, [{"content": [_r(1)]}])
        return ctx, parser, during

    ctx, parser, during = _on_route("numeric", run)
    assert during == {"kb:1", "1", "2"}
    assert ctx.chunks == {"kb:1": kept, "2": earlier}
    assert parser.context_grew_late
    # Results re-sent after the reference do not come back.
    ctx2, parser2, _ = _on_route("numeric", run)
    _stream_ctx_more(parser2, [{"content": [_t(" More.")]}], top=lists)
    assert ctx2.chunks == {"kb:1": kept, "2": earlier}


def _stream_ctx_more(parser: OpenAIStreamParser, deltas: list[dict[str, Any]],
                     top: dict[str, Any] | None = None) -> None:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    for d in deltas:
        parser.feed(SSEEvent(data=json.dumps(
            {**head, **(top or {}), "choices": [{"index": 0, "delta": d,
                                                  "finish_reason": None}]})))


def test_stream_search_results_only_on_numeric_routes() -> None:
    lists = {"search_results": [{"url": "https://a.example/", "snippet": "one"}]}
    for fmt, want in (("numeric", {"1"}), ("doc-chunk", set()), ("footnote", set())):
        ctx = ContextSet()

        def feed(ctx: ContextSet = ctx) -> OpenAIStreamParser:
            return _stream_ctx([{"content": "A [1]."}], lists, ctx)

        _on_route(fmt, feed)
        assert set(ctx.chunks) == want, fmt


def test_positional_list_is_dropped_whole_with_its_unknown_fields() -> None:
    table = Obj("top", {"xs": Positional(Items(Obj("x", {"url": Meta(is_url)},
                                                     nullable=False)))})
    log = FieldLog()
    assert clean(table, {"xs": [{"url": "https://a.example/", "title": "t"}]}, log) == {
        "xs": [{"url": "https://a.example/", "title": "t"}]
    }
    assert log.unknown == [("x", ("xs", 0, "title"))]
    log = FieldLog()
    assert clean(table, {"xs": [{"url": "https://a.example/", "title": "t"}, 3]}, log) == {}
    assert log.unknown == []
    assert ("top", ("xs",)) in log.dropped


def test_search_result_fields_are_decided() -> None:
    body = _body(
        {"content": "hi"},
        citations=["https://a.example/"],
        search_results=[{"url": "https://a.example/", "date": "2025-01-02", "title": "T",
                         "snippet": "S", "last_updated": "yesterday"}],
    )
    answer = _on_route("numeric", lambda: parse_body(body))
    assert sorted(answer.unknown_fields) == [
        ("search_results", 0, "snippet"), ("search_results", 0, "title")
    ]
    assert ("search_result", ("search_results", 0, "last_updated")) in answer.dropped


@pytest.mark.parametrize("fmt", ["doc-chunk", "footnote", "regex", None])
def test_search_lists_are_not_relayed_where_they_are_no_context(fmt: str | None) -> None:
    """The lists cite nothing the gateway checked on a route whose markers are not numeric
    (or outside an exchange): their URLs are free text there, so the body loses them."""
    body = _body({"content": "hi"}, citations=["https://a.example/ZQX-built-it"],
                 search_results=[{"url": "https://a.example/ZQX", "title": "T"}])
    if fmt is None:
        answer = contextvars.Context().run(lambda: parse_body(body))
    else:
        answer = _on_route(fmt, lambda: parse_body(body))
    assert "citations" not in answer.body and "search_results" not in answer.body
    assert ("top", ("citations",)) in answer.dropped
    assert ("top", ("search_results",)) in answer.dropped
    assert answer.unknown_fields == []  # the title went with its list
    kept = _on_route("numeric", lambda: parse_body(body))
    assert kept.body["citations"] == ["https://a.example/ZQX-built-it"]
    assert kept.body["search_results"] == [{"url": "https://a.example/ZQX", "title": "T"}]
    assert kept.dropped == []


def _verify(policy: Path, response: str, request: str = "request.json") -> Any:
    sent = FIXTURES / request
    if response.endswith(".sse"):  # a stream capture answers a request that asked for one
        sent = policy.parent / "request-stream.json"
        sent.write_text(json.dumps({**json.loads((FIXTURES / request).read_text()),
                                    "stream": True}))
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "verify", "--policy", str(policy), "--protocol",
         "openai-chat", "--request", str(sent), "--response",
         str(FIXTURES / response), "--format", "json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("response", ["perplexity.json", "perplexity.sse"])
def test_perplexity_fixture_verifies_with_numeric_markers(tmp_path: Path, response: str) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "name: pplx\nroutes:\n  - name: chat\n    match: {path: /v1/chat/completions}\n"
        "    protocol: openai-chat\ncitations: {format: numeric}\n"
    )
    report = _verify(policy, response)
    assert report["decision"] == "released", report["claims"]
    assert [c["citations"] for c in report["claims"]] == [["1"], ["2"]]
    body = report["body"]
    text = json.dumps(body) if isinstance(body, dict) else body
    assert "HR handbook" not in text and "snippet" not in text
    assert "https://hr.example/leave" in text
    whole = _verify(policy, "perplexity.json")
    assert report["context_fingerprint"] == whole["context_fingerprint"]


# -- Mistral ---------------------------------------------------------------------------------


def _t(x: str) -> dict[str, Any]:
    return {"type": "text", "text": x}


def _r(*ids: int) -> dict[str, Any]:
    return {"type": "reference", "reference_ids": list(ids)}


def test_references_span_the_last_character_before_them() -> None:
    text, native = chunks_text([_r(9), _t("Ab"), _r(1), _t("  "), _r(2), _t(" c."), _r(3)])
    assert text == "Ab   c."
    assert [(s, e, c.id) for s, e, c in native] == [
        (0, 0, "9"), (1, 2, "1"), (1, 2, "2"), (6, 7, "3")
    ]


SENTENCES = ["Alpha is one.", "Beta is two.", "Gamma is three.", "Delta is four."]


@settings(max_examples=60, deadline=None)
@given(
    keep=st.lists(st.booleans(), min_size=4, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=6),
)
def test_rebuilt_chunks_spell_the_rebuilt_text_and_keep_only_kept_references(
    keep: list[bool], cuts: list[int]
) -> None:
    """However the upstream cut its text chunks, the partial chunk list spells exactly the
    rebuilt text, and holds the references of the kept sentences only, each right after the
    sentence it cites."""
    chunks: list[dict[str, Any]] = []
    claims = []
    pos = 0
    for i, s in enumerate(SENTENCES):
        piece = s if i == 0 else " " + s
        at = [c % (len(piece) + 1) for c in cuts]
        bounds = sorted({0, len(piece), *at})
        chunks += [_t(piece[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
        chunks.append(_r(i))
        start = pos + (0 if i == 0 else 1)
        claims.append(Claim(i, 0, s, start, start + len(s)))
        pos += len(piece)
    text, _ = chunks_text(chunks)
    kept = [c for c, k in zip(claims, keep, strict=True) if k]
    new, mapping = rebuild_with_map(text, kept, "Some statements were removed.")
    out = rebuild_chunks(chunks, new, mapping)
    assert "".join(c["text"] for c in out if c["type"] == "text") == new
    refs = [c["reference_ids"][0] for c in out if c["type"] == "reference"]
    assert refs == [i for i, k in enumerate(keep) if k]
    for k, c in enumerate(out):
        if c["type"] == "reference":
            before = "".join(x["text"] for x in out[:k] if x["type"] == "text")
            assert before.endswith(SENTENCES[c["reference_ids"][0]])


def _feed(parser: OpenAIStreamParser, deltas: list[dict[str, Any]]) -> None:
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    for d in [{"role": "assistant", "content": ""}, *deltas]:
        parser.feed(SSEEvent(data=json.dumps(
            {**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
        )))
    parser.feed(SSEEvent(data=json.dumps(
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    )))
    parser.feed(SSEEvent(data="[DONE]"))


def test_stream_records_references_at_their_offsets_within_one_delta() -> None:
    parser = OpenAIStreamParser()
    content = [_t("A is 1"), _r(0), _t(". B is 2"), _r(1), _t(".")]
    _feed(parser, [{"content": content}])
    assert parser.body()["choices"][0]["message"]["content"] == content
    assert [c.id for c in parser.primary_citations(0, 7)] == ["0"]
    assert [c.id for c in parser.primary_citations(8, 15)] == ["1"]
    answer = parser.finish()
    assert answer.channels[0].native == parse_body(parser.body()).channels[0].native


def test_stream_merges_thinking_pieces_and_reasoning_details() -> None:
    parser = OpenAIStreamParser()
    _feed(parser, [
        {"content": [{"type": "thinking", "thinking": [_t("thin")]}]},
        {"content": [{"type": "thinking", "thinking": [_t("king")]}]},
        {"reasoning_details": [{"type": "reasoning.text", "text": "a", "index": 0}]},
        {"reasoning_details": [{"type": "reasoning.text", "text": "b", "index": 0,
                                "signature": "c2ln"}]},
        {"reasoning_details": [{"type": "reasoning.text", "text": ["not a string"],
                                "index": 1}]},
        {"content": [_t("Done.")]},
    ])
    msg = parser.body()["choices"][0]["message"]
    assert msg["content"] == [
        {"type": "thinking", "thinking": [_t("thin"), _t("king")]}, _t("Done.")
    ]
    assert msg["reasoning_details"] == [
        {"type": "reasoning.text", "text": "ab", "index": 0, "signature": "c2ln"},
        {"type": "reasoning.text", "text": None, "index": 1},
    ]
    kinds = [(c.kind, c.path[3:], c.text) for c in parser.finish().channels]
    assert ("reasoning", ("content", 0), "thinking") in kinds
    assert ("reasoning", ("reasoning_details", 0, "text"), "ab") in kinds


# -- what a buffered stream said that the assembled body does not hold -------------------------


def _frames(parser: OpenAIStreamParser, chunks: list[dict[str, Any]]) -> list[Any]:
    """Feed whole frames (each `{choice keys…}` of choice 0, or a top-level dict under
    `"top"`); the assembled answer's dropped fields."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    for c in chunks:
        top = c.pop("top", {})
        choices = [] if c.pop("none", False) else [{"index": 0, "finish_reason": None, **c}]
        parser.feed(SSEEvent(data=json.dumps({**head, **top, "choices": choices})))
    parser.feed(SSEEvent(data="[DONE]"))
    return parser.finish().dropped


_USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param([{"delta": {"content": "A."}, "top": {"usage": {"x_note": "a b"}}},
                      {"delta": {}, "none": True, "top": {"usage": _USAGE}}], id="usage"),
        pytest.param([{"delta": {"content": "A."},
                       "logprobs": {"content": [], "refusal": "a b"}}], id="logprobs-member"),
        pytest.param([{"delta": {"content": "A."}, "logprobs": "a b"}], id="logprobs-value"),
        pytest.param([{"delta": {"content": "A."}, "message": {"content": "B."}}],
                     id="choice-message"),
        pytest.param([{"delta": {"audio": {"id": "a_1", "transcript": "A."}}},
                      {"delta": {"audio": {"id": "a_2"}}}], id="audio-id"),
        pytest.param([{"delta": {"reasoning_details": [
                          {"type": "reasoning.text", "index": 0, "text": "a", "id": "r_1"}]}},
                      {"delta": {"reasoning_details": [
                          {"type": "reasoning.text", "index": 0, "text": "b", "id": "r_2"}]}}],
                     id="reasoning-detail"),
        pytest.param([{"delta": {"content": "A."}, "x_note": "a"},
                      {"delta": {}, "x_note": "b"}], id="choice-extra"),
    ],
)
def test_a_frame_value_the_body_overwrote_or_ignored_is_dropped(
    chunks: list[dict[str, Any]]
) -> None:
    dropped = _frames(OpenAIStreamParser(), copy.deepcopy(chunks))
    assert dropped, "the stream would be relayed as the upstream's bytes"


def test_a_frame_message_does_not_replace_the_assembled_message() -> None:
    parser = OpenAIStreamParser()
    _frames(parser, [{"delta": {"content": "A."}, "message": {"content": "B."}}])
    assert parser.body()["choices"][0]["message"]["content"] == "A."


def test_decided_frames_drop_nothing() -> None:
    """A growing usage of the right shape, a repeated audio id, logprobs with a null refusal
    and detail pieces that only add strings: nothing the body does not hold."""
    tok = {"token": "A.", "logprob": -0.1, "bytes": [65, 46], "top_logprobs": []}
    dropped = _frames(OpenAIStreamParser(), [
        {"delta": {"content": "A."}, "logprobs": {"content": [tok], "refusal": None},
         "top": {"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}},
        {"delta": {"audio": {"id": "a_1", "expires_at": 1, "transcript": "A."}}},
        {"delta": {"audio": {"id": "a_1", "data": "aGk="}}},
        {"delta": {"reasoning_details": [
            {"type": "reasoning.text", "index": 0, "text": "a", "signature": None}]}},
        {"delta": {"reasoning_details": [
            {"type": "reasoning.text", "index": 0, "text": "b", "signature": "c2ln"}]}},
        {"delta": {}, "none": True, "top": {"usage": _USAGE}},
    ])
    assert dropped == []


# -- what the stream parser let go of is recorded (the stream is then re-framed) ---------------


def _undecided(deltas: list[dict[str, Any]]) -> list[Any]:
    """What the assembled answer dropped or does not know (either re-frames the stream on a
    route that does not allow-list it)."""
    parser = OpenAIStreamParser()
    _feed(parser, copy.deepcopy(deltas))
    answer = parser.finish()
    return [*answer.dropped, *answer.unknown_fields]


_THINK = {"type": "thinking", "thinking": [_t("a")]}
_DETAIL = {"type": "reasoning.text", "index": 0, "text": "a"}


@pytest.mark.parametrize(
    "deltas",
    [
        pytest.param([{"content": [{**_t("A."), "note": "a b"}]}], id="text-chunk-extra"),
        pytest.param([{"content": [_t("A"), {**_t("."), "x_meta": {"k": 1}}]}],
                     id="text-chunk-extra-later"),
        pytest.param([{"content": [_THINK]}, {"content": [{**_THINK, "note": "a b"}]}],
                     id="thinking-continued-extra"),
        pytest.param([{"content": [{**_THINK, "closed": False}]},
                      {"content": [{**_THINK, "closed": "a b"}]}],
                     id="thinking-continued-other-value"),
        pytest.param([{"reasoning_details": [{**_DETAIL, "signature": {"n": "a b"}}]}],
                     id="detail-signature-object"),
        pytest.param([{"reasoning_details": [_DETAIL]},
                      {"reasoning_details": [{**_DETAIL, "signature": ["a b"]}]}],
                     id="detail-continued-signature-list"),
        pytest.param([{"reasoning_details": [{**_DETAIL, "text": 7}]}],
                     id="detail-text-number"),
    ],
)
def test_a_value_lost_while_merging_is_dropped(deltas: list[dict[str, Any]]) -> None:
    assert _undecided(deltas), "the stream would be relayed as the upstream's bytes"


def test_merged_pieces_that_lose_nothing_drop_nothing() -> None:
    """Thinking continued (its `closed` said once, then repeated) and details continued with a
    signature: the assembled body holds all of it."""
    parser = OpenAIStreamParser()
    _feed(parser, [
        {"content": [_t("A"), _t(".")]},
        {"content": [_THINK]},
        {"content": [{**_THINK, "closed": True}]},
        {"content": [{**_THINK, "closed": True}]},
        {"reasoning_details": [_DETAIL]},
        {"reasoning_details": [{**_DETAIL, "signature": "c2ln", "text": "b"}]},
    ])
    assert parser.finish().dropped == []
    msg = parser.body()["choices"][0]["message"]
    assert msg["content"] == [
        _t("A."), {"type": "thinking", "thinking": [_t("a")] * 3, "closed": True}
    ]
    assert msg["reasoning_details"] == [{**_DETAIL, "text": "ab", "signature": "c2ln"}]


@pytest.mark.parametrize("end", ["\n", "\r\n", "\r"])
def test_an_event_line_on_the_done_event_is_dropped(end: str) -> None:
    from gateway.sse import SSEDecoder

    parser = OpenAIStreamParser()
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    frame = json.dumps({**head, "choices": [{"index": 0, "delta": {"content": "A."},
                                             "finish_reason": "stop"}]})
    raw = f"data: {frame}{end}{end}event: a b{end}data: [DONE]{end}{end}".encode()
    for event in SSEDecoder().feed(raw):
        parser.feed(event)
    assert parser.done
    assert ("sse", ("event",)) in parser.finish().dropped


@pytest.mark.parametrize(
    "delta",
    [
        pytest.param({"tool_calls": [{"index": 0, "id": "c", "function": "a b"}]},
                     id="function-string"),
        pytest.param({"tool_calls": [{"index": 0, "id": "c",
                                      "function": {"name": "f", "arguments": {"a": 1}}}]},
                     id="arguments-object"),
        pytest.param({"tool_calls": [{"index": 0, "id": "c",
                                      "function": {"name": "f", "arguments": 0}}]},
                     id="arguments-zero"),
        pytest.param({"tool_calls": [{"index": 0, "id": "c",
                                      "function": {"name": ["f"], "arguments": "{}"}}]},
                     id="name-list"),
        pytest.param({"function_call": {"name": {"x": 1}, "arguments": "{}"}},
                     id="function-call-name-object"),
        pytest.param({"function_call": {"name": "f", "arguments": ["a"]}},
                     id="function-call-arguments-list"),
    ],
)
def test_a_malformed_tool_call_delta_is_a_protocol_error(delta: dict[str, Any]) -> None:
    from gateway.errors import ProtocolError

    with pytest.raises(ProtocolError):
        _feed(OpenAIStreamParser(), [delta])


def test_tool_call_deltas_of_the_usual_shapes_are_assembled() -> None:
    parser = OpenAIStreamParser()
    _feed(parser, [
        {"tool_calls": [{"index": 0, "id": "c", "type": "function",
                         "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]},
        {"tool_calls": [{"index": 0, "function": {"name": None, "arguments": None}}]},
        {"function_call": {"name": "g", "arguments": None}},
        {"function_call": {"arguments": "{}"}},
    ])
    msg = parser.body()["choices"][0]["message"]
    assert msg["tool_calls"] == [{"id": "c", "type": "function",
                                  "function": {"name": "f", "arguments": "{}"}}]
    assert msg["function_call"] == {"name": "g", "arguments": "{}"}
    assert parser.finish().dropped == []

"""cohere-chat, the pure parts: request context (document ids, tool results, trust), native
span citations, the stream parser's event rules, partial answers whose citation offsets stay
valid (a property test), and the shipped example policy through the real gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cohere
import cohere.v2.types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.context import build_context
from gateway.errors import ProtocolError
from gateway.policy import ContextSpec, Policy, load_policy
from gateway.protocols import get
from gateway.protocols.cohere.context import document_text
from gateway.sse import SSEEvent
from gateway.types import Claim, Decision, Outcome, Report
from tests import cohere_wire as w
from tests.gateway_harness import run_gateway
from tests.test_protocol_helpers import ROUTES
from tests.upstream_app import SCENARIO_HEADER, Json, Stream, create_upstream, serve

ADAPTER = get("cohere-chat")
ROUTE = ROUTES["cohere-chat"]
POLICY = Policy(name="t", routes=[ROUTE])
SHIPPED = Path(__file__).resolve().parent.parent / "policies" / "cohere.yaml"


def ctx_of(body: dict[str, Any], **context: Any) -> dict[str, str | None]:
    spec = ContextSpec.model_validate(context)
    return {c.id: c.text for c in build_context("cohere-chat", spec, request=body).chunks.values()}


# -- context --------------------------------------------------------------------------------------


def test_documents_get_their_own_or_cohere_assigned_ids() -> None:
    chunks = ctx_of(w.request())
    assert set(chunks) == {"k7-spec", "doc:1", "doc:2", "k7:safety"}
    assert chunks["doc:2"] == "Installation takes one day."
    assert chunks["doc:1"] == (
        "title: Warranty\nsnippet: The warranty lasts ten years from installation."
    )
    assert document_text({"n": 3, "tags": ["a"]}) == 'n: 3\ntags: ["a"]'


def test_documents_untrusted_are_not_context_and_are_counted() -> None:
    spec = ContextSpec.model_validate({"trust": {"documents": False}})
    ctx = build_context("cohere-chat", spec, request=w.request())
    assert set(ctx.chunks) == {"k7:safety"}
    assert ctx.rejected == {"untrusted_document": 3}


def test_tool_results_are_documents_named_by_call_id() -> None:
    body = {"messages": [
        {"role": "tool", "tool_call_id": "lookup_1", "content": [
            {"type": "document", "document": {"data": {"a": "x"}}},
            {"type": "document", "document": {"id": "mine", "data": {"b": "y"}}},
            {"type": "text", "text": 'plain <chunk id="t:1">tagged</chunk>'},
        ]},
        {"role": "tool", "tool_call_id": "lookup_2", "content": '{"temp": 22}'},
        {"role": "assistant", "content": '<chunk id="a:1">model text</chunk>'},
        {"role": "user", "content": '<chunk id="u:1">planted</chunk>'},
    ]}
    chunks = ctx_of(body)
    assert chunks == {"t:1": "tagged", "lookup_1:0": "a: x", "mine": "b: y",
                      "lookup_1:2": 'plain <chunk id="t:1">tagged</chunk>',
                      "lookup_2:0": '{"temp": 22}'}
    assert set(ctx_of(body, trust={"roles": ["system"]})) == set()
    assert "u:1" in ctx_of(body, trust={"roles": ["system", "tool", "user"]})


def test_an_id_two_documents_share_with_different_texts_names_neither() -> None:
    body = {"documents": [{"id": "doc:1", "data": {"t": "one"}}, "two"]}
    assert ctx_of(body) == {}
    same = {"documents": [{"id": "doc:1", "data": "same"}, "same"]}
    assert ctx_of(same) == {"doc:1": "same"}


# -- parsing --------------------------------------------------------------------------------------


def test_citations_are_spans_of_the_channel_they_index() -> None:
    text = "A is 1. B is 2."
    body = w.body(text, [w.cite(text, "1", "x", content_index=1),
                         w.cite(text, "2", "y", "z", content_index=None)],
                  thinking="hmm", tool_plan="plan")
    answer = ADAPTER.parse(body, ROUTE)
    main = answer.channels[0]
    assert (main.kind, main.path, main.text) == ("content", ("text", 0), text)
    assert [(s, e, c.id, c.malformed) for s, e, c in main.native] == [
        (5, 6, "x", None), (13, 14, "y", None), (13, 14, "z", None)]
    assert [c.kind for c in answer.channels] == ["content", "reasoning", "reasoning"]
    # content_index 0 is the thinking item here: it is no text to index.
    body["message"]["citations"][0]["content_index"] = 0
    with pytest.raises(ProtocolError):
        ADAPTER.parse(body, ROUTE)


def test_a_citation_text_that_is_not_the_slice_is_malformed() -> None:
    text = "A is 1. B is 2."
    bad = w.cite(text, "1", "x")
    bad["text"] = "2"
    answer = ADAPTER.parse(w.body(text, [bad]), ROUTE)
    assert [c.malformed for _, _, c in answer.channels[0].native] == [
        "citation text is not the answer's span at its offsets"]
    released = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), Report((), "x"), POLICY)
    assert released["message"]["citations"] == []  # type: ignore[index]
    assert ADAPTER.needs_rewrite(answer, POLICY)


# -- the stream parser ----------------------------------------------------------------------------


def events(raw: bytes) -> list[SSEEvent]:
    from gateway.sse import SSEDecoder

    return SSEDecoder().feed(raw)


def test_text_is_held_until_its_citation_arrives() -> None:
    text = "One is 1. Two is 2."
    body = w.body(text, [w.cite(text, "1", "x"), w.cite(text, "2", "y")])
    parser = ADAPTER.stream_parser(ROUTE)
    seen: list[tuple[str, str]] = []
    for ev in events(w.events(body, chunk=3, citations_at_end=True)):
        seen += parser.feed(ev)
        if json.loads(ev.data)["type"] == "citation-start":
            break
    assert "".join(t for _, t in seen) == "One is 1"  # up to the first citation's end
    parser2 = ADAPTER.stream_parser(ROUTE)
    got = [d for ev in events(w.events(body, chunk=3)) for d in parser2.feed(ev)]
    assert "".join(t for _, t in got) == text
    assert parser2.finish().channels[0].text == text


@pytest.mark.parametrize(
    ("data", "event"),
    [
        ('{"type": "content-delta", "index": 0}', None),  # before message-start
        ('{"type": "message-start", "type": "x"}', None),  # duplicate key
        ('{"type": "message-start"}', "content-delta"),  # event name disagrees
        ("[1]", None),
    ],
)
def test_ambiguous_events_fail_closed(data: str, event: str | None) -> None:
    with pytest.raises(ProtocolError):
        ADAPTER.stream_parser(ROUTE).feed(SSEEvent(data=data, event=event))


def test_unknown_events_and_keys_are_recorded_not_relayed() -> None:
    text = "One is 1."
    body = w.body(text, [w.cite(text, "1", "x")])
    raw = w.events(body).replace(b"event: message-end", b'event: debug\ndata: {"type": "debug", '
                                 b'"prompt": "PLANTED"}\n\nevent: message-end')
    parser = ADAPTER.stream_parser(ROUTE)
    for ev in events(raw):
        parser.feed(ev)
    answer = parser.finish()
    assert ("stream", "debug") in answer.unknown_fields
    assert ADAPTER.needs_rewrite(answer, POLICY)
    assert "PLANTED" not in json.dumps(ADAPTER.render(
        answer, [], Outcome(Decision.RELEASED), Report((), "x"), POLICY))



def _mutated(kind: str) -> bytes:
    """A stream with a key the parser does not read for that item or call."""
    text = "One is 1."
    body = w.body(text, [w.cite(text, "1", "x", content_index=1)], thinking="Hm.",
                  tool_calls=[w.tool_call("c1", "f", {})])
    evs = w.sse_data(w.events(body))
    kinds: dict[int, str] = {}  # content index -> item type
    for e in evs:
        msg = e.get("delta", {}).get("message", {})
        if e["type"] == "tool-call-delta" and kind == "call-delta-name":
            msg["tool_calls"]["function"]["name"] = "PLANTED"
        if e["type"] not in ("content-start", "content-delta"):
            continue
        part = msg["content"]
        if e["type"] == "content-start":
            kinds[e["index"]] = part["type"]
        where = f"{kinds[e['index']]}-{e['type'].split('-')[1]}"
        if kind == f"{where}-thinking" and kinds[e["index"]] == "text":
            part["thinking"] = "PLANTED"
        if kind == f"{where}-text" and kinds[e["index"]] == "thinking":
            part["text"] = "PLANTED"
    return b"".join(w.frame(e) for e in evs)


@pytest.mark.parametrize(
    "kind",
    ["text-start-thinking", "text-delta-thinking", "thinking-start-text", "thinking-delta-text",
     "call-delta-name"],
)
def test_keys_an_item_or_call_does_not_have_are_recorded_not_relayed(kind: str) -> None:
    raw = _mutated(kind)
    assert b"PLANTED" in raw
    parser = ADAPTER.stream_parser(ROUTE)
    for ev in events(raw):
        parser.feed(ev)
    answer = parser.finish()
    assert answer.unknown_fields and ADAPTER.needs_rewrite(answer, POLICY)
    assert "PLANTED" not in json.dumps(ADAPTER.render(
        answer, [], Outcome(Decision.RELEASED), Report((), "x"), POLICY))


def test_an_empty_key_of_the_other_kind_is_no_content() -> None:
    text = "One is 1."
    evs = w.sse_data(w.events(w.body(text, [w.cite(text, "1", "x")])))
    for e in evs:
        content = e.get("delta", {}).get("message", {}).get("content")
        if isinstance(content, dict):
            content["thinking"] = ""
    parser = ADAPTER.stream_parser(ROUTE)
    for ev in events(b"".join(w.frame(e) for e in evs)):
        parser.feed(ev)
    answer = parser.finish()
    assert not answer.unknown_fields and not ADAPTER.needs_rewrite(answer, POLICY)


def test_a_tool_call_delta_function_that_is_no_object_fails() -> None:
    evs = w.sse_data(w.events(w.body("One.", tool_calls=[w.tool_call("c1", "f", {"a": 1})])))
    delta = next(e for e in evs if e["type"] == "tool-call-delta")
    delta["delta"]["message"]["tool_calls"]["function"] = "PLANTED"
    parser = ADAPTER.stream_parser(ROUTE)
    with pytest.raises(ProtocolError):
        for ev in events(b"".join(w.frame(e) for e in evs)):
            parser.feed(ev)


# -- partial answers: citation offsets stay valid -------------------------------------------------

WORDS = ["alpha", "beta", "gamma", "délta", "🔋", "ε", "zeta", "eta"]


@st.composite
def answers(
    draw: st.DrawFn,
) -> tuple[str, list[tuple[int, int]], list[dict[str, Any]], set[int]]:
    n = draw(st.integers(1, 5))
    sentences = [
        " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))).capitalize() + "."
        for _ in range(n)
    ]
    text = ""
    spans = []
    for s in sentences:
        if text:
            text += " "
        spans.append((len(text), len(text) + len(s)))
        text += s
    citations = []
    for _ in range(draw(st.integers(0, 8))):
        a = draw(st.integers(0, len(text)))
        b = draw(st.integers(a, min(len(text), a + 12)))
        citations.append({"start": a, "end": b, "text": text[a:b], "type": "TEXT_CONTENT",
                          "sources": [{"type": "document", "id": f"d{a}"}], "content_index": 0})
    kept = set(draw(st.sets(st.integers(0, n - 1))))
    return text, spans, citations, kept


@settings(max_examples=150, deadline=None)
@given(answers())
def test_partial_citations_are_slices_of_the_rebuilt_text(
    case: tuple[str, list[tuple[int, int]], list[dict[str, Any]], set[int]],
) -> None:
    text, spans, citations, kept = case
    answer = ADAPTER.parse(w.body(text, citations), ROUTE)
    claims = [Claim(i, 0, text[s:e], s, e) for i, (s, e) in enumerate(spans)]
    outcome = Outcome(Decision.PARTIAL, "hallucinated_citation", 0, "partial", frozenset(kept))
    body = ADAPTER.render(answer, claims, outcome, Report((), "x"), POLICY)
    cohere.v2.types.V2ChatResponse.model_validate(body)
    new = body["message"]["content"][0]["text"]  # type: ignore[index]
    out = body["message"].get("citations", [])  # type: ignore[attr-defined]
    for c in out:
        assert new[c["start"] : c["end"]] == c["text"]
    # Exactly the citations lying inside a kept claim survive, in order (all of them when no
    # claim of the text failed: it is not rebuilt).
    inside = [c for c in citations
              if len(kept) == len(spans) or any(s <= c["start"] and c["end"] <= e
                                                for i, (s, e) in enumerate(spans) if i in kept)]
    assert [(c["text"], c["sources"]) for c in out] == [(c["text"], c["sources"]) for c in inside]
    for i, (s, e) in enumerate(spans):
        if i not in kept and not any(text[s:e] == text[s2:e2] for j, (s2, e2) in enumerate(spans)
                                     if j in kept):
            assert text[s:e] not in new


# -- the shipped example policy -------------------------------------------------------------------


@pytest.fixture(scope="module")
def shipped() -> Iterator[str]:
    mixed = "The K7 stores 13.5 kWh. It was assembled on the Moon. Its warranty lasts ten years."
    body = w.body(mixed, [w.cite(mixed, "13.5 kWh", "k7-spec"),
                          w.cite(mixed, "on the Moon", "doc:7"),
                          w.cite(mixed, "ten years", "doc:1")])
    up = create_upstream({"json": Json(body), "sse": Stream(w.events(body, chunk=4), seed=3)})
    with serve(up) as up_url, run_gateway(up_url, [SHIPPED]) as gw:
        yield gw.url


def test_shipped_policy_strips_and_streams_progressively(shipped: str) -> None:
    loaded = load_policy(SHIPPED)
    assert loaded.policy.routes[0].protocol == "cohere-chat"
    assert loaded.policy.streaming.mode == "progressive"
    client = cohere.ClientV2(api_key="x", base_url=shipped, max_retries=0, timeout=10)
    try:
        req = w.request()
        opts: Any = {"additional_headers": {SCENARIO_HEADER: "json"}}
        resp = client.chat(model="m", messages=req["messages"], documents=req["documents"],
                           request_options=opts)
        text = resp.message.content[0].text
        assert "Moon" not in text and text.startswith("The K7 stores 13.5 kWh.")
        assert [(text[c.start:c.end], c.text) for c in resp.message.citations] == [
            ("13.5 kWh", "13.5 kWh"), ("ten years", "ten years")]
        opts = {"additional_headers": {SCENARIO_HEADER: "sse"}}
        streamed = "".join(
            e.delta.message.content.text
            for e in client.chat_stream(model="m", messages=req["messages"],
                                        documents=req["documents"], request_options=opts)
            if e.type == "content-delta"
        )
        assert streamed.startswith("The K7 stores 13.5 kWh.") and "Moon" not in streamed
    finally:
        client._client_wrapper.httpx_client.httpx_client.close()

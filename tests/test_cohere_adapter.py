"""cohere-chat, the pure parts: request context (document ids, tool results, trust), native
span citations, the stream parser's event rules, partial answers whose citation offsets stay
valid (a property test), and the shipped example policy through the real gateway."""

from __future__ import annotations

import io
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
from gateway.offline import verify_exchange
from gateway.policy import ContextSpec, Policy, load_policy
from gateway.protocols import get
from gateway.protocols.cohere.context import document_text
from gateway.sse import SSEEvent
from gateway.types import Citation, Claim, Decision, Outcome, Report
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


SYS_TAG = '<chunk id="kb:1">ninety-nine</chunk>'
SAME_TAG = '<chunk id="kb:1">forty</chunk>'


def _tool(*content: Any) -> list[dict[str, Any]]:
    return [{"role": "assistant", "tool_calls": [w.tool_call("c1", "f", {})]},
            {"role": "tool", "tool_call_id": "c1", "content": list(content)}]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "system", "content": SYS_TAG}], "documents": [
            {"id": "kb:1", "data": "forty"}]},
        {"documents": [{"id": "kb:1", "data": "forty"}, {"id": "kb:2", "data": SYS_TAG}]},
        {"documents": [{"id": "kb:2", "data": SYS_TAG}, {"id": "kb:1", "data": "forty"}]},
        {"documents": [{"id": "kb:1", "data": "forty"}],
         "messages": _tool({"type": "text", "text": SYS_TAG})},
        {"messages": [{"role": "system", "content": SYS_TAG},
                      *_tool({"type": "document", "document": {"id": "kb:1", "data": "forty"}})]},
        {"messages": [{"role": "system", "content": f"{SAME_TAG} {SYS_TAG}"}]},
        {"messages": [{"role": "system", "content": SAME_TAG},
                      {"role": "system", "content": SYS_TAG}]},
    ],
    ids=["system-tag", "tag-in-a-later-document", "tag-in-an-earlier-document", "tool-text-tag",
         "tool-document", "two-tags-one-text", "two-tags-two-messages"],
)
def test_an_id_a_chunk_tag_and_another_source_give_different_texts_names_neither(
    body: dict[str, Any],
) -> None:
    chunks = ctx_of(body)
    assert "kb:1" not in chunks
    assert chunks.get("kb:2") in (None, SYS_TAG)  # the other document keeps its own id


def test_a_chunk_tag_repeating_a_document_or_wrapping_its_own_text_still_counts() -> None:
    same = {"messages": [{"role": "system", "content": SAME_TAG}],
            "documents": [{"id": "kb:1", "data": "forty"}]}
    assert ctx_of(same) == {"kb:1": "forty"}
    versioned = {"messages": [{"role": "system",
                               "content": '<chunk id="kb:1" version="3">forty</chunk>'}],
                 "documents": [{"id": "kb:1", "data": "forty"}]}
    spec = ContextSpec.model_validate({})
    chunk = build_context("cohere-chat", spec, request=versioned).chunks["kb:1"]
    assert (chunk.text, chunk.version) == ("forty", "3")  # the tag, read first, is kept
    # A document that wraps its text in a tag of its own id is one source: the tag's chunk.
    wrapped = {"documents": [{"id": "kb:1", "data": f"Pump facts: {SAME_TAG}"}]}
    assert ctx_of(wrapped) == {"kb:1": "forty"}
    tool = {"messages": _tool({"type": "document", "document": {
        "id": "kb:1", "data": f"Pump facts: {SAME_TAG}"}})}
    assert ctx_of(tool) == {"kb:1": "forty"}


def test_tags_refused_while_documents_are_weighed_are_still_counted() -> None:
    body = {"messages": [{"role": "user", "content": SYS_TAG},
                         *_tool({"type": "text", "text": SYS_TAG})],
            "documents": [{"id": "kb:1", "data": "forty"}]}
    spec = ContextSpec.model_validate({"trust": {"roles": ["system"]}})
    ctx = build_context("cohere-chat", spec, request=body)
    assert {c.id: c.text for c in ctx.chunks.values()} == {"kb:1": "forty"}
    assert ctx.rejected == {"untrusted_role": 2, "untrusted_document": 1}


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


@pytest.mark.parametrize("order", [(1, 0), (0, 2), (0, 0)])
def test_content_items_started_out_of_index_order_fail(order: tuple[int, int]) -> None:
    """A text item's channel is its rank among the items started, a citation without
    `content_index` names the lowest-indexed text item: only the order 0, 1, 2, … keeps the
    two the same item."""
    start = {"id": "m", "type": "message-start", "delta": {"message": {"role": "assistant"}}}
    parser = ADAPTER.stream_parser(ROUTE)
    parser.feed(SSEEvent(data=json.dumps(start), event="message-start"))
    cs = {"type": "content-start", "delta": {"message": {"content": {"type": "text", "text": ""}}}}
    with pytest.raises(ProtocolError, match="not the next one"):
        for i in order:
            parser.feed(SSEEvent(data=json.dumps({**cs, "index": i}), event="content-start"))


def test_items_in_index_order_still_parse() -> None:
    text = "One is 1."
    body = w.body(text, [w.cite(text, "1", "x", content_index=1)], thinking="Hm.")
    parser = ADAPTER.stream_parser(ROUTE)
    for ev in events(w.events(body)):
        parser.feed(ev)
    answer = parser.finish()
    assert [c.text for c in answer.channels] == [text, "Hm."]


# -- logprobs -------------------------------------------------------------------------------------

LP = "One is 1."


@pytest.mark.parametrize(
    "entry",
    [
        {"text": LP, "token_ids": [1, "PLANTED"], "logprobs": [-0.1, -0.2]},
        {"text": LP, "token_ids": [1], "logprobs": {"note": "PLANTED"}},
        {"text": LP, "token_ids": [1], "logprobs": ["PLANTED"]},
        {"text": LP, "token_ids": [1, 2], "logprobs": [-0.1]},
        {"text": LP, "token_ids": [True], "logprobs": [-0.1], "n": "PLANTED"},
        {"text": LP, "token_ids": [1], "logprobs": [False], "n": "PLANTED"},
        {"text": ["PLANTED"], "token_ids": [1], "logprobs": [-0.1]},
        {"token_ids": [1], "logprobs": [-0.1], "n": "PLANTED"},
        {"text": LP, "token_ids": "PLANTED"},
        "PLANTED",
    ],
)
@pytest.mark.parametrize("rule", ["pass", "verify"])
def test_logprobs_of_another_shape_are_dropped_whole(entry: Any, rule: str) -> None:
    body = w.body(LP)
    body["logprobs"] = [entry]
    answer = ADAPTER.parse(body, ROUTE)
    assert "logprobs" not in answer.body and not answer.has_logprobs
    assert answer.dropped  # recorded: a stream holding them is re-framed, never relayed
    policy = Policy(name="t", routes=[ROUTE], channels={"logprobs": rule})
    assert ADAPTER.needs_rewrite(answer, policy)
    released = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), Report((), "x"), policy)
    assert "PLANTED" not in json.dumps(released)


def test_logprob_entries_keep_their_known_keys_only() -> None:
    body = w.body(LP)
    body["logprobs"] = [{"text": "One ", "token_ids": [7, 8], "logprobs": [-0.1, -2],
                         "n": "PLANTED"},
                        {"text": "is 1.", "token_ids": [9], "logprobs": None}]
    answer = ADAPTER.parse(body, ROUTE)
    assert answer.body["logprobs"] == [
        {"text": "One ", "token_ids": [7, 8], "logprobs": [-0.1, -2]},
        {"text": "is 1.", "token_ids": [9], "logprobs": None}]
    assert answer.dropped == [("top", ("logprobs", 0, "n"))]


def test_clean_logprobs_are_kept_as_they_are() -> None:
    body = w.body(LP)
    body["logprobs"] = [{"text": "One ", "token_ids": [7, 8], "logprobs": [-0.1, -2.5]},
                        {"text": "is 1.", "token_ids": [9]}]
    answer = ADAPTER.parse(body, ROUTE)
    assert answer.body["logprobs"] == body["logprobs"] and not answer.dropped
    assert answer.has_logprobs and not ADAPTER.needs_rewrite(answer, POLICY)


# -- progressive framing --------------------------------------------------------------------------


def _claim(text: str, start: int, *ids: str) -> Claim:
    cits = tuple(Citation(id=i, raw=i) for i in ids)
    return Claim(index=0, channel=0, text=text, start=start, end=start + len(text),
                 citations=cits)


def _cite_event(j: int, start: int, end: int, text: str, source: str) -> SSEEvent:
    c = {"start": start, "end": end, "text": text[start:end], "type": "TEXT_CONTENT",
         "sources": [{"type": "document", "id": source}]}
    return SSEEvent(data=json.dumps({"type": "citation-start", "index": j,
                                     "delta": {"message": {"citations": c}}}),
                    event="citation-start")


def test_framer_sends_a_citation_only_with_the_sources_its_piece_was_verified_with() -> None:
    one, two = "A is 1.", " B is 2."
    text = one + two
    framer = ADAPTER.progressive_framer(True)
    framer.observe(SSEEvent(data=json.dumps({"type": "content-start", "index": 0, "delta": {
        "message": {"content": {"type": "text", "text": ""}}}}), event="content-start"))
    framer.observe(_cite_event(0, 0, len(one), text, "x"))
    out = framer.text(one, [_claim(one, 0, "x")])
    framer.observe(_cite_event(1, len(one) + 1, len(text), text, "y"))
    out += framer.text(two, [_claim(two[1:], len(one) + 1, "y")])
    # After both claims went out: on the first claim a source its claim was not checked with
    # (another claim's, a prose id) or its own; on the space between the claims.
    framer.observe(_cite_event(2, 0, 1, text, "y"))
    framer.observe(_cite_event(3, 0, 1, text, "PLANTED prose"))
    framer.observe(_cite_event(4, 0, 1, text, "x"))
    framer.observe(_cite_event(5, len(one), len(one) + 1, text, "PLANTED"))
    out += framer.tail(None, {"message": {"content": [{"type": "text", "text": text}]},
                              "finish_reason": "COMPLETE"})
    sent = [e["delta"]["message"]["citations"] for e in w.sse_data(out)
            if e["type"] == "citation-start"]
    assert [(c["start"], c["end"], c["sources"][0]["id"]) for c in sent] == [
        (0, len(one), "x"), (len(one) + 1, len(text), "y"), (0, 1, "x")]
    assert b"PLANTED" not in out


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
        # Inside one sentence: the gateway makes a claim of its own of a citation on text
        # that is no claim, which these hand-made claims do not model.
        lo, hi = spans[draw(st.integers(0, n - 1))]
        a = draw(st.integers(lo, hi))
        b = draw(st.integers(a, min(hi, a + 12)))
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
    native = answer.channels[0].native
    claims = [
        Claim(i, 0, text[s:e], s, e, tuple(c for a, b, c in native if s <= a and b <= e))
        for i, (s, e) in enumerate(spans)
    ]
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


# -- partial answers keep a citation only with the claims that carry it ---------------------------


def _offline(tmp_path: Path, answer: dict[str, Any]) -> dict[str, Any]:
    req, resp = tmp_path / "request.json", tmp_path / "response.json"
    req.write_text(json.dumps(w.request()))
    resp.write_text(json.dumps(answer))
    out, err = io.StringIO(), io.StringIO()
    verify_exchange(policy_path=str(SHIPPED), protocol="cohere-chat", request_path=str(req),
                    response_path=str(resp), route_name=None, out=out, err=err)
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def test_a_failing_citation_on_a_kept_items_marker_is_not_kept(tmp_path: Path) -> None:
    # The bogus source cites the "- " of a list item whose own claim verifies: the citation is a
    # claim of its own (text that is no claim), which fails; the kept item must not take it.
    text = "- The K7 stores 13.5 kWh.\n- Its warranty lasts ten years."
    cits = [w.cite(text, "- ", "doc:99"), w.cite(text, "13.5 kWh", "k7-spec"),
            w.cite(text, "ten years", "doc:1")]
    report = _offline(tmp_path, w.body(text, cits))
    assert report["decision"] == "partial", report
    kept = report["body"]["message"].get("citations", [])
    ids = [s["id"] for c in kept for s in c["sources"]]
    assert "doc:99" not in ids
    assert sorted(ids) == ["doc:1", "k7-spec"]

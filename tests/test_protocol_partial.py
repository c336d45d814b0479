"""Partial answers: failing claims' text must not survive anywhere in the rendered body."""

from __future__ import annotations

import json

import anthropic.types
import openai.types.chat

from gateway.policy import Channels
from gateway.protocols import ADAPTERS
from gateway.protocols.base import rebuild_text
from gateway.types import Citation, Claim, Decision, Outcome, Report
from tests.test_protocol_helpers import POLICY, claims_for, parse_json

REPORT = Report(claims=(), context="x")
DISCLOSURE = POLICY.release.templates.partial


def partial(kept: set[int]) -> Outcome:
    return Outcome(
        Decision.PARTIAL,
        reason="hallucinated_citation",
        claim_index=1,
        template="partial",
        kept=frozenset(kept),
    )


def test_rebuild_joins_sentences_with_space_and_keeps_list_items() -> None:
    text = "Intro:\n- A is true [a:1].\n- B is false [b:1].\n- C holds [c:1]."
    cs = [
        Claim(i, 0, t, text.index(t), text.index(t) + len(t))
        for i, t in enumerate(["A is true [a:1].", "C holds [c:1]."])
    ]
    assert rebuild_text(text, cs, "D.") == "- A is true [a:1].\n- C holds [c:1].\n\nD."
    s = "One [a:1]. Two [b:1]. Three [c:1]."
    cs = [Claim(0, 0, "One [a:1].", 0, 10), Claim(2, 0, "Three [c:1].", 22, 34)]
    assert rebuild_text(s, cs, None) == "One [a:1]. Three [c:1]."
    assert rebuild_text(s, [], "D.") == "D."


def _span(text: str, part: str, index: int = 0) -> Claim:
    at = text.index(part)
    return Claim(index, 0, part, at, at + len(part))


def test_rebuild_same_line() -> None:
    text = "One [a:1]. Bad [z:9]. Three [b:2]."
    kept = [_span(text, "One [a:1]."), _span(text, "Three [b:2].")]
    assert rebuild_text(text, kept, "Note.") == "One [a:1]. Three [b:2].\n\nNote."


def test_rebuild_list_items_and_paragraphs() -> None:
    # A list item keeps its marker on its own line; a paragraph break becomes a line break.
    text = "Intro [a:1].\n\n- one [a:1]\n- bad [z:9]\n- three [b:2]\n\nOutro [c:1]."
    kept = [_span(text, p) for p in ("Intro [a:1].", "one [a:1]", "three [b:2]", "Outro [c:1].")]
    assert rebuild_text(text, kept, None) == (
        "Intro [a:1].\n- one [a:1]\n- three [b:2]\nOutro [c:1]."
    )


def test_rebuild_numbered_items() -> None:
    text = "1. first [a:1]\n2. second [b:2]"
    assert rebuild_text(text, [_span(text, "second [b:2]")], "D") == "2. second [b:2]\n\nD"
    assert rebuild_text(text, [], "D") == "D"


def test_openai_partial_removes_claim_from_every_choice_reasoning_and_logprobs() -> None:
    adapter = ADAPTERS["openai-chat"]
    answer = parse_json("openai-chat", "partial.json")
    bad = "Employees also get a yearly bonus of 2,000 dollars [hr:bonus]."
    claims = claims_for(
        answer,
        0,
        [
            "Full-time employees get 25 days of paid annual leave per year [hr:leave].",
            bad,
            "The VPN client must be updated every 90 days [it:vpn].",
        ],
    )
    policy = POLICY.model_copy(update={"channels": Channels(reasoning="pass", logprobs="pass")})
    body = adapter.render(answer, claims, partial({0, 2}), REPORT, policy)
    openai.types.chat.ChatCompletion.model_validate(body)
    msg = body["choices"][0]["message"]  # type: ignore[index]
    assert msg["content"] == (
        "Full-time employees get 25 days of paid annual leave per year [hr:leave]. "
        "The VPN client must be updated every 90 days [it:vpn].\n\n" + DISCLOSURE
    )
    assert "bonus" not in json.dumps(body)


def test_openai_partial_sweeps_unverified_channels_and_drops_tool_calls() -> None:
    adapter = ADAPTERS["openai-chat"]
    answer = parse_json("openai-chat", "n2_reasoning_logprobs.json")
    body_in = answer.body
    leaked = "Employees may work remotely up to 3 days per week with manager approval [hr:remote]."
    # Choice 1's only claim fails; choice 0 keeps all of its claims.
    c0 = claims_for(
        answer, 0, ["Full-time employees get 25 days of paid annual leave per year [hr:leave]."]
    )
    idx1 = next(i for i, c in enumerate(answer.channels) if c.choice == 1 and c.kind == "content")
    c1 = claims_for(answer, idx1, [leaked], first_index=1)
    policy = POLICY.model_copy(update={"channels": Channels(reasoning="pass", logprobs="pass")})
    body = adapter.render(answer, [*c0, *c1], partial({0}), REPORT, policy)
    openai.types.chat.ChatCompletion.model_validate(body)
    dumped = json.dumps(body)
    assert "Employees may work remotely" not in dumped
    assert "You can work remotely" in dumped  # choice 0 is untouched
    assert all(ch["logprobs"] is None for ch in body["choices"])  # type: ignore[union-attr]
    assert body_in["choices"][0]["logprobs"] is not None  # type: ignore[index]
    # Reasoning passes by policy and does not repeat the failed claim: it survives.
    assert "reasoning_content" in body["choices"][0]["message"]  # type: ignore[index]

    tool = parse_json("openai-chat", "tool_call.json")
    tool_claims = claims_for(tool, 0, ["Remote work is allowed up to 3 days per week [hr:remote]."])
    out = adapter.render(tool, tool_claims, partial(set()), REPORT, POLICY)
    openai.types.chat.ChatCompletion.model_validate(out)
    assert "tool_calls" not in out["choices"][0]["message"]  # type: ignore[index]
    assert out["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]


def test_openai_partial_keeps_annotations_of_kept_text_with_shifted_offsets() -> None:
    adapter = ADAPTERS["openai-chat"]
    answer = parse_json("openai-chat", "annotations_unknown_field.json")
    first = "Full-time employees get 25 days of paid annual leave per year [hr:leave]."
    second = "You can work remotely up to 3 days per week with manager approval [hr:remote]."
    claims = claims_for(answer, 0, [first, second])
    body = adapter.render(answer, claims, partial({0}), REPORT, POLICY)
    openai.types.chat.ChatCompletion.model_validate(body)
    msg = body["choices"][0]["message"]  # type: ignore[index]
    assert [a["url_citation"]["start_index"] for a in msg["annotations"]] == [0]
    assert "x_vendor_trace" not in msg
    dropped = adapter.render(answer, claims, partial({1}), REPORT, POLICY)
    assert dropped["choices"][0]["message"]["annotations"] == []  # type: ignore[index]


def test_openai_released_withholds_reasoning_and_unknown_fields() -> None:
    adapter = ADAPTERS["openai-chat"]
    good = parse_json("openai-chat", "good.json")
    assert not adapter.needs_rewrite(good, POLICY)
    multi = parse_json("openai-chat", "n2_reasoning_logprobs.json")
    assert multi.has_logprobs and adapter.needs_rewrite(multi, POLICY)
    body = adapter.render(multi, [], Outcome(Decision.RELEASED), REPORT, POLICY)
    assert "reasoning_content" not in json.dumps(body)
    # Its logprobs hold one token, "Full": they do not spell the released content.
    assert body["choices"][0]["logprobs"] is None  # type: ignore[index]
    unknown = parse_json("openai-chat", "annotations_unknown_field.json")
    assert unknown.unknown_fields == [("choices", 0, "message", "x_vendor_trace")]
    assert adapter.needs_rewrite(unknown, POLICY)
    allow = POLICY.model_copy(update={"channels": Channels(allow_fields=["x_vendor_trace"])})
    # Allow-listing the unknown field does not bring back its annotation's title.
    assert [level for level, _ in unknown.dropped] == ["annotation"]
    assert adapter.needs_rewrite(unknown, allow)


def test_anthropic_partial_rebuilds_blocks_and_keeps_citations_of_kept_claims() -> None:
    adapter = ADAPTERS["anthropic-messages"]
    answer = parse_json("anthropic-messages", "native_partial.json")
    ch = answer.channels[0]
    natives = [c for _, _, c in ch.native]
    keep_text = "Full-time employees receive 25 days of paid annual leave per year."
    bad_text = "Unused leave is paid out in cash."
    vpn = "The VPN client must be updated every 90 days [it:vpn]."
    claims = claims_for(answer, 0, [keep_text, bad_text, vpn])
    claims[0] = Claim(0, 0, keep_text, claims[0].start, claims[0].end, (natives[0],))
    claims[1] = Claim(1, 0, bad_text, claims[1].start, claims[1].end, (natives[1],))
    body = adapter.render(answer, claims, partial({0, 2}), REPORT, POLICY)
    anthropic.types.Message.model_validate(body)
    assert "paid out in cash" not in json.dumps(body)
    blocks = body["content"]
    assert isinstance(blocks, list)
    assert "".join(b["text"] for b in blocks) == f"{keep_text} {vpn}\n\n{DISCLOSURE}"
    cited = [b for b in blocks if b.get("citations")]
    assert len(cited) == 1 and cited[0]["text"].startswith("Full-time")
    reparsed = adapter.parse(body, None)  # type: ignore[arg-type]
    ((start, end, _),) = reparsed.channels[0].native
    assert reparsed.channels[0].text[start:end] == cited[0]["text"]


def test_anthropic_partial_drops_tool_use_and_withholds_thinking() -> None:
    adapter = ADAPTERS["anthropic-messages"]
    answer = parse_json("anthropic-messages", "thinking_tool_use.json")
    kinds = [c.kind for c in answer.channels]
    assert kinds == ["content", "reasoning", "tool_arguments"]
    assert adapter.needs_rewrite(answer, POLICY)
    tool_claim = Claim(1, 2, "The VPN client must be updated every 90 days [it:vpn].", 0, 10)
    body = adapter.render(answer, [tool_claim], partial(set()), REPORT, POLICY)
    anthropic.types.Message.model_validate(body)
    types_ = [b["type"] for b in body["content"]]  # type: ignore[union-attr]
    # The tool call went: the answer says it is partial (DESIGN §5), after its own text.
    assert types_ == ["text", "text", "text"] and body["stop_reason"] == "end_turn"
    assert body["content"][-1]["text"] == "\n\n" + POLICY.release.templates.partial  # type: ignore[index]
    released = adapter.render(answer, [], Outcome(Decision.RELEASED), REPORT, POLICY)
    assert [b["type"] for b in released["content"]] == ["text", "text", "tool_use"]  # type: ignore[union-attr]


def test_anthropic_unknown_blocks_and_redacted_thinking_are_dropped() -> None:
    adapter = ADAPTERS["anthropic-messages"]
    answer = parse_json("anthropic-messages", "redacted_unknown_block.json")
    # A block of an unknown type leaves the content list as the answer is parsed.
    assert answer.dropped == [("content_block", ("content", 2))]
    body = adapter.render(answer, [], Outcome(Decision.RELEASED), REPORT, POLICY)
    assert [b["type"] for b in body["content"]] == ["text"]  # type: ignore[union-attr]


def test_anthropic_native_spans_cover_their_blocks() -> None:
    answer = parse_json("anthropic-messages", "native_good.json")
    ch = answer.channels[0]
    assert [
        (ch.text[s:e], c.native.document_index if c.native else None) for s, e, c in ch.native
    ] == [
        ("full-time employees receive 25 days of paid annual leave per year", 0),
        ("Remote work is allowed up to 3 days per week with manager approval", 0),
        ("Laptops are replaced every 4 years", 1),
    ]


def test_rag_json_partial_answer_and_structured_claims() -> None:
    adapter = ADAPTERS["rag-json"]
    answer = parse_json("rag-json", "hallucinated.json")
    bad = "Leave can be carried over indefinitely [hr:carryover]."
    claims = claims_for(
        answer,
        0,
        ["Full-time employees get 25 days of paid annual leave per year [hr:leave].", bad],
    )
    body = adapter.render(answer, claims, partial({0}), REPORT, POLICY)
    assert "carried over" not in json.dumps(body)
    assert body["answer"] == (
        "Full-time employees get 25 days of paid annual leave per year [hr:leave].\n\n" + DISCLOSURE
    )
    assert body["sources"] == answer.body["sources"]

    structured = parse_json("rag-json", "claims_partial.json")
    ch = structured.channels[0]
    assert ch.structured is not None and ch.structured[1][1] == ("hr:approvals",)
    sc = [
        Claim(i, 0, t, 0, len(t), tuple(Citation(id=x, raw=x) for x in ids))
        for i, (t, ids) in enumerate(ch.structured)
    ]
    out = adapter.render(structured, sc, partial({0}), REPORT, POLICY)
    assert "24 hours" not in json.dumps(out)
    assert [c["text"] for c in out["claims"]] == [ch.structured[0][0], DISCLOSURE]  # type: ignore[union-attr]

    abstain = adapter.render(
        structured, sc, Outcome(Decision.ABSTAINED, template="no_evidence"), REPORT, POLICY
    )
    assert abstain["claims"] == [] and abstain["answer"] == POLICY.release.templates.no_evidence


def test_rag_json_numeric_context_and_usage_free() -> None:
    answer = parse_json("rag-json", "numeric.json")
    assert answer.channels[0].text.endswith("[1].")

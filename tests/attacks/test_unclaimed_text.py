"""Text that no ordinary claim carries is still checked: a native citation on a block that is
no claim (whitespace, a title) or on an exempt phrase, a marker citation on an exempt phrase,
and prose in tool-call arguments that dodges the prose test (no period, a closing quote or an
ellipsis after it, a sentence written as an object key). The marker is in what must not go
out; positive controls show the same shapes with correct content are still released."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from gateway.demo import responses_wire as rw
from tests import bedrock_wire as w
from tests.attacks import gemini_spec
from tests.attacks.bedrock_spec import BEDROCK, CLAIM, events, framed, with_document
from tests.attacks.conftest import run_case
from tests.attacks.harness import MARKER, GatewayProcess, RawResponse, assert_no_leak
from tests.attacks.protocols import (
    ANTHROPIC,
    CHUNK_TEXT,
    GOOD,
    OPENAI,
    QUESTION,
    REGISTRY,
    Mode,
    _an_body,
    _an_tool_plant,
    _oa_tool_plant,
    _with_document,
)
from tests.attacks.responses_spec import RESPONSES, body
from tests.attacks.responses_spec import events as responses_events
from tests.attacks.responses_spec import framed as responses_framed
from tests.upstream_app import FakeUpstream, Json, Stream

MODES: tuple[Mode, ...] = ("json", "buffer", "progressive")
BAD_CITED = f"The pump was designed by {MARKER} in 1931."


def _decision(resp: RawResponse) -> str | None:
    return resp.header("x-citewarden-decision")


# --------------------------------------------------------------------------------------------
# Native citations on text that is no claim
# --------------------------------------------------------------------------------------------


def _an_cit(cited: str = CHUNK_TEXT, index: int = 0) -> dict[str, Any]:
    return {"type": "char_location", "cited_text": cited, "document_index": index,
            "start_char_index": 0, "end_char_index": len(CHUNK_TEXT)}


def _br_cit(cited: str = CHUNK_TEXT, index: int = 0) -> dict[str, Any]:
    return {"sourceContent": [{"text": cited}],
            "location": {"documentChar": {"documentIndex": index, "start": 0,
                                          "end": len(CHUNK_TEXT)}}}


def _blocks(cit: dict[str, Any], claim_cit: dict[str, Any]) -> dict[str, list[tuple[str, Any]]]:
    """(text, citation) blocks per shape: the citation `cit` rides on text that is no claim."""
    return {
        "whitespace-block": [(CLAIM, claim_cit), (" ", cit)],
        "exempt-block": [("I don't know.", cit)],
        "title-block": [("# Pump overview\n\n", cit), (CLAIM, claim_cit)],
    }


def _anthropic(blocks: list[tuple[str, Any]], mode: Mode) -> Json | Stream:
    from gateway.demo import wire
    from gateway.protocols.anthropic_messages.render import stream_events

    b = _an_body("x")
    b["content"] = [{"type": "text", "text": t, "citations": [c]} for t, c in blocks]
    if mode == "json":
        return Json(b)
    frames = wire.anthropic_frames([(e["type"], e) for e in stream_events(b)])
    return Stream(frames, seed=3, max_piece=97, delay=0.0)


def _bedrock(blocks: list[tuple[str, Any]], mode: Mode) -> Json | Stream:
    cited = [w.cited(t, c) for t, c in blocks]
    if mode == "json":
        return Json(w.body(*cited))
    return Stream(framed(events(cited)), seed=3, max_piece=97, delay=0.0)


NATIVE: dict[str, tuple[Any, Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {
    "anthropic-messages": (ANTHROPIC, _anthropic, _an_cit, _with_document),
    "bedrock-converse": (BEDROCK, _bedrock, _br_cit, with_document),
}


def _native_case(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    protocol: str,
    mode: Mode,
    shape: str,
    cit: dict[str, Any],
) -> RawResponse:
    spec, build, make_cit, with_doc = NATIVE[protocol]
    blocks = _blocks(cit, make_cit())[shape]
    req = with_doc(spec.request(QUESTION, mode != "json"))
    return run_case(gateway, upstream, spec, mode, build(copy.deepcopy(blocks), mode), request=req)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", ["whitespace-block", "exempt-block", "title-block"])
@pytest.mark.parametrize("protocol", list(NATIVE))
def test_a_native_citation_on_no_claim_is_checked(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    protocol: str,
    mode: Mode,
    shape: str,
) -> None:
    bad = NATIVE[protocol][2](BAD_CITED, 7)  # upstream prose as cited text, no such document
    resp = _native_case(gateway, upstream, protocol, mode, shape, bad)
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", ["whitespace-block", "exempt-block", "title-block"])
@pytest.mark.parametrize("protocol", list(NATIVE))
def test_a_correct_native_citation_on_no_claim_is_released(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    protocol: str,
    mode: Mode,
    shape: str,
) -> None:
    good = NATIVE[protocol][2]()
    resp = _native_case(gateway, upstream, protocol, mode, shape, good)
    assert resp.status == 200, resp.raw[:800]
    assert _decision(resp) in ("released", "progressive"), resp.raw[:800]
    assert CHUNK_TEXT.encode() in resp.body or b"cited_text" not in resp.body


def _responses_annotated(text: str, start: int, url: str, mode: Mode) -> Json | Stream:
    b = body(text)
    b["output"][0]["content"][0]["annotations"] = [
        {"type": "url_citation", "url": url, "title": "", "start_index": start,
         "end_index": start + 1}
    ]
    if mode == "json":
        return Json(b)
    return Stream(responses_framed(responses_events(b)), seed=7, max_piece=256, delay=0.0)


TWO_CLAIMS = f"{GOOD}  {GOOD}"
GAPS = {"after-the-last-claim": (f"{GOOD}  ", len(GOOD) + 1),
        "between-claims": (TWO_CLAIMS, len(GOOD) + 1)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gap", list(GAPS))
def test_a_responses_annotation_on_text_no_claim_carries_is_checked(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode, gap: str
) -> None:
    text, at = GAPS[gap]
    url = f"https://example.com/the-pump-was-built-by-{MARKER}"
    resp = run_case(gateway, upstream, RESPONSES, mode, _responses_annotated(text, at, url, mode))
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize("mode", MODES)
def test_two_citations_on_one_span_no_claim_carries_are_checked_not_a_crash(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], mode: Mode
) -> None:
    """Two correct citations on a title: their spans tie, and ordering them once compared
    the citations themselves (a crash in the verifier, so a correct answer abstained)."""
    from gateway.demo import wire
    from gateway.protocols.anthropic_messages.render import stream_events

    b = _an_body("x")
    b["content"] = [
        {"type": "text", "text": "# Pump overview\n\n", "citations": [
            _an_cit(), {**_an_cit(CHUNK_TEXT[:9]), "end_char_index": 9}]},
        {"type": "text", "text": CLAIM, "citations": [_an_cit()]},
    ]
    behaviour: Json | Stream = Json(b) if mode == "json" else Stream(
        wire.anthropic_frames([(e["type"], e) for e in stream_events(b)]),
        seed=3, max_piece=97, delay=0.0)
    req = _with_document(ANTHROPIC.request(QUESTION, mode != "json"))
    resp = run_case(gateway, upstream, ANTHROPIC, mode, behaviour, request=req)
    assert resp.status == 200, resp.raw[:800]
    assert _decision(resp) in ("released", "progressive"), resp.raw[:800]
    assert CLAIM in ANTHROPIC.answer_text(resp)


# --------------------------------------------------------------------------------------------
# A citation on an exempt phrase
# --------------------------------------------------------------------------------------------


def _modes(protocols: list[str]) -> list[Any]:
    return [
        pytest.param(REGISTRY[p], m, id=f"{p}-{m}")
        for p in protocols
        for m in REGISTRY[p].mode_free
    ]


@pytest.mark.parametrize(("spec", "mode"), _modes(list(REGISTRY)))
def test_an_exempt_phrase_that_cites_is_checked(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: Any, mode: Mode
) -> None:
    behaviour = spec.good(f"{GOOD}\n\nI don't know [kb:{MARKER}].").behaviour(mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize(("spec", "mode"), _modes(["openai-chat", "anthropic-messages"]))
def test_an_exempt_phrase_that_cites_a_real_chunk_is_released(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: Any, mode: Mode
) -> None:
    text = f"{GOOD}\n\nI don't know [kb:1]."
    behaviour = spec.good(text).behaviour(mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:800]
    assert _decision(resp) in ("released", "progressive"), resp.raw[:800]
    assert "I don't know [kb:1]." in spec.answer_text(resp)


LONE_MARKERS = {
    "lone-marker-line": f"{GOOD}\n\n[kb:{MARKER}]",
    "lone-marker-list-item": f"- {GOOD}\n- [kb:{MARKER}]",
}


@pytest.mark.parametrize("name", list(LONE_MARKERS))
@pytest.mark.parametrize(("spec", "mode"), _modes(list(REGISTRY)))
def test_a_lone_citation_marker_is_checked(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: Any, mode: Mode, name: str
) -> None:
    behaviour = spec.good(LONE_MARKERS[name]).behaviour(mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize(("spec", "mode"), _modes(["openai-chat", "anthropic-messages"]))
def test_a_lone_marker_citing_a_real_chunk_is_released(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: Any, mode: Mode
) -> None:
    behaviour = spec.good(f"{GOOD}\n\n[kb:1]").behaviour(mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:800]
    assert _decision(resp) in ("released", "progressive"), resp.raw[:800]
    assert spec.answer_text(resp).endswith("[kb:1]")


# --------------------------------------------------------------------------------------------
# Prose in tool-call arguments
# --------------------------------------------------------------------------------------------

UNPUNCTUATED = f"The Orbit pump was designed by {MARKER} in 1931"
ARGUMENTS: dict[str, dict[str, Any]] = {
    "no-period": {"summary": UNPUNCTUATED},
    "quote-after-period": {"summary": f'He wrote "{UNPUNCTUATED}."'},
    "ellipsis": {"summary": f"{UNPUNCTUATED}…"},
    "sentence-as-key": {f"{UNPUNCTUATED}.": True},
}
KEYWORDS = {"query": "Orbit pump flow rate"}  # a search query is no claim


def _gemini_tool(args: dict[str, Any], mode: Mode) -> Json | None:
    if mode != "json":
        return None
    b = gemini_spec.body(GOOD)
    b["candidates"][0]["content"]["parts"].append({"functionCall": {"name": "lookup",
                                                                    "args": args}})
    return Json(b)


def _bedrock_tool(args: dict[str, Any], mode: Mode) -> Json | None:
    if mode != "json":
        return None
    return Json(w.body({"text": GOOD}, {"toolUse": {"toolUseId": "tu_1", "name": "lookup",
                                                    "input": args}}, stop="tool_use"))


def _cohere_tool(args: dict[str, Any], mode: Mode) -> Json | None:
    if mode != "json":
        return None
    from tests import cohere_wire

    return Json(cohere_wire.body(
        GOOD, tool_calls=[cohere_wire.tool_call("call_1", "lookup", args)]
    ))


def _openai_tool(args: dict[str, Any], mode: Mode) -> Json | Stream | None:
    return _oa_tool_plant(function={"arguments": json.dumps(args)}).behaviour(mode)


def _anthropic_tool(args: dict[str, Any], mode: Mode) -> Json | Stream | None:
    block = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": args}
    return _an_tool_plant(block, json.dumps(args)).behaviour(mode)


def _responses_tool(args: dict[str, Any], mode: Mode) -> Json | Stream | None:
    item = rw.function_call_item("lookup", json.dumps(args), id="fc_1", call_id="call_1")
    b = body(GOOD, item)
    if mode == "json":
        return Json(b)
    return Stream(responses_framed(responses_events(b)), seed=7, max_piece=256, delay=0.0)


TOOLS: dict[str, tuple[Any, Callable[[dict[str, Any], Mode], Json | Stream | None]]] = {
    "openai-chat": (OPENAI, _openai_tool),
    "openai-responses": (RESPONSES, _responses_tool),
    "anthropic-messages": (ANTHROPIC, _anthropic_tool),
    "gemini": (REGISTRY["gemini"], _gemini_tool),
    "bedrock-converse": (BEDROCK, _bedrock_tool),
    "cohere-chat": (REGISTRY["cohere-chat"], _cohere_tool),
}


def _tool_cases(names: list[str]) -> list[Any]:
    return [
        pytest.param(p, m, n, id=f"{p}-{m}-{n}")
        for p, (spec, build) in TOOLS.items()
        for m in MODES
        if build(KEYWORDS, m) is not None
        for n in names
    ]


@pytest.mark.parametrize(("protocol", "mode", "name"), _tool_cases(list(ARGUMENTS)))
def test_prose_in_tool_arguments_is_checked(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    protocol: str,
    mode: Mode,
    name: str,
) -> None:
    spec, build = TOOLS[protocol]
    behaviour = build(copy.deepcopy(ARGUMENTS[name]), mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status != 500, resp.raw[:800]
    assert_no_leak(resp)


@pytest.mark.parametrize(("protocol", "mode", "name"), _tool_cases(["keywords"]))
def test_a_keyword_query_in_tool_arguments_is_released(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    protocol: str,
    mode: Mode,
    name: str,
) -> None:
    spec, build = TOOLS[protocol]
    behaviour = build(dict(KEYWORDS), mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:800]
    assert _decision(resp) in ("released", "progressive"), resp.raw[:800]
    assert b"Orbit pump flow rate" in resp.body


# --------------------------------------------------------------------------------------------
# A citation that arrives after its claim went out
# --------------------------------------------------------------------------------------------


def _late_citation_frames(late: dict[str, Any]) -> list[bytes]:
    """One text block: a good citation, the claim, the next sentence, then `late`."""
    from gateway.demo import wire

    events = [(n, d) for n, d in wire.anthropic_events(
        ["x"], id="msg_attack", model="claude-fake", usage=wire.Usage(20, 10))]
    head = [e for e in events if e[0] == "message_start"]
    tail = [e for e in events if e[0] in ("message_delta", "message_stop")]

    def delta(d: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d})

    body = [
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": "",
                                                   "citations": []}}),
        delta({"type": "citations_delta", "citation": _an_cit()}),
        delta({"type": "text_delta", "text": CLAIM + " "}),
        delta({"type": "text_delta", "text": "It moves water. "}),
        delta({"type": "citations_delta", "citation": late}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ]
    return wire.anthropic_frames([*head, *body, *tail])


def test_a_late_citation_that_checks_out_ends_the_stream_normally(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """A claim judged again when its stream ends (its citations grew) that still checks out
    ends the stream as usual."""
    frames = _late_citation_frames(_an_cit())
    req = _with_document(ANTHROPIC.request(QUESTION, True))
    resp = run_case(gateway, upstream, ANTHROPIC, "progressive",
                    Stream(frames, seed=3, max_piece=4096, delay=0.0), request=req)
    assert resp.status == 200, resp.raw[:800]
    assert b"message_stop" in resp.body and b"event: error" not in resp.body, resp.body[-800:]


# --------------------------------------------------------------------------------------------
# A partial answer says so, whatever channel lost the claim
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("protocol", "mode", "name"), _tool_cases(["failing-tool-call"]))
def test_a_partial_answer_that_lost_only_a_tool_call_carries_the_disclosure(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    protocol: str,
    mode: Mode,
    name: str,
) -> None:
    """DESIGN §5: partial means failing claims removed and the disclosure appended."""
    from gateway.policy.model import Templates

    spec, build = TOOLS[protocol]
    behaviour = build({"note": f"The Orbit pump was designed by {MARKER} in 1931 [kb:404]."}, mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert Templates().partial in spec.answer_text(resp), resp.body[-1500:]


@pytest.mark.parametrize("where", ["before-end", "after-end"])
def test_a_released_claim_that_a_late_citation_fails_ends_the_stream_with_an_error(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], where: str
) -> None:
    """DESIGN §5: never a clean end after a claim that fails. A Cohere citation with a source
    not in the context, inside the first claim, arrives after that claim went out: judged
    whole, the claim fails; what went out cannot be taken back, so the stream ends with the
    error event (its citation never goes out, either)."""
    from tests.attacks.test_cohere_more import COHERE, _late, _stream

    resp = run_case(gateway, upstream, COHERE, "progressive",
                    _stream(_late(f"{MARKER}:404", where)))
    assert resp.status == 200, resp.raw[:800]
    assert_no_leak(resp)
    assert b'"finish_reason": "COMPLETE"' not in resp.body, resp.body[-800:]
    assert b'"finish_reason": "ERROR"' in resp.body, resp.body[-800:]

"""bedrock-converse, the pure parts: trusted context, native citation checks, the stream
parser's guards, path-chosen streaming, the shipped policy and the `release.retry` lint."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import pytest

from gateway import paths
from gateway.errors import ProtocolError
from gateway.pipeline import RoutePipeline
from gateway.policy import check_paths, load_policies, load_policy
from gateway.protocols import ADAPTERS
from gateway.protocols.bedrock.codec import BedrockCodec
from gateway.sse import SSEEvent
from tests import bedrock_wire as w

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "policies" / "bedrock.yaml"
ADAPTER = ADAPTERS["bedrock-converse"]


def _pipeline(tmp_path: Path) -> RoutePipeline:
    loaded = load_policy(SHIPPED)
    return RoutePipeline(loaded, loaded.policy.routes[0])


def _judge(p: RoutePipeline, request: dict[str, Any], body: dict[str, Any]) -> tuple[str, Any]:
    answer = ADAPTER.parse(body, p.route)
    judgement = p.judge(answer, p.context(request, body, None))
    return judgement.outcome.decision.value, judgement.outcome.reason


CAP = w.char_citation(w.CAPACITY)


# -- context ----------------------------------------------------------------------------------


def test_chunk_tags_count_only_from_trusted_places(tmp_path: Path) -> None:
    p = _pipeline(tmp_path)
    tag = '<chunk id="k7:w">The K7 weighs 114 kg.</chunk>'
    answer = w.body({"text": "The K7 weighs 114 kg [k7:w]."})
    in_system = w.request("q", w.document(), system=[tag])
    in_user = w.request("q " + tag, w.document())
    in_tool = {"messages": [
        {"role": "user", "content": [{"text": "q"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f",
                                                       "input": {}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t1",
                                                     "content": [{"text": tag}]}}]},
    ]}
    in_assistant = {"messages": [{"role": "assistant", "content": [{"text": tag}]}]}
    assert _judge(p, in_system, answer)[0] == "released"
    assert _judge(p, in_tool, answer)[0] == "released"
    assert _judge(p, in_user, answer) == ("blocked", "hallucinated_citation")
    assert _judge(p, in_assistant, answer) == ("blocked", "hallucinated_citation")
    ctx = p.context(in_user, None, None)
    assert ctx.rejected == {"untrusted_role": 1}


def test_documents_are_context_only_where_trusted_and_cited(tmp_path: Path) -> None:
    answer = w.body(w.cited(w.CAPACITY, CAP))
    p = _pipeline(tmp_path)
    assert _judge(p, w.request("q", w.document()), answer)[0] == "released"
    # citations not enabled on the document: nothing to point at
    assert _judge(p, w.request("q", w.document(citations=False)), answer) == (
        "blocked", "hallucinated_citation")
    # a document in an assistant turn is numbered but never context
    shifted = {"messages": [
        {"role": "assistant", "content": [w.document()]},
        {"role": "user", "content": [w.document(), {"text": "q"}]},
    ]}
    cite_second = w.body(w.cited(w.CAPACITY, w.char_citation(w.CAPACITY, index=1)))
    assert _judge(p, shifted, cite_second)[0] == "released"
    assert _judge(p, shifted, answer) == ("blocked", "hallucinated_citation")
    loaded = load_policy(
        _write(tmp_path, SHIPPED.read_text().replace("documents: true", "documents: false"))
    )
    untrusting = RoutePipeline(loaded, loaded.policy.routes[0])
    assert _judge(untrusting, w.request("q", w.document()), answer) == (
        "blocked", "hallucinated_citation")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "q.yaml"
    path.write_text(text)
    return path


def test_a_text_document_sent_as_bytes_is_read(tmp_path: Path) -> None:
    raw = base64.b64encode(w.DOC_TEXT.encode()).decode()
    request = w.request("q", w.document(bytes=raw))
    assert _judge(_pipeline(tmp_path), request, w.body(w.cited(w.CAPACITY, CAP)))[0] == "released"


# -- native citations -------------------------------------------------------------------------


def _loc(kind: str, **fields: int) -> dict[str, Any]:
    return {"location": {kind: fields}}


@pytest.mark.parametrize(
    ("citation", "expected"),
    [
        (CAP, ("released", None)),
        ({**CAP, **_loc("documentChar", documentIndex=0, start=0, end=400)},
         ("blocked", "quote_mismatch")),  # end past the document
        ({**CAP, **_loc("documentChar", documentIndex=0, start=3, end=51)},
         ("blocked", "quote_mismatch")),  # the slice is not the cited text
        ({**CAP, **_loc("documentChar", documentIndex=1, start=0, end=48)},
         ("blocked", "hallucinated_citation")),  # only one document
        ({**CAP, **_loc("documentPage", documentIndex=0, start=1, end=2)}, ("released", None)),
        ({**CAP, **_loc("documentPage", documentIndex=0, start=0, end=0)},
         ("blocked", "quote_mismatch")),
        ({**CAP, "sourceContent": [{"text": "The K7 battery stores 99 kWh."}]},
         ("blocked", "quote_mismatch")),
        ({**CAP, "location": {"web": {"url": "https://example.com"}}},
         ("blocked", "hallucinated_citation")),
        ({**CAP, "location": {}}, ("blocked", "hallucinated_citation")),
    ],
    ids=["char", "char-past-end", "char-wrong-slice", "index-out-of-range", "page",
         "page-bad-range", "source-not-in-document", "web", "no-location"],
)
def test_native_citations_are_checked_against_the_document(
    tmp_path: Path, citation: dict[str, Any], expected: tuple[str, str | None]
) -> None:
    answer = w.body(w.cited(w.CAPACITY, citation))
    assert _judge(_pipeline(tmp_path), w.request("q", w.document()), answer) == expected


def test_chunk_and_search_result_locations(tmp_path: Path) -> None:
    chunks = w.document(name="sheet", content=[{"text": t} for t in w.CHUNKS_DOC])
    search = {"searchResult": {"source": "kb://k7", "title": "K7", "content": [
        {"text": "Warranty: ten years."}], "citations": {"enabled": True}}}
    request = w.request("q", chunks, search)
    p = _pipeline(tmp_path)
    chunk = {"sourceContent": [{"text": w.CHUNKS_DOC[1]}],
             **_loc("documentChunk", documentIndex=0, start=1, end=2)}
    assert _judge(p, request, w.body(w.cited("It weighs 114 kg.", chunk)))[0] == "released"
    wrong = {**chunk, **_loc("documentChunk", documentIndex=0, start=0, end=1)}
    assert _judge(p, request, w.body(w.cited("It weighs 114 kg.", wrong)))[1] == "quote_mismatch"
    sr = {"sourceContent": [{"text": "Warranty: ten years."}],
          **_loc("searchResultLocation", searchResultIndex=0, start=0, end=1)}
    assert _judge(p, request, w.body(w.cited("The warranty is ten years.", sr)))[0] == "released"
    far = {**sr, **_loc("searchResultLocation", searchResultIndex=3, start=0, end=1)}
    assert _judge(p, request, w.body(w.cited("The warranty is ten years.", far)))[1] == (
        "hallucinated_citation")


def test_tool_use_input_is_a_verified_channel(tmp_path: Path) -> None:
    tool = {"toolUse": {"toolUseId": "t1", "name": "send",
                        "input": {"note": "The K7 battery stores 99 kWh of energy."}}}
    answer = w.body(w.cited(w.CAPACITY, CAP), tool, stop="tool_use")
    assert _judge(_pipeline(tmp_path), w.request("q", w.document()), answer) == (
        "blocked", "missing_citation")


# -- stream parser guards ---------------------------------------------------------------------


def _feed(events: list[tuple[str, dict[str, Any]]]) -> Any:
    parser = ADAPTER.stream_parser(None)  # type: ignore[arg-type]
    decoder = BedrockCodec().decoder()
    data = b"".join(w.event(n, p) for n, p in events)
    for ev in decoder.feed(data) + decoder.finish():
        parser.feed(ev)
    return parser.finish()


START = ("messageStart", {"role": "assistant"})
STOP = ("messageStop", {"stopReason": "end_turn"})


def _text(i: int, t: str) -> tuple[str, dict[str, Any]]:
    return ("contentBlockDelta", {"contentBlockIndex": i, "delta": {"text": t}})


def test_stream_parser_refuses_what_would_reorder_or_hide_text() -> None:
    assert _feed([START, _text(0, "a."), _text(1, " b."), STOP]).channels[0].text == "a. b."
    for events in (
        [START, _text(1, "a."), _text(0, " b."), STOP],  # blocks out of order
        [START, _text(0, "a."), _text(1, " b."), _text(0, " c."), STOP],  # interleaved
        [_text(0, "a."), STOP],  # before messageStart
        [START, _text(0, "a.")],  # no messageStop
        [START, ("contentBlockDelta", {"contentBlockIndex": 0,
                                       "delta": {"reasoningContent": {"text": "x"}}}),
         _text(0, "a."), STOP],  # two kinds in one block
    ):
        with pytest.raises(ProtocolError):
            _feed(events)


def _cite(i: int) -> tuple[str, dict[str, Any]]:
    cit = {"sourceContent": [{"text": "a."}],
           "location": {"documentChar": {"documentIndex": 0, "start": 0, "end": 2}}}
    return ("contentBlockDelta", {"contentBlockIndex": i, "delta": {"citation": cit}})


def _think(i: int) -> tuple[str, dict[str, Any]]:
    return ("contentBlockDelta", {"contentBlockIndex": i,
                                  "delta": {"reasoningContent": {"text": "hm"}}})


def _tool(i: int) -> tuple[str, dict[str, Any]]:
    return ("contentBlockStart", {"contentBlockIndex": i,
                                  "start": {"toolUse": {"toolUseId": "t", "name": "f"}}})


@pytest.mark.parametrize("opener", [_text, _cite, _think, _tool])
@pytest.mark.parametrize("first", [[], [_cite(0)], [_text(0, "a.")]])
def test_text_for_a_block_below_the_highest_started_is_out_of_order(
    opener: Any, first: list[tuple[str, dict[str, Any]]]
) -> None:
    """Once block 1 was started (by text, a citation, reasoning or a tool call), text for block
    0 would land in the stream after block 1's start but in the body before it: refused,
    whether block 0 so far holds text, only a citation, or nothing."""
    opened = opener(1) if opener is not _text else _text(1, " b.")
    with pytest.raises(ProtocolError, match="out of order"):
        _feed([START, *first, opened, _text(0, " c."), STOP])


def test_blocks_in_order_with_late_citations_are_accepted() -> None:
    answer = _feed([START, _think(0), _text(1, "a."), _cite(1), _cite(2), _text(2, " b."),
                    _text(2, " c."), _cite(2), _tool(3), STOP])
    assert answer.channels[0].text == "a. b. c."


def test_an_exception_message_is_a_protocol_error() -> None:
    parser = ADAPTER.stream_parser(None)  # type: ignore[arg-type]
    parser.feed(SSEEvent('{"role":"assistant"}', "messageStart"))
    with pytest.raises(ProtocolError):
        parser.feed(SSEEvent('{"message":"x"}', "exception", "throttlingException"))


def test_a_non_event_message_type_is_a_protocol_error() -> None:
    from gateway.eventstream import encode_message

    decoder = BedrockCodec().decoder()
    with pytest.raises(ProtocolError):
        decoder.feed(encode_message({":message-type": "weird"}, b"{}"))
    with pytest.raises(ProtocolError):
        decoder.feed(encode_message({":message-type": "event", ":event-type": "x"}, b"\xff"))


# -- paths, policy ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "streams"),
    [
        ("/model/m/converse", False),
        ("/model/m/converse-stream", True),
        ("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A1%3Ainference-profile%2Fx/converse-stream",
         True),
        ("/model/m/invoke", None),
    ],
)
def test_streaming_is_chosen_by_the_path(path: str, streams: bool | None) -> None:
    assert ADAPTER.streams_by_path(path) is streams  # type: ignore[attr-defined]


def test_the_shipped_policy_routes_model_arns_by_segment() -> None:
    policies = load_policies([SHIPPED])
    arn = "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.claude"
    for path, route in (
        (f"/model/{arn}/converse", "converse"),
        (f"/model/{arn}/converse-stream", "converse-stream"),
        ("/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse", "converse"),
    ):
        matched = policies.match("POST", paths.segments(path), {})
        assert matched is not None and matched[1].name == route
    assert policies.match("POST", paths.segments("/model/a/b/converse"), {}) is None


def test_policy_check_warns_that_retry_is_not_applied_on_bedrock(tmp_path: Path) -> None:
    path = _write(tmp_path, SHIPPED.read_text().replace(
        "  block_status: 422", "  block_status: 422\n  retry: 2"))
    out = io.StringIO()
    assert check_paths([str(path)], out) == 0
    assert "release.retry is not applied on route 'converse'" in out.getvalue()
    clean = io.StringIO()
    assert check_paths([str(SHIPPED)], clean) == 0
    assert "retry" not in clean.getvalue()

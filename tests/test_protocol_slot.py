"""Stream parsers read repeated text chunks through a learnt template; the result must be the
same as a full parse whatever the text holds and however the upstream spells its JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.demo import wire
from gateway.errors import ProtocolError
from gateway.protocols.anthropic_messages import AnthropicStreamParser
from gateway.protocols.openai_chat import OpenAIStreamParser
from gateway.protocols.slot import StringSlot, learn_slot
from gateway.sse import SSEEvent


def _is_content(parsed: object, probe: str) -> bool:
    return isinstance(parsed, dict) and parsed.get("delta") == {"content": probe}


def test_slot_matches_one_string_literal_exactly() -> None:
    text = '{"id": "x", "delta": {"content": "ab"}, "n": null}'
    slot = learn_slot(text, "content", "ab", _is_content)
    assert slot is not None
    assert slot.match(text) == "ab"
    assert slot.match('{"id": "x", "delta": {"content": "\\"\\u00e9}"}, "n": null}') == '"é}'
    assert slot.match('{"id": "x", "delta": {"content": ""}, "n": null}') == ""
    # Not one literal between the same prefix and suffix, or a different frame: no match.
    assert slot.match('{"id": "x", "delta": {"content": "a", "b": "c"}, "n": null}') is None
    assert slot.match('{"id": "x", "delta": {"content": "a\\x"}, "n": null}') is None
    assert slot.match('{"id": "x", "delta": {"content": "a\nb"}, "n": null}') is None
    assert slot.match('{"id": "y", "delta": {"content": "ab"}, "n": null}') is None
    assert slot.match('{"id": "x", "delta": {"content": "ab"}, "n": 1}') is None
    assert StringSlot('{"a": "', '"}').match('{"a": "}') is None


def test_learning_skips_a_literal_the_parse_did_not_keep() -> None:
    # With a duplicate key json.loads keeps the last value; only that literal is the slot.
    text = '{"delta": {"content": "ab", "content": "ab"}}'
    slot = learn_slot(text, "content", "ab", _is_content)
    assert slot is not None
    assert slot.prefix == '{"delta": {"content": "ab", "content": "'
    assert slot.match('{"delta": {"content": "ab", "content": "zz"}}') == "zz"
    # The key spelt inside a string is not a key.
    tricky = '{"note": "\\"content\\": \\"ab\\"", "delta": {"content": "ab"}}'
    slot = learn_slot(tricky, "content", "ab", _is_content)
    assert slot is not None and slot.match(tricky.replace('"ab"}}', '"q"}}')) == "q"
    assert learn_slot('{"delta": {"content": "ab"}}', "content", "zz", _is_content) is None


_PIECE = st.lists(
    st.sampled_from([*'ab .\\"/{}[]:,\n\tü🌍\u2028\x00', "content", '"content": "']),
    max_size=4,
).map("".join)
_SPELLING = st.tuples(st.booleans(), st.sampled_from([None, (",", ":"), (", ", ": ")]))


def _dump(obj: Any, spelling: tuple[bool, tuple[str, str] | None]) -> str:
    return json.dumps(obj, ensure_ascii=spelling[0], separators=spelling[1])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_PIECE, max_size=12),
    st.lists(_SPELLING, min_size=1, max_size=4),
    st.lists(
        st.sampled_from(["", "obfuscation", "id", "length", "stop", "logprobs", "error"]),
        max_size=12,
    ),
)
def test_openai_parser_reads_repeated_chunks_like_a_full_parse(
    pieces: list[str], spellings: list[tuple[bool, Any]], changes: list[str]
) -> None:
    chunks = wire.openai_chunks(
        pieces, id="c1", model="m", created=1, usage=wire.Usage(1, 2), include_usage=True
    )
    events = []
    for k, chunk in enumerate(chunks):
        change = changes[k] if k < len(changes) else ""
        choice = chunk["choices"][0] if chunk["choices"] else {}
        if change == "obfuscation":
            chunk["obfuscation"] = "x" * k  # varies per chunk, as some upstreams do
        elif change == "id":
            chunk["id"] = f"other{k}"
        elif change in ("length", "stop") and choice:
            choice["finish_reason"] = change
        elif change == "logprobs" and choice:
            choice["logprobs"] = {"content": [{"token": "t", "logprob": 0.0}]}
        name = "error" if change == "error" else None
        events.append(SSEEvent(_dump(chunk, spellings[k % len(spellings)]), event=name))
    events.append(SSEEvent("[DONE]"))
    parser = OpenAIStreamParser()
    if any(e.event == "error" for e in events):
        with pytest.raises(ProtocolError):
            for e in events:
                parser.feed(e)
        return
    deltas = [d for e in events for d in parser.feed(e)]
    key = "choices/0/message/content"
    assert deltas == [(key, p) for p in pieces if p]
    body = parser.body()
    assert body["id"] == chunks[0]["id"]
    choice = body["choices"][0]
    assert choice["message"]["content"] == ("".join(pieces) or None)
    sent = [c["choices"][0] for c in chunks if c["choices"]]
    finish = [c["finish_reason"] for c in sent if c["finish_reason"] is not None]
    assert choice["finish_reason"] == finish[-1]
    logprobs = [t for c in sent if c["logprobs"] for t in c["logprobs"]["content"]]
    assert (choice["logprobs"] or {}).get("content", []) == logprobs


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_PIECE, max_size=12),
    st.lists(_SPELLING, min_size=1, max_size=4),
    st.lists(st.sampled_from(["", "error", "extra", "restart"]), max_size=16),
)
def test_anthropic_parser_reads_repeated_deltas_like_a_full_parse(
    pieces: list[str], spellings: list[tuple[bool, Any]], changes: list[str]
) -> None:
    events = []
    sent: list[str] = []  # every text delta
    block: list[str] = []  # the text deltas since the block last started
    failed = False
    for k, (name, data) in enumerate(
        wire.anthropic_events(
            pieces, id="m", model="c", usage=wire.Usage(1, 2), stop_reason="end_turn", ping=True
        )
    ):
        change = changes[k] if k < len(changes) else ""
        text_delta = data["type"] == "content_block_delta"
        if text_delta and change == "error":
            events.append(SSEEvent(_dump(data, spellings[0]), event="error"))
            failed = True
            break
        if text_delta and change == "extra":
            data["delta"]["x"] = 1  # not a plain text_delta any more, but still text
        if text_delta and change == "restart":
            start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
            events.append(SSEEvent(_dump(start, spellings[0]), event=start["type"]))
            block.clear()
        if text_delta:
            sent.append(data["delta"]["text"])
            block.append(data["delta"]["text"])
        events.append(SSEEvent(_dump(data, spellings[k % len(spellings)]), event=name))
    parser = AnthropicStreamParser()
    if failed:
        with pytest.raises(ProtocolError):
            for e in events:
                parser.feed(e)
        return
    deltas = [d for e in events for d in parser.feed(e)]
    assert deltas == [("content", p) for p in sent if p]
    assert parser.body()["content"][0]["text"] == "".join(block)


def test_openai_chunks_matching_the_slot_keep_every_effect() -> None:
    def chunk(text: str, finish: str | None) -> SSEEvent:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
        return SSEEvent(json.dumps({"id": "c", "choices": [choice]}))

    # Alternating chunks use up the parser's tries at learning a slot; the last ones match.
    parser = OpenAIStreamParser()
    for text in "abcdefgh":
        finish = "length" if text in "aceg" else "stop"
        assert parser.feed(chunk(text, finish)) == [("choices/0/message/content", text)]
    assert parser.feed(SSEEvent("[DONE]")) == []
    choice = parser.body()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("abcdefgh", "stop")

"""The field-table machinery (gateway/protocols/fields.py) and the adapters' tables, unit by
unit: duplicate-key detection, the walk, allow_fields paths, logprobs, SSE line counting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ProtocolError
from gateway.policy import Channels, Policy
from gateway.protocols import ADAPTERS
from gateway.protocols.anthropic_messages import BODY_TABLE as ANTHROPIC_TABLE
from gateway.protocols.fields import (
    Blank,
    FieldLog,
    Items,
    Meta,
    Obj,
    Text,
    allowed,
    clean,
    has_duplicate_keys,
    is_token,
    level_of,
    loads_unique,
    usage_check,
    verified_token_logprobs,
)
from gateway.protocols.openai_chat import BODY_TABLE as OPENAI_TABLE
from gateway.sse import SSEDecoder
from gateway.types import Chunk, ContextSet, Decision, Outcome, Report
from tests.upstream_app import anthropic_body, openai_body, split_random

POLICY = Policy.model_validate(
    {"name": "t", "routes": [{"name": "c", "match": {"path": "/x"}, "protocol": "openai-chat"}]}
)

# -- duplicate keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',
        '{"x": {"b": [1, {"c": 1, "c": 1}]}}',
        '[{"k": "v"}, {"k": "v", "k": "w"}]',
        '{"a": 1, "\\u0061": 2}',  # the same key, spelt differently
        '{"a:b": "x:y", "a:b": "z"}',
        '{"q\\"": 1, "q\\"" : 2}',
        '{"k:": ":", "k:": ":"}',
        '{"\\u003a": 1, ":": 2}',  # one key, its colon escaped once
        '{"a": "\\u003A", "b": {"c": 1, "c": "x:y"}}',
    ],
)
def test_a_repeated_key_anywhere_is_refused(text: str) -> None:
    for raw in (text, text.encode()):
        with pytest.raises(ProtocolError):
            loads_unique(raw)
        with pytest.raises(ProtocolError):
            loads_unique(raw, stdlib=True)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": "b:c", "d": "[kb:1] e: f"}',
        '{"url": "https://x:8080/a", "n": {"m": ":::"}}',
        '{"s": "\\":\\"", "t": "\\\\"}',
        '{"a": 1, "b": {"a": 1}}',  # one name at two levels is no repeat
        '[1, "x:y", {}]',
        '"just: a string"',
        '{"a": "\\u003a", "b:": "c\\u003Ad", "e": [":", {"f": "g:"}]}',
        '{"a\\\\u003a": "x", "t": "line\\nbreak: y"}',
    ],
)
def test_colons_and_quotes_inside_strings_are_no_repeat(text: str) -> None:
    assert loads_unique(text) == json.loads(text)


def test_integers_beyond_64_bits_parse_in_stdlib_mode() -> None:
    assert loads_unique('{"n": 123456789012345678901234567890}', stdlib=True)["n"] > 2**64


@pytest.mark.parametrize(
    "body",
    [
        '"n": 123456789012345678901234567890',  # beyond 64 bits: orjson cannot write it
        '"s": "\\ud800"',  # a lone surrogate: orjson cannot write it
        '"d": ' + "[" * 300 + "1" + "]" * 300,  # deeper than orjson writes
    ],
)
def test_values_orjson_cannot_write_are_still_checked(body: str) -> None:
    once = "{" + body + ', "a": 1}'
    twice = "{" + body + ', "a": 1, "a": 2}'
    for raw in (once, once.encode()):
        assert not has_duplicate_keys(raw, json.loads(raw))
    for raw in (twice, twice.encode()):
        assert has_duplicate_keys(raw, json.loads(raw))
        with pytest.raises(ProtocolError):
            loads_unique(raw, stdlib=True)


_KEYS = st.text(st.characters(codec="utf-8"), max_size=6)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | _KEYS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


def _dump_repeating(value: Any, at: list[int]) -> str:
    """JSON text of `value`; the object whose turn is at[0] spells its first key twice."""
    if isinstance(value, dict):
        items = [f"{json.dumps(k)}: {_dump_repeating(v, at)}" for k, v in value.items()]
        at[0] -= 1
        if at[0] == 0 and items:
            items.append(items[0])
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_dump_repeating(v, at) for v in value) + "]"
    return json.dumps(value)


@settings(max_examples=200, deadline=None)
@given(_JSON, st.integers(0, 6), st.booleans())
def test_detection_is_exact_on_random_json(value: Any, which: int, ascii_only: bool) -> None:
    plain = json.dumps(value, ensure_ascii=ascii_only)
    assert not has_duplicate_keys(plain, json.loads(plain))
    assert not has_duplicate_keys(plain.encode(), json.loads(plain))
    text = _dump_repeating(value, [which])
    repeated = text != _dump_repeating(value, [0])  # [0]: no object's turn comes
    assert has_duplicate_keys(text.encode(), json.loads(text)) == repeated


# -- the walk --------------------------------------------------------------------------------


def test_metadata_of_the_wrong_shape_is_dropped_or_replaced() -> None:
    table = Obj(
        "top",
        {
            "id": Meta(is_token, fallback=""),
            "n": Meta(lambda v: type(v) is int),
            "title": Blank(""),
            "text": Text("content"),
        },
        nullable=False,
    )
    log = FieldLog()
    out = clean(table, {"id": "a b", "n": "1", "title": "T", "text": "x", "zz": 1}, log)
    assert out == {"id": "", "title": "", "text": "x", "zz": 1}
    assert sorted(p for _, p in log.dropped) == [("id",), ("n",), ("title",)]
    assert log.unknown == [("top", ("zz",))]


def test_a_required_or_vital_field_that_fails_drops_its_object() -> None:
    call = Obj(
        "tool_call",
        {"id": Meta(is_token), "fn": Obj("tool_call", {"name": Meta(is_token)},
                                         required=frozenset({"name"}))},
        required=frozenset({"id"}),
        vital=frozenset({"fn"}),
    )
    table = Obj("top", {"calls": Items(call)}, nullable=False)
    body = {
        "calls": [
            {"id": "call_1", "fn": {"name": "ok"}},
            {"id": "call 2 with words", "fn": {"name": "ok"}},
            {"id": "call_3", "fn": {"name": "not ok"}},
            {"fn": {"name": "ok"}},
        ]
    }
    log = FieldLog()
    assert clean(table, body, log) == {"calls": [{"id": "call_1", "fn": {"name": "ok"}}]}
    assert {level for level, _ in log.dropped} == {"tool_call"}


def test_usage_is_ints_tiers_and_nested_ints_only() -> None:
    assert usage_check({"input_tokens": 3, "service_tier": "standard",
                        "cache_creation": {"ephemeral_5m_input_tokens": 0}})
    assert not usage_check({"input_tokens": "3 tokens"})
    assert not usage_check({"a key with words": 1})
    assert not usage_check({"d": {"e": {"f": {"g": 1}}}})


def test_levels_come_from_the_table() -> None:
    assert level_of(OPENAI_TABLE, ("x",)) == "top"
    assert level_of(OPENAI_TABLE, ("choices", 0, "x")) == "choice"
    assert level_of(OPENAI_TABLE, ("choices", 0, "message", "x")) == "message"
    assert level_of(OPENAI_TABLE, ("choices", 0, "message", "tool_calls", 0, "x")) == "tool_call"
    assert level_of(ANTHROPIC_TABLE, ("content", 0, "x")) == "content_block"


@pytest.mark.parametrize(
    ("path", "allow", "kept"),
    [
        (("choices", 0, "message", "x_trace"), ["x_trace"], True),
        (("choices", 0, "message", "x_trace"), ["choices.*.message.x_trace"], True),
        (("choices", 1, "message", "x_trace"), ["choices.0.message.x_trace"], False),
        (("choices", 0, "x_trace"), ["choices.*.message.x_trace"], False),
        (("x_trace",), ["x_trace"], True),
        (("content", 0), ["content.*"], False),  # a list element is never allow-listed
        (("y",), ["x_trace"], False),
    ],
)
def test_allow_fields_paths(path: tuple[str | int, ...], allow: list[str], kept: bool) -> None:
    assert allowed(path, allow) is kept


# -- logprobs --------------------------------------------------------------------------------


def _entries(tokens: list[str], top: bool = False) -> list[dict[str, Any]]:
    return [
        {
            "token": t,
            "logprob": -0.5,
            "bytes": list(t.encode()),
            "top_logprobs": [{"token": "other", "logprob": -2.0, "bytes": None}] if top else [],
        }
        for t in tokens
    ]


def test_logprobs_are_kept_only_when_they_spell_the_text() -> None:
    kept = verified_token_logprobs(_entries(["The", " pump", "."], top=True), "The pump.")
    assert kept is not None
    assert [e["token"] for e in kept] == ["The", " pump", "."]
    assert all(e["top_logprobs"] == [] for e in kept)
    assert verified_token_logprobs(_entries(["The", " pump"]), "The pump.") is None
    assert verified_token_logprobs(_entries(["The pump on Mars."]), "The pump.") is None
    assert verified_token_logprobs([], None) == []
    odd = _entries(["The pump."])
    odd[0]["bytes"] = list(b"something else")
    assert verified_token_logprobs(odd, "The pump.") == [
        {"token": "The pump.", "logprob": -0.5, "bytes": None, "top_logprobs": []}
    ]
    assert verified_token_logprobs([{"token": 1, "logprob": 0}], "1") is None


def _openai_with_logprobs(text: str, tokens: list[str], top: bool) -> dict[str, Any]:
    body = openai_body(text)
    body["choices"][0]["logprobs"] = {"content": _entries(tokens, top), "refusal": None}
    return body


def test_openai_logprobs_rule_per_mode() -> None:
    adapter = ADAPTERS["openai-chat"]
    text = "The pump moves water."
    tokens = ["The", " pump", " moves", " water", "."]
    released = Outcome(Decision.RELEASED)
    for top, verify_rewrites in ((False, False), (True, True)):
        answer = adapter.parse(_openai_with_logprobs(text, tokens, top), POLICY.routes[0])
        assert adapter.needs_rewrite(answer, POLICY) is verify_rewrites
        body = adapter.render(answer, [], released, Report((), "x"), POLICY)
        lp = body["choices"][0]["logprobs"]  # type: ignore[index]
        assert [e["token"] for e in lp["content"]] == tokens
        assert all(e["top_logprobs"] == [] for e in lp["content"])
        passing = POLICY.model_copy(update={"channels": Channels(logprobs="pass")})
        assert not adapter.needs_rewrite(answer, passing)
        withhold = POLICY.model_copy(update={"channels": Channels(logprobs="withhold")})
        assert adapter.needs_rewrite(answer, withhold)
        body = adapter.render(answer, [], released, Report((), "x"), withhold)
        assert body["choices"][0]["logprobs"] is None  # type: ignore[index]
    other = adapter.parse(_openai_with_logprobs(text, ["The pump is on Mars."], False),
                          POLICY.routes[0])
    assert adapter.needs_rewrite(other, POLICY)
    body = adapter.render(other, [], released, Report((), "x"), POLICY)
    assert body["choices"][0]["logprobs"] is None  # type: ignore[index]


# -- the adapters' tables --------------------------------------------------------------------


def test_a_clean_answer_has_nothing_dropped() -> None:
    route = POLICY.routes[0]
    for protocol, body in (
        ("openai-chat", openai_body("The pump [a:1].")),
        ("anthropic-messages", anthropic_body("The pump [a:1].")),
    ):
        answer = ADAPTERS[protocol].parse(body, route)
        assert answer.dropped == [] and answer.unknown_fields == []
        assert not ADAPTERS[protocol].needs_rewrite(answer, POLICY)


def test_a_tool_call_with_a_prose_id_is_dropped_whole() -> None:
    body = openai_body("x")
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "call one two", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "f", "arguments": "{}"}},
    ]
    answer = ADAPTERS["openai-chat"].parse(body, POLICY.routes[0])
    calls = answer.body["choices"][0]["message"]["tool_calls"]  # type: ignore[index]
    assert [c["id"] for c in calls] == ["call_2"]
    assert [c.path for c in answer.channels if c.kind == "tool_arguments"] == [
        ("choices", 0, "message", "tool_calls", 0, "function", "arguments")
    ]
    assert ADAPTERS["openai-chat"].needs_rewrite(answer, POLICY)


# -- SSE lines -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "count"),
    [
        (b"", 0),
        (b": keep-alive\n", 1),
        (b"id: 7\n", 1),
        (b"retry: 100\n", 1),
        (b"note: x\n", 1),
        (b"event: x\n\n", 1),
        (b": a\r\n: b\r", 2),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_decoder_counts_lines_no_event_carries(extra: bytes, count: int, seed: int) -> None:
    stream = b'data: {"a": 1}\n\n' + extra + b'event: e\ndata: {"b": 2}\n\ndata: [DONE]\n\n'
    decoder = SSEDecoder()
    events = []
    for piece in split_random(stream, seed=seed, max_piece=5):
        events.extend(decoder.feed(piece))
    events.extend(decoder.finish())
    assert [e.data for e in events] == ['{"a": 1}', '{"b": 2}', "[DONE]"]
    assert decoder.undefined == count


# -- fuzz: any JSON gives an answer or a clean ProtocolError ------------------------------------

_NAMES = st.sampled_from(
    ["id", "model", "choices", "message", "content", "tool_calls", "function", "name", "type",
     "usage", "text", "citations", "index", "delta", "logprobs", "annotations", "url_citation",
     "title", "role", "finish_reason", "stop_reason", "input", "thinking", "x"]
)
_SHAPED = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5)
    | st.sampled_from(["text", "tool_use", "char_location", "url_citation", "function"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_NAMES, inner, max_size=5),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(_NAMES, _SHAPED, max_size=6),
    st.sampled_from(["openai", "anthropic"]),
    st.sampled_from(["top", "inner"]),
)
def test_random_shaped_bodies_parse_or_fail_cleanly(
    body: dict[str, Any], which: str, where: str
) -> None:
    base = openai_body("x") if which == "openai" else anthropic_body("x")
    if where == "top":
        base.update(body)
    elif which == "openai":
        base["choices"][0]["message"].update(body)
        base["choices"][0].update({k: v for k, v in body.items() if k != "message"})
    else:
        base["content"].append(body)
        base["content"][0].update({k: v for k, v in body.items() if k not in ("type", "text")})
    adapter = ADAPTERS["openai-chat" if which == "openai" else "anthropic-messages"]
    try:
        answer = adapter.parse(base, POLICY.routes[0])
    except ProtocolError:
        return
    adapter.needs_rewrite(answer, POLICY)
    for decision in (Decision.RELEASED, Decision.ABSTAINED):
        rendered = adapter.render(answer, [], Outcome(decision), Report((), "x"), POLICY)
        json.dumps(rendered)


def test_a_tool_call_keeps_only_the_member_its_type_names() -> None:
    body = openai_body("x")
    both = {"function": {"name": "f", "arguments": "{}"}, "custom": {"name": "s", "input": "B"}}
    body["choices"][0]["message"]["tool_calls"] = [
        {"id": "call_1", "type": "function", **both},
        {"id": "call_2", "type": "custom", **both},
    ]
    answer = ADAPTERS["openai-chat"].parse(body, POLICY.routes[0])
    calls = answer.body["choices"][0]["message"]["tool_calls"]  # type: ignore[index]
    assert [sorted(c) for c in calls] == [["function", "id", "type"], ["custom", "id", "type"]]
    assert [c.text for c in answer.channels if c.kind == "tool_arguments"] == ["{}", "B"]
    assert ADAPTERS["openai-chat"].needs_rewrite(answer, POLICY)


@pytest.mark.parametrize(
    ("audio", "kept"),
    [
        ({"id": "a_1", "data": "aGk=", "expires_at": 1, "transcript": "x"}, True),
        ({"id": "a_1", "data": "aGk=", "expires_at": 1}, False),
        ({"id": "a_1", "data": "aGk=", "expires_at": 1, "transcript": None}, False),
        ({"id": "a_1", "data": "aGk=", "expires_at": 1, "transcript": ["x"]}, False),
    ],
)
def test_audio_goes_out_only_with_its_transcript(audio: dict[str, Any], kept: bool) -> None:
    body = openai_body("x")
    body["choices"][0]["message"]["audio"] = audio
    answer = ADAPTERS["openai-chat"].parse(body, POLICY.routes[0])
    assert ("audio" in answer.body["choices"][0]["message"]) is kept  # type: ignore[index]
    assert bool(answer.dropped) is not kept


def test_a_url_citation_goes_out_only_when_its_url_is_a_context_chunk() -> None:
    adapter = ADAPTERS["openai-chat"]
    body = openai_body("The pump [a:1].")
    known, other = "https://kb.example/pump", "https://example.com/elsewhere"
    body["choices"][0]["message"]["annotations"] = [
        {"type": "url_citation",
         "url_citation": {"url": u, "title": "", "start_index": 0, "end_index": 8}}
        for u in (known, other)
    ]
    answer = adapter.parse(body, POLICY.routes[0])
    assert adapter.needs_rewrite(answer, POLICY)
    ctx = ContextSet()
    ctx.add(Chunk(id=known, text="The pump."))
    out = adapter.render(answer, [], Outcome(Decision.RELEASED), Report((), ctx), POLICY)
    anns = out["choices"][0]["message"]["annotations"]  # type: ignore[index]
    assert [a["url_citation"]["url"] for a in anns] == [known]
    out = adapter.render(answer, [], Outcome(Decision.RELEASED), Report((), ContextSet()), POLICY)
    assert out["choices"][0]["message"]["annotations"] == []  # type: ignore[index]

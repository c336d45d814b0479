"""openai-responses, the pure parts: ambiguous streams fail closed, unknown stream fields force a
re-render, partial answers keep annotation offsets consistent, the `include` rewrite, trusted
request places, `policy check` on passthrough entries, and `citewarden verify` offline.
"""

from __future__ import annotations

import contextvars
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cli import main as cli_main
from gateway.context import request_context as context_of
from gateway.demo import responses_wire as w
from gateway.errors import ProtocolError
from gateway.pipeline import RoutePipeline
from gateway.policy import ContextSpec, Match, Policy, Route, from_model, load_policy
from gateway.protocols import ADAPTERS
from gateway.protocols.openai_responses import context as rctx
from gateway.protocols.openai_responses.render import partial_body
from gateway.sse import SSEDecoder, encode
from gateway.types import ContextSet, Decision, Outcome
from tests.upstream_app import split_random

FIXTURES = Path(__file__).parent / "fixtures" / "openai_responses"
ADAPTER = ADAPTERS["openai-responses"]
ROUTE = Route(name="responses", match=Match(path="/v1/responses"), protocol="openai-responses")


def _parse_stream(data: bytes, pieces: int = 0) -> Any:
    parser = ADAPTER.stream_parser(ROUTE)
    decoder = SSEDecoder()
    chunks = split_random(data, seed=pieces, max_piece=9) if pieces else [data]
    for chunk in chunks:
        for event in decoder.feed(chunk):
            parser.feed(event)
    for event in decoder.finish():
        parser.feed(event)
    return parser.finish()


def _frames(body: dict[str, Any]) -> list[bytes]:
    return w.response_events(body, chunk_size=6)


GOOD = w.response_text("The K7 stores 13.5 kWh [k7:capacity].", id="resp_1")


# -- ambiguous streams ----------------------------------------------------------------------------


def _tamper(frames: list[bytes], index: int, old: bytes, new: bytes) -> bytes:
    assert old in frames[index]
    return b"".join([*frames[:index], frames[index].replace(old, new, 1), *frames[index + 1 :]])


def _find(frames: list[bytes], etype: str) -> int:
    return next(i for i, f in enumerate(frames) if f.startswith(f"event: {etype}\n".encode()))


@pytest.mark.parametrize(
    "case",
    ["done_differs", "item_differs", "final_differs", "duplicate_key", "name_mismatch",
     "error_event", "failed", "before_created", "truncated"],
)
def test_ambiguous_or_failed_streams_raise(case: str) -> None:
    frames = _frames(GOOD)
    done = _find(frames, "response.output_text.done")
    item_done = _find(frames, "response.output_item.done")
    if case == "done_differs":
        data = _tamper(frames, done, b"13.5 kWh", b"14.5 kWh")
    elif case == "item_differs":
        data = _tamper(frames, item_done, b"13.5 kWh", b"14.5 kWh")
    elif case == "final_differs":
        data = _tamper(frames, len(frames) - 1, b"13.5 kWh", b"14.5 kWh")
    elif case == "duplicate_key":
        data = _tamper(frames, done, b'"text": ', b'"text": "x", "text": ')
    elif case == "name_mismatch":
        data = _tamper(frames, done, b"event: response.output_text.done", b"event: ping")
    elif case == "error_event":
        err = w.sse({"type": "error", "sequence_number": 3, "code": "x", "message": "m"}, "error")
        data = b"".join([*frames[:3], err, *frames[3:]])
    elif case == "failed":
        data = _tamper(frames, len(frames) - 1, b"response.completed", b"response.failed")
    elif case == "before_created":
        data = b"".join(frames[1:])
    else:
        data = b"".join(frames[:-1])
    with pytest.raises(ProtocolError):
        _parse_stream(data)


def test_unknown_stream_fields_force_a_rerender_without_them(tmp_path: Path) -> None:
    frames = _frames(GOOD)
    delta = _find(frames, "response.output_text.delta")
    odd = w.sse({"type": "response.novel_event", "sequence_number": 99, "text": "PLANTED"},
                "response.novel_event")
    data = _tamper(frames, delta, b'"logprobs": []', b'"logprobs": [], "extra": "PLANTED"')
    data = data.replace(frames[2], frames[2] + odd)
    answer = _parse_stream(data, pieces=3)
    assert ("stream", "response.novel_event") in answer.unknown_fields
    policy = Policy(name="t", routes=[ROUTE])
    assert ADAPTER.needs_rewrite(answer, policy)
    body = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), None, policy)  # type: ignore[arg-type]
    events = ADAPTER.to_stream(body, True)
    wire = b"".join(encode(e) for e in events)
    assert b"PLANTED" not in wire and b"novel" not in wire


def test_only_a_canonical_stream_is_relayed_as_is() -> None:
    data = b"".join(_frames(GOOD))
    relayable = ADAPTER.stream_relayable  # type: ignore[attr-defined]
    assert relayable(data)
    assert not relayable(b": keep-alive\n\n" + data)
    assert not relayable(data + b"data: {}\n\n")
    assert not relayable(data.replace(b"\n", b"\r\n"))


# -- partial answers keep offsets consistent ------------------------------------------------------

SENTENCES = [
    ("The K7 stores 13.5 kWh.", "file-a"),
    ("Its warranty lasts ten years.", "file-b"),
    ("It was built on the Moon.", "file-x"),
    ("It weighs 120 kg.", "file-a"),
    ("Installers need a permit.", "file-b"),
]


@settings(max_examples=40, deadline=None)
@given(
    order=st.permutations(range(len(SENTENCES))),
    keep=st.sets(st.integers(0, len(SENTENCES) - 1)),
    url_every=st.integers(1, 3),
)
def test_partial_keeps_annotation_offsets_consistent(
    order: list[int], keep: set[int], url_every: int
) -> None:
    parts = [SENTENCES[i] for i in order]
    text = " ".join(s for s, _ in parts)
    annotations: list[dict[str, Any]] = []
    pos = 0
    for k, (sentence, fid) in enumerate(parts):
        if k % url_every == 0:
            annotations.append({"type": "url_citation", "url": f"https://x.example/{k}",
                                "start_index": pos, "end_index": pos + len(sentence),
                                "title": "t"})
        # A file citation's index may point past the space after its claim.
        index = pos + len(sentence) + (1 if k % 2 and pos + len(sentence) < len(text) else 0)
        annotations.append({"type": "file_citation", "file_id": fid, "filename": "f.md",
                            "index": index})
        pos += len(sentence) + 1
    body = w.response_body([w.message_item(text, annotations=annotations)])
    answer = ADAPTER.parse(body, ROUTE)
    policy = Policy(name="t", routes=[ROUTE])
    pipeline = RoutePipeline(from_model(policy), ROUTE)
    claims = pipeline.verifier.claims(answer)
    assert [c.text for c in claims] == [s for s, _ in parts]
    kept = frozenset(c.index for c in claims if order[c.index] in keep)
    outcome = Outcome(Decision.PARTIAL, "hallucinated_citation", 0, "partial", kept)
    out = partial_body(answer, claims, outcome, policy)
    part = out["output"][0]["content"][0]
    new = part["text"]
    kept_sentences = [s for (s, _), i in zip(parts, order, strict=True) if i in keep]
    assert new.startswith(" ".join(kept_sentences))
    for ann in part["annotations"]:
        if ann["type"] == "url_citation":
            k = int(ann["url"].rsplit("/", 1)[1])
            assert new[ann["start_index"] : ann["end_index"]] == parts[k][0]
            assert ann["title"] == ""
        else:
            before = new[: ann["index"]].rstrip()
            owner = next(s for s, fid in parts if before.endswith(s))
            assert dict(parts)[owner] == ann["file_id"]
    cited = sum(1 for a in part["annotations"] if a["type"] == "file_citation")
    assert cited == len(kept_sentences)


# -- context ---------------------------------------------------------------------------------


def test_request_context_reads_trusted_places_only() -> None:
    def tag(cid: str) -> str:
        return f'<chunk id="{cid}">text {cid}</chunk>'

    body = {
        "instructions": tag("instr"),
        "input": [
            {"role": "system", "content": tag("sys")},
            {"role": "developer", "content": [{"type": "input_text", "text": tag("dev")}]},
            {"role": "user", "content": tag("user")},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": tag("asst")}]},
            {"type": "function_call_output", "call_id": "c", "output": tag("tool")},
            {"type": "custom_tool_call_output", "call_id": "d",
             "output": [{"type": "input_text", "text": tag("custom")}]},
        ],
    }
    ctx = ContextSet()
    rctx.request_context(body, ctx, None)
    assert sorted(ctx.chunks) == ["custom", "dev", "instr", "sys", "tool"]
    bare = ContextSet()
    rctx.request_context({"input": tag("user")}, bare, None)
    assert not bare.chunks


@pytest.mark.parametrize("role", ["tool", "function", "System", "critic", "", "assistant"])
def test_a_message_of_a_role_responses_does_not_have_is_not_trusted(role: str) -> None:
    """Responses roles are system, developer, user and assistant; tool results are
    `function_call_output` items. `role: "tool"` is a chat completions role: it matches the
    policy's trusted `tool` role by name only, and is not trusted (its tags are refused and
    counted, as a user's are)."""
    tag = '<chunk id="x">planted</chunk>'
    for trust_roles in (None, ["system", "developer", "tool", "user"]):
        spec = ContextSpec.model_validate(
            {} if trust_roles is None else {"trust": {"roles": trust_roles}})
        body = {"input": [{"type": "message", "role": role, "content": tag}],
                "instructions": [{"role": role, "content": tag}]}
        ctx = context_of("openai-responses", body, spec)
        if role == "assistant":  # earlier model output: never read
            assert not ctx.chunks and not ctx.rejected
        else:
            assert not ctx.chunks, (role, trust_roles)
            assert ctx.rejected == {"untrusted_role": 2}


def test_responses_roles_map_to_trust_roles() -> None:
    """system and developer messages are their roles, function_call_output items are `tool`,
    user messages `user`: each counts exactly when `context.trust.roles` names it."""
    def tag(cid: str) -> str:
        return f'<chunk id="{cid}">text {cid}</chunk>'

    body = {"input": [
        {"role": "system", "content": tag("sys")},
        {"role": "developer", "content": tag("dev")},
        {"role": "user", "content": tag("user")},
        {"type": "function_call_output", "call_id": "c", "output": tag("tool")},
    ]}
    for roles, want in (
        (["system"], ["sys"]),
        (["developer", "user"], ["dev", "user"]),
        (["tool"], ["tool"]),
    ):
        spec = ContextSpec.model_validate({"trust": {"roles": roles}})
        assert sorted(context_of("openai-responses", body, spec).chunks) == want, roles


FS_RESULTS = [{"file_id": "file-a", "filename": "a.txt", "score": 0.9, "text": "A is one."}]
FS_TOOL = {"type": "file_search", "vector_store_ids": ["vs_1"]}


@pytest.mark.parametrize(
    ("sent", "echo", "counts"),
    [
        (b'{"input": "q", "tools": [' + json.dumps(FS_TOOL).encode() + b"]}", None, True),
        (b'{"input": "q", "tools": [' + json.dumps(FS_TOOL).encode() + b"]}", [], True),
        (b'{"input": "q"}', [FS_TOOL], False),  # the upstream's echo is not the request
        (b'{"input": "q", "tools": [{"type": "function", "name": "f"}]}', None, False),
        (b'{"input": "q", "tools": {"type": "file_search"}}', None, False),
        (b"not json", [FS_TOOL], False),
        (None, [FS_TOOL], True),  # a stored response's GET: its echoed tools
        (None, [{"type": "web_search"}], False),
        (None, None, False),
        (b"", [], False),
    ],
)
def test_file_search_results_count_only_when_file_search_was_enabled(
    sent: bytes | None, echo: list[Any] | None, counts: bool
) -> None:
    """A `file_search_call` item is context only when the forwarded request had a
    `file_search` tool; with no request body (a stored GET), when the stored response's echoed
    `tools` has one. Otherwise its results are upstream text."""
    import contextvars

    def run() -> list[str]:
        if sent is not None:
            rctx.remember_request(sent)
        body: dict[str, Any] = {"output": [w.file_search_item(FS_RESULTS, id="fs_1")]}
        if echo is not None:
            body["tools"] = echo
        ctx = ContextSet()
        rctx.response_context(body, ctx, None)
        return sorted(ctx.chunks)

    assert contextvars.Context().run(run) == (["file-a"] if counts else [])


@pytest.mark.parametrize("enabled", [True, False])
def test_streamed_file_search_results_count_only_when_enabled(enabled: bool) -> None:
    import contextvars

    tools = [FS_TOOL] if enabled else []
    body = w.response_body(
        [w.file_search_item(FS_RESULTS, id="fs_1"), w.message_item("A is one.")], id="r1")

    def run() -> list[str]:
        rctx.remember_request(json.dumps({"input": "q", "tools": tools}).encode())
        parser = ADAPTER.stream_parser(ROUTE)
        ctx = ContextSet()
        parser.bind_context(ctx, ContextSpec())
        decoder = SSEDecoder()
        for event in decoder.feed(b"".join(_frames(body))):
            parser.feed(event)
        return sorted(ctx.chunks)

    assert contextvars.Context().run(run) == (["file-a"] if enabled else [])


@pytest.mark.parametrize("echo", [[FS_TOOL], []])
def test_stored_stream_file_search_results_follow_the_echoed_tools(echo: list[Any]) -> None:
    import contextvars

    body = w.response_body(
        [w.file_search_item(FS_RESULTS, id="fs_1"), w.message_item("A is one.")], id="r1",
        extra={"tools": echo})

    def run() -> list[str]:
        parser = ADAPTER.stream_parser(ROUTE)
        ctx = ContextSet()
        parser.bind_context(ctx, ContextSpec())
        decoder = SSEDecoder()
        for event in decoder.feed(b"".join(_frames(body))):
            parser.feed(event)
        return sorted(ctx.chunks)

    assert contextvars.Context().run(run) == (["file-a"] if echo else [])


def test_forward_body_asks_for_results_only_where_they_are_context() -> None:
    with_response = ContextSpec.model_validate({"from": ["request", "response"]})
    request_only = ContextSpec.model_validate({"from": ["request"]})
    raw = json.dumps({"model": "m", "input": "q", "include": ["reasoning.encrypted_content"]})
    out = json.loads(rctx.forward_body(raw.encode(), "/v1/responses", with_response))
    assert out["include"] == ["reasoning.encrypted_content", "file_search_call.results"]
    assert rctx.client_wants_results() is False
    assert rctx.forward_body(raw.encode(), "/v1/responses", request_only) == raw.encode()
    shadow = rctx.forward_body(raw.encode(), "/v1/responses", with_response, shadow=True)
    assert shadow == raw.encode()  # shadow mode does not change what the upstream answers
    asked = json.dumps({"model": "m", "include": ["file_search_call.results"]}).encode()
    assert rctx.forward_body(asked, "/v1/responses", with_response) == asked
    assert rctx.client_wants_results() is True
    rctx.forward_body(b"", "/v1/responses/r1?include[]=file_search_call.results", with_response)
    assert rctx.client_wants_results() is True
    rctx.forward_body(b"", "/v1/responses/r1", with_response)
    assert rctx.client_wants_results() is False


def test_several_results_of_one_file_form_one_chunk() -> None:
    body = json.loads((FIXTURES / "file_search.json").read_text())
    chunks = {c.id: c for c in rctx.file_search_chunks(body)}
    assert sorted(chunks) == ["file-k7spec", "file-k7war"]
    assert chunks["file-k7spec"].text == (
        "Usable capacity: 13.5 kWh per K7 unit.\n\nRound-trip efficiency is 90%."
    )


# -- policy check, verify offline ----------------------------------------------------------


def test_policy_check_warns_on_passthrough_of_model_output(tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "name: p\nroutes:\n  - name: r\n    match: {path: /v1/responses}\n"
        "    protocol: openai-responses\n"
        "passthrough: [/v1/models, /v1/responses, /v1/responses/*, /v1/files/*, /v1/threads/*,\n"
        "              /v1/files/f1/content, /v1/threads]\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", str(policy)],
        capture_output=True, text=True, check=False,
    )
    text = out.stdout + out.stderr
    for entry in ("/v1/responses", "/v1/responses/*", "/v1/files/*", "/v1/threads/*",
                  "/v1/files/f1/content"):
        assert f"passthrough entry '{entry}'" in text
    assert "passthrough entry '/v1/models'" not in text
    assert "passthrough entry '/v1/threads'" not in text
    assert load_policy(policy).policy.routes[0].protocol == "openai-responses"


POLICY = """\
name: offline
routes:
  - name: responses
    match: {{path: /v1/responses}}
    protocol: openai-responses
context: {{from: [{sources}]}}
release: {{on_unverified: {on_unverified}}}
"""


@pytest.mark.parametrize(
    ("response", "sources", "on_unverified", "decision", "code"),
    [
        ("good.json", "request", "block", "released", 0),
        ("good.sse", "request", "block", "released", 0),
        ("hallucinated.json", "request", "block", "blocked", 1),
        ("hallucinated.sse", "request", "strip", "abstained", 1),
        ("file_search.json", "request, response", "block", "released", 1),
        ("file_search.sse", "request", "block", "blocked", 1),
        # The request never enabled file search: its results are no context.
        ("file_search.json", "request, response (no tool)", "block", "blocked", 1),
        ("reasoning_tool.sse", "request", "block", "released", 1),
    ],
)
def test_verify_offline(
    tmp_path: Path, response: str, sources: str, on_unverified: str, decision: str, code: int
) -> None:
    policy = tmp_path / "p.yaml"
    no_tool = sources.endswith(" (no tool)")
    sources = sources.removesuffix(" (no tool)")
    policy.write_text(POLICY.format(sources=sources, on_unverified=on_unverified))
    request = FIXTURES / "request.json"
    if response.startswith("file_search"):
        # The captured answer searched files: its request enabled the file_search tool
        # (or, for the no-tool case, did not).
        sent = json.loads(request.read_text())
        sent["tools"] = [] if no_tool else [{"type": "file_search", "vector_store_ids": ["vs_k7"]}]
        request = tmp_path / "request.json"
        request.write_text(json.dumps(sent))
    if response.endswith(".sse"):  # a stream capture answers a request that asked for one
        sent = json.loads(request.read_text())
        request = tmp_path / "request-stream.json"
        request.write_text(json.dumps({**sent, "stream": True}))
    out = io.StringIO()
    argv = ["verify", "--policy", str(policy), "--protocol", "openai-responses",
            "--request", str(request),
            "--response", str(FIXTURES / response)]
    old = sys.stdout
    sys.stdout = out
    try:
        rc = cli_main(argv)
    finally:
        sys.stdout = old
    report = json.loads(out.getvalue())
    assert (report["decision"], rc) == (decision, code)
    body = json.dumps(report["body"])
    # Released with results or a reasoning summary withheld: re-rendered, never relayed.
    assert "Usable capacity" not in body and "Thinking about" not in body


def test_an_incomplete_answer_stays_incomplete() -> None:
    body = w.response_text("The K7 stores 13.5 kWh [k7:capacity]. It", id="resp_cut")
    body.update(status="incomplete", incomplete_details={"reason": "max_output_tokens"})
    answer = _parse_stream(b"".join(_frames(body)), pieces=5)
    assert answer.body["incomplete_details"] == {"reason": "max_output_tokens"}
    policy = Policy(name="t", routes=[ROUTE])
    released = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), None, policy)  # type: ignore[arg-type]
    events = ADAPTER.to_stream(released, True)
    assert [e.event for e in events][-1] == "response.incomplete"
    assert [json.loads(e.data)["sequence_number"] for e in events] == list(range(len(events)))


def _released(body: dict[str, Any], policy: Policy) -> tuple[bool, dict[str, Any]]:
    answer = ADAPTER.parse(body, ROUTE)
    out = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), None, policy)  # type: ignore[arg-type]
    return ADAPTER.needs_rewrite(answer, policy), out


def test_logprobs_kept_only_when_they_spell_the_text() -> None:
    text = "The K7 stores 13.5 kWh."
    tokens = ["The", " K7", " stores", " 13.5", " kWh", "."]
    good = w.response_text(text)
    good["output"][0]["content"][0]["logprobs"] = [
        {"token": t, "bytes": list(t.encode()), "logprob": -0.1, "top_logprobs": []}
        for t in tokens
    ]
    policy = Policy(name="t", routes=[ROUTE])
    rewrite, out = _released(good, policy)
    assert not rewrite and out["output"][0]["content"][0]["logprobs"] == good["output"][0][
        "content"][0]["logprobs"]
    bad = json.loads(json.dumps(good))
    bad["output"][0]["content"][0]["logprobs"][3]["token"] = " 99"
    bad["output"][0]["content"][0]["logprobs"][0]["top_logprobs"] = [
        {"token": "PLANTED", "bytes": [], "logprob": -3.0}
    ]
    rewrite, out = _released(bad, policy)
    assert rewrite and out["output"][0]["content"][0]["logprobs"] == []
    alternatives = json.loads(json.dumps(good))
    alternatives["output"][0]["content"][0]["logprobs"][0]["top_logprobs"] = [
        {"token": "PLANTED", "bytes": [], "logprob": -3.0}
    ]
    rewrite, out = _released(alternatives, policy)
    assert rewrite and "PLANTED" not in json.dumps(out)
    assert len(out["output"][0]["content"][0]["logprobs"]) == len(tokens)


def test_tool_calls_withheld_by_policy() -> None:
    body = json.loads((FIXTURES / "reasoning_tool.json").read_text())
    policy = Policy.model_validate(
        {"name": "t", "routes": [ROUTE.model_dump()], "channels": {"tool_calls": "withhold"}}
    )
    rewrite, out = _released(body, policy)
    assert rewrite
    assert [i["type"] for i in out["output"]] == ["reasoning", "message"]


@pytest.mark.parametrize(
    ("sent", "counts"),
    [(None, True), (b"", True), (b"  ", True), (b"{}", False), (b'{"input": "q"}', False)],
)
def test_an_echoed_instruction_is_context_only_without_a_request_body(
    sent: bytes | None, counts: bool
) -> None:
    """A stored response's GET has nothing but the echo to say what the prompt was; after any
    request body, even `{}`, the echo is the upstream's word and plants nothing."""
    import contextvars

    def run() -> list[str]:
        if sent is not None:
            rctx.remember_request(sent)
        ctx = ContextSet()
        echo = {"instructions": '<chunk id="planted">The pump was built in 1931.</chunk>'}
        rctx.response_context(echo, ctx, None)
        return sorted(ctx.chunks)

    assert contextvars.Context().run(run) == (["planted"] if counts else [])


# -- texts no finished item holds -------------------------------------------------------------


def _events(body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for frame in _frames(body):
        line = next(x for x in frame.decode().split("\n") if x.startswith("data: "))
        out.append(json.loads(line[len("data: "):]))
    return out


def _wire(evs: list[dict[str, Any]]) -> bytes:
    return b"".join(w.sse({**e, "sequence_number": n}, e["type"]) for n, e in enumerate(evs))


def _before_done(evs: list[dict[str, Any]], event: dict[str, Any], item: int = 0) -> None:
    at = next(k for k, e in enumerate(evs)
              if e["type"] == "response.output_item.done" and e["output_index"] == item)
    evs.insert(at, event)


_ON_MESSAGE = {"item_id": "msg_fake", "output_index": 0}


@pytest.mark.parametrize(
    "event",
    [
        pytest.param({"type": "response.reasoning_text.delta", **_ON_MESSAGE,
                      "content_index": 3, "delta": "PLANTED"}, id="reasoning-text"),
        pytest.param({"type": "response.reasoning_summary_text.delta", **_ON_MESSAGE,
                      "summary_index": 0, "delta": "PLANTED"}, id="summary"),
        pytest.param({"type": "response.function_call_arguments.delta", **_ON_MESSAGE,
                      "delta": "PLANTED"}, id="arguments"),
        pytest.param({"type": "response.output_text.delta", **_ON_MESSAGE, "content_index": 1,
                      "delta": "PLANTED", "logprobs": []}, id="text-on-refusal"),
        pytest.param({"type": "response.refusal.delta", **_ON_MESSAGE, "content_index": 0,
                      "delta": "PLANTED"}, id="refusal-on-text"),
        pytest.param({"type": "response.output_text.annotation.added", **_ON_MESSAGE,
                      "content_index": 1, "annotation_index": 0,
                      "annotation": {"type": "file_path", "file_id": "f", "index": 0}},
                     id="annotation-on-refusal"),
    ],
)
def test_a_text_event_for_another_item_or_part_type_raises(event: dict[str, Any]) -> None:
    body = w.response_text("The K7 stores 13.5 kWh [k7:capacity].", id="resp_1")
    body["output"][0]["content"].append({"type": "refusal", "refusal": "No."})
    evs = _events(body)
    _before_done(evs, event)
    with pytest.raises(ProtocolError):
        _parse_stream(_wire(evs))


def _rerendered(evs: list[dict[str, Any]]) -> bytes:
    answer = _parse_stream(_wire(evs))
    policy = Policy(name="t", routes=[ROUTE])
    assert ADAPTER.needs_rewrite(answer, policy)
    body = ADAPTER.render(answer, [], Outcome(Decision.RELEASED), None, policy)  # type: ignore[arg-type]
    return b"".join(encode(e) for e in ADAPTER.to_stream(body, True))


def test_a_summary_the_finished_item_drops_forces_a_rerender_without_it() -> None:
    body = w.response_body([w.reasoning_item("PLANTED summary", id="rs_1"),
                            w.message_item("The K7 stores 13.5 kWh [k7:capacity].", id="m_1")],
                           id="resp_1")
    evs = _events(body)
    for e in evs:
        if e["type"] == "response.output_item.done" and e["item"]["type"] == "reasoning":
            e["item"]["summary"] = []
        if e["type"] == "response.completed":
            e["response"]["output"][0]["summary"] = []
    assert b"PLANTED" not in _rerendered(evs)


def test_an_announcement_the_finished_item_does_not_repeat_forces_a_rerender() -> None:
    fs = w.file_search_item(None, queries=["pump speed"], id="fs_1")
    body = w.response_body([fs, w.message_item("The K7 stores 13.5 kWh [k7:capacity].",
                                               id="m_1")], id="resp_1")
    evs = _events(body)
    added = next(e for e in evs if e["type"] == "response.output_item.added")
    added["item"]["queries"] = ["PLANTED query"]
    part = next(e for e in evs if e["type"] == "response.content_part.added")
    part["part"]["logprobs"] = [{"token": "PLANTED", "logprob": -1.0, "bytes": [],
                                 "top_logprobs": []}]
    assert b"PLANTED" not in _rerendered(evs)


def test_a_differing_reasoning_text_raises_and_a_repeated_one_is_relayed() -> None:
    item = {"id": "rs_1", "type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": "Think."}]}
    body = w.response_body([item, w.message_item("The K7 stores 13.5 kWh [k7:capacity].",
                                                 id="m_1")], id="resp_1")
    evs = _events(body)
    delta = {"type": "response.reasoning_text.delta", "item_id": "rs_1", "output_index": 0,
             "content_index": 0, "delta": "Think."}
    added = next(e for e in evs if e["type"] == "response.output_item.added")
    added["item"].pop("content", None)
    _before_done(evs, delta)
    answer = _parse_stream(_wire(evs))
    assert not any(p[0] == "stream" for p in answer.unknown_fields)
    delta["delta"] = "PLANTED"
    with pytest.raises(ProtocolError):
        _parse_stream(_wire(evs))


# -- encrypted state, logprob entries, file_search results -------------------------------------

REAL_ENCRYPTED = "gAAAAABo" + "Zk9xQ2-_" * 60 + "Ab/+Yz=="


@pytest.mark.parametrize(("value", "asked", "kept"), [
    (REAL_ENCRYPTED, True, True), (None, True, True), ("state with spaces", True, False),
    (["x"], True, False), (REAL_ENCRYPTED, False, False), (None, False, True),
])
def test_encrypted_content_is_kept_only_as_an_opaque_blob_the_client_asked_for(
    value: object, asked: bool, kept: bool
) -> None:
    item = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": value}
    body = w.response_body([item, w.message_item("The K7 stores 13.5 kWh [k7:capacity].",
                                                 id="m_1")], id="resp_1")
    include = ["reasoning.encrypted_content"] if asked else ["file_search_call.results"]
    request = json.dumps({"model": "m", "input": "q", "include": include}).encode()

    def run() -> None:
        rctx.forward_body(request, "/v1/responses", ContextSpec())
        answer = ADAPTER.parse(body, ROUTE)
        assert (("output", 0, "encrypted_content") not in answer.unknown_fields) is kept
        rewrite, out = _released(body, Policy(name="t", routes=[ROUTE]))
        assert rewrite is not kept
        assert ("encrypted_content" in out["output"][0]) is kept

    contextvars.Context().run(run)


def test_a_stored_response_s_encrypted_content_is_kept_when_its_query_asks() -> None:
    def asked(path_qs: str) -> bool:
        rctx.forward_body(b"", path_qs, ContextSpec())
        return rctx.client_wants_encrypted()

    assert contextvars.Context().run(
        asked, "/v1/responses/resp_1?include[]=reasoning.encrypted_content"
    )
    assert not contextvars.Context().run(asked, "/v1/responses/resp_1")


def test_logprob_entries_are_cut_to_their_known_keys() -> None:
    text = "The K7 stores 13.5 kWh."
    tokens = ["The", " K7", " stores", " 13.5", " kWh", "."]
    body = w.response_text(text)
    body["output"][0]["content"][0]["logprobs"] = [
        {"token": t, "bytes": list(t.encode()), "logprob": -0.1, "top_logprobs": [],
         "x_note": "PLANTED"} for t in tokens
    ]
    rewrite, out = _released(body, Policy(name="t", routes=[ROUTE]))
    assert rewrite
    assert out["output"][0]["content"][0]["logprobs"] == [
        {"token": t, "logprob": -0.1, "bytes": list(t.encode()), "top_logprobs": []}
        for t in tokens
    ]
    body["output"][0]["content"][0]["logprobs"][0]["logprob"] = "PLANTED"
    rewrite, out = _released(body, Policy(name="t", routes=[ROUTE]))
    assert rewrite and out["output"][0]["content"][0]["logprobs"] == []


def test_file_search_results_the_client_asked_for_are_shape_checked() -> None:
    good: dict[str, Any] = {
        "file_id": "k7", "filename": "k7.txt", "score": 0.5, "text": "The K7 stores 13.5 kWh.",
        "attributes": {"team": "k7", "rev": 3, "public": False},
    }
    results = [
        {**good, "x_note": "PLANTED", "attributes": {**good["attributes"], "note": "PLANTED x"}},
        "PLANTED",
        {"filename": "k7.txt", "text": "PLANTED without a file id"},
        {**good, "filename": "PLANTED file name"},
    ]
    fs = {**w.file_search_item(None, id="fs_1"), "results": results}
    body = w.response_body([fs, w.message_item("The K7 stores 13.5 kWh [k7:capacity].",
                                               id="m_1")], id="resp_1")
    rctx.set_client_wants_results(True)
    try:
        rewrite, out = _released(body, Policy(name="t", routes=[ROUTE]))
        clean, kept = _released(
            {**body, "output": [{**fs, "results": [good]}, body["output"][1]]},
            Policy(name="t", routes=[ROUTE]),
        )
    finally:
        rctx.set_client_wants_results(False)
    assert rewrite and "PLANTED" not in json.dumps(out)
    assert out["output"][0]["results"] == [good, {k: v for k, v in good.items()
                                                  if k != "filename"}]
    assert not clean and kept["output"][0]["results"] == [good]


def test_a_stream_error_message_never_carries_the_upstreams_text() -> None:
    """DESIGN §7: a gateway error names the problem, never echoes upstream content."""
    sentence = "The pump was designed by PLANTED in 1931."
    body = w.response_text("The K7 stores 13.5 kWh [k7:capacity].", id="resp_1")
    evs = _events(body)
    at = next(k for k, e in enumerate(evs) if e["type"] == "response.output_item.done")
    evs[at:at] = [
        {"type": "response.output_item.added", "output_index": 1,
         "item": {"type": sentence, "id": "x_1"}},
        {"type": "response.output_text.delta", "output_index": 1, "item_id": "x_1",
         "content_index": 0, "delta": "x", "logprobs": []},
    ]
    with pytest.raises(ProtocolError) as raised:
        _parse_stream(_wire(evs))
    assert "PLANTED" not in str(raised.value)
    repeated = _wire(_events(body)).replace(
        b'"type":', f'"{sentence}": 1, "{sentence}": 2, "type":'.encode(), 1
    )
    with pytest.raises(ProtocolError) as raised:
        _parse_stream(repeated)
    assert "PLANTED" not in str(raised.value)

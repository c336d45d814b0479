from __future__ import annotations

import base64
import json

import pytest

from gateway.context import (
    build_context,
    chunks_in_text,
    header_chunks,
    request_context,
    response_chunks,
)
from gateway.errors import ProtocolError
from gateway.policy import ContextSpec, RagSpec
from gateway.types import Chunk, Document


def b64url(obj: object, pad: bool = False) -> str:
    s = base64.urlsafe_b64encode(json.dumps(obj).encode()).decode()
    return s if pad else s.rstrip("=")


def test_chunk_tags_attribute_order_quotes_version_and_entities() -> None:
    text = (
        '<chunk id="hr:1" version="3">Leave is 25 days &amp; &lt;paid&gt;.</chunk>\n'
        "<chunk version='2' id='hr:2'>Say &quot;hi&quot;</chunk>"
        '<chunk id="hr:3">no version</chunk><chunk>no id</chunk>'
        '<chunk id="x">&amp;lt;</chunk>'
    )
    assert chunks_in_text(text) == [
        Chunk("hr:1", "Leave is 25 days & <paid>.", "3"),
        Chunk("hr:2", 'Say "hi"', "2"),
        Chunk("hr:3", "no version"),
        Chunk("x", "&lt;"),
    ]


def test_policy_chunk_pattern_replaces_tags() -> None:
    spec = ContextSpec(chunk_pattern=r"\[\[(?P<id>[^|\]]+)\|(?P<version>\w*)\|(?P<text>[^\]]*)\]\]")
    body = {
        "messages": [{"role": "system", "content": '[[a:1|v2|Alpha]] <chunk id="b">B</chunk>'}]
    }
    ctx = request_context("openai-chat", body, spec)
    assert list(ctx.chunks.values()) == [Chunk("a:1", "Alpha", "v2")]


def test_chunk_pattern_needs_id_and_text_groups() -> None:
    with pytest.raises(ValueError):
        request_context("openai-chat", {}, ContextSpec(chunk_pattern=r"(?P<id>\w+)"))


def test_openai_request_roles_and_content_parts() -> None:
    body = {
        "messages": [
            {"role": "system", "content": '<chunk id="s:1">sys</chunk>'},
            {
                "role": "developer",
                "content": [{"type": "text", "text": '<chunk id="d:1">dev</chunk>'}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": '<chunk id="u:1">user</chunk>'},
                    {"type": "image_url", "image_url": {"url": "x"}},
                ],
            },
            {"role": "assistant", "content": '<chunk id="a:1">model said</chunk>'},
            {"role": "tool", "tool_call_id": "t", "content": '<chunk id="t:1">tool</chunk>'},
        ]
    }
    ctx = request_context("openai-chat", body, ContextSpec())
    assert list(ctx.chunks) == ["s:1", "d:1", "t:1"]  # user text and assistant turns are not
    assert ctx.rejected == {"untrusted_role": 1}  # assistant turns are not even read


def test_anthropic_documents_search_results_and_system_blocks() -> None:
    body = {
        "system": [{"type": "text", "text": '<chunk id="sys:1">S</chunk>'}],
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "document",
                        "source": {
                            "type": "text",
                            "media_type": "text/plain",
                            "data": "Plain doc.",
                        },
                        "title": "Plain",
                    },
                    {
                        "type": "document",
                        "source": {
                            "type": "base64",
                            "media_type": "application/pdf",
                            "data": "JVBERi0=",
                        },
                    },
                    {
                        "type": "search_result",
                        "source": "https://kb/1",
                        "title": "KB 1",
                        "content": [
                            {"type": "text", "text": "First."},
                            {"type": "text", "text": "Second."},
                        ],
                    },
                    {"type": "text", "text": '<chunk id="u:1">U</chunk>'},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "text", "text": '<chunk id="a:1">A</chunk>'}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t",
                        "content": [
                            {
                                "type": "search_result",
                                "source": "s2",
                                "title": "KB 2",
                                "content": [{"type": "text", "text": "Third."}],
                            }
                        ],
                    },
                    {
                        "type": "document",
                        "title": "Custom",
                        "source": {
                            "type": "content",
                            "content": [
                                {"type": "text", "text": "Block A."},
                                {"type": "text", "text": "Block B."},
                            ],
                        },
                    },
                ],
            },
        ],
    }
    ctx = request_context("anthropic-messages", body, ContextSpec())
    assert list(ctx.chunks) == ["sys:1"]
    assert ctx.rejected == {"untrusted_role": 1}
    assert ctx.documents == [
        Document(0, "text", text="Plain doc.", title="Plain"),
        Document(1, "pdf"),
        Document(2, "content", blocks=("Block A.", "Block B."), title="Custom"),
    ]
    assert ctx.search_results == [
        Document(
            0, "search_result", blocks=("First.", "Second."), title="KB 1", source="https://kb/1"
        ),
        Document(1, "search_result", blocks=("Third.",), title="KB 2", source="s2"),
    ]
    assert Document(0, "text").kind == "text"


def test_anthropic_system_string() -> None:
    ctx = request_context(
        "anthropic-messages", {"system": '<chunk id="a">x</chunk>', "messages": []}, ContextSpec()
    )
    assert ctx.get("a") == Chunk("a", "x")


def test_rag_json_response_context_objects_and_positions() -> None:
    rag = RagSpec(context="/sources", context_id="doc", context_text="body")
    body = {
        "sources": [{"doc": "kb:1", "body": "One", "version": 4, "source": "s"}, {"body": "No id"}]
    }
    assert response_chunks(body, rag) == [Chunk("kb:1", "One", "4", "s"), Chunk("2", "No id")]
    assert response_chunks({"sources": ["a", "b"]}, rag) == [Chunk("1", "a"), Chunk("2", "b")]
    assert response_chunks({}, rag) == []
    with pytest.raises(ProtocolError):
        response_chunks({"sources": {"a": 1}}, rag)
    with pytest.raises(ProtocolError):
        response_chunks({"sources": [3]}, rag)


def test_context_header_with_and_without_padding() -> None:
    chunks = [{"id": "a:1", "text": "T", "version": "2"}, {"id": "b:1"}]
    for pad in (True, False):
        got = header_chunks({"X-Citewarden-Context": b64url(chunks, pad)})
        assert got == [Chunk("a:1", "T", "2"), Chunk("b:1")]


def test_context_ids_header() -> None:
    assert header_chunks([("x-citewarden-context-ids", "a:1, b:2")]) == [Chunk("a:1"), Chunk("b:2")]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("x-citewarden-context", "!!!not base64"),
        ("x-citewarden-context", b64url({"id": "a"})),
        ("x-citewarden-context", b64url([{"text": "no id"}])),
        ("x-citewarden-context", b64url([{"id": "a", "text": 3}])),
        ("x-citewarden-context", base64.urlsafe_b64encode(b"not json").decode()),
        ("x-citewarden-context-ids", "a,,b"),
    ],
)
def test_malformed_context_header_fails_closed(name: str, value: str) -> None:
    with pytest.raises(ProtocolError):
        header_chunks({name: value})


def test_build_context_uses_only_named_sources_and_upgrades_id_only() -> None:
    request = {"messages": [{"role": "system", "content": '<chunk id="a">from request</chunk>'}]}
    response = {"sources": [{"id": "b", "text": "from response"}]}
    headers = {"x-citewarden-context-ids": "a,b,c"}
    rag = RagSpec(context="/sources")
    ctx = build_context(
        "openai-chat",
        ContextSpec.model_validate({"from": ["header", "request"]}),
        request=request,
        response=response,
        headers=headers,
        rag=rag,
    )
    assert ctx.chunks == {"a": Chunk("a", "from request"), "b": Chunk("b"), "c": Chunk("c")}
    only_req = build_context(
        "openai-chat",
        ContextSpec.model_validate({"from": ["request"]}),
        request=request,
        headers={"x-citewarden-context-ids": "!,"},
    )
    assert list(only_req.chunks) == ["a"]


def test_repeated_prompt_text_gives_equal_independent_chunk_lists() -> None:
    text = '<chunk id="a:1" version="2">Alpha.</chunk> and <chunk id="b:1">Beta.</chunk>'
    first = chunks_in_text(text)
    first.append(Chunk("x:9", "planted"))  # a caller mutating its list ...
    second = chunks_in_text(text)  # ... must not change what the next request gets
    assert [c.id for c in second] == ["a:1", "b:1"]
    big = text + " " * (64 * 1024)  # beyond the cached size: extracted afresh, same result
    assert chunks_in_text(big) == second

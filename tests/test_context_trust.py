"""Which places of a request are context (`context.trust`) and HMAC-signed chunks
(`context.signing`), DESIGN §3: unit level. End to end: tests/test_context_e2e.py."""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import context as context_mod
from gateway.context import (
    REJECT_REASONS,
    build_context,
    chunk_signature,
    request_context,
    sign_chunk,
)
from gateway.errors import PolicyError
from gateway.metrics import CONTEXT_REJECT_REASONS, Metrics
from gateway.policy import (
    ContextSpec,
    Policy,
    canonical_json,
    check_paths,
    from_model,
    load_policy,
)
from gateway.types import Chunk, ContextSet, Document, Report

KEY = "k3y-for-tests"
KEY_ENV = "CITEWARDEN_TEST_CONTEXT_KEY"


def tag(cid: str, text: str) -> str:
    return f'<chunk id="{cid}">{text}</chunk>'


def spec(**context: Any) -> ContextSpec:
    return ContextSpec.model_validate(context)


@pytest.fixture
def signing(monkeypatch: pytest.MonkeyPatch) -> ContextSpec:
    monkeypatch.setenv(KEY_ENV, KEY)
    return spec(signing={"key_env": KEY_ENV})


def openai(*messages: tuple[str, object]) -> dict[str, object]:
    return {"messages": [{"role": r, "content": c} for r, c in messages]}


# -- context.trust: OpenAI ------------------------------------------------------------------------


def test_openai_default_trusts_system_developer_tool_and_function_only() -> None:
    body = openai(
        ("system", tag("s", "S")),
        ("developer", [{"type": "text", "text": tag("d", "D")}]),
        ("user", tag("u1", "planted")),
        ("user", [{"type": "text", "text": tag("u2", "planted")}]),
        ("assistant", tag("a", "model said")),
        ("tool", tag("t", "T")),
        ("function", tag("f", "F")),
        ("System", tag("x", "not a role")),
    )
    ctx = request_context("openai-chat", body, ContextSpec())
    assert list(ctx.chunks) == ["s", "d", "t", "f"]
    assert ctx.rejected == {"untrusted_role": 2}


def test_trust_roles_widen_and_narrow() -> None:
    body = openai(("system", tag("s", "S")), ("user", tag("u", "U")), ("tool", tag("t", "T")))
    wide = request_context("openai-chat", body, spec(trust={"roles": ["system", "user"]}))
    assert list(wide.chunks) == ["s", "u"]
    assert wide.rejected == {"untrusted_role": 1}  # the tool message, now left out
    none = request_context("openai-chat", body, spec(trust={"roles": []}))
    assert none.chunks == {} and none.rejected == {"untrusted_role": 3}


def test_trust_roles_cannot_name_assistant() -> None:
    with pytest.raises(ValueError, match="assistant"):
        spec(trust={"roles": ["system", "assistant"]})


def test_only_text_parts_are_read() -> None:
    parts = [
        {"type": "image_url", "image_url": {"url": "u"}, "text": tag("img", "hidden")},
        {"type": "text", "text": tag("s", "S")},
        {"text": tag("untyped", "U")},
    ]
    ctx = request_context("openai-chat", openai(("system", parts)), ContextSpec())
    assert list(ctx.chunks) == ["s"]


def test_user_text_without_tags_costs_no_rejection() -> None:
    ctx = request_context("openai-chat", openai(("user", "What is 2 < 3?")), ContextSpec())
    assert ctx.chunks == {} and ctx.rejected == {}


# -- context.trust: Anthropic ---------------------------------------------------------------------


def text_doc(data: str) -> dict[str, object]:
    return {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": data},
    }


def search_result(text: str) -> dict[str, object]:
    return {
        "type": "search_result",
        "source": "kb",
        "title": "KB",
        "content": [{"type": "text", "text": text}],
    }


def anthropic_body() -> dict[str, object]:
    return {
        "system": [{"type": "text", "text": tag("sys", "S")}],
        "messages": [
            {"role": "user", "content": tag("u1", "planted string")},
            {"role": "assistant", "content": [text_doc("assistant doc"), search_result("asr")]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": tag("u2", "planted block")},
                    text_doc("Doc one. " + tag("indoc", "I")),
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": tag("tr1", "tool string"),
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [
                            {"type": "text", "text": tag("tr2", "tool block")},
                            search_result("Nested result."),
                        ],
                    },
                ],
            },
        ],
    }


def test_anthropic_default_trust() -> None:
    ctx = request_context("anthropic-messages", anthropic_body(), ContextSpec())
    assert list(ctx.chunks) == ["sys", "indoc", "tr1", "tr2"]
    # The assistant turn's blocks are not context but keep their numbers: the user turn's
    # document is document_index 1 and its nested search result search_result_index 1.
    assert ctx.documents == [Document(1, "text", text="Doc one. " + tag("indoc", "I"))]
    assert ctx.search_results == [
        Document(1, "search_result", blocks=("Nested result.",), title="KB", source="kb")
    ]
    assert ctx.rejected == {"untrusted_role": 2, "untrusted_document": 2}


def test_anthropic_documents_off_and_system_string() -> None:
    body = anthropic_body()
    body["system"] = tag("sys", "S")
    ctx = request_context("anthropic-messages", body, spec(trust={"documents": False}))
    assert list(ctx.chunks) == ["sys", "tr1", "tr2"]  # no tag read from inside a document
    assert ctx.documents == [] and ctx.search_results == []
    assert ctx.rejected == {"untrusted_role": 2, "untrusted_document": 4}


def test_anthropic_system_can_be_left_out() -> None:
    body = anthropic_body()
    ctx = request_context("anthropic-messages", body, spec(trust={"roles": ["tool"]}))
    assert list(ctx.chunks) == ["indoc", "tr1", "tr2"]


# -- rag-json request ----------------------------------------------------------------------------


def test_rag_json_request_is_not_context_unless_signed(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"question": "Q " + tag("doc:9", "planted"), "filters": {"k": [tag("doc:8", "x")]}}
    ctx = request_context("rag-json", body, ContextSpec())
    assert ctx.chunks == {} and ctx.rejected == {"untrusted_role": 2}
    monkeypatch.setenv(KEY_ENV, KEY)
    signed = {"question": sign_chunk(KEY, "doc:9", "2", "Signed."), "x": tag("doc:8", "x")}
    ctx = request_context("rag-json", signed, spec(signing={"key_env": KEY_ENV}))
    assert list(ctx.chunks.values()) == [Chunk("doc:9", "Signed.", "2")]
    assert ctx.rejected == {"unsigned": 1}


# -- context.signing ------------------------------------------------------------------------------


def test_signature_is_hmac_sha256_of_id_version_and_raw_text() -> None:
    raw = "Tom &amp; Jerry"
    want = hmac.new(KEY.encode(), b"a:1\x1fv2\x1fTom &amp; Jerry", hashlib.sha256)
    assert chunk_signature(KEY, "a:1", "v2", raw) == want.hexdigest()
    absent = hmac.new(KEY.encode(), b"a:1\x1f\x1fx", hashlib.sha256).hexdigest()
    assert chunk_signature(KEY.encode(), "a:1", None, "x") == absent
    assert sign_chunk(KEY, "a:1", None, "x") == f'<chunk id="a:1" sig="{absent}">x</chunk>'


def test_signed_chunks_count_from_any_role_unsigned_never(signing: ContextSpec) -> None:
    text = 'Fish & chips < "5" >'
    body = openai(
        ("system", tag("plain", "unsigned in system")),
        ("user", sign_chunk(KEY, "u:1", "3", text)),
        ("tool", sign_chunk(KEY, 'q"id&', None, "T")),
        ("assistant", sign_chunk(KEY, "a:1", None, "never read")),
    )
    ctx = request_context("openai-chat", body, signing)
    assert list(ctx.chunks.values()) == [Chunk("u:1", text, "3"), Chunk('q"id&', "T")]
    assert ctx.rejected == {"unsigned": 1}


@pytest.mark.parametrize(
    "forge",
    [
        lambda t: t.replace("The pack", "The moon"),  # text changed
        lambda t: t.replace('id="bat:1"', 'id="bat:2"'),  # id changed
        lambda t: t.replace('version="3"', 'version="4"'),  # version changed
        lambda t: t.replace(' version="3"', ""),  # version dropped
        lambda t: re.sub(r'sig="([0-9a-f]+)"', lambda m: f'sig="{m.group(1).upper()}"', t),
        lambda t: re.sub(r'sig="[0-9a-f]+"', 'sig="é✓"', t),  # not even ASCII
        lambda t: re.sub(r'sig="[0-9a-f]+"', 'sig=""', t),
        lambda t: t.replace("&amp;", "&"),  # raw text is what is signed
    ],
)
def test_forged_or_altered_signed_chunks_are_refused(signing: ContextSpec, forge: Any) -> None:
    good = sign_chunk(KEY, "bat:1", "3", "The pack stores 62.5 kWh & weighs 410 kg.")
    assert list(request_context("openai-chat", openai(("user", good)), signing).chunks) == ["bat:1"]
    bad = forge(good)
    assert bad != good
    ctx = request_context("openai-chat", openai(("system", bad)), signing)
    assert ctx.chunks == {}
    assert ctx.rejected == {"bad_signature": 1}


def test_wrong_key_and_separator_splicing_are_refused(signing: ContextSpec) -> None:
    other = sign_chunk("another key", "a", "1", "x")
    # A chunk signed as (id "a", version "b", text "c\x1fd") must not be re-read as
    # (id "a", version "b\x1fc", text "d"): ids and versions cannot hold the separator.
    sig = chunk_signature(KEY, "a", "b", "c\x1fd")
    spliced = f'<chunk id="a" version="b\x1fc" sig="{sig}">d</chunk>'
    ctx = request_context("openai-chat", openai(("system", other + spliced)), signing)
    assert ctx.chunks == {} and ctx.rejected == {"bad_signature": 2}
    with pytest.raises(ValueError):
        sign_chunk(KEY, "a", "b\x1fc", "d")


def test_signed_chunk_source_is_not_trusted(signing: ContextSpec) -> None:
    tagged = sign_chunk(KEY, "a", None, "x").replace("<chunk ", '<chunk source="evil" ')
    ctx = request_context("openai-chat", openai(("user", tagged)), signing)
    assert ctx.chunks == {"a": Chunk("a", "x")}


def test_signing_applies_to_anthropic_documents_text_too(signing: ContextSpec) -> None:
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    text_doc(tag("plain", "P") + sign_chunk(KEY, "s", None, "S")),
                    {"type": "text", "text": sign_chunk(KEY, "u", None, "U")},
                ],
            }
        ]
    }
    ctx = request_context("anthropic-messages", body, signing)
    assert list(ctx.chunks) == ["s", "u"]
    assert len(ctx.documents) == 1  # documents carry no signature: trust.documents decides
    assert ctx.rejected == {"unsigned": 1}


def test_custom_pattern_with_signing_needs_a_sig_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    with pytest.raises(ValueError, match="sig"):
        spec(chunk_pattern=r"\[(?P<id>\w+)\|(?P<text>[^\]]*)\]", signing={"key_env": KEY_ENV})
    s = spec(
        chunk_pattern=r"\[(?P<id>\w+)\|(?P<sig>\w*)\|(?P<text>[^\]]*)\]",
        signing={"key_env": KEY_ENV},
    )
    text = "line 1\nline 2"
    good = f"[a|{chunk_signature(KEY, 'a', None, text)}|{text}]"
    ctx = request_context("openai-chat", openai(("user", good + "[b|00|x]")), s)
    assert ctx.chunks == {"a": Chunk("a", text)}
    assert ctx.rejected == {"bad_signature": 1}


# -- policy load ----------------------------------------------------------------------------------

POLICY = """\
name: signed
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat
context:
  from: [request]
  signing:
    key_env: %s
"""


def test_missing_or_empty_key_env_is_a_policy_error_with_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY % KEY_ENV)
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert (err.value.line, KEY_ENV in str(err.value)) == (9, True)
    monkeypatch.setenv(KEY_ENV, "")
    with pytest.raises(PolicyError, match="empty"):
        load_policy(path)
    monkeypatch.setenv(KEY_ENV, KEY)
    loaded = load_policy(path)
    assert loaded.policy.context.signing is not None
    assert loaded.policy.context.signing.key == KEY.encode()
    # The key itself is in no canonical form (so no version), repr or dump.
    dumped = canonical_json(loaded.policy) + repr(loaded.policy) + str(loaded.policy.model_dump())
    assert KEY not in dumped and KEY_ENV in dumped


def test_serve_refuses_to_start_without_the_key(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(POLICY % "CITEWARDEN_TEST_KEY_THAT_IS_NOT_SET")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--upstream",
            "http://127.0.0.1:9",
            "--policy",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "CITEWARDEN_POLICY"},
    )
    assert result.returncode == 2, result.stderr
    assert f"{path}:9:" in result.stderr
    assert "CITEWARDEN_TEST_KEY_THAT_IS_NOT_SET is not set" in result.stderr


def test_chunk_pattern_is_compiled_once_at_load_with_dotall() -> None:
    policy = Policy.model_validate(
        {
            "name": "p",
            "routes": [{"name": "r", "match": {"path": "/x"}, "protocol": "openai-chat"}],
            "context": {"chunk_pattern": r"\[\[(?P<id>[^|]+)\|(?P<text>.*?)\]\]"},
        }
    )
    loaded = from_model(policy)
    compiled = loaded.compiled.chunk_pattern
    assert compiled is not None and compiled.flags & re.S
    assert policy.context.chunk_re is compiled
    assert context_mod.trust_of(policy.context).pattern is compiled
    ctx = build_context("openai-chat", policy.context, request=openai(("system", "[[a|one\ntwo]]")))
    assert ctx.chunks == {"a": Chunk("a", "one\ntwo")}


# -- metrics ------------------------------------------------------------------------------------


def test_rejections_are_counted_per_route_and_reason() -> None:
    assert set(REJECT_REASONS) == CONTEXT_REJECT_REASONS
    m = Metrics()
    ctx = ContextSet()
    ctx.rejected.update({"untrusted_role": 2, "bad_signature": 1, "made_up": 1})
    m.observe_verification("chat", Report((), ctx))
    m.observe_verification("chat", Report((), ContextSet()))
    m.observe_verification("chat", Report((), "fingerprint-only"))

    def value(why: str) -> float | None:
        return m.registry.get_sample_value(
            "citewarden_context_rejected_total", {"route": "chat", "why": why}
        )

    assert (value("untrusted_role"), value("bad_signature"), value("unknown")) == (2, 1, 1)
    assert value("made_up") is None


# -- chunk tag scanning: the client's text must not cost quadratic time -------------------------

_REFERENCE_TAG = re.compile(r"<chunk\b(?P<attrs>[^>]*)>(?P<text>.*?)</chunk\s*>", re.S | re.I)
_REFERENCE_ATTR = re.compile(r"""([A-Za-z_][\w:.-]*)\s*=\s*(?:"([^"]*)"|'([^']*)')""")
_PIECES = [
    "<chunk",
    "<CHUNK",
    ">",
    "</chunk>",
    "</Chunk \n>",
    "</chunk",
    " ",
    "\n",
    "a",
    "-",
    'id="x"',
    "id='y'",
    'version="2"',
    "=",
    '"',
    "<chunky",
    "x:1",
]


@given(st.lists(st.sampled_from(_PIECES), max_size=40))
@settings(max_examples=300, deadline=None)
def test_tag_scanner_agrees_with_the_reference_regex(pieces: list[str]) -> None:
    text = "".join(pieces)
    want = []
    for m in _REFERENCE_TAG.finditer(text):
        attrs = {
            a.group(1).lower(): a.group(2) if a.group(2) is not None else a.group(3)
            for a in _REFERENCE_ATTR.finditer(m.group("attrs"))
        }
        if attrs.get("id"):
            want.append((attrs["id"], m.group("text"), attrs.get("version") or None))
    got = [(c.id, c.text, c.version) for c in context_mod._tags(text, None)]
    assert got == want


@pytest.mark.parametrize(
    "text",
    [
        "<chunk " + "a" * 200_000 + ">x</chunk>",  # one long attribute name
        "<chunk " + 'a="' * 60_000 + ">",  # unclosed quotes
        '<chunk id="a" ' * 20_000,  # openings that never close
        "<chunk " * 30_000,  # openings without `>`
        '<chunk id="a">x</chunk   ' * 8_000,  # closes without `>`
    ],
)
def test_pathological_user_text_is_scanned_in_linear_time(text: str) -> None:
    body = openai(("user", text), ("system", text))
    t0 = time.perf_counter()
    request_context("openai-chat", body, ContextSpec())
    assert time.perf_counter() - t0 < 2.0  # quadratic scanning took minutes


def test_policy_check_warns_when_user_text_is_trusted(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "name: p\nroutes:\n  - name: r\n    match: {path: /x}\n    protocol: openai-chat\n"
        "context:\n  trust:\n    roles: [system, user]\n"
    )
    out = io.StringIO()
    check_paths([str(path)], out)
    assert f"{path}:8: warning: context.trust.roles includes user" in out.getvalue()

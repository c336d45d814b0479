"""Route matching across files, header conditions, passthrough, and `policy check` lint."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.errors import PolicyError
from gateway.paths import lenient, segments
from gateway.policy import PolicySet, check_paths, load_policies, load_policy

FIRST = """\
name: first
routes:
  - name: acme-chat
    match:
      path: /v1/chat/completions
      header: {X-Tenant: acme, x-plan: gold}
    protocol: openai-chat
  - name: kb
    match: {path_prefix: /rag/}
    protocol: rag-json
    rag: {answer: /answer, context: /sources}
passthrough: [/v1/models, /static/*]
"""

SECOND = """\
name: second
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat
  - name: messages
    match: {path: /v1/messages, methods: [post]}
    protocol: anthropic-messages
  - name: rag-special
    match: {path_prefix: /rag/special/}
    protocol: rag-json
    rag: {claims: /claims}
passthrough: [/healthz-upstream]
"""


def write(tmp_path: Path, text: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


@pytest.fixture
def policies(tmp_path: Path) -> PolicySet:
    return load_policies([write(tmp_path, FIRST, "a.yaml"), write(tmp_path, SECOND, "b.yaml")])


def routed(policies: PolicySet, method: str, path: str, headers: dict[str, str]) -> str | None:
    found = policies.match(method, path, headers)
    return None if found is None else f"{found[0].name}/{found[1].name}"


def test_files_in_order_then_routes_in_order(policies: PolicySet) -> None:
    gold = {"x-tenant": "acme", "x-plan": "gold"}
    assert routed(policies, "POST", "/v1/chat/completions", gold) == "first/acme-chat"
    assert routed(policies, "POST", "/v1/chat/completions", {}) == "second/chat"
    # The earlier file's prefix wins over the later, more specific prefix.
    assert routed(policies, "POST", "/rag/special/x", {}) == "first/kb"
    assert routed(policies, "POST", "/v1/messages", {}) == "second/messages"


def test_order_of_files_decides(tmp_path: Path) -> None:
    a, b = write(tmp_path, FIRST, "a.yaml"), write(tmp_path, SECOND, "b.yaml")
    reversed_ = load_policies([b, a])
    gold = {"x-tenant": "acme", "x-plan": "gold"}
    assert routed(reversed_, "POST", "/v1/chat/completions", gold) == "second/chat"
    assert routed(reversed_, "POST", "/rag/special/x", {}) == "second/rag-special"


def test_header_conditions_all_must_hold_names_case_insensitive(policies: PolicySet) -> None:
    path = "/v1/chat/completions"
    assert routed(policies, "POST", path, {"X-TENANT": "acme", "X-Plan": "gold"}) == (
        "first/acme-chat"
    )
    assert routed(policies, "POST", path, {"x-tenant": "acme"}) == "second/chat"
    assert routed(policies, "POST", path, {"x-tenant": "ACME", "x-plan": "gold"}) == "second/chat"


def test_exact_path_ignores_query_string_and_requires_equality(policies: PolicySet) -> None:
    assert routed(policies, "POST", "/v1/messages?beta=true", {}) == "second/messages"
    assert routed(policies, "POST", "/v1/messages/", {}) is None
    assert routed(policies, "POST", "/v1/messages/count_tokens", {}) is None
    assert routed(policies, "POST", "/rag", {}) is None


def test_methods_condition(policies: PolicySet) -> None:
    assert routed(policies, "post", "/v1/messages", {}) == "second/messages"
    assert routed(policies, "GET", "/v1/messages", {}) is None


def test_passthrough_exact_and_star_prefix(policies: PolicySet) -> None:
    assert policies.is_passthrough("/v1/models")
    assert policies.is_passthrough("/v1/models?limit=5")
    assert not policies.is_passthrough("/v1/models/gpt-4o")
    assert policies.is_passthrough("/static/")
    assert policies.is_passthrough("/static/app.js")
    assert not policies.is_passthrough("/static")
    assert policies.is_passthrough("/healthz-upstream")  # from the second file
    assert not policies.is_passthrough("/v1/chat/completions")


def test_route_by_name_and_labels(policies: PolicySet) -> None:
    found = policies.route("messages")
    assert found is not None and found[0].name == "second"
    assert policies.route("nope") is None
    assert [label.split("@")[0] for label in policies.labels] == ["first", "second"]


def test_duplicate_route_names_across_files_are_rejected(tmp_path: Path) -> None:
    a = write(tmp_path, SECOND, "a.yaml")
    b = write(tmp_path, SECOND.replace("name: second", "name: third"), "b.yaml")
    with pytest.raises(PolicyError) as info:
        load_policies([a, b])
    assert info.value.file == str(b)
    assert info.value.line == 3
    assert f"already used in {a}:3" in info.value.message


def test_no_files_is_an_error() -> None:
    with pytest.raises(PolicyError):
        load_policies([])


DEFAULT = load_policies([Path(__file__).resolve().parent.parent / "policies/default.yaml"])


@given(
    path=st.text(alphabet="/abcrgv1?=&.", max_size=30),
    tenant=st.sampled_from(["acme", "ACME", "other", None]),
)
def test_match_agrees_with_a_naive_reading_of_the_rules(path: str, tenant: str | None) -> None:
    policies = DEFAULT
    headers = {} if tenant is None else {"x-tenant": tenant}
    bare = path.split("?", 1)[0]
    expected = (
        "chat"
        if bare == "/v1/chat/completions"
        else "messages"
        if bare == "/v1/messages"
        else "rag"
        if bare.startswith("/rag/")
        else None
    )
    found = policies.match("POST", path, headers)
    assert (None if found is None else found[1].name) == expected


# ------------------------------------------------------------------ policy check lint


def check(*paths: Path) -> tuple[int, list[str]]:
    out = io.StringIO()
    code = check_paths([str(p) for p in paths], out)
    # Notes (claims.code: exempt) are tested in test_claims_policy.py.
    return code, [line for line in out.getvalue().splitlines() if ": note: " not in line]


def test_check_reports_ok_with_label(tmp_path: Path) -> None:
    a = write(tmp_path, SECOND, "a.yaml")
    code, lines = check(a)
    assert code == 0
    assert lines == [f"ok: {a} ({load_policy(a).label})"]


def test_unreachable_routes_within_and_across_files(tmp_path: Path) -> None:
    a = write(
        tmp_path,
        """\
        name: a
        routes:
          - name: all-rag
            match: {path_prefix: /rag/}
            protocol: rag-json
            rag: {answer: /answer}
          - name: rag-deep
            match: {path_prefix: /rag/deep/}
            protocol: rag-json
            rag: {answer: /answer}
          - name: rag-exact
            match: {path: /rag/x, header: {x-tenant: acme}}
            protocol: rag-json
            rag: {answer: /answer}
          - name: tenant
            match: {header: {x-tenant: acme}}
            protocol: openai-chat
          - name: tenant-chat
            match: {path: /v1/chat/completions, header: {X-Tenant: acme, x-plan: gold}}
            protocol: openai-chat
          - name: chat-post
            match: {path: /v1/chat/completions, methods: [POST]}
            protocol: openai-chat
          - name: chat-any
            match: {path: /v1/chat/completions}
            protocol: openai-chat
        """,
        "a.yaml",
    )
    b = write(
        tmp_path,
        """\
        name: b
        routes:
          - name: chat-b
            match: {path: /v1/chat/completions, methods: [POST]}
            protocol: openai-chat
          - name: messages
            match: {path: /v1/messages}
            protocol: anthropic-messages
        """,
        "b.yaml",
    )
    code, lines = check(a, b)
    assert code == 0  # warnings only
    warnings = [line for line in lines if ": warning: " in line]
    assert warnings == [
        f"{a}:7: warning: route 'rag-deep' is unreachable: every request it matches is taken "
        f"first by route 'all-rag' ({a}:3)",
        f"{a}:11: warning: route 'rag-exact' is unreachable: every request it matches is taken "
        f"first by route 'all-rag' ({a}:3)",
        f"{a}:18: warning: route 'tenant-chat' is unreachable: every request it matches is "
        f"taken first by route 'tenant' ({a}:15)",
        f"{b}:3: warning: route 'chat-b' is unreachable: every request it matches is taken "
        f"first by route 'chat-post' ({a}:21)",
    ]
    # chat-any after chat-post is reachable (GET), and so is /v1/messages.
    assert not any("'chat-any'" in w or "'messages'" in w for w in warnings)
    # Grouped per file in the order given: a's warnings, a's ok line, then b's.
    assert lines[3] == f"ok: {a} ({load_policy(a).label})"
    assert lines[-1] == f"ok: {b} ({load_policy(b).label})"


@pytest.mark.parametrize(
    ("extra", "line", "fragment"),
    [
        ("mode: shadow\n", 6, "mode: shadow — NOTHING IS ENFORCED"),
        ("checks: []\n", 6, "checks is empty"),
        (
            "checks: [missing_citation]\nrelease:\n  on_unverified: strip\n",
            8,
            "on_unverified: strip without hallucinated_citation",
        ),
        (
            "streaming:\n  mode: progressive\n",
            7,
            "a block mid-stream ends the stream with the protocol's error event",
        ),
        ("citations:\n  pattern: '(?P<id>x)'\n", 7, "citations.pattern is ignored"),
        ("support:\n  threshold: 0.7\n", 6, "unsupported is not in checks"),
        ("checks: [missing_citation, missing_citation]\n", 6, "more than once"),
    ],
)
def test_lint_warnings(tmp_path: Path, extra: str, line: int, fragment: str) -> None:
    base = "name: p\nroutes:\n  - name: chat\n    match: {path: /c}\n    protocol: openai-chat\n"
    path = write(tmp_path, base + extra, "p.yaml")
    code, lines = check(path)
    assert code == 0
    warnings = [w for w in lines if ": warning: " in w]
    assert len(warnings) == 1, lines
    assert warnings[0].startswith(f"{path}:{line}: warning: ")
    assert fragment in warnings[0]
    assert lines[-1].startswith(f"ok: {path} (p@")


def test_progressive_strip_and_buffer_block_do_not_warn(tmp_path: Path) -> None:
    base = "name: p\nroutes:\n  - name: chat\n    match: {path: /c}\n    protocol: openai-chat\n"
    strip = write(
        tmp_path, base + "streaming: {mode: progressive}\nrelease: {on_unverified: strip}\n", "s"
    )
    block = write(tmp_path, base + "streaming: {mode: buffer}\n", "b")
    assert check(strip) == (0, [f"ok: {strip} ({load_policy(strip).label})"])
    assert check(block) == (0, [f"ok: {block} ({load_policy(block).label})"])


def test_rag_on_other_protocol_warns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: p
        routes:
          - name: chat
            match: {path: /c}
            protocol: openai-chat
            rag: {answer: /answer}
        """,
        "p.yaml",
    )
    code, lines = check(path)
    assert code == 0
    assert lines[0] == f"{path}:6: warning: rag is ignored for protocol openai-chat"


def test_check_errors_exit_1_and_good_files_still_report_ok(tmp_path: Path) -> None:
    good = write(tmp_path, SECOND, "good.yaml")
    bad = write(tmp_path, "name: bad\nroutes: []\n", "bad.yaml")
    missing = tmp_path / "missing.yaml"
    code, lines = check(good, bad, missing)
    assert code == 1
    assert lines[0] == f"ok: {good} ({load_policy(good).label})"
    assert lines[1].startswith(f"{bad}:2: error: routes: ")
    assert lines[2].startswith(f"{missing}: error: cannot read policy file")
    assert len(lines) == 3


def test_check_cross_file_duplicate_route_is_an_error(tmp_path: Path) -> None:
    a = write(tmp_path, SECOND, "a.yaml")
    b = write(tmp_path, SECOND.replace("name: second", "name: other"), "b.yaml")
    code, lines = check(a, b)
    assert code == 1
    assert f"{b}:3: error: route name 'chat' is already used in {a}:3" in "\n".join(lines)
    assert not any(line.startswith(f"ok: {b}") for line in lines)


def test_check_with_no_paths() -> None:
    assert check() == (1, ["error: no policy files given"])


def test_lenient_spelling_merges_empty_segments_cuts_parameters_and_folds_case() -> None:
    assert lenient(segments("/v1//Chat/completions;x=1/")) == ("", "v1", "chat", "completions")
    assert lenient(segments("/")) == ("",)
    assert lenient(segments("/v1/chat%2Fcompletions")) == ("", "v1", "chat", "completions")
    # As many rounds of decoding as the path checks read through (paths.refusal).
    assert lenient(segments("/v1/chat%25252F%2563ompletions")) == (
        "", "v1", "chat", "completions")


def test_a_path_aliases_a_route_only_when_its_lenient_spelling_matches_one(
    policies: PolicySet,
) -> None:
    headers = {"x-tenant": "acme"}
    for path, expected in [
        ("/v1/chat//completions", True),
        ("/V1/CHAT/COMPLETIONS/", True),
        ("/v1/models", False),
        ("/v1/chat", False),
    ]:
        assert policies.aliases_route("POST", segments(path), headers) is expected, path

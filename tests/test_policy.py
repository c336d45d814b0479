"""Policy loading: file:line errors for every rejection, canonical versions, compiled regexes."""

from __future__ import annotations

import io
import textwrap
from pathlib import Path

import pytest

from gateway.errors import PolicyError
from gateway.policy import (
    SHORT_VERSION_LEN,
    ClaimsSpec,
    LoadedPolicy,
    Policy,
    check_paths,
    from_model,
    load_policies,
    load_policy,
)

POLICIES = Path(__file__).resolve().parent.parent / "policies"
SHIPPED = sorted(POLICIES.glob("*.yaml"))

MINIMAL = """\
name: p
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat
"""


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def error_of(path: Path) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_policy(path)
    assert info.value.file == str(path)
    return info.value


# ------------------------------------------------------------------ shipped policies


def test_all_five_example_policies_ship() -> None:
    names = {p.stem for p in SHIPPED}
    assert {"default", "strict", "lenient", "shadow", "rag-json"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_policy_loads_and_checks_clean(path: Path) -> None:
    loaded = load_policy(path)
    assert loaded.label == f"{loaded.policy.name}@{loaded.version[:12]}"
    out = io.StringIO()
    assert check_paths([str(path)], out) == 0, out.getvalue()
    assert f"ok: {path} ({loaded.label})" in out.getvalue()
    assert ": error:" not in out.getvalue()


def test_shipped_policies_load_together() -> None:
    policies = load_policies(SHIPPED)
    assert len(policies.policies) == len(SHIPPED)


def test_shipped_policies_have_the_documented_choices() -> None:
    by_stem = {p.stem: load_policy(p).policy for p in SHIPPED}
    default = by_stem["default"]
    assert [r.protocol for r in default.routes] == ["openai-chat", "anthropic-messages", "rag-json"]
    assert default.passthrough == ["/v1/models"]
    assert default.release.on_unverified == "block"
    strict = by_stem["strict"]
    assert "unsupported" in strict.checks
    assert strict.release.on_infrastructure_failure == "block"
    assert strict.streaming.mode == "buffer"
    assert by_stem["lenient"].release.on_unverified == "strip"
    assert by_stem["shadow"].mode == "shadow"
    rag = by_stem["rag-json"]
    assert rag.citations.format == "numeric"
    assert rag.routes[0].rag is not None
    assert rag.routes[0].rag.claims == "/claims"
    assert rag.routes[0].rag.context == "/documents"


# ------------------------------------------------------------------ errors with file:line


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match: {path: /v1/chat/completions}
                protocol: openai-chat
                protocl: x
            """,
            6,
            "unknown key 'protocl' in routes[0]; did you mean 'protocol'?",
            id="unknown-key",
        ),
        pytest.param(
            MINIMAL + "colour: blue\n",
            6,
            "unknown key 'colour' at the top level",
            id="unknown-top-level-key",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match: {path: /v1/chat/completions}
                protocol: openai-chatt
            """,
            5,
            "routes[0].protocol: Input should be",
            id="enum",
        ),
        pytest.param(
            MINIMAL + "release:\n  block_status: lots\n",
            7,
            "release.block_status",
            id="wrong-type",
        ),
        pytest.param(
            MINIMAL + "release:\n  block_status: 200\n",
            7,
            "release.block_status",
            id="out-of-range",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                protocol: openai-chat
            """,
            3,
            "missing required key 'match' in routes[0]",
            id="missing-key",
        ),
        pytest.param(
            MINIMAL + "citations:\n  format: regex\n  pattern: '[A-Z]+'\n",
            8,
            "citations.pattern: needs a named group `id`",
            id="citation-pattern-without-id",
        ),
        pytest.param(
            MINIMAL + "citations:\n  format: regex\n  pattern: '(?P<id>[A-Z'\n",
            8,
            "citations.pattern: not a valid regular expression",
            id="citation-pattern-invalid",
        ),
        pytest.param(
            MINIMAL + "citations:\n  format: regex\n",
            7,
            "citations.format: regex needs citations.pattern",
            id="regex-without-pattern",
        ),
        pytest.param(
            MINIMAL + "context:\n  chunk_pattern: '(?P<id>\\w+)'\n",
            7,
            "context.chunk_pattern: needs named groups `id` and `text`; missing `text`",
            id="chunk-pattern-groups",
        ),
        pytest.param(
            MINIMAL + "claims:\n  exempt:\n    - '^ok'\n    - '(unclosed'\n",
            9,
            "claims.exempt[1]: not a valid regular expression",
            id="exempt-invalid",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: kb
                match: {path_prefix: /rag/}
                protocol: rag-json
            """,
            3,
            "routes[0].rag: protocol rag-json needs rag.answer or rag.claims",
            id="rag-json-without-rag",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: kb
                match: {path_prefix: /rag/}
                protocol: rag-json
                rag:
                  answer: /answer
                  context: sources
            """,
            8,
            "routes[0].rag.context: JSON pointer 'sources' must start with '/'",
            id="rag-pointer-without-slash",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match: {path: /a}
                protocol: openai-chat
              - name: chat
                match: {path: /b}
                protocol: openai-chat
            """,
            6,
            "routes[1].name: duplicate route name 'chat'",
            id="duplicate-route-name",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match: {path: /a}
                protocol: openai-chat
            name: q
            """,
            6,
            "duplicate key 'name' (first defined on line 1)",
            id="duplicate-yaml-key",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match: {path: /a
                protocol: openai-chat
            """,
            5,
            "YAML syntax error",
            id="yaml-syntax",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match: {}
                protocol: openai-chat
            """,
            4,
            "match needs at least one of path, path_prefix, path_glob or header",
            id="match-without-conditions",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match:
                  path: /a
                  path_prefix: /b
                protocol: openai-chat
            """,
            6,
            "use only one of path, path_prefix and path_glob",
            id="path-and-prefix",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match:
                  path_prefix: /b
                  header: {x-tenant: a}
                  path_glob: /a/*
                protocol: openai-chat
            """,
            7,
            "not path_prefix and path_glob",
            id="prefix-and-glob",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                protocol: openai-chat
                match:
                  header: {x-tenant: a}
                  path_glob: /openai/deployments**
            """,
            7,
            "'**' stands for whole segments only",
            id="glob-double-star-in-segment",
        ),
        pytest.param(
            """\
            name: p
            routes:
              - name: chat
                match: {path: v1/chat}
                protocol: openai-chat
            """,
            4,
            "must start with '/'",
            id="relative-path",
        ),
        pytest.param(
            MINIMAL + "passthrough:\n  - /v1/models\n  - /v1/*/files\n  - /v1/files**\n",
            9,
            "'**' stands for whole segments only",
            id="passthrough-double-star",
        ),
        pytest.param(
            """\
            name: has space
            routes:
              - name: chat
                match: {path: /a}
                protocol: openai-chat
            """,
            1,
            "not a valid name",
            id="policy-name",
        ),
        pytest.param(
            MINIMAL + "404: gone\n",
            6,
            "key 404 must be a string; quote it",
            id="non-string-key",
        ),
        pytest.param("- just\n- a list\n", 1, "YAML mapping at the top level", id="not-mapping"),
        pytest.param("", 1, "the file is empty", id="empty"),
        pytest.param(MINIMAL + "---\nname: q\n", 6, "YAML syntax error", id="two-documents"),
        pytest.param(
            MINIMAL + "mode: !!python/object:os.system x\n",
            6,
            "YAML syntax error",
            id="unsafe-tag",
        ),
    ],
)
def test_errors_point_at_file_and_line(
    tmp_path: Path, text: str, line: int, fragment: str
) -> None:
    path = write(tmp_path, text)
    err = error_of(path)
    assert err.line == line, err
    assert fragment in err.message, err.message
    assert str(err).startswith(f"{path}:{line}: ")


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    err = error_of(missing)
    assert err.line is None
    assert "cannot read policy file" in err.message
    err = error_of(tmp_path)  # a directory
    assert "cannot read policy file" in err.message


def test_invalid_utf8(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_bytes(MINIMAL.encode() + b"# caf\xe9\n")
    err = error_of(path)
    assert err.line == 6
    assert "UTF-8" in err.message


def test_first_error_by_line_is_raised_and_check_lists_all(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: p
        routes:
          - name: chat
            match: {path: /a}
            protocol: nope
        release:
          on_unverified: maybe
        """,
    )
    assert error_of(path).line == 5
    out = io.StringIO()
    assert check_paths([str(path)], out) == 1
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"{path}:5: error: routes[0].protocol")
    assert lines[1].startswith(f"{path}:7: error: release.on_unverified")
    assert not any(line.startswith("ok:") for line in lines)


# ------------------------------------------------------------------ versions


def test_version_ignores_formatting_comments_key_order_and_explicit_defaults(
    tmp_path: Path,
) -> None:
    a = write(tmp_path, MINIMAL, "a.yaml")
    b = write(
        tmp_path,
        """\
        # the same policy, written differently
        routes:
          -   protocol:   openai-chat      # comment
              match:
                path: "/v1/chat/completions"
              name: chat
        mode: enforce      # the default, stated explicitly
        name: 'p'
        """,
        "b.yaml",
    )
    va, vb = load_policy(a), load_policy(b)
    assert va.version == vb.version
    assert len(va.version) == 64
    assert va.label == vb.label == f"p@{va.version[:SHORT_VERSION_LEN]}"


def test_version_changes_with_content(tmp_path: Path) -> None:
    base = load_policy(write(tmp_path, MINIMAL, "a.yaml")).version
    changed = load_policy(
        write(tmp_path, MINIMAL.replace("/v1/chat/completions", "/v2/chat"), "b.yaml")
    ).version
    blocked = load_policy(
        write(tmp_path, MINIMAL + "release: {block_status: 451}\n", "c.yaml")
    ).version
    assert len({base, changed, blocked}) == 3


def test_version_is_independent_of_path_and_matches_model(tmp_path: Path) -> None:
    loaded = load_policy(write(tmp_path, MINIMAL))
    again = from_model(Policy.model_validate(loaded.policy.model_dump(by_alias=True)))
    assert again.version == loaded.version
    assert again.label == loaded.label


# ------------------------------------------------------------------ compiled once


def test_regexes_are_compiled_at_load(tmp_path: Path) -> None:
    loaded: LoadedPolicy = load_policy(
        write(
            tmp_path,
            MINIMAL
            + "citations:\n  format: regex\n  pattern: '\\{\\{(?P<id>[a-z0-9:]+)\\}\\}'\n"
            + "context:\n  chunk_pattern: '<c n=\"(?P<id>[^\"]+)\">(?P<text>.*?)</c>'\n"
            + "claims:\n  exempt: ['(?i)^no idea']\n",
        )
    )
    c = loaded.compiled
    assert c.citation_pattern is not None
    match = c.citation_pattern.search("see {{a:1}}")
    assert match is not None and match.group("id") == "a:1"
    assert c.chunk_pattern is not None and c.chunk_pattern.groupindex.keys() >= {"id", "text"}
    assert [p.pattern for p in c.exempt] == ["(?i)^no idea"]
    assert c.routes["chat"].protocol == "openai-chat"
    assert "hallucinated_citation" in c.checks


def test_defaults_compile_without_optional_patterns(tmp_path: Path) -> None:
    c = load_policy(write(tmp_path, MINIMAL)).compiled
    assert c.citation_pattern is None
    assert c.chunk_pattern is None
    assert c.exempt[0].match("I don't know the answer.")
    assert c.exempt[0].match("Refunds take 5 days.") is None


def test_context_from_uses_the_yaml_key(tmp_path: Path) -> None:
    loaded = load_policy(write(tmp_path, MINIMAL + "context:\n  from: [response]\n"))
    assert loaded.policy.context.from_ == ["response"]
    err = error_of(write(tmp_path, MINIMAL + "context:\n  from: [disk]\n", "bad.yaml"))
    assert err.line == 7
    assert "context.from[0]" in err.message


def test_line_of_falls_back_to_enclosing_key(tmp_path: Path) -> None:
    loaded = load_policy(write(tmp_path, MINIMAL))
    assert loaded.line_of("routes", 0, "match", "path") == 4
    assert loaded.line_of("routes", 0, "rag") == 3
    assert loaded.line_of("release", "on_unverified") == 1  # the document itself


def test_loaded_policies_are_hashable_and_equal_by_version(tmp_path: Path) -> None:
    a = load_policy(write(tmp_path, MINIMAL))
    b = load_policy(write(tmp_path, MINIMAL))
    c = load_policy(write(tmp_path, MINIMAL.replace("/v1/chat/completions", "/v2")))
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2


def test_aliases_are_indexed_once_and_errors_inside_them_point_at_the_use(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        name: p
        x-match: &m {path: /a, colour: red}
        routes:
          - name: chat
            match: *m
            protocol: openai-chat
        """,
    )
    err = error_of(path)
    assert "unknown key 'x-match' at the top level" in err.message
    out = io.StringIO()
    assert check_paths([str(path)], out) == 1
    assert f"{path}:5: error: unknown key 'colour' in routes[0].match" in out.getvalue()


def test_nested_aliases_do_not_explode(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 7)]
    err = error_of(write(tmp_path, "\n".join(levels) + "\n"))
    assert err.line == 1  # routes / name missing, reported at the document


@pytest.mark.parametrize(
    ("text", "exempt"),
    [
        ("I cannot discuss why the plant exploded.", False),  # asserts that it did
        ("I can't share why the sale to Acme fell through.", False),
        ("I cannot discuss other employees' salaries.", True),
    ],
)
def test_a_refusal_that_says_why_something_happened_is_a_claim(text: str, exempt: bool) -> None:
    patterns = ClaimsSpec().exempt_re
    assert any(p.fullmatch(text) for p in patterns) is exempt

"""`path_glob` routes and glob passthrough entries from real policy files; the lint on a
trailing `/*`; the shipped policies and the documented Azure example."""

from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path

import pytest

from gateway.errors import PolicyError
from gateway.policy import check_paths, load_policies, load_policy

ROOT = Path(__file__).resolve().parent.parent

GLOBS = """\
name: globs
routes:
  - name: azure
    match: {path_glob: /openai/deployments/*/chat/completions}
    protocol: openai-chat
  - name: gemini
    match: {path_glob: "/v1beta/models/*:streamGenerateContent"}
    protocol: openai-chat
  - name: bedrock
    match: {path_glob: /model/*/converse}
    protocol: openai-chat
  - name: nested
    match: {path_glob: /tenants/**/answer}
    protocol: rag-json
    rag: {answer: /answer}
passthrough:
  - /openai/deployments/*/embeddings
  - /v1/files/**
  - /static/*
"""


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def route_of(tmp_path: Path, path: str) -> str | None:
    policies = load_policies([write(tmp_path, GLOBS)])
    matched = policies.match("POST", path, {})
    return None if matched is None else matched[1].name


@pytest.mark.parametrize(
    ("path", "route"),
    [
        ("/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01", "azure"),
        ("/openai/deployments/gpt-4o/extra/chat/completions", None),
        ("/v1beta/models/gemini-1.5-pro:streamGenerateContent?alt=sse", "gemini"),
        ("/v1beta/models/gemini-1.5-pro:generateContent", None),
        ("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123%3Acustom-model%2Fmy-model/converse",
         "bedrock"),
        ("/model/arn:aws:bedrock:us-east-1:123:custom-model/my-model/converse", None),
        ("/tenants/acme/answer", "nested"),
        ("/tenants/acme/eu/kb/answer", "nested"),
        ("/tenants/answer", "nested"),
        ("/tenants/acme/answers", None),
    ],
)
def test_path_glob_routes(tmp_path: Path, path: str, route: str | None) -> None:
    assert route_of(tmp_path, path) == route


@pytest.mark.parametrize(
    ("path", "passed"),
    [
        ("/openai/deployments/ada/embeddings", True),
        ("/openai/deployments/ada/x/embeddings", False),
        ("/v1/files", True),
        ("/v1/files/abc/content", True),
        ("/static/app.js", True),
        ("/static/js/app.js", False),  # a trailing `/*` is one segment now
        ("/static", False),
    ],
)
def test_passthrough_globs(tmp_path: Path, path: str, passed: bool) -> None:
    assert load_policies([write(tmp_path, GLOBS)]).is_passthrough(path) is passed


def test_a_bad_glob_is_an_error_at_its_line(tmp_path: Path) -> None:
    text = GLOBS.replace("/tenants/**/answer", "/tenants/a**/answer")
    with pytest.raises(PolicyError) as err:
        load_policy(write(tmp_path, text))
    assert err.value.line == 13
    assert "path_glob" in err.value.message and "whole segments" in err.value.message


def test_policy_check_warns_on_a_trailing_slash_star_passthrough(tmp_path: Path) -> None:
    out = io.StringIO()
    path = write(tmp_path, GLOBS)
    assert check_paths([str(path)], out) == 0
    # (`/v1/files/**` warns too, for another reason: file contents can be model output.)
    warnings = [line for line in out.getvalue().splitlines() if "used to mean the tree" in line]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"{path}:19: warning:")
    assert "'/static/**'" in warnings[0]


def test_unreachable_routes_are_found_across_path_forms(tmp_path: Path) -> None:
    text = """\
    name: shadowed
    routes:
      - name: openai
        match: {path_prefix: /openai/}
        protocol: openai-chat
      - name: azure
        match: {path_glob: /openai/deployments/*/chat/completions}
        protocol: openai-chat
      - name: any-deployment
        match: {path_glob: /v2/deployments/*/chat}
        protocol: openai-chat
      - name: one-deployment
        match: {path: /v2/deployments/a/chat}
        protocol: openai-chat
      - name: reachable
        match: {path_glob: /v2/deployments/*/chat/**}
        protocol: openai-chat
    """
    out = io.StringIO()
    check_paths([str(write(tmp_path, text))], out)
    unreachable = re.findall(r"route '([^']+)' is unreachable", out.getvalue())
    assert unreachable == ["azure", "one-deployment"]


SHIPPED = sorted([*ROOT.glob("policies/*.yaml"), *ROOT.glob("gateway/demo/*.yaml")])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_policies_have_no_ambiguous_passthrough_entry(path: Path) -> None:
    out = io.StringIO()
    assert check_paths([str(path)], out) == 0
    assert "passthrough entry" not in out.getvalue()


def test_the_documented_azure_example_routes_as_described(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "policy.md").read_text()
    section = doc[doc.index("### Worked example: Azure OpenAI") :]
    example = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert example is not None
    policies = load_policies([write(tmp_path, example.group(1))])
    matched = policies.match(
        "POST", "/openai/deployments/gpt-4o/chat/completions?api-version=2024-06-01", {}
    )
    assert matched is not None and matched[1].protocol == "openai-chat"
    assert policies.match("GET", "/openai/deployments/gpt-4o/chat/completions", {}) is None
    assert policies.is_passthrough("/openai/deployments/ada/embeddings")
    assert not policies.is_passthrough("/openai/deployments/a/b/embeddings")
    out = io.StringIO()
    assert check_paths([str(tmp_path / "p.yaml")], out) == 0
    assert "warning" not in out.getvalue()

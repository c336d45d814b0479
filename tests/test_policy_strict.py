"""Policy values are taken as written, never coerced: a string where a number belongs, a
boolean where a count belongs, a number where a boolean belongs is an error at its line, as
any other policy error (`policy check` exit 1, `verify` and start-up exit 2, `file:line`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import cli

BASE = [
    "name: strict",
    "routes:",
    "  - name: chat",
    "    match: {path: /v1/chat/completions, methods: [POST]}",
    "    protocol: openai-chat",
    "context:",
    "  trust: {documents: true}",
    "support: {threshold: 0.7}",
    "release: {block_status: 422, retry: 1}",
    "audit: {include_text: false}",
    "claims: {title_words: 8}",
]

# (line number, the line as written): each wrong only in its value's type.
WRONG = {
    "block_status-string": (9, 'release: {block_status: "422", retry: 1}'),
    "retry-bool": (9, "release: {block_status: 422, retry: true}"),
    "include_text-int": (10, "audit: {include_text: 1}"),
    "documents-string": (7, '  trust: {documents: "off"}'),
    "threshold-string": (8, 'support: {threshold: "0.7"}'),
    "methods-not-http": (4, "    match: {path: /v1/chat/completions, methods: [POTS]}"),
    "title_words-float": (11, "claims: {title_words: 8.5}"),
    "title_words-string": (11, 'claims: {title_words: "8"}'),
}


def _write(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_value_of_the_wrong_type_is_an_error_at_its_line(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line, text = WRONG[case]
    lines = list(BASE)
    lines[line - 1] = text
    path = _write(tmp_path, lines)
    capsys.readouterr()
    assert cli.main(["policy", "check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert f"{path}:{line}:" in out + err
    request = tmp_path / "request.json"
    request.write_text("{}")
    code = cli.main([
        "verify", "--policy", str(path), "--protocol", "openai-chat",
        "--request", str(request), "--response", str(request), "--format", "json",
    ])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert f"{path}:{line}" in err


def test_an_integer_is_a_number_and_methods_are_read_in_any_case(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = list(BASE)
    lines[7] = "support: {threshold: 1}"  # YAML 1 is an int: a fine float
    lines[3] = "    match: {path: /v1/chat/completions, methods: [post, GET]}"
    path = _write(tmp_path, lines)
    capsys.readouterr()
    assert cli.main(["policy", "check", str(path)]) == 0, capsys.readouterr()


@pytest.mark.parametrize(("written", "value"), [("7e-1", 0.7), ("5E-1", 0.5), ("+1e0", 1.0)])
def test_a_number_with_an_exponent_is_a_number(
    tmp_path: Path, written: str, value: float
) -> None:
    """YAML 1.2 (and every JSON or YAML emitter) writes 0.7 as `7e-1`; PyYAML's YAML 1.1
    resolver would read it as a string, which strict validation refuses."""
    from gateway.policy import load_policy

    lines = list(BASE)
    lines[7] = f"support: {{threshold: {written}}}"
    support = load_policy(_write(tmp_path, lines)).policy.support
    assert support is not None and support.threshold == value


def test_the_shipped_policies_load(capsys: pytest.CaptureFixture[str]) -> None:
    shipped = sorted(str(p) for p in (Path(__file__).parent.parent / "policies").glob("*.yaml"))
    assert shipped
    assert cli.main(["policy", "check", "--each", *shipped]) == 0, capsys.readouterr()

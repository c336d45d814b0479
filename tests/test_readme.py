"""The README's promises: every `x-citewarden-decision` value is documented, and the
`citewarden policy check` commands it shows lint the shipped policies clean (shadow mode's
warning excepted, which the README explains)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.types import Decision

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _decision_table() -> set[str]:
    start = README.index("| `x-citewarden-decision` | meaning |")
    values = set()
    for line in README[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        values.add(line.split("|")[1].strip().strip("`"))
    return values


def test_every_decision_header_value_is_documented() -> None:
    expected = {d.value for d in Decision} | {"progressive", "error"}
    assert _decision_table() == expected


def _policy_check_commands() -> list[str]:
    return re.findall(r"^citewarden policy check .*$", README, flags=re.MULTILINE)


@pytest.mark.parametrize("command", _policy_check_commands())
def test_readme_policy_check_commands_lint_clean(command: str) -> None:
    expanded: list[str] = []
    for arg in shlex.split(command)[1:]:
        if "*" in arg:  # the shell's glob, in its order
            expanded.extend(sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(arg)))
        else:
            expanded.append(arg)
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *expanded],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if ": warning: " in line]
    assert all(line.startswith("policies/shadow.yaml:") for line in warnings), warnings
    assert all("mode: shadow" in line for line in warnings), warnings


def test_readme_shows_both_policy_check_forms() -> None:
    commands = _policy_check_commands()
    assert any("--each" in c and "policies/*.yaml" in c for c in commands)
    assert any("--each" not in c for c in commands)


def test_policy_check_together_warns_about_alternatives() -> None:
    """Why the README does not lint `policies/*.yaml` together: the alternatives shadow each
    other's routes, which the README explains."""
    paths = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("policies/*.yaml"))
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", *paths],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert "unreachable" in result.stdout
    assert "rightly warns that the routes of all but the first are" in README.replace("\n", " ")


def test_policy_check_each_fails_when_any_file_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nroutes: 3\n")
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "policy", "check", "--each",
         "policies/default.yaml", str(bad)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 1
    assert "ok: policies/default.yaml" in result.stdout
    assert f"{bad}:2:" in result.stdout

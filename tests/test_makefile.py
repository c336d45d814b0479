"""`make run` installs the runtime dependencies only; `make test` adds the dev tool chain to
the same .venv. Checked with `make -n` (what make would run) on a fresh copy."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _plan(tmp_path: Path, target: str, *, touch: tuple[str, ...] = ()) -> str:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for stamp in touch:
        path = tmp_path / stamp
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    result = subprocess.run(
        ["make", "-n", target], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_run_installs_runtime_only(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "run")
    assert "-e ." in plan
    assert ".[dev]" not in plan
    assert "citewarden demo" in plan


def test_test_adds_dev_extras_to_the_same_venv(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "test")
    assert "-e '.[dev]'" in plan
    assert "-m pytest" in plan
    assert plan.count("-m venv --without-pip .venv") == 1


def test_test_after_run_only_adds_dev_extras(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "test", touch=(".venv/.installed-runtime",))
    assert "-m venv" not in plan  # the .venv of `make run` is reused
    assert "-e '.[dev]'" in plan


def test_run_after_test_installs_nothing(tmp_path: Path) -> None:
    plan = _plan(tmp_path, "run", touch=(".venv/.installed-runtime", ".venv/.installed-dev"))
    assert "pip" not in plan

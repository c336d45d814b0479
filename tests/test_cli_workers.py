"""`serve --workers` was removed (one process per container; scale-out is replicas, DESIGN §9):
a value above 1, by flag or by CITEWARDEN_WORKERS, is one line naming the replacement and exit
2, before anything binds; 1 — what older charts always set — is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway import cli

ROOT = Path(__file__).resolve().parents[1]
POLICY = str(ROOT / "policies" / "default.yaml")


@pytest.mark.parametrize(("flags", "env"), [(["--workers", "2"], None), ([], "4")])
def test_more_than_one_worker_is_a_clear_usage_error(
    flags: list[str], env: str | None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if env is not None:
        monkeypatch.setenv("CITEWARDEN_WORKERS", env)
    code = cli.main(["serve", "--upstream", "http://127.0.0.1:9", "--policy", POLICY, *flags])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--workers / CITEWARDEN_WORKERS was removed" in err
    assert "replicaCount" in err and "One process per container" in err


@pytest.mark.parametrize(("flags", "env"), [(["--workers", "1"], None), ([], "1")])
def test_one_worker_is_still_accepted(
    flags: list[str], env: str | None, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if env is not None:
        monkeypatch.setenv("CITEWARDEN_WORKERS", env)
    # An unusable upstream stops serve right after the workers check: the error is about it.
    assert cli.main(["serve", "--upstream", "ftp://x", "--policy", POLICY, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("citewarden serve: --upstream: ")
    assert "workers" not in err


def test_serve_help_no_longer_offers_workers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--upstream-ca-file" in out  # the help is the serve command's
    assert "--workers" not in out

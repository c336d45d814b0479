"""`--format text|json` for `citewarden verify` and `citewarden report`: text on a terminal,
JSON when piped, either on request; exit codes do not depend on the format."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "openai_chat"
POLICY = ROOT / "policies" / "default.yaml"


def _verify_args(response: str) -> list[str]:
    return [
        "verify",
        "--policy",
        str(POLICY),
        "--protocol",
        "openai-chat",
        "--request",
        str(FIXTURES / "request.json"),
        "--response",
        str(FIXTURES / response),
    ]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _run_on_terminal(*args: str) -> tuple[int, str]:
    """Run the command with stdout on a pseudo-terminal, as a person at a shell would."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", *args],
            stdout=follower,
            stderr=subprocess.PIPE,
            cwd=ROOT,
        )
        os.close(follower)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=60)
        assert proc.stderr is not None
        proc.stderr.close()
    finally:
        with contextlib.suppress(OSError):
            os.close(leader)
    return code, b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.fixture
def audit_file(tmp_path: Path) -> Path:
    events = [
        {"event": "audit", "route": "chat", "decision": "released", "policy": "p@1",
         "reasons": [], "timings": {"verification_ms": 0.4}},
        {"event": "audit", "route": "chat", "decision": "blocked", "policy": "p@1",
         "reasons": ["hallucinated_citation"], "timings": {"verification_ms": 0.6}},
        {"event": "audit", "route": "kb", "decision": "abstained", "policy": "p@1",
         "reasons": ["number_mismatch"], "timings": {"verification_ms": 1.0}},
    ]  # fmt: skip
    path = tmp_path / "audit.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events) + '\n{"event": "started"}\n')
    return path


@pytest.mark.parametrize(("response", "code"), [("good.json", 0), ("hallucinated.json", 1)])
def test_verify_formats_keep_exit_codes(response: str, code: int) -> None:
    piped = _run(*_verify_args(response))
    as_json = _run(*_verify_args(response), "--format", "json")
    as_text = _run(*_verify_args(response), "--format", "text")
    assert piped.returncode == as_json.returncode == as_text.returncode == code
    assert json.loads(piped.stdout) == json.loads(as_json.stdout)  # piped: JSON by default
    report = json.loads(as_json.stdout)
    first = as_text.stdout.splitlines()[0]
    assert first.split()[:2] == ["decision", report["decision"]]
    if report["reason"]:
        assert report["reason"] in first
    with pytest.raises(ValueError):
        json.loads(as_text.stdout)
    assert len(as_text.stdout.splitlines()) < 30  # a short summary, not the report


def test_verify_on_a_terminal_prints_text() -> None:
    code, out = _run_on_terminal(*_verify_args("hallucinated.json"))
    assert code == 1
    assert out.startswith("decision  blocked (hallucinated_citation")
    code, out = _run_on_terminal(*_verify_args("hallucinated.json"), "--format", "json")
    assert json.loads(out)["decision"] == "blocked"


def test_verify_bad_input_is_still_2_in_text() -> None:
    args = _verify_args("good.json")
    args[args.index("--request") + 1] = "/nonexistent.json"
    result = _run(*args, "--format", "text")
    assert result.returncode == 2
    assert result.stdout == ""


def test_report_formats(audit_file: Path) -> None:
    piped = _run("report", str(audit_file))
    as_text = _run("report", str(audit_file), "--format", "text")
    assert piped.returncode == as_text.returncode == 0
    summary = json.loads(piped.stdout)
    assert summary["total"] == 3
    text = as_text.stdout
    assert text.startswith("3 requests")
    assert "released 1 (33.3%)" in text and "blocked 1 (33.3%)" in text
    assert "hallucinated_citation 1" in text
    assert "route chat: 2 requests" in text and "route kb: 1 requests" in text
    assert "p50" in text
    with pytest.raises(ValueError):
        json.loads(text)


def test_report_on_a_terminal_prints_text(audit_file: Path) -> None:
    code, out = _run_on_terminal("report", str(audit_file))
    assert code == 0
    assert out.startswith("3 requests")


def test_report_unreadable_file_exit_2_in_either_format(tmp_path: Path) -> None:
    for fmt in ("text", "json"):
        result = _run("report", str(tmp_path / "missing.jsonl"), "--format", fmt)
        assert result.returncode == 2
        assert "cannot read" in result.stderr


def test_unknown_format_is_a_usage_error(audit_file: Path) -> None:
    result = _run("report", str(audit_file), "--format", "yaml")
    assert result.returncode == 2

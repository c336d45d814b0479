"""The `citewarden` command as a user runs it: policy check, report, usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

POLICIES = sorted((Path(__file__).parent.parent / "policies").glob("*.yaml"))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_policy_check_passes_every_shipped_policy() -> None:
    assert len(POLICIES) >= 5
    for policy in POLICIES:
        result = run("policy", "check", str(policy))
        assert result.returncode == 0, (policy, result.stdout, result.stderr)
        assert f"ok: {policy}" in result.stdout
    shadow = run("policy", "check", *(str(p) for p in POLICIES if p.name == "shadow.yaml"))
    assert "warning" in shadow.stdout and "shadow" in shadow.stdout


def test_policy_check_reports_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\n"
        "routes:\n"
        "  - name: chat\n"
        "    match: {path: /v1/chat/completions}\n"
        "    protocol: openai-chat\n"
        "release:\n"
        "  on_unverifed: block\n"
    )
    result = run("policy", "check", str(bad))
    assert result.returncode == 1
    assert f"{bad}:7:" in result.stdout + result.stderr
    assert "on_unverifed" in result.stdout + result.stderr


def test_report_summarises_an_audit_file(tmp_path: Path) -> None:
    audit = tmp_path / "audit.jsonl"
    events = [
        {"event": "audit", "route": "chat", "decision": "released", "policy": "p@1",
         "reasons": [], "timings": {"verification_ms": 0.4}},
        {"event": "audit", "route": "chat", "decision": "blocked", "policy": "p@1",
         "reason": "hallucinated_citation", "reasons": ["hallucinated_citation"],
         "timings": {"verification_ms": 0.6}},
    ]
    audit.write_text("\n".join(json.dumps(e) for e in events) + "\nnot json\n")
    result = run("report", str(audit))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["total"] == 2
    assert summary["decisions"] == {"released": 1, "blocked": 1}
    assert summary["failure_reasons"] == {"hallucinated_citation": 1}
    assert run("report", str(tmp_path / "missing.jsonl")).returncode == 2


@pytest.mark.parametrize(
    "url", ["localhost:8000", "ftp://host/", "http://user:pw@host/", "http://host:99999/"]
)
def test_serve_with_an_unusable_upstream_url_is_a_usage_error(url: str) -> None:
    result = run("serve", "--upstream", url, "--policy", str(POLICIES[0]))
    assert result.returncode == 2
    assert result.stderr.startswith("citewarden serve: --upstream: ")


def test_serve_without_upstream_or_policy_is_a_usage_error() -> None:
    result = run("serve", "--policy", str(POLICIES[0]))
    assert result.returncode == 2
    assert "--upstream" in result.stderr

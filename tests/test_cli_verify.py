"""Every captured exchange in tests/fixtures, run through the real `citewarden verify` CLI.

The expectations are read from tests/fixtures/README.md, so the documented table and the
behaviour cannot drift apart.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
PROTOCOL_DIRS = {
    "openai_chat": "openai-chat",
    "openai_responses": "openai-responses",
    "anthropic_messages": "anthropic-messages",
    "rag_json": "rag-json",
    "bedrock_converse": "bedrock-converse",
    "cohere_chat": "cohere-chat",
    "gemini": "gemini",
}

POLICY = """\
name: fixtures
routes:
  - name: chat
    match: {{path: /v1/chat/completions}}
    protocol: openai-chat
  - name: messages
    match: {{path: /v1/messages}}
    protocol: anthropic-messages
  - name: responses
    match: {{path: /v1/responses}}
    protocol: openai-responses
  - name: gemini
    match: {{path_glob: "/v1beta/models/*:generateContent"}}
    protocol: gemini
  - name: gemini-stream
    match: {{path_glob: "/v1beta/models/*:streamGenerateContent"}}
    protocol: gemini
  - name: rag
    match: {{path_prefix: /rag/}}
    protocol: rag-json
    rag: {{answer: /answer, claims: /claims, context: /sources}}
  - name: bedrock
    match: {{path_glob: /model/*/converse}}
    protocol: bedrock-converse
  - name: bedrock-stream
    match: {{path_glob: /model/*/converse-stream}}
    protocol: bedrock-converse
  - name: cohere
    match: {{path: /v2/chat}}
    protocol: cohere-chat
citations: {{format: {format}}}
release: {{on_unverified: {on_unverified}}}
"""


@dataclass(frozen=True)
class Row:
    protocol_dir: str
    response: str
    decision: str
    reason: str | None
    claim_index: int | None
    notes: str

    @property
    def id(self) -> str:
        return f"{self.protocol_dir}/{self.response}"


def _expand(cell: str, previous: str | None) -> list[str]:
    names = []
    for part in (p.strip() for p in cell.split(",")):
        if part.startswith(".") and previous is not None:
            part = previous.rsplit(".", 1)[0] + part
        names.append(part)
        previous = part
    return names


def rows() -> list[Row]:
    out: list[Row] = []
    section = None
    for line in (FIXTURES / "README.md").read_text().splitlines():
        m = re.match(r"## (\w+)", line)
        if m:
            section = m.group(1)
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            section not in PROTOCOL_DIRS
            or len(cells) != 5
            or not cells[0].endswith(("json", "sse", "eventstream"))
        ):
            continue
        files, decision, reason, index, notes = cells
        for name in _expand(files, None):
            out.append(
                Row(
                    section,
                    name,
                    decision,
                    None if reason in ("–", "-") else reason,
                    None if index in ("–", "-") else int(index),
                    notes,
                )
            )
    return out


ROWS = rows()


def _policy(tmp_path: Path, *, on_unverified: str = "block", fmt: str = "doc-chunk") -> Path:
    path = tmp_path / f"policy-{on_unverified}-{fmt}.yaml"
    path.write_text(POLICY.format(on_unverified=on_unverified, format=fmt))
    return path


# The path of a streaming request, for protocols whose path (not body) asks for a stream.
STREAM_PATHS = {
    "gemini": "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse",
    "bedrock_converse": "/model/m/converse-stream",
}


def _verify(policy: Path, row: Row) -> subprocess.CompletedProcess[str]:
    """`verify` on a fixture; a stream capture with a request that asks for a stream, as the
    proxy decides JSON or stream from the request (its body, or its path)."""
    directory = FIXTURES / row.protocol_dir
    request = directory / "request.json"
    extra: list[str] = []
    if row.response.endswith((".sse", ".eventstream")):
        if row.protocol_dir in STREAM_PATHS:
            extra = ["--path", STREAM_PATHS[row.protocol_dir]]
        elif (directory / "request_stream.json").exists():
            request = directory / "request_stream.json"
        else:
            body = json.loads(request.read_text())
            request = policy.parent / f"{row.protocol_dir}-request-stream.json"
            request.write_text(json.dumps({**body, "stream": True}))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "verify",
            "--policy",
            str(policy),
            "--protocol",
            PROTOCOL_DIRS[row.protocol_dir],
            "--request",
            str(request),
            "--response",
            str(directory / row.response),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_readme_table_covers_every_response_fixture() -> None:
    listed = {r.id for r in ROWS}
    on_disk = {
        f"{p.parent.name}/{p.name}"
        for p in FIXTURES.glob("*/*")
        if p.suffix in (".json", ".sse", ".eventstream") and not p.name.startswith("request")
    }
    assert on_disk == listed
    assert len(ROWS) >= 35


STRIP_ROWS = [r for r in ROWS if "strip → partial" in r.notes]

Results = dict[tuple[str, str], subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Results:
    """Every fixture through the CLI (under the block policy; the strip rows again under the
    strip policy), the processes run side by side: one per core, as their start-up, not the
    verification, is what each of them waits for."""
    tmp = tmp_path_factory.mktemp("policies")
    policies = {"block": _policy(tmp), "strip": _policy(tmp, on_unverified="strip")}
    jobs = [("block", r) for r in ROWS] + [("strip", r) for r in STRIP_ROWS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        done = pool.map(lambda job: _verify(policies[job[0]], job[1]), jobs)
        return {(kind, row.id): result for (kind, row), result in zip(jobs, done, strict=True)}


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_fixture_decision(row: Row, results: Results) -> None:
    result = results["block", row.id]
    if row.decision == "bad input":
        assert result.returncode == 2, result.stdout
        assert "citewarden verify:" in result.stderr
        assert result.stdout == ""
        return
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert report["decision"] == row.decision, report["claims"]
    assert report["reason"] == row.reason
    assert report["claim_index"] == row.claim_index
    assert report["policy"].startswith("fixtures@")
    assert len(report["context_fingerprint"]) == 64
    unchanged = row.decision == "released" and "rewritten" not in row.notes
    assert report["unchanged"] is unchanged
    assert result.returncode == (0 if unchanged else 1)
    if row.decision == "blocked":
        assert report["status"] == 422
        assert report["body"]["citewarden"]["claim_index"] == row.claim_index
    for claim in report["claims"]:
        assert {"index", "span", "citations", "status", "reason", "text"} <= claim.keys()


@pytest.mark.parametrize("row", STRIP_ROWS, ids=[r.id for r in STRIP_ROWS])
def test_fixture_strip(row: Row, results: Results) -> None:
    result = results["strip", row.id]
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert report["decision"] == "partial"
    failing = [c["text"] for c in report["claims"] if c["status"] == "failed"]
    assert failing
    body = json.dumps(report["body"], ensure_ascii=False)
    for text in failing:
        core = re.sub(r"\[[^\]]*\]", "", text).strip(" .")
        assert core not in body


def test_numeric_citations_resolve_against_positional_ids(tmp_path: Path) -> None:
    row = next(r for r in ROWS if r.response == "numeric.json")
    result = _verify(_policy(tmp_path, fmt="numeric"), row)
    assert result.returncode == 0, result.stdout
    assert json.loads(result.stdout)["decision"] == "released"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_bad_input_exits_2_with_a_clear_message(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    request = FIXTURES / "openai_chat" / "request.json"
    good = FIXTURES / "openai_chat" / "good.json"
    broken = tmp_path / "broken.json"
    broken.write_text('{"choices": [')
    bad_policy = tmp_path / "bad.yaml"
    bad_policy.write_text(
        "name: x\nroutes:\n  - name: a\n    match: {path: /a}\n    protocol: smtp\n"
    )
    cases = {
        "invalid JSON": (
            [
                "--policy",
                str(policy),
                "--protocol",
                "openai-chat",
                "--request",
                str(request),
                "--response",
                str(broken),
            ],
            "not valid JSON",
        ),
        "unknown protocol": (
            [
                "--policy",
                str(policy),
                "--protocol",
                "smtp",
                "--request",
                str(request),
                "--response",
                str(good),
            ],
            "unknown protocol",
        ),
        "unreadable file": (
            [
                "--policy",
                str(policy),
                "--protocol",
                "openai-chat",
                "--request",
                str(tmp_path / "nope.json"),
                "--response",
                str(good),
            ],
            "cannot read",
        ),
        "invalid policy": (
            [
                "--policy",
                str(bad_policy),
                "--protocol",
                "openai-chat",
                "--request",
                str(request),
                "--response",
                str(good),
            ],
            f"{bad_policy}:5",
        ),
        "missing policy": (
            [
                "--policy",
                str(tmp_path / "none.yaml"),
                "--protocol",
                "openai-chat",
                "--request",
                str(request),
                "--response",
                str(good),
            ],
            "none.yaml",
        ),
        "not an answer": (
            [
                "--policy",
                str(policy),
                "--protocol",
                "openai-chat",
                "--request",
                str(request),
                "--response",
                str(request),
            ],
            "not a valid openai-chat answer",
        ),
    }
    for name, (args, message) in cases.items():
        result = _run("verify", *args)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert message in result.stderr, (name, result.stderr)
        assert result.stdout == "", name


def test_usage_errors_exit_2() -> None:
    assert _run("verify", "--policy", "x").returncode == 2
    assert _run("nonsense").returncode == 2

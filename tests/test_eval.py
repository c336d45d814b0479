"""`citewarden eval`: the scores of a policy on labelled rows, lexical only and with a scripted
judge, text and JSON output, and bad input."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.cli import main
from gateway.eval import run
from tests.judge_server import JudgeScript, run_judge

ROWS = [
    # attributable and lexically clear
    {"claim": "Milira sings Go Outside in the Rain.", "references": [
        "Go Outside in the Rain is a song by Milira."], "label": "attributable", "src": "A"},
    # not attributable: a wrong number
    {"claim": "The song charted at number 12.", "references": [
        "The song reached number 36 on the chart."], "label": "not attributable", "src": "A"},
    # not attributable, lexically plausible (only a judge can tell)
    {"claim": "Milira wrote an unsupported song about rain.", "references": [
        "Milira sang a song about rain."], "label": "not attributable", "src": "B",
     "question": "Who wrote it?"},
    # attributable, lexically weak
    {"claim": "The singer is Milira.", "references": ["Song by Milira, released 1990."],
     "label": "attributable", "src": "B"},
]

POLICY = """\
name: ev
routes: [{{name: kb, match: {{path: /rag/a}}, protocol: rag-json, rag: {{answer: /answer}}}}]
checks: [hallucinated_citation, number_mismatch, unsupported]
{support}
"""


def _write(tmp: Path, support: str = "") -> tuple[Path, Path]:
    policy = tmp / "p.yaml"
    policy.write_text(POLICY.format(support=support))
    data = tmp / "d.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    return policy, data


def _json(policy: Path, data: Path) -> dict[str, object]:
    out = io.StringIO()
    assert run(str(policy), str(data), out, "json", err=io.StringIO()) == 0
    result: dict[str, object] = json.loads(out.getvalue())
    return result


def test_lexical_scores_have_every_key(tmp_path: Path) -> None:
    result = _json(*_write(tmp_path))
    assert set(result) >= {
        "rows", "balanced_accuracy", "macro_f1", "precision_na", "recall_na",
        "rows_per_second", "decisions", "by_reason", "by_src",
    }
    assert result["rows"] == 4
    by_reason = result["by_reason"]
    assert isinstance(by_reason, dict) and by_reason["number_mismatch"]["rows"] == 1
    assert set(result["by_src"]) == {"A", "B"}  # type: ignore[arg-type]
    assert sum(result["decisions"].values()) == 4  # type: ignore[attr-defined]


@pytest.fixture
def judge() -> Iterator[tuple[JudgeScript, str]]:
    script = JudgeScript()
    with run_judge(script) as url:
        yield script, url


def test_judge_pass_decides_the_borderline_rows(
    tmp_path: Path, judge: tuple[JudgeScript, str]
) -> None:
    script, url = judge
    support = (
        "support:\n  lexical: {pass_above: 1.0, fail_below: 0.0}\n"
        f"  judge: {{url: {url}/v1, model: j, max_concurrency: 2}}\n"
    )
    result = _json(*_write(tmp_path, support))
    # The judge says NO to the unsupported row, YES to the others; numbers fail before it.
    assert result["macro_f1"] == 1.0
    assert len(script.calls) == 3
    assert script.max_in_flight <= 2
    shown = [c["body"]["messages"][-1]["content"] for c in script.calls]
    assert not any("Who wrote it?" in s for s in shown)  # a long claim: no question


def test_text_output_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy, data = _write(tmp_path)
    assert main(["eval", "--policy", str(policy), str(data), "--format", "text"]) == 0
    out = capsys.readouterr().out
    assert "macro-F1" in out and "by src" in out


def test_bad_row_is_exit_2_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy, data = _write(tmp_path)
    data.write_text(data.read_text() + '{"claim": "x", "references": [], "label": "maybe"}\n')
    assert main(["eval", "--policy", str(policy), str(data)]) == 2
    assert f"{data}:5:" in capsys.readouterr().err

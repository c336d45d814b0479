"""`citewarden verify` runs the judge pass as the proxy does."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from gateway.offline import verify_exchange
from tests.judge_server import JudgeScript, run_judge
from tests.upstream_app import openai_body

POLICY = """\
name: offline
routes: [{{name: chat, match: {{path: /v1/chat/completions}}, protocol: openai-chat}}]
checks: [hallucinated_citation, unsupported]
support:
  lexical: {{pass_above: 1.0, fail_below: 0.0}}
  judge: {{url: {url}/v1, model: j}}
"""
REQUEST = {"model": "m", "messages": [
    {"role": "system", "content": '<chunk id="a:1">Oslo has a reactor.</chunk>'},
    {"role": "user", "content": "where?"}]}


@pytest.mark.parametrize(("text", "decision"), [
    ("Oslo has a reactor [a:1].", "released"),
    ("Oslo has an unsupported reactor [a:1].", "blocked"),
])
def test_verify_asks_the_judge(tmp_path: Path, text: str, decision: str) -> None:
    script = JudgeScript()
    with run_judge(script) as url:
        (tmp_path / "p.yaml").write_text(POLICY.format(url=url))
        (tmp_path / "req.json").write_text(json.dumps(REQUEST))
        (tmp_path / "resp.json").write_text(json.dumps(openai_body(text)))
        out = io.StringIO()
        verify_exchange(
            policy_path=str(tmp_path / "p.yaml"), protocol="openai-chat",
            request_path=str(tmp_path / "req.json"), response_path=str(tmp_path / "resp.json"),
            route_name=None, out=out, fmt="json",
        )
    assert json.loads(out.getvalue())["decision"] == decision
    assert len(script.calls) == 1

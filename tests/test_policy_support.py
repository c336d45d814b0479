"""`support:` keys: validated at load with file:line errors; the judge key never in the version."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import PolicyError
from gateway.policy import canonical_json, load_policy

HEAD = """\
name: s
routes: [{name: chat, match: {path: /v1/chat/completions}, protocol: openai-chat}]
checks: [unsupported]
support:
"""


def _load(tmp: Path, body: str) -> object:
    path = tmp / "p.yaml"
    path.write_text(HEAD + body)
    return load_policy(path)


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ("  lexical: {pass_above: 0.2, fail_below: 0.5}\n", 5, "must not be greater"),
        ("  judge: {url: 'http://j/v1', model: m, timeout: 5 seconds}\n", 5, "not a duration"),
        ("  judge:\n    url: http://j/v1\n    model: m\n    timeout: 9s\n    deadline: 2s\n",
         9, "deadline"),
        ("  judge:\n    url: ftp://j\n    model: m\n", 6, "not an http(s) URL"),
        ("  judge:\n    url: http://j\n", 5, "needs a `model`"),
        ("  judge:\n    url: http://j\n    model: m\n    group_by: sentence\n", 8, "group_by"),
        ("  judge:\n    url: http://j\n    model: m\n    prompt: missing.txt\n", 8,
         "cannot read 'missing.txt'"),
        ("  judge:\n    url: http://j\n    model: m\n    api_key_env: NO_SUCH_JUDGE_KEY_VAR\n",
         8, "is not set"),
        ("  judge:\n    url: http://j\n    model: m\n    cirquit: {failures: 1}\n", 8,
         "did you mean 'circuit'"),
    ],
)
def test_bad_support_keys_name_file_and_line(
    tmp_path: Path, body: str, line: int, message: str
) -> None:
    with pytest.raises(PolicyError) as e:
        _load(tmp_path, body)
    assert e.value.line == line, str(e.value)
    assert message in str(e.value)


def test_template_is_relative_to_the_policy_and_key_stays_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t.txt").write_text("{chunks}\n{claims}\n")
    (tmp_path / "key").write_text("sk-file-secret\n")
    loaded = _load(
        tmp_path,
        "  judge:\n    url: http://j/v1\n    model: m\n    prompt: t.txt\n"
        "    api_key_file: key\n    timeout: 250ms\n    cache: {ttl: 2m}\n",
    )
    judge = loaded.policy.support.judge  # type: ignore[attr-defined]
    assert judge.template == "{chunks}\n{claims}\n"
    assert judge.key == "sk-file-secret"
    assert (judge.timeout, judge.cache.ttl) == (0.25, 120.0)
    assert "sk-file-secret" not in canonical_json(loaded.policy)  # type: ignore[attr-defined]
    assert "sk-file-secret" not in repr(loaded)

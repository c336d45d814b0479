"""Hot reload: last good set kept on errors; edits, renames and ConfigMap symlink swaps seen."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from gateway.errors import PolicyError
from gateway.pipeline import Pipelines, RoutePipeline
from gateway.policy import PolicyStore, ReloadOutcome

POLICY = """\
name: live
routes:
  - name: chat
    match: {{path: {path}}}
    protocol: openai-chat
"""


def policy_text(path: str) -> str:
    return POLICY.format(path=path)


def route_path(store: PolicyStore) -> str | None:
    return store.current.policies[0].policy.routes[0].match.path


def test_initial_invalid_policy_raises(tmp_path: Path) -> None:
    bad = tmp_path / "p.yaml"
    bad.write_text("name: x\n", encoding="utf-8")
    with pytest.raises(PolicyError) as info:
        PolicyStore([bad])
    assert info.value.file == str(bad)


def test_reload_keeps_last_good_set_on_invalid_content(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_text("/v1/a"), encoding="utf-8")
    store = PolicyStore([path])
    good = store.current
    path.write_text(policy_text("/v1/b") + "bogus: true\n", encoding="utf-8")
    assert store.reload() is False
    assert store.current is good
    assert store.last_error is not None and store.last_error.line == 6
    assert store.current.match("POST", "/v1/a", {}) is not None

    path.write_text(policy_text("/v1/b"), encoding="utf-8")
    assert store.reload() is True
    assert store.last_error is None
    assert route_path(store) == "/v1/b"
    assert store.current.match("POST", "/v1/a", {}) is None


def test_reload_keeps_last_good_set_when_file_disappears(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_text("/v1/a"), encoding="utf-8")
    store = PolicyStore([path])
    path.unlink()
    assert store.poll() == "error"
    assert route_path(store) == "/v1/a"
    assert store.poll() is None  # still missing: no repeated event
    path.write_text(policy_text("/v1/c"), encoding="utf-8")
    assert store.poll() == "success"
    assert route_path(store) == "/v1/c"


def test_poll_sees_edits_and_ignores_touches(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_text("/v1/a"), encoding="utf-8")
    store = PolicyStore([path])
    assert store.poll() is None
    before = store.current
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert store.poll() is None  # same content: no reload
    assert store.current is before
    path.write_text(policy_text("/v1/bb"), encoding="utf-8")
    assert store.poll() == "success"
    assert route_path(store) == "/v1/bb"


def test_atomic_rename_with_identical_stat_fields_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_text("/v1/a"), encoding="utf-8")
    store = PolicyStore([path])
    st = path.stat()
    tmp = tmp_path / ".p.yaml.tmp"
    tmp.write_text(policy_text("/v1/z"), encoding="utf-8")  # same size as the original
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert store.poll() == "success"
    assert route_path(store) == "/v1/z"


def configmap(tmp_path: Path) -> tuple[Path, Path]:
    """A Kubernetes ConfigMap volume: file -> ..data/policy.yaml, ..data -> ..ts1."""
    mount = tmp_path / "config"
    (mount / "..ts1").mkdir(parents=True)
    (mount / "..ts1" / "policy.yaml").write_text(policy_text("/v1/one"), encoding="utf-8")
    os.symlink("..ts1", mount / "..data")
    os.symlink("..data/policy.yaml", mount / "policy.yaml")
    return mount, mount / "policy.yaml"


def swap(mount: Path, text: str, ts: str) -> None:
    (mount / ts).mkdir()
    new = mount / ts / "policy.yaml"
    new.write_text(text, encoding="utf-8")
    old = (mount / "..data" / "policy.yaml").stat()
    # Same mtime and size as the old file: only the resolved path and inode differ.
    os.utime(new, ns=(old.st_atime_ns, old.st_mtime_ns))
    os.symlink(ts, mount / "..data_tmp")
    os.replace(mount / "..data_tmp", mount / "..data")


async def wait_for(events: list[tuple[ReloadOutcome, PolicyError | None]], n: int) -> None:
    for _ in range(400):
        if len(events) >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"expected {n} reload events, got {events}")


async def test_watch_detects_configmap_symlink_swap(tmp_path: Path) -> None:
    mount, path = configmap(tmp_path)
    store = PolicyStore([path])
    assert route_path(store) == "/v1/one"
    events: list[tuple[ReloadOutcome, PolicyError | None]] = []
    task = asyncio.create_task(store.watch(0.01, lambda o, e: events.append((o, e))))
    try:
        swap(mount, policy_text("/v1/two"), "..ts2")
        await wait_for(events, 1)
        assert events == [("success", None)]
        assert route_path(store) == "/v1/two"

        swap(mount, policy_text("/v1/two") + "oops: 1\n", "..ts3")
        await wait_for(events, 2)
        outcome, error = events[1]
        assert outcome == "error"
        assert error is not None and error.line == 6 and "unknown key 'oops'" in error.message
        assert route_path(store) == "/v1/two"  # last good kept
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_a_failing_callback_does_not_stop_the_watch(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(policy_text("/v1/a"), encoding="utf-8")
    store = PolicyStore([path])
    events: list[tuple[ReloadOutcome, PolicyError | None]] = []

    def on_event(outcome: ReloadOutcome, error: PolicyError | None) -> None:
        events.append((outcome, error))
        if len(events) == 1:
            raise RuntimeError("metrics backend down")

    task = asyncio.create_task(store.watch(0.01, on_event))
    try:
        path.write_text(policy_text("/v1/bb"), encoding="utf-8")
        await wait_for(events, 1)
        path.write_text(policy_text("/v1/ccc"), encoding="utf-8")
        await wait_for(events, 2)
        assert [o for o, _ in events] == ["success", "success"]
        assert route_path(store) == "/v1/ccc"
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


JUDGE_POLICY = """\
name: judged
routes:
  - name: chat
    match: {path: /v1/chat/completions}
    protocol: openai-chat
checks: [missing_citation, hallucinated_citation, unsupported]
support:
  judge: {url: "http://127.0.0.1:9/v1", model: m, prompt: prompt.txt, api_key_file: key.txt}
"""


def _pipeline(store: PolicyStore, pipelines: Pipelines) -> RoutePipeline:
    loaded = store.current.policies[0]
    return pipelines.get(loaded, loaded.policy.routes[0])


def test_a_reload_uses_the_new_prompt_template_and_key_file(tmp_path: Path) -> None:
    """The files a policy names (its judge prompt template and key file) are part of what a
    route's pipeline was built from: editing one and reloading gives a pipeline built anew,
    though the policy's version (its canonical form, which names the files) is unchanged."""
    path = tmp_path / "policy.yaml"
    path.write_text(JUDGE_POLICY)
    prompt, key = tmp_path / "prompt.txt", tmp_path / "key.txt"
    prompt.write_text("FIRST judge {claims} against {chunks}")
    key.write_text("key-one\n")
    store, pipelines = PolicyStore([path]), Pipelines()
    first = _pipeline(store, pipelines)
    assert first.judge_pass is not None and "FIRST" in first.judge_pass.prompt.template
    version = store.current.policies[0].version

    prompt.write_text("SECOND judge {claims} against {chunks}")
    key.write_text("key-two\n")
    # The watch sees an edit of a file the policy names, as of the policy file itself.
    assert store.poll() == "success"
    assert store.current.policies[0].version == version
    second = _pipeline(store, pipelines)
    assert second.judge_pass is not None and "SECOND" in second.judge_pass.prompt.template
    assert second.judge_pass.spec.key == "key-two"
    assert _pipeline(store, pipelines) is second  # still cached while nothing changes
    assert store.poll() is None

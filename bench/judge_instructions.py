"""Instructions per judged answer, counted by valgrind's callgrind: the judge pass's own CPU as
an A/B that the machine's other load cannot move (support_bench's wall-clock windows on a
shared 2-core VM swing by more than the cuts they would check).

One judged answer is what `support_bench.py`'s judge traffic sends: 3 pending claims citing
one chunk, `group_by: chunk`, verdicts not cached, so one call to the judge —
`RoutePipeline.resolve_judge` with the plan, the prompt, the HTTP exchange over
`gateway.http1` on loopback, reading the verdicts, re-deciding. The scripted judge is
support_bench's (a separate process answering YES at once; callgrind counts only the measured
interpreter). The measured interpreter runs the gateway's own loop (uvloop), builds `--high`
answers before it starts, warms the connection up, then judges `--low` or `--high` of them one
after another; the difference over the extra answers is one answer's own work, start-up and
warm-up cancelled out. With `--baseline REF`, REF is checked out into a temporary worktree
(as `bench/run.py --baseline` does) and counted the same way.

Instructions are not time (see bench/instructions.py): use this to see which way a change
moves and by how much, support_bench for the wall-clock ratio.

    python bench/judge_instructions.py [--baseline REF] [--low 40] [--high 200]
    python bench/judge_instructions.py --profile [--high 2000]   # cProfile, for direction
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WARM = 5  # judged answers before the counted ones: the connection and caches warmed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def scripted_judge() -> Iterator[str]:
    """support_bench's scripted judge, answering at once, in a process of its own."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(BENCH / "support_bench.py"), "--serve-judge",
                             str(port), "--latency", "0"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 15
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the scripted judge did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def count(tree: Path, url: str, answers: int, total: int) -> int:
    """Instructions callgrind collected for a fresh interpreter judging `answers` of `total`
    prepared answers with the gateway package of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
            str(Path(__file__).resolve()), "--child", str(answers), "--total", str(total),
            "--url", url]
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True)
    m = re.search(r"Collected : (\d+)", out.stderr)
    if m is None:
        raise RuntimeError(f"no callgrind total in: {out.stderr[-500:]}")
    return int(m.group(1))


def per_answer(tree: Path, url: str, low: int, high: int) -> int:
    return (count(tree, url, high, high) - count(tree, url, low, high)) // (high - low)


def _prepare(url: str, total: int) -> tuple[Any, list[Any]]:
    # The gateway package first, from PYTHONPATH (the tree counted): support_bench puts this
    # tree's root first on sys.path, which must not decide which gateway runs.
    import gateway  # noqa: F401

    sys.path.insert(1, str(BENCH))
    import support_bench as sb

    support = (
        "support:\n  lexical: {pass_above: 1.0, fail_below: 0.0}\n"
        f"  judge: {{url: {url}/v1, model: j, timeout: 5s, deadline: 8s, max_concurrency: 64,"
        " cache: {entries: 100000, ttl: 1h}}\n"
    )
    pipeline = sb._pipeline(support)
    # Built before anything is judged, and as many in every count: only judging differs.
    answers = [sb._pending_judgement(*sb._answer(3, f"a{k}")) for k in range(WARM + total)]
    return pipeline, answers


async def _judge(pipeline: Any, answers: list[Any]) -> None:
    for j in answers:
        out = await pipeline.resolve_judge(j, None)
        assert out.judge is not None and len(out.judge.calls) == 1, out.judge
        assert out.outcome.decision.value == "released", out.outcome


def child(url: str, answers: int, total: int) -> None:
    """Judge `answers` of `total` prepared answers (run under callgrind by `count`)."""
    pipeline, prepared = _prepare(url, total)
    from gateway.judge.client import close_clients
    from gateway.server import loop_factory

    async def main() -> None:
        await _judge(pipeline, prepared[:WARM])
        await _judge(pipeline, prepared[WARM:WARM + answers])
        await close_clients()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())


def profile(url: str, answers: int) -> None:
    """cProfile of `answers` judged answers in this process: where the time goes (direction
    only: the profiler's own overhead is per call)."""
    import cProfile
    import pstats

    pipeline, prepared = _prepare(url, answers)
    from gateway.judge.client import close_clients
    from gateway.server import loop_factory

    prof = cProfile.Profile()

    async def main() -> None:
        await _judge(pipeline, prepared[:WARM])
        prof.enable()
        await _judge(pipeline, prepared[WARM:])
        prof.disable()
        await close_clients()

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(main())
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="a commit to count the same way")
    ap.add_argument("--low", type=int, default=40)
    ap.add_argument("--high", type=int, default=200)
    ap.add_argument("--profile", action="store_true", help="cProfile --high answers instead")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--total", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.url, args.child, args.total)
        return 0
    if args.profile:
        sys.path.insert(0, str(ROOT))  # this tree's gateway, not an installed one
        with scripted_judge() as url:
            profile(url, args.high)
        return 0
    if shutil.which("valgrind") is None:
        print("unavailable: valgrind not installed (apt-get install -y valgrind)")
        return 1
    with scripted_judge() as url:
        here = per_answer(ROOT, url, args.low, args.high)
        print(f"this tree: {here:,} instructions per judged answer")
        if args.baseline:
            sys.path.insert(0, str(BENCH))
            from run import baseline_tree

            with baseline_tree(args.baseline) as (commit, tree):
                base = per_answer(tree, url, args.low, args.high)
            print(f"@{commit}: {base:,} instructions per judged answer")
            print(f"this tree / @{commit}: {here / base:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Instructions per answered request, counted by valgrind's callgrind: an A/B that the
machine's other load cannot move (wall-clock A/Bs on a shared 2-core VM swing by more than the
budgets they check; instruction counts repeat to a fraction of a percent).

The gateway is driven in process as `bench/inprocess.py` drives it (ASGI, a stub upstream
answering the mock's cited answer at once, bench/policy.yaml), `--low` and then `--high`
requests in a fresh interpreter each; the difference over the extra requests is one
request's own work, start-up and warm-up cancelled out. With `--baseline REF`, REF is checked
out into a temporary worktree (as `bench/run.py --baseline` does) and counted the same way.

Instructions are not time: code that touches more memory runs slower per instruction under
load (see docs/benchmarks.md). Use this to see which way a change moves and by how much, and
`bench/run.py --baseline` for the wall-clock ratios.

    python bench/instructions.py [--baseline REF] [--low 50] [--high 250]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def count(tree: Path, requests: int) -> int:
    """Instructions callgrind collected for a fresh interpreter serving `requests` requests
    with the gateway package of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
            str(Path(__file__).resolve()), "--child", str(requests)]
    out = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True)
    m = re.search(r"Collected : (\d+)", out.stderr)
    if m is None:
        raise RuntimeError(f"no callgrind total in: {out.stderr[-500:]}")
    return int(m.group(1))


def per_request(tree: Path, low: int, high: int) -> int:
    return (count(tree, high) - count(tree, low)) // (high - low)


def child(requests: int) -> None:
    """Serve `requests` requests in process (run under callgrind by `count`)."""
    # The gateway package first, from PYTHONPATH (the tree counted): inprocess.py puts this
    # tree's root first on sys.path, which must not decide which gateway runs.
    from gateway import audit
    from gateway.app import ProxyApp
    from gateway.metrics import Metrics
    from gateway.policy import PolicyStore

    sys.path.insert(1, str(BENCH))
    import inprocess as ip

    async def main() -> None:
        audit.configure_logging(io.StringIO())
        app = ProxyApp(PolicyStore([str(BENCH / "policy.yaml")]), ip.StubUpstream(), Metrics())
        for _ in range(requests):
            sink = ip.Sink()
            await app(ip.scope(), ip._receive, sink)
            assert sink.status == 200, sink.status

    asyncio.run(main())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="a commit to count the same way")
    ap.add_argument("--low", type=int, default=50)
    ap.add_argument("--high", type=int, default=250)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child)
        return 0
    if shutil.which("valgrind") is None:
        print("unavailable: valgrind not installed (apt-get install -y valgrind)")
        return 1
    here = per_request(ROOT, args.low, args.high)
    print(f"this tree: {here:,} instructions per request")
    if args.baseline:
        sys.path.insert(0, str(BENCH))
        from run import baseline_tree

        with baseline_tree(args.baseline) as (commit, tree):
            base = per_request(tree, args.low, args.high)
        print(f"@{commit}: {base:,} instructions per request")
        print(f"this tree / @{commit}: {here / base:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Verification latency: segmentation plus every deterministic check, at 1x / 10x / 100x size.

The 1x case is a ~1 KB cited answer against ~8 KB of context. Run:
    .venv/bin/python bench/verify_bench.py [--runs N] [--write docs/benchmarks-verify.md]
Time per KB should stay flat across sizes (verification is linear).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.checks.base import source_text
from gateway.policy import Policy
from gateway.types import Answer, Channel, Chunk, ContextSet
from gateway.verify import Verifier

CHUNK_TEXT = (
    "The {k}th pumping station opened in 2021 and serves 1,200 homes across the valley. "
    "Its battery stores 62.5 kWh and cost $3.2 million, roughly 80% of the original budget. "
    "Engineers said \"the station exceeded every target\" during the first winter season. "
    "Maintenance crews inspect the turbines, filters and pipes every quarter, e.g. in March. "
    "Dr. Smith of the U.S. water board approved version v2.1.3 of the control software. "
)
SENTENCES = [
    "The {k}th pumping station opened in 2021 and serves 1,200 homes [doc{k}:1].",
    "Its battery stores 62.5 kWh and cost $3.2 million [doc{k}:1].",
    'Engineers said "the station exceeded every target" [doc{k}:1].',
    "- Crews inspect the turbines every quarter, e.g. in March [doc{k}:1].",
    "Dr. Smith approved v2.1.3 of the control software. [doc{k}:1]",
]


HISTORY = "## Before and after"


def build(scale: int) -> tuple[Answer, ContextSet]:
    ctx = ContextSet()
    parts: list[str] = []
    for k in range(20 * scale):
        ctx.add(Chunk(f"doc{k}:1", CHUNK_TEXT.format(k=k), version="1"))
    n = 0
    while sum(map(len, parts)) < 1000 * scale:
        k = n % (20 * scale)
        parts.append(SENTENCES[n % len(SENTENCES)].format(k=k))
        parts.append("\n" if n % len(SENTENCES) in (2, 3) else " ")
        n += 1
    text = "".join(parts)
    answer = Answer("rag-json", {}, [Channel("content", ("answer",), text)])
    return answer, ctx


def policy() -> Policy:
    spec: dict[str, Any] = {
        "name": "bench",
        "routes": [{"name": "r", "match": {"path": "/x"}, "protocol": "openai-chat"}],
        "checks": [
            "missing_citation", "malformed_citation", "hallucinated_citation", "stale_source",
            "quote_mismatch", "number_mismatch", "unsupported",
        ],
        "support": {"threshold": 0.5},
    }
    return Policy.model_validate(spec)


def measure(scale: int, runs: int) -> dict[str, float]:
    answer, ctx = build(scale)
    v = Verifier(policy())
    report = v.verify(answer, ctx)
    assert report.all_verified, [c for c in report.claims if c.verdict != "verified"][:1]
    for _ in range(min(runs, 20)):
        v.verify(answer, ctx)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        v.verify(answer, ctx)
        times.append(time.perf_counter() - t0)
    times.sort()
    # Real contexts are new text: each chunk's index (`source_text`: numbers, normalised
    # text, content words) is built on its first citation. The same runs with that cache
    # emptied before each one.
    fresh = []
    for _ in range(runs):
        source_text.cache_clear()
        t0 = time.perf_counter()
        v.verify(answer, ctx)
        fresh.append(time.perf_counter() - t0)
    answer_kb = len(answer.channels[0].text.encode()) / 1024
    ctx_kb = sum(len((c.text or "").encode()) for c in ctx.chunks.values()) / 1024
    return {
        "answer_kb": answer_kb,
        "context_kb": ctx_kb,
        "claims": len(report.claims),
        "p50_ms": statistics.median(times) * 1e3,
        "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))] * 1e3,
        "fresh_p50_ms": statistics.median(fresh) * 1e3,
    }


def machine() -> str:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"nproc {os.cpu_count()}, CPU {cpu}, Python {platform.python_version()} "
        f"({platform.python_implementation()}), {platform.system()} {platform.machine()}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--write", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for scale in (1, 10, 100):
        runs = max(10, args.runs // scale)
        r = measure(scale, runs)
        r["scale"] = scale
        r["runs"] = runs
        rows.append(r)
    base = rows[0]["p50_ms"] / rows[0]["answer_kb"]
    lines = [
        "| size | answer KB | context KB | claims | runs | p50 ms | p99 ms | p50 ms/KB | growth "
        "| p50 ms, chunks new to the index |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        per_kb = r["p50_ms"] / r["answer_kb"]
        lines.append(
            f"| {r['scale']}x | {r['answer_kb']:.1f} | {r['context_kb']:.0f} | {r['claims']:.0f} "
            f"| {r['runs']:.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {per_kb:.3f} "
            f"| {r['p50_ms'] / rows[0]['p50_ms']:.1f}x ({per_kb / base:.2f} per KB) "
            f"| {r['fresh_p50_ms']:.3f} |"
        )
    table = "\n".join(lines)
    print(machine())
    print(table)
    if args.write:
        # Keep the hand-written history below the generated part.
        kept = ""
        if args.write.exists():
            old = args.write.read_text()
            at = old.find(HISTORY)
            kept = "\n" + old[at:] if at >= 0 else ""
        args.write.write_text(
            "# Verification benchmark\n\n"
            "`bench/verify_bench.py`: claim segmentation plus every deterministic check\n"
            "(missing, malformed, hallucinated, stale, quote, number, lexical support) over a\n"
            "~1 KB cited answer against ~8 KB of context, then 10x and 100x both. `growth` is p50\n"
            "relative to 1x, and p50 per KB relative to 1x (flat = linear). Single process, one\n"
            "core, on a machine shared with other work, so p99 is noisy.\n\n"
            f"Machine: {machine()}\n\n{table}\n\n"
            "Reproduce: `.venv/bin/python bench/verify_bench.py "
            "--write docs/benchmarks-verify.md`\n" + kept
        )


if __name__ == "__main__":
    main()

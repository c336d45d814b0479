"""The support check's cost and quality (not a test; `python bench/support_bench.py`).

1. The lexical tier on the AttributionBench dev set: macro-F1 and rows/s (`citewarden eval`).
2. The judge pass against a local scripted judge (a separate process, fixed latency, default
   200 ms): added latency per answer vs one judge round trip, calls per answer, the cost of
   an answer whose verdicts are all cached, an open-loop run below the judge's capacity
   (p50 vs upstream + one round trip), and the throughput of answers that need no judge call
   with and without judge traffic on the same event loop.

    python bench/support_bench.py [--data PATH] [--latency 0.2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway import policy as policy_mod  # noqa: E402
from gateway.checks.judge import PENDING  # noqa: E402
from gateway.eval import evaluate, read_rows, scores  # noqa: E402
from gateway.judge.client import close_clients  # noqa: E402
from gateway.pipeline import Judgement, RoutePipeline  # noqa: E402
from gateway.release import decide  # noqa: E402
from gateway.types import Chunk, Citation, Claim, ClaimReport, ContextSet, Report  # noqa: E402

DATA = Path(os.environ.get("CITEWARDEN_DEV_DATA", "/work/shared/data/attributionbench-dev.jsonl"))
ROUTE = "routes: [{name: kb, match: {path: /rag/a}, protocol: rag-json, rag: {answer: /answer}}]"


# -------------------------------------------------------------------- the scripted judge


def judge_app(latency: float) -> Any:
    """A chat-completions judge answering YES to every claim after `latency` seconds."""
    import re

    claim = re.compile(r'<claim id="([^"]*)"')

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw)
        ids = claim.findall(body["messages"][-1]["content"])
        await asyncio.sleep(latency)
        content = json.dumps({"verdicts": [{"id": i, "rationale": "", "label": "YES"}
                                           for i in ids]})
        out = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant",
                                                                "content": content}}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": out})

    return app


def serve_judge(port: int, latency: float) -> None:
    import uvicorn

    uvicorn.run(judge_app(latency), host="127.0.0.1", port=port, log_level="warning",
                access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("the scripted judge did not start")


# -------------------------------------------------------------------- pipelines


def _pipeline(support: str) -> RoutePipeline:
    import tempfile

    text = f"name: bench\n{ROUTE}\nchecks: [hallucinated_citation, unsupported]\n{support}\n"
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write(text)
    loaded = policy_mod.load_policy(fh.name)
    os.unlink(fh.name)
    return RoutePipeline(loaded, loaded.policy.routes[0])


def _answer(n_claims: int, tag: str) -> tuple[list[Claim], ContextSet]:
    ctx = ContextSet(chunks={"1": Chunk(id="1", text="The reactor near Oslo holds 42 rods.")})
    claims = [
        Claim(i, 0, f"Claim {tag} {i} about the reactor.", 0, 10, (Citation(id="1", raw="[1]"),))
        for i in range(n_claims)
    ]
    return claims, ctx


def _pending_judgement(claims: list[Claim], ctx: ContextSet) -> Judgement:
    reports = tuple(
        ClaimReport(c, "errored", error_kind=PENDING, check="unsupported") for c in claims
    )
    report = Report(reports, ctx)
    return Judgement(claims, report, decide(report, policy_mod.Release()))


# -------------------------------------------------------------------- measurements


def lexical(data: Path) -> dict[str, Any]:
    rows = read_rows(str(data))
    six = _pipeline_six()
    judged, seconds = asyncio.run(evaluate(six, rows))
    s = scores(judged, seconds)
    best = []
    for t in (0.3, 0.4, 0.5, 0.6, 0.7):
        p = _pipeline_six(f"support: {{threshold: {t}}}")
        j, sec = asyncio.run(evaluate(p, rows))
        best.append((t, scores(j, sec)["macro_f1"]))
    return {"rows": s["rows"], "macro_f1": s["macro_f1"],
            "balanced_accuracy": s["balanced_accuracy"], "rows_per_second": s["rows_per_second"],
            "by_threshold": best}


def _pipeline_six(support: str = "") -> RoutePipeline:
    import tempfile

    text = (f"name: bench\n{ROUTE}\ncitations: {{format: numeric}}\n"
            "checks: [missing_citation, malformed_citation, hallucinated_citation, stale_source,"
            " quote_mismatch, number_mismatch, unsupported]\n" + support + "\n")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        fh.write(text)
    loaded = policy_mod.load_policy(fh.name)
    os.unlink(fh.name)
    return RoutePipeline(loaded, loaded.policy.routes[0])


async def judge_costs(url: str, latency: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    support = (
        "support:\n  lexical: {pass_above: 1.0, fail_below: 0.0}\n"
        f"  judge: {{url: {url}/v1, model: j, timeout: 5s, deadline: 8s, max_concurrency: 64,"
        " cache: {entries: 100000, ttl: 1h}}\n"
    )
    pipeline = _pipeline(support)
    assert pipeline.judge_pass is not None
    # Warm the connection pool.
    c, ctx = _answer(1, "warm")
    await pipeline.resolve_judge(_pending_judgement(c, ctx), None)
    added, calls = [], []
    for k in range(20):
        claims, ctx = _answer(5, f"lat{k}")  # 5 claims citing one chunk: one batched call
        t0 = time.perf_counter()
        j = await pipeline.resolve_judge(_pending_judgement(claims, ctx), None)
        added.append((time.perf_counter() - t0 - latency) * 1000)
        assert j.judge is not None and j.outcome.decision.value == "released"
        calls.append(len(j.judge.calls))
    out["added_ms_over_round_trip_p50"] = round(statistics.median(added), 2)
    out["added_ms_over_round_trip_max"] = round(max(added), 2)
    out["calls_per_answer"] = statistics.mean(calls)
    # Cache hits: the same answers again.
    hit = []
    for k in range(20):
        claims, ctx = _answer(5, f"lat{k}")
        jd = _pending_judgement(claims, ctx)
        t0 = time.perf_counter()
        for _ in range(50):
            j = await pipeline.resolve_judge(jd, None)
        hit.append((time.perf_counter() - t0) / 50 * 1e6)
        assert j.judge is not None and not j.judge.calls
    out["cache_hit_answer_us_p50"] = round(statistics.median(hit), 1)
    out["cache_hit_per_claim_us"] = round(statistics.median(hit) / 5, 1)
    out.update(await open_loop(pipeline, latency))
    await close_clients()
    return out


async def open_loop(pipeline: RoutePipeline, latency: float) -> dict[str, Any]:
    """Fixed-rate arrivals (below max_concurrency / latency): each answer waits a 20 ms
    'upstream', then its judge pass; meanwhile a closed loop of answers that need no judge
    call (all verdicts cached) measures the loop's throughput with judge traffic present."""
    upstream = 0.02
    rate, seconds = 100.0, 5.0  # capacity 64 / 0.2 s = 320 answers/s
    lat: list[float] = []
    errors = 0

    async def one(k: int) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        await asyncio.sleep(upstream)
        claims, ctx = _answer(3, f"open{k}")
        j = await pipeline.resolve_judge(_pending_judgement(claims, ctx), None)
        lat.append(time.perf_counter() - t0)
        if j.outcome.decision.value != "released":
            errors += 1

    cached_claims, cached_ctx = _answer(3, "cached")
    cached = _pending_judgement(cached_claims, cached_ctx)
    await pipeline.resolve_judge(cached, None)

    async def no_judge_loop(stop: float) -> int:
        n = 0
        while time.perf_counter() < stop:
            await pipeline.resolve_judge(cached, None)
            n += 1
            if n % 20 == 0:
                await asyncio.sleep(0)
        return n

    async def drive(k0: int) -> list[asyncio.Task[None]]:
        tasks: list[asyncio.Task[None]] = []
        t_start = time.perf_counter()
        k = 0
        while time.perf_counter() < t_start + seconds:
            tasks.append(asyncio.create_task(one(k0 + k)))
            k += 1
            await asyncio.sleep(max(0.0, t_start + k / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
        return tasks

    # A: the open loop alone.
    await drive(0)
    lat.sort()
    alone_lat = list(lat)
    lat.clear()
    # B: answers that need no judge call, alone; C: the same with the open loop running.
    base_seconds = 2.0
    alone = await no_judge_loop(time.perf_counter() + base_seconds) / base_seconds
    counter = asyncio.create_task(no_judge_loop(time.perf_counter() + seconds))
    await drive(100_000)
    with_traffic = await counter / seconds
    lat.sort()
    return {
        "open_loop_rate": rate,
        "open_loop_answers": len(alone_lat),
        "open_loop_p50_ms": round(alone_lat[len(alone_lat) // 2] * 1000, 1),
        "open_loop_p99_ms": round(alone_lat[int(len(alone_lat) * 0.99)] * 1000, 1),
        "open_loop_budget_ms": round((upstream + latency) * 1000 + 5, 1),
        "open_loop_errors": errors,
        "open_loop_p50_ms_beside_saturating_no_judge_loop": round(lat[len(lat) // 2] * 1000, 1),
        "no_judge_answers_per_s_alone": round(alone),
        "no_judge_answers_per_s_with_judge_traffic": round(with_traffic),
        "no_judge_throughput_kept": round(with_traffic / alone, 3) if alone else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve-judge", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_judge is not None:
        serve_judge(args.serve_judge, args.latency)
        return 0
    result: dict[str, Any] = {}
    if Path(args.data).exists():
        result["lexical"] = lexical(Path(args.data))
    port = _free_port()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-judge", str(port),
                             "--latency", str(args.latency)])
    try:
        _wait_port(port)
        result["judge"] = asyncio.run(judge_costs(f"http://127.0.0.1:{port}", args.latency))
    finally:
        proc.terminate()
        proc.wait(10)
    result["judge_latency_ms"] = args.latency * 1000
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The support check's cost and quality (not a test; `python bench/support_bench.py`).

1. The lexical tier on the AttributionBench dev set: macro-F1 and rows/s (`citewarden eval`).
2. The judge pass against a local scripted judge (a separate process, fixed latency, default
   200 ms): added latency per answer vs one judge round trip, calls per answer, the cost of
   an answer whose verdicts are all cached, an open-loop run below the judge's capacity
   (p50 vs upstream + one round trip), and the throughput of answers that need no judge call
   with and without judge traffic on the same event loop.

The judge pass runs on the event loop the gateway serves on (`gateway.server.loop_factory`:
uvloop where installed). With two CPUs or more, the measuring process is pinned to one CPU and
the scripted judge to another (`--no-pin` leaves both to the scheduler), so the judge's own
work never shares a core with the measured loop; the machine's other work still may.

    python bench/support_bench.py [--data PATH] [--latency 0.2] [--json] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
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
from gateway.server import loop_factory  # noqa: E402
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


def serve_judge(port: int, latency: float, cpu: int | None = None) -> None:
    import uvicorn

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # before uvicorn starts a thread: they all inherit it
    uvicorn.run(judge_app(latency), host="127.0.0.1", port=port, log_level="warning",
                access_log=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pin_plan(pin: bool) -> tuple[int | None, int | None, str]:
    """(the measured loop's CPU, the scripted judge's CPU, a note for the report). Two CPUs or
    more: the loop on the highest-numbered one this process may use, the judge on the lowest
    (which also takes most device interrupts). Fewer, or no sched_setaffinity: no pinning."""
    if not pin:
        return None, None, "not pinned (--no-pin)"
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None, None, "not pinned: no sched_setaffinity on this platform"
    if len(cpus) < 2:
        return None, None, f"not pinned: only CPU {cpus[0]} available to this process"
    loop, judge = cpus[-1], cpus[0]
    return loop, judge, f"measured loop pinned to CPU {loop}, scripted judge to CPU {judge}"


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


async def judge_costs(url: str, latency: float, rounds: int, seconds: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    out: dict[str, Any] = {"event_loop": f"{type(loop).__module__}.{type(loop).__name__}"}
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
    out["beside"] = await beside(pipeline, rounds, seconds)
    await close_clients()
    return out


async def open_loop(pipeline: RoutePipeline, latency: float) -> dict[str, Any]:
    """Fixed-rate arrivals alone (below max_concurrency / latency): each answer waits a 20 ms
    'upstream', then its judge pass; p50 / p99 against upstream + one judge round trip."""
    seconds = 5.0
    lat: list[float] = []
    errors = await _drive(pipeline, _judged_answers(RATE * seconds, "open"), seconds, lat)
    lat.sort()
    return {
        "open_loop_rate": RATE,
        "open_loop_answers": len(lat),
        "open_loop_p50_ms": round(lat[len(lat) // 2] * 1000, 1),
        "open_loop_p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 1),
        "open_loop_budget_ms": round((UPSTREAM + latency) * 1000 + 5, 1),
        "open_loop_errors": errors,
    }


# -------------------------------------------------------------------- beside judge traffic
#
# The target (DESIGN §10): answers that need no judge call keep >= 90% of their throughput
# beside judge traffic, i.e. judge waits never block the event loop. On one event loop the
# judge traffic's own CPU (building the call, HTTP, reading the verdicts) necessarily comes
# out of the loop's time; what must not happen is the loop stalling on a judge call. So each
# round measures, taken in turns, five windows of the same length on this one loop:
#
#   judge         the judge traffic alone (fixed rate, below the judge's capacity): its CPU
#   alone         a closed loop of answers whose verdicts are all cached: their throughput
#   with          both at once
#   harness       the judge traffic's harness alone: the same arrivals and 20 ms "upstream"
#                 waits, the judge pass replaced by a no-op (what the bench itself costs)
#   harness_with  the harness beside the closed loop
#
# and each window's thread time from /proc/thread-self/schedstat: on a CPU, waiting for one
# (the machine's other work, other users), and neither (the loop blocked in a system call or
# slept; it never has reason to while the closed loop runs); user and system time from
# getrusage(RUSAGE_THREAD), and the time the collector ran (gc.callbacks).

RATE = 100.0  # judged answers/s; the judge's capacity is max_concurrency 64 / 0.2 s = 320/s
UPSTREAM = 0.02  # each judged answer's simulated upstream wait before its judge pass
WARM = 0.4  # judge traffic runs this long before a "with" window opens (two round trips)


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux


def _rusage() -> tuple[float, float]:
    """(user, system) CPU seconds of this thread so far; of the process without RUSAGE_THREAD."""
    r = resource.getrusage(_RUSAGE_THREAD if _RUSAGE_THREAD is not None
                           else resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


class _GcClock:
    """Thread CPU seconds spent in the cyclic collector since `install`."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
        else:
            self.total += time.thread_time() - self._t0

    def install(self) -> None:
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def remove(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


GC_CLOCK = _GcClock()


def _sched() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of this thread so far."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            on, wait, _ = fh.read().split()
        return int(on) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return time.thread_time(), 0.0  # no schedstat: waiting is counted as blocked


class _Window:
    """One measured stretch of the loop: wall, on-CPU, waiting and the closed loop's work."""

    def __init__(self) -> None:
        self.wall = self.cpu = self.waiting = self.user = self.system = self.gc = 0.0
        self.answers = 0
        self.holds: list[float] = []  # wall seconds the loop was away at each yield
        self.hold_cpus: list[float] = []  # thread CPU seconds of each: other callbacks' work
        self._t0, self._s0, self._r0, self._gc0 = 0.0, (0.0, 0.0), (0.0, 0.0), 0.0

    def start(self) -> None:
        self._gc0, self._r0 = GC_CLOCK.total, _rusage()
        self._s0, self._t0 = _sched(), time.perf_counter()

    def stop(self) -> None:
        self.wall = time.perf_counter() - self._t0
        s1 = _sched()
        self.cpu, self.waiting = s1[0] - self._s0[0], s1[1] - self._s0[1]
        r1 = _rusage()
        self.user, self.system = r1[0] - self._r0[0], r1[1] - self._r0[1]
        self.gc = GC_CLOCK.total - self._gc0

    @property
    def blocked(self) -> float:
        return max(0.0, self.wall - self.cpu - self.waiting)


def _judged_answers(n: float, tag: str) -> list[Judgement]:
    # Built before the clock starts: the bench's own answer building is no judge traffic.
    out = []
    for k in range(int(n) + 1):
        claims, ctx = _answer(3, f"{tag}{k}")
        out.append(_pending_judgement(claims, ctx))
    return out


async def _no_judge_pass(judgement: Judgement, request: Any) -> Judgement:
    """The harness windows' stand-in for `resolve_judge`: the judgement as it came."""
    return judgement


async def _drive(pipeline: RoutePipeline, answers: list[Judgement], seconds: float,
                 lat: list[float] | None = None, *, harness_only: bool = False) -> int:
    """Start one judged answer every 1 / RATE s for `seconds`, then wait for them all;
    the number that were not released. `harness_only`: the same arrivals and upstream waits,
    with no judge pass (the pending answers then count as not released: no errors counted)."""
    errors = 0
    resolve = _no_judge_pass if harness_only else pipeline.resolve_judge

    async def one(j: Judgement) -> None:
        nonlocal errors
        t0 = time.perf_counter()
        await asyncio.sleep(UPSTREAM)
        out = await resolve(j, None)
        if lat is not None:
            lat.append(time.perf_counter() - t0)
        if out.outcome.decision.value != "released" and not harness_only:
            errors += 1

    tasks: list[asyncio.Task[None]] = []
    t_start = time.perf_counter()
    k = 0
    while time.perf_counter() < t_start + seconds:
        tasks.append(asyncio.create_task(one(answers[k])))
        k += 1
        await asyncio.sleep(max(0.0, t_start + k / RATE - time.perf_counter()))
    await asyncio.gather(*tasks)
    return errors


async def _no_judge_loop(pipeline: RoutePipeline, cached: Judgement, w: _Window,
                         seconds: float) -> None:
    """Answers needing no judge call, back to back, each given its own turn of the loop (as
    a server's requests are); counts them and how long the loop was away between them."""
    stop = time.perf_counter() + seconds
    while True:
        await pipeline.resolve_judge(cached, None)
        w.answers += 1
        t = time.perf_counter()
        if t >= stop:
            return
        c = time.thread_time()
        await asyncio.sleep(0)
        w.hold_cpus.append(time.thread_time() - c)
        w.holds.append(time.perf_counter() - t)


async def beside(pipeline: RoutePipeline, rounds: int, seconds: float) -> dict[str, Any]:
    cached_claims, cached_ctx = _answer(3, "cached")
    cached = _pending_judgement(cached_claims, cached_ctx)
    await pipeline.resolve_judge(cached, None)  # its verdicts are cached from now on
    order = ["judge", "alone", "with", "harness", "harness_with"]
    windows: dict[str, list[_Window]] = {k: [] for k in order}
    judged_lat: list[float] = []
    errors = 0
    GC_CLOCK.install()
    for r in range(rounds):
        for kind in order[r % 5:] + order[: r % 5]:  # rotated: no kind always goes first
            answers = _judged_answers(RATE * (seconds + WARM), f"r{r}{kind}")
            gc.collect()
            await asyncio.sleep(0.2)  # let the machine settle after the last window
            w = _Window()
            harness = kind.startswith("harness")
            if kind in ("judge", "harness"):
                w.start()
                # including its last answers' judge round trips
                errors += await _drive(pipeline, answers, seconds, harness_only=harness)
                w.stop()
            elif kind == "alone":
                w.start()
                await _no_judge_loop(pipeline, cached, w, seconds)
                w.stop()
            else:
                # The judge traffic runs from WARM s before the window to its end: the window
                # sees it in its steady state (calls going out and verdicts coming back).
                driver = asyncio.create_task(_drive(
                    pipeline, answers, seconds + WARM, None if harness else judged_lat,
                    harness_only=harness))
                await asyncio.sleep(WARM)
                w.start()
                await _no_judge_loop(pipeline, cached, w, seconds)
                w.stop()
                errors += await driver
            windows[kind].append(w)
    GC_CLOCK.remove()
    return _beside_figures(windows, judged_lat, errors, seconds)


def _beside_figures(windows: dict[str, list[_Window]], judged_lat: list[float], errors: int,
                    seconds: float) -> dict[str, Any]:
    med = statistics.median
    # The judge traffic's CPU per wall second at RATE, alone (the loop idles between arrivals).
    judge_alone = [w.cpu / seconds for w in windows["judge"]]
    alone = [w.answers / w.wall for w in windows["alone"]]
    with_ = [w.answers / w.wall for w in windows["with"]]
    kept = [b / a for a, b in zip(alone, with_, strict=True)]
    # Beside it, measured in the window itself: the CPU the loop spent away from the no-judge
    # answers, less what a yield costs when nothing else runs.
    per_yield = med([sum(w.hold_cpus) / max(1, len(w.holds)) for w in windows["alone"]])
    judge_with = [max(0.0, sum(w.hold_cpus) - per_yield * len(w.holds)) for w in windows["with"]]
    judge_with_share = [j / w.wall for j, w in zip(judge_with, windows["with"], strict=True)]
    # The harness alone (arrivals, upstream waits, no judge pass), alone and beside.
    harness_alone = [w.cpu / seconds for w in windows["harness"]]
    harness_with = [max(0.0, sum(w.hold_cpus) - per_yield * len(w.holds))
                    for w in windows["harness_with"]]
    harness_with_share = [h / w.wall for h, w in zip(harness_with, windows["harness_with"],
                                                      strict=True)]
    kept_harness = [w.answers / w.wall / a
                    for a, w in zip(alone, windows["harness_with"], strict=True)]
    n_judged = RATE * seconds

    def per_answer_us(kind: str, attr: str) -> list[int]:
        return [round(getattr(w, attr) / n_judged * 1e6) for w in windows[kind]]
    cost_alone = [w.cpu / w.answers * 1e6 for w in windows["alone"]]
    cost_with = [(w.cpu - j) / w.answers * 1e6
                 for j, w in zip(judge_with, windows["with"], strict=True)]
    per_cpu_alone = [w.answers / w.cpu for w in windows["alone"]]
    per_cpu_with = [w.answers / w.cpu for w in windows["with"]]
    holds = sorted(h for w in windows["with"] for h in w.holds)
    holds_alone = sorted(h for w in windows["alone"] for h in w.holds)
    hold_cpus = sorted(h for w in windows["with"] for h in w.hold_cpus)
    judged_lat.sort()

    def share(kind: str, attr: str) -> list[float]:
        return [round(getattr(w, attr) / w.wall, 3) for w in windows[kind]]

    def q(xs: list[float], p: float) -> float:
        return round(xs[min(len(xs) - 1, int(len(xs) * p))] * 1000, 2) if xs else 0.0

    return {
        "rounds": len(kept),
        "window_s": seconds,
        "judged_rate": RATE,
        "no_judge_per_s_alone": [round(x) for x in alone],
        "no_judge_per_s_with_judge_traffic": [round(x) for x in with_],
        "no_judge_kept": [round(x, 3) for x in kept],
        "no_judge_kept_median": round(med(kept), 3),
        # Per second of CPU the loop actually got: what the machine's other work cannot move.
        "no_judge_kept_per_cpu_second": [round(b / a, 3) for a, b in
                                         zip(per_cpu_alone, per_cpu_with, strict=True)],
        "judge_traffic_cpu_share_alone": [round(x, 3) for x in judge_alone],
        "judge_traffic_cpu_us_per_answer_alone": [round(x / RATE * 1e6) for x in judge_alone],
        "judge_traffic_cpu_share_with": [round(x, 3) for x in judge_with_share],
        # Thread user / system time and the collector's, per judged answer, in the windows
        # of the judge traffic and of its harness alone.
        "judge_traffic_user_us_per_answer_alone": per_answer_us("judge", "user"),
        "judge_traffic_system_us_per_answer_alone": per_answer_us("judge", "system"),
        "judge_traffic_gc_us_per_answer_alone": per_answer_us("judge", "gc"),
        "harness_cpu_us_per_answer_alone": [round(x / RATE * 1e6) for x in harness_alone],
        "harness_user_us_per_answer_alone": per_answer_us("harness", "user"),
        "harness_system_us_per_answer_alone": per_answer_us("harness", "system"),
        # Each round's judge window less its harness window: the judge pass's own CPU (the
        # plan, the HTTP exchange, the verdicts, re-deciding), with the loop otherwise idle.
        "judge_pass_cpu_us_per_answer_alone": [
            round((j - h) / RATE * 1e6) for j, h in zip(judge_alone, harness_alone, strict=True)],
        "harness_cpu_share_with": [round(x, 3) for x in harness_with_share],
        "no_judge_kept_harness_only": [round(x, 3) for x in kept_harness],
        "no_judge_kept_harness_only_median": round(med(kept_harness), 3),
        "judge_traffic_share_of_loop_cpu_with": [
            round(j / w.cpu, 3) for j, w in zip(judge_with, windows["with"], strict=True)],
        "on_cpu_share_alone": share("alone", "cpu"),
        "on_cpu_share_with": share("with", "cpu"),
        "waiting_for_cpu_share_alone": share("alone", "waiting"),
        "waiting_for_cpu_share_with": share("with", "waiting"),
        "blocked_share_alone": share("alone", "blocked"),
        "blocked_share_with": share("with", "blocked"),
        "no_judge_cpu_us_alone": [round(x, 1) for x in cost_alone],
        "no_judge_cpu_us_with": [round(x, 1) for x in cost_with],
        # On a core of its own the loop would lose the judge traffic's CPU per second, and any
        # change in the no-judge answers' own cost beside it (caches, allocation).
        "kept_on_a_core_of_its_own": round(
            (1 - med(judge_with_share)) * med(cost_alone) / med(cost_with), 3),
        "loop_away_ms_alone_p99_max": [q(holds_alone, 0.99), q(holds_alone, 1.0)],
        "loop_away_ms_with_p50_p99_max": [q(holds, 0.5), q(holds, 0.99), q(holds, 1.0)],
        # The same turns of the loop in CPU time: the judge traffic's work between two
        # no-judge answers; the rest of a long wall-clock turn was spent waiting for a CPU.
        "loop_away_cpu_ms_with_p99_max": [q(hold_cpus, 0.99), q(hold_cpus, 1.0)],
        "judged_p50_ms_beside_no_judge_loop": q(judged_lat, 0.5),
        "judged_errors": errors,
    }


def markdown(result: dict[str, Any]) -> str:
    """The figures as the markdown `make bench` prints and docs/benchmarks.md quotes."""
    out = []
    lex = result.get("lexical")
    if lex:
        out.append(f"Lexical tier on {lex['rows']} AttributionBench dev rows: macro-F1 "
                   f"{lex['macro_f1']:.3f}, balanced accuracy {lex['balanced_accuracy']:.3f}, "
                   f"{lex['rows_per_second']:,.0f} rows/s; macro-F1 by `support.threshold`: "
                   + ", ".join(f"{t} {f:.3f}" for t, f in lex["by_threshold"]) + ".\n")
    else:
        out.append("Lexical tier: not measured (no AttributionBench dev set at --data).\n")
    j = result["judge"]
    b = j["beside"]

    def spread(xs: list[float], fmt: str) -> str:
        lo, mid, hi = min(xs), statistics.median(xs), max(xs)
        return f"{format(mid, fmt)} ({format(lo, fmt)}–{format(hi, fmt)})"

    rt = result["judge_latency_ms"]
    rows = [
        ["added latency per answer over one judge round trip, p50 / max of 20",
         f"{j['added_ms_over_round_trip_p50']} / {j['added_ms_over_round_trip_max']} ms",
         "≤ 2 ms (p50)"],
        ["judge calls per answer (5 claims, one chunk)", f"{j['calls_per_answer']:g}", "1"],
        ["an answer whose 5 verdicts are all cached",
         f"{j['cache_hit_answer_us_p50']} µs ({j['cache_hit_per_claim_us']} µs per claim)",
         "≤ 50 µs per hit"],
        [f"open loop at {j['open_loop_rate']:g} answers/s, {UPSTREAM * 1000:g} ms upstream: "
         "p50 / p99", f"{j['open_loop_p50_ms']} / {j['open_loop_p99_ms']} ms, "
         f"{j['open_loop_errors']} errors", f"≤ {j['open_loop_budget_ms']} ms"],
        [f"no-judge answers/s alone → beside {b['judged_rate']:g} judged answers/s; kept "
         f"(median, min–max of {b['rounds']} rounds)",
         f"{spread(b['no_judge_per_s_alone'], ',.0f')} → "
         f"{spread(b['no_judge_per_s_with_judge_traffic'], ',.0f')}; "
         f"{spread(b['no_judge_kept'], '.0%')}", "≥ 90%"],
    ]
    table = "\n".join(["| measure | result | target |", "| --- | --- | --- |"]
                      + ["| " + " | ".join(r) + " |" for r in rows])
    detail = [
        ["no-judge answers kept per second of CPU the loop got (the machine's share out)",
         spread(b["no_judge_kept_per_cpu_second"], ".0%")],
        ["the judge traffic's CPU, share of a core: alone / beside (measured in the window)",
         f"{spread(b['judge_traffic_cpu_share_alone'], '.1%')} / "
         f"{spread(b['judge_traffic_cpu_share_with'], '.1%')}"],
        ["… per judged answer (alone)",
         spread(b["judge_traffic_cpu_us_per_answer_alone"], ".0f") + " µs"],
        ["… share of the CPU the loop got (with)",
         spread(b["judge_traffic_share_of_loop_cpu_with"], ".0%")],
        ["… of it user / system / in the collector",
         f"{spread(b['judge_traffic_user_us_per_answer_alone'], '.0f')} / "
         f"{spread(b['judge_traffic_system_us_per_answer_alone'], '.0f')} / "
         f"{spread(b['judge_traffic_gc_us_per_answer_alone'], '.0f')} µs"],
        ["the harness alone (same arrivals and 20 ms waits, no judge pass), per answer: "
         "CPU (user / system)",
         f"{spread(b['harness_cpu_us_per_answer_alone'], '.0f')} µs "
         f"({spread(b['harness_user_us_per_answer_alone'], '.0f')} / "
         f"{spread(b['harness_system_us_per_answer_alone'], '.0f')})"],
        ["the judge pass's own CPU per judged answer (each round's judge − harness window)",
         spread(b["judge_pass_cpu_us_per_answer_alone"], ".0f") + " µs"],
        ["the harness's CPU beside the no-judge loop, share of a core; no-judge answers kept "
         "beside the harness alone",
         f"{spread(b['harness_cpu_share_with'], '.1%')}; "
         f"{spread(b['no_judge_kept_harness_only'], '.0%')}"],
        ["CPU per no-judge answer, alone / beside judge traffic (its CPU taken out)",
         f"{spread(b['no_judge_cpu_us_alone'], '.1f')} / "
         f"{spread(b['no_judge_cpu_us_with'], '.1f')} µs"],
        ["the loop's thread on a CPU, alone / with",
         f"{spread(b['on_cpu_share_alone'], '.0%')} / {spread(b['on_cpu_share_with'], '.0%')}"],
        ["… waiting for a CPU (the machine's other work), alone / with",
         f"{spread(b['waiting_for_cpu_share_alone'], '.0%')} / "
         f"{spread(b['waiting_for_cpu_share_with'], '.0%')}"],
        ["… blocked or asleep with answers ready, alone / with",
         f"{spread(b['blocked_share_alone'], '.1%')} / {spread(b['blocked_share_with'], '.1%')}"],
        ["kept on a core of its own: (1 − judge CPU share) × no-judge CPU alone / with",
         f"{b['kept_on_a_core_of_its_own']:.0%}"],
        ["loop away between two no-judge answers, p99 / max: alone",
         " / ".join(f"{x} ms" for x in b["loop_away_ms_alone_p99_max"])],
        ["… with judge traffic, p50 / p99 / max",
         " / ".join(f"{x} ms" for x in b["loop_away_ms_with_p50_p99_max"])],
        ["… of it on a CPU (the judge traffic's work in one turn), p99 / max",
         " / ".join(f"{x} ms" for x in b["loop_away_cpu_ms_with_p99_max"])],
        ["judged answers' p50 beside the no-judge loop / errors",
         f"{b['judged_p50_ms_beside_no_judge_loop']} ms / {b['judged_errors']}"],
    ]
    out.append(f"Judge pass against a scripted judge (a separate process answering after "
               f"{rt:g} ms; answers of pending claims citing one chunk, `group_by: chunk`); "
               f"event loop {j['event_loop']}; {result['pinning']}:\n")
    out.append(table + "\n")
    out.append(f"Beside judge traffic, {b['rounds']} rounds of {b['window_s']:g} s windows "
               "taken in turns (judge traffic alone, no-judge answers alone, both, the "
               "harness alone, the harness beside the no-judge answers), median (min–max); "
               "thread times from /proc/thread-self/schedstat and getrusage:\n")
    out.append("\n".join(["| measure | result |", "| --- | --- |"]
                         + ["| " + " | ".join(r) + " |" for r in detail]) + "\n")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--latency", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the beside-judge windows")
    ap.add_argument("--window", type=float, default=2.0, help="seconds per window")
    ap.add_argument("--json", action="store_true", help="print JSON instead of markdown")
    ap.add_argument("--json-out", default=None, help="also write the JSON figures here")
    ap.add_argument("--no-pin", action="store_true",
                    help="leave the measured loop and the scripted judge to the scheduler")
    ap.add_argument("--serve-judge", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--judge-cpu", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_judge is not None:
        serve_judge(args.serve_judge, args.latency, args.judge_cpu)
        return 0
    loop_cpu, judge_cpu, pinning = pin_plan(not args.no_pin)
    if loop_cpu is not None:
        os.sched_setaffinity(0, {loop_cpu})  # this (only) thread, before any other starts
    result: dict[str, Any] = {"pinning": pinning}
    if Path(args.data).exists():
        result["lexical"] = lexical(Path(args.data))
    port = _free_port()
    cmd = [sys.executable, __file__, "--serve-judge", str(port), "--latency", str(args.latency)]
    if judge_cpu is not None:
        cmd += ["--judge-cpu", str(judge_cpu)]
    proc = subprocess.Popen(cmd)
    try:
        _wait_port(port)
        # The loop the gateway serves on (gateway/server.py): uvloop where installed.
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            result["judge"] = runner.run(judge_costs(f"http://127.0.0.1:{port}", args.latency,
                                                     args.rounds, args.window))
    finally:
        proc.terminate()
        proc.wait(10)
    result["judge_latency_ms"] = args.latency * 1000
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2) if args.json else markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

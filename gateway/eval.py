"""`citewarden eval`: score a policy's checks against labelled claims (DESIGN §1).

Each row (`claim`, `references`, optional `question`, `label`, `src`) is judged as one claim
citing all its references (chunk ids 1, 2, …) through the same verifier and judge pass as the
proxy. A claim the policy does not verify (failed, or errored: fail closed) is predicted "not
attributable". Rows run concurrently up to `support.judge.max_concurrency` when a judge is on.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from gateway.errors import InputError
from gateway.pipeline import RoutePipeline
from gateway.policy import load_policy
from gateway.release import decide
from gateway.types import Chunk, Citation, Claim, ClaimReport, ContextSet, Report

__all__ = ["Row", "evaluate", "read_rows", "run", "scores"]

NA = "not attributable"
LABELS = ("attributable", NA)


@dataclass(frozen=True, slots=True)
class Row:
    line: int
    claim: str
    references: tuple[str, ...]
    question: str | None
    label: str
    src: str


@dataclass(frozen=True, slots=True)
class Judged:
    row: Row
    predicted: str
    reason: str  # the failing reason / error kind, or "verified" / "exempt"
    decision: str


def read_rows(path: str) -> list[Row]:
    """The rows of a JSONL file; InputError naming the line of the first bad one."""
    rows: list[Row] = []
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from None
    with fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise InputError(f"{path}:{n}: not a JSON object") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{n}: not a JSON object")
            claim, refs, label = obj.get("claim"), obj.get("references"), obj.get("label")
            if not isinstance(claim, str):
                raise InputError(f"{path}:{n}: `claim` must be a string")
            if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
                raise InputError(f"{path}:{n}: `references` must be a list of strings")
            if label not in LABELS:
                raise InputError(f"{path}:{n}: `label` must be 'attributable' or '{NA}'")
            q = obj.get("question")
            src = obj.get("src")
            rows.append(
                Row(n, claim, tuple(refs), q if isinstance(q, str) and q else None, label,
                    src if isinstance(src, str) and src else "-")
            )
    return rows


def _claim_and_context(row: Row) -> tuple[Claim, ContextSet]:
    ids = [str(i + 1) for i in range(len(row.references))]
    pairs = zip(ids, row.references, strict=True)
    ctx = ContextSet(chunks={i: Chunk(id=i, text=t) for i, t in pairs})
    cits = tuple(Citation(id=i, raw=f"[{i}]") for i in ids)
    return Claim(0, 0, row.claim, 0, len(row.claim), cits), ctx


async def _judge_row(pipeline: RoutePipeline, row: Row) -> Judged:
    claim, ctx = _claim_and_context(row)
    reports: list[ClaimReport] = pipeline.verifier.verify_claims([claim], ctx)
    if pipeline.judge_pass is not None:
        reports, _ = await pipeline.judge_claims(
            reports, ctx, row.question, pipeline.judge_deadline()
        )
    (r,) = reports
    outcome = decide(Report(tuple(reports), ctx), pipeline.policy.release)
    predicted = "attributable" if r.verdict in ("verified", "exempt") else NA
    reason = r.reason or r.error_kind or r.verdict
    return Judged(row, predicted, reason, outcome.decision.value)


def _progress(done: int, total: int, started: float, err: TextIO) -> None:
    width = 30
    filled = width * done // max(total, 1)
    rate = done / max(time.perf_counter() - started, 1e-9)
    err.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {rate:.0f} rows/s")
    if done == total:
        err.write("\n")
    err.flush()


async def evaluate(
    pipeline: RoutePipeline, rows: Sequence[Row], progress: TextIO | None = None
) -> tuple[list[Judged], float]:
    """Every row judged (in input order) and the seconds it took."""
    started = time.perf_counter()
    total = len(rows)
    step = max(1, total // 200)
    out: list[Judged | None] = [None] * total
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None and (done % step == 0 or done == total):
            _progress(done, total, started, progress)

    if pipeline.judge_pass is None:
        for i, row in enumerate(rows):
            out[i] = await _judge_row(pipeline, row)  # no awaits inside: CPU only
            tick()
    else:
        spec = pipeline.policy.support.judge
        assert spec is not None
        sem = asyncio.Semaphore(spec.max_concurrency)

        async def one(i: int, row: Row) -> None:
            async with sem:
                out[i] = await _judge_row(pipeline, row)
            tick()

        await asyncio.gather(*(one(i, r) for i, r in enumerate(rows)))
    return [j for j in out if j is not None], time.perf_counter() - started


def _binary(judged: Iterable[Judged]) -> dict[str, Any]:
    tp = fp = fn = tn = 0  # positive class: "not attributable"
    for j in judged:
        actual, pred = j.row.label == NA, j.predicted == NA
        if actual and pred:
            tp += 1
        elif pred:
            fp += 1
        elif actual:
            fn += 1
        else:
            tn += 1
    p_na = tp / (tp + fp) if tp + fp else 0.0
    r_na = tp / (tp + fn) if tp + fn else 0.0
    p_a = tn / (tn + fn) if tn + fn else 0.0
    r_a = tn / (tn + fp) if tn + fp else 0.0
    f_na = 2 * p_na * r_na / (p_na + r_na) if p_na + r_na else 0.0
    f_a = 2 * p_a * r_a / (p_a + r_a) if p_a + r_a else 0.0
    return {
        "rows": tp + fp + fn + tn,
        "balanced_accuracy": round((r_na + r_a) / 2, 4),
        "macro_f1": round((f_na + f_a) / 2, 4),
        "precision_na": round(p_na, 4),
        "recall_na": round(r_na, 4),
    }


def scores(judged: Sequence[Judged], seconds: float) -> dict[str, Any]:
    """The report `--format json` prints (DESIGN §1 lists its keys)."""
    out = _binary(judged)
    out["rows_per_second"] = round(len(judged) / seconds, 1) if seconds > 0 else None
    decisions: dict[str, int] = {}
    by_reason: dict[str, dict[str, int]] = {}
    for j in judged:
        decisions[j.decision] = decisions.get(j.decision, 0) + 1
        entry = by_reason.setdefault(j.reason, {"rows": 0, "not_attributable": 0})
        entry["rows"] += 1
        entry["not_attributable"] += j.row.label == NA
    out["decisions"] = dict(sorted(decisions.items()))
    out["by_reason"] = {
        k: {**v, "precision_na": round(v["not_attributable"] / v["rows"], 4)}
        for k, v in sorted(by_reason.items())
    }
    srcs = sorted({j.row.src for j in judged})
    out["by_src"] = {s: _binary(j for j in judged if j.row.src == s) for s in srcs}
    return out


def text_report(result: dict[str, Any]) -> str:
    lines = [
        f"rows               {result['rows']}",
        f"macro-F1           {result['macro_f1']:.3f}",
        f"balanced accuracy  {result['balanced_accuracy']:.3f}",
        f"not attributable   precision {result['precision_na']:.3f}  "
        f"recall {result['recall_na']:.3f}",
        f"rows/s             {result['rows_per_second']}",
        "decisions          " + ", ".join(f"{k} {v}" for k, v in result["decisions"].items()),
        "by reason          (rows, share labelled not attributable)",
    ]
    for k, v in result["by_reason"].items():
        lines.append(f"  {k:<24} {v['rows']:>6}  {v['precision_na']:.3f}")
    lines.append("by src             (rows, macro-F1, balanced accuracy)")
    for k, v in result["by_src"].items():
        lines.append(
            f"  {k:<24} {v['rows']:>6}  {v['macro_f1']:.3f}  {v['balanced_accuracy']:.3f}"
        )
    return "\n".join(lines) + "\n"


def run(policy_path: str, data_path: str, out: TextIO, fmt: str, err: TextIO | None = None) -> int:
    """The command: 0 once the report is printed; bad input raises (exit 2 in the CLI)."""
    loaded = load_policy(policy_path)
    if "unsupported" not in loaded.policy.checks:
        print("citewarden eval: note: `unsupported` is not in the policy's checks",
              file=err or sys.stderr)
    rows = read_rows(data_path)
    pipeline = RoutePipeline(loaded, loaded.policy.routes[0])
    err = err if err is not None else sys.stderr
    progress = err if getattr(err, "isatty", lambda: False)() else None

    async def main() -> tuple[list[Judged], float]:
        from gateway.judge.client import close_clients

        try:
            return await evaluate(pipeline, rows, progress)
        finally:
            await close_clients()

    judged, seconds = asyncio.run(main())
    result = scores(judged, seconds)
    if fmt == "json":
        out.write(json.dumps(result, indent=2) + "\n")
    else:
        out.write(text_report(result))
    return 0

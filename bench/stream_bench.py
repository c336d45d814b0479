"""The gateway's CPU cost per upstream SSE frame, in process, for OpenAI and Anthropic streams.

Feeds the mock upstream's ~1 KB cited answer (6 characters per delta) through the streaming hot
path — `SSEDecoder` → the protocol's stream parser → `ClaimSegmenter` → verification of each
claim — and prints µs per frame for each stage cumulatively, then for the whole stream
including the final judgement. Run:
    .venv/bin/python bench/stream_bench.py [--runs N] [--profile openai|anthropic]

On the 2-core bench machine (µs per frame, openai / anthropic), 3 Dec, after the string
slots were removed (every frame parsed, duplicate-key checked and walked through its frame
table): + parser 16.2 / 9.5; + segmenter 18.0 / 11.2; whole stream 22.0 / 14.8 (with the
slots: 3.7 / 3.8, 5.5 / 5.6, 8.8 / 8.5). docs/benchmarks.md has the history.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.mock_upstream import ANSWER_TEXT, REQUEST
from gateway.demo import wire
from gateway.pipeline import RoutePipeline
from gateway.policy import Policy, from_model, load_policy
from gateway.sse import SSEDecoder
from gateway.stream import StreamVerifier

POLICY = Path(__file__).resolve().parent / "policy.yaml"
CHUNK = 6  # characters per delta: about one token


def openai_frames() -> list[bytes]:
    chunks = wire.openai_chunks(
        wire.split_fixed(ANSWER_TEXT, CHUNK),
        id="chatcmpl-bench",
        model="bench-model",
        created=1_700_000_000,
        usage=wire.Usage(210, 96),
        n=1,
        include_usage=True,
        finish_reason="stop",
    )
    return wire.openai_frames(chunks, done=True)


def anthropic_frames() -> list[bytes]:
    events = wire.anthropic_events(
        wire.split_fixed(ANSWER_TEXT, CHUNK),
        id="msg_bench",
        model="bench-model",
        usage=wire.Usage(210, 96),
        stop_reason="end_turn",
        ping=True,
    )
    return wire.anthropic_frames(events)


def pipelines() -> dict[str, tuple[RoutePipeline, dict[str, Any], list[bytes]]]:
    lp = load_policy(POLICY)
    raw = json.loads(lp.policy.model_dump_json(by_alias=True))
    raw["routes"] = [{"name": "messages", "match": {"path": "/v1/messages"}}]
    raw["routes"][0]["protocol"] = "anthropic-messages"
    ap = from_model(Policy.model_validate(raw))
    system, user = REQUEST["messages"]
    assert isinstance(system, dict)
    anthropic_request = {"model": "bench-model", "system": system["content"], "messages": [user]}
    return {
        "openai": (RoutePipeline(lp, lp.policy.routes[0]), REQUEST, openai_frames()),
        "anthropic": (
            RoutePipeline(ap, ap.policy.routes[0]),
            anthropic_request,
            anthropic_frames(),
        ),
    }


def stages(
    p: RoutePipeline, request: dict[str, Any], frames: list[bytes]
) -> dict[str, Callable[[], None]]:
    def sse() -> None:
        dec = SSEDecoder()
        for f in frames:
            dec.feed(f)
        dec.finish()

    def parse() -> None:
        dec = SSEDecoder()
        parser = p.adapter.stream_parser(p.route)
        for f in frames:
            for ev in dec.feed(f):
                parser.feed(ev)
        parser.finish()

    def segment() -> None:
        dec = SSEDecoder()
        parser = p.adapter.stream_parser(p.route)
        seg = p.verifier.segmenter()
        for f in frames:
            for ev in dec.feed(f):
                for key, delta in parser.feed(ev):
                    if key == p.primary_key:
                        seg.feed(delta)
        seg.finish()
        parser.finish()

    def verify() -> None:
        sv = StreamVerifier(p, p.context(request, None, {}))
        dec = SSEDecoder()
        for f in frames:
            for ev in dec.feed(f):
                sv.feed(ev)
        sv.finish()

    def judged() -> None:
        ctx = p.context(request, None, {})
        sv = StreamVerifier(p, ctx)
        dec = SSEDecoder()
        for f in frames:
            for ev in dec.feed(f):
                sv.feed(ev)
        _, answer = sv.finish()
        outcome = p.safe_judge(answer, ctx, sv.known).outcome
        assert outcome.decision.value == "released", outcome

    return {
        "sse": sse,
        "+parser": parse,
        "+segmenter": segment,
        "+verify": verify,
        "+judge (whole)": judged,
    }


def per_frame(fn: Callable[[], None], frames: int, runs: int) -> float:
    for _ in range(max(runs // 10, 5)):
        fn()
    best = float("inf")
    for _ in range(5):  # best of 5 batches: the machine is shared
        t = time.perf_counter()
        for _ in range(runs // 5):
            fn()
        best = min(best, (time.perf_counter() - t) / (runs // 5))
    return best / frames * 1e6


def growth(p: RoutePipeline) -> None:
    """Per-delta cost of long inputs at 5k and 50k deltas: equal costs mean linear growth
    (a parser or segmenter that re-scans what it holds would cost ~10x more per delta)."""
    from gateway.sse import SSEEvent

    def segmenter(n: int) -> float:
        seg = p.verifier.segmenter()
        t0 = time.perf_counter()
        for _ in range(n):
            seg.feed("word ")
        seg.feed("[doc:1].\n")
        seg.finish()
        return (time.perf_counter() - t0) / n * 1e6

    def tool_arguments(n: int) -> float:
        parser = p.adapter.stream_parser(p.route)
        head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        call = {"index": 0, "id": "x", "type": "function", "function": {"name": "f"}}
        opening = {"role": "assistant", "tool_calls": [call]}
        piece = {"tool_calls": [{"index": 0, "function": {"arguments": "ab"}}]}
        events = [
            SSEEvent(json.dumps({**head, "choices": [{"index": 0, "delta": d}]}))
            for d in (opening, piece)
        ]
        parser.feed(events[0])
        t0 = time.perf_counter()
        for _ in range(n):
            parser.feed(events[1])
        parser.feed(SSEEvent("[DONE]"))
        parser.finish()
        return (time.perf_counter() - t0) / n * 1e6

    for name, fn in (("segmenter", segmenter), ("tool arguments", tool_arguments)):
        small, big = fn(5_000), fn(50_000)
        print(f"{name:<16} {small:8.2f} us/delta @5k  {big:8.2f} @50k  ratio {big / small:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--profile", choices=["openai", "anthropic"])
    args = ap.parse_args()
    setups = pipelines()
    if args.profile:
        import cProfile
        import pstats

        p, request, frames = setups[args.profile]
        fn = stages(p, request, frames)["+judge (whole)"]
        prof = cProfile.Profile()
        prof.runcall(lambda: [fn() for _ in range(args.runs)])
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return
    print(f"{'µs per frame':<16}" + "".join(f"{name:>14}" for name in setups))
    names = list(stages(*setups["openai"]))
    table = {
        proto: {n: per_frame(fn, len(frames), args.runs) for n, fn in stages(p, r, frames).items()}
        for proto, (p, r, frames) in setups.items()
    }
    for n in names:
        print(f"{n:<16}" + "".join(f"{table[proto][n]:>14.1f}" for proto in setups))
    print("frames/stream   " + "".join(f"{len(s[2]):>14}" for s in setups.values()))
    print()
    growth(setups["openai"][0])


if __name__ == "__main__":
    main()

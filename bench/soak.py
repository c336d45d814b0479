"""Soak: minutes of mixed traffic at 24 concurrent through a real gateway subprocess.

A scripted upstream (tests/upstream_app.py, in this process) answers good and hallucinated
answers for each protocol and streaming mode, plus upstream faults (5xx, invalid JSON, resets,
truncated and stalled streams); some clients hang up mid-stream. Every hallucinated answer
carries a marker word; every response is read whole (status line, headers, body, stream) and
scanned for it. Not part of `make test`. Run:

    .venv/bin/python bench/soak.py [--minutes 30] [--concurrency 24] [--attacks]

Prints requests (per scenario), leaks (responses carrying the marker), unhandled errors (a
status the scenario does not allow, and tracebacks in the gateway's log), the gateway's RSS and
open file descriptors at start and end, and the RSS slope after warm-up (MB/min, least
squares over samples every 5 s). `--attacks` adds every plant of the adversarial matrix
(tests/attacks/protocols.py): field, frame and header channels, planted context.
Exit 1 on any leak or unhandled error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from tests.attacks.harness import (
    POLICIES,
    GatewayProcess,
    build_request,
    leaks,
    parse_response,
)
from tests.attacks.protocols import (
    BAD,
    GOOD,
    PLANTED_ANSWER,
    QUESTION,
    REGISTRY,
    Mode,
    ProtocolSpec,
    error_behaviour,
    generic_plants,
)
from tests.upstream_app import (
    SCENARIO_HEADER,
    Behaviour,
    ErrorEnvelope,
    FakeUpstream,
    InvalidJson,
    Reset,
    Slow,
    Stream,
    Truncated,
    create_upstream,
    serve,
)

OK = frozenset({200})


@dataclass
class Scenario:
    name: str
    spec: ProtocolSpec
    mode: Mode
    behaviour: Behaviour
    allowed: frozenset[int]
    weight: int = 1
    request: dict[str, object] | None = None
    disconnect: bool = False
    path: str | None = None


def _body(spec: ProtocolSpec, text: str, mode: Mode) -> Behaviour:
    behaviour = spec.good(text).behaviour(mode)
    assert behaviour is not None
    if isinstance(behaviour, Stream):  # a little pacing, as a model streams
        return Stream(behaviour.frames, seed=3, max_piece=128, delay=0.002)
    return behaviour


def core_scenarios() -> list[Scenario]:
    out: list[Scenario] = []
    for spec in REGISTRY.values():
        for mode in spec.modes:
            tag = f"{spec.name}-{mode}"
            out.append(Scenario(f"good-{tag}", spec, mode, _body(spec, GOOD, mode), OK, 4))
            out.append(
                Scenario(
                    f"hallucinated-{tag}", spec, mode, _body(spec, f"{GOOD} {BAD}", mode), OK, 3
                )
            )
            out.append(
                Scenario(
                    f"upstream-500-{tag}",
                    spec,
                    mode,
                    ErrorEnvelope(500, spec.error_protocol, BAD),
                    frozenset({500, 502}),
                )
            )
            if mode == "json":
                out.append(
                    Scenario(f"invalid-json-{tag}", spec, mode, InvalidJson(), frozenset({502}))
                )
                out.append(
                    Scenario(f"stalled-{tag}", spec, mode, Slow(4.0), frozenset({504}), weight=1)
                )
            else:
                frames = spec.frames(f"{GOOD} {BAD}") if spec.frames else []
                out.append(
                    Scenario(f"reset-{tag}", spec, mode, Reset(frames), frozenset({200, 502}))
                )
                out.append(
                    Scenario(
                        f"truncated-{tag}", spec, mode, Truncated(frames), frozenset({200, 502})
                    )
                )
                out.append(
                    Scenario(
                        f"disconnect-{tag}",
                        spec,
                        mode,
                        Stream(frames, seed=1, max_piece=32, delay=0.01),
                        OK,
                        2,
                        disconnect=True,
                    )
                )
    return out


def attack_scenarios() -> list[Scenario]:
    out: list[Scenario] = []
    for spec in REGISTRY.values():
        plants = {**spec.plants, **generic_plants(spec)}
        for name, plant in plants.items():
            for mode in spec.modes:
                b = error_behaviour(plant, mode) if plant.status != 200 else plant.behaviour(mode)
                if b is None:
                    continue
                req = spec.request(QUESTION, mode != "json")
                if plant.request is not None:
                    req = plant.request(req)
                allowed = frozenset({200, 400, 422, 429, 500, 502, 503, plant.status})
                out.append(
                    Scenario(
                        f"attack-{spec.name}-{mode}-{name}",
                        spec,
                        mode,
                        b,
                        allowed,
                        request=req,
                        path=plant.path,
                    )
                )
        for where, build in spec.planted_requests.items():
            for mode in spec.modes:
                out.append(
                    Scenario(
                        f"planted-{spec.name}-{mode}-{where}",
                        spec,
                        mode,
                        _body(spec, PLANTED_ANSWER, mode),
                        OK,
                        request=build(QUESTION, mode != "json"),
                    )
                )
    return out


# -- process figures ------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def upstream_sockets(pid: int, port: int) -> int:
    """The process's TCP sockets connected to `port` (the upstream's): pooled keep-alive
    connections, which stay open until their idle timeout."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    n = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                cols = line.split()
                if cols[9] in inodes and int(cols[2].rsplit(":", 1)[1], 16) == port:
                    n += 1
    return n


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    if len(samples) < 2:
        return float("nan")
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    if var == 0:
        return float("nan")
    return sum((t - mt) * (r - mr) for t, r in samples) / var * 60


# -- traffic --------------------------------------------------------------------------------


@dataclass
class Tally:
    requests: Counter[str] = field(default_factory=Counter)
    leaks: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    client_errors: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)


async def one(gw: GatewayProcess, sc: Scenario, tally: Tally) -> None:
    req = sc.request if sc.request is not None else sc.spec.request(QUESTION, sc.mode != "json")
    headers = [(SCENARIO_HEADER, sc.name), ("content-type", "application/json")]
    if sc.mode == "progressive":
        headers.append(("x-attack-mode", "progressive"))
    path = sc.path
    if path is None and sc.mode != "json" and sc.spec.stream_path is not None:
        path = sc.spec.stream_path  # gemini: the path, not the body, asks for a stream
    payload = build_request(
        "POST",
        path or sc.spec.path,
        host=gw.host,
        headers=headers,
        body=json.dumps(req).encode(),
    )
    tally.requests[sc.name.split("-")[0]] += 1
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*gw.address), 10)
    except (OSError, TimeoutError) as exc:
        tally.client_errors[type(exc).__name__] += 1
        return
    try:
        writer.write(payload)
        await writer.drain()
        if sc.disconnect:
            await asyncio.wait_for(reader.read(random.randint(1, 600)), 10)
            return
        raw = await asyncio.wait_for(reader.read(-1), 30)
    except (OSError, TimeoutError) as exc:
        tally.client_errors[type(exc).__name__] += 1
        return
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    try:
        resp = parse_response(raw)
    except (AssertionError, ValueError, IndexError):
        tally.unexpected[f"{sc.name}: unparseable response"] += 1
        return
    tally.statuses[resp.status] += 1
    found = leaks(resp)
    # DESIGN §7: a 4xx envelope's message is relayed by design, so it is not a leak.
    if found and not (400 <= resp.status < 500 and sc.name.startswith("attack-")):
        tally.leaks[sc.name] += 1
        if len(tally.examples) < 5:
            tally.examples.append(f"{sc.name}: {resp.status_line} {found}")
    if resp.status not in sc.allowed:
        tally.unexpected[f"{sc.name}: {resp.status}"] += 1


async def drive(
    gw: GatewayProcess,
    scenarios: list[Scenario],
    seconds: float,
    concurrency: int,
    tally: Tally,
    samples: list[tuple[float, float]],
) -> None:
    weights = [s.weight for s in scenarios]
    deadline = time.monotonic() + seconds
    start = time.monotonic()
    assert gw.proc is not None

    async def worker(seed: int) -> None:
        rng = random.Random(seed)
        while time.monotonic() < deadline:
            await one(gw, rng.choices(scenarios, weights)[0], tally)

    async def sampler() -> None:
        assert gw.proc is not None
        while time.monotonic() < deadline:
            samples.append((time.monotonic() - start, rss_mb(gw.proc.pid)))
            await asyncio.sleep(5)

    await asyncio.gather(sampler(), *(worker(i) for i in range(concurrency)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds excluded from the RSS slope (default: 20%% of the run, <= 120)",
    )
    ap.add_argument(
        "--attacks",
        action="store_true",
        help="add every plant of the adversarial matrix to the mix",
    )
    args = ap.parse_args(argv)
    seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(120.0, seconds * 0.2)

    scenarios = core_scenarios() + (attack_scenarios() if args.attacks else [])
    upstream: FakeUpstream = create_upstream({s.name: s.behaviour for s in scenarios})
    log_dir = Path(tempfile.mkdtemp(prefix="citewarden-soak-"))
    with serve(upstream) as url:
        gw = GatewayProcess(
            url,
            [POLICIES / "progressive.yaml", POLICIES / "base.yaml"],
            log_dir / "gateway.log",
            extra_args=["--read-timeout", "2", "--total-timeout", "20"],
        )
        gw.start()
        try:
            assert gw.proc is not None
            pid = gw.proc.pid
            time.sleep(1.0)
            rss0, fds0 = rss_mb(pid), open_fds(pid)
            tally, samples = Tally(), []
            t0 = time.monotonic()
            asyncio.run(drive(gw, scenarios, seconds, args.concurrency, tally, samples))
            elapsed = time.monotonic() - t0
            upstream.requests.clear()  # the recording is the upstream's, not the gateway's
            time.sleep(3.0)  # let lingering streams and keep-alive connections close
            rss1, fds1 = rss_mb(pid), open_fds(pid)
            pooled = upstream_sockets(pid, int(url.rsplit(":", 1)[1].split("/")[0]))
            log = gw.log()
        finally:
            gw.stop()
    tracebacks = log.count("Traceback") + log.count("Exception in ASGI")
    steady = [(t, r) for t, r in samples if t >= warmup]
    total = sum(tally.requests.values())
    unhandled = sum(tally.unexpected.values()) + tracebacks
    print(
        f"soak: {elapsed / 60:.1f} min, {args.concurrency} concurrent, "
        f"{len(scenarios)} scenarios{' (with attacks)' if args.attacks else ''}"
    )
    print(f"requests: {total} ({total / elapsed:.0f}/s)  by kind: {dict(tally.requests)}")
    print(f"statuses: {dict(sorted(tally.statuses.items()))}")
    print(f"leaks: {sum(tally.leaks.values())}  {dict(tally.leaks.most_common(8))}")
    for ex in tally.examples:
        print(f"  e.g. {ex}")
    print(
        f"unhandled errors: {unhandled} (unexpected statuses "
        f"{sum(tally.unexpected.values())}, tracebacks in the gateway log {tracebacks})"
    )
    if tally.unexpected:
        print(f"  {dict(tally.unexpected.most_common(8))}")
    if tally.client_errors:
        print(f"client-side errors (not counted): {dict(tally.client_errors)}")
    print(
        f"rss MB: start {rss0:.1f}, end {rss1:.1f}; slope after {warmup:.0f} s warm-up: "
        f"{slope_mb_per_min(steady):.3f} MB/min over {len(steady)} samples"
    )
    print(
        f"open fds: start {fds0}, end {fds1} "
        f"({pooled} of them keep-alive connections to the upstream, 3 s after the traffic)"
    )
    print(f"gateway log: {log_dir / 'gateway.log'}")
    return 1 if tally.leaks or unhandled else 0


if __name__ == "__main__":
    sys.exit(main())

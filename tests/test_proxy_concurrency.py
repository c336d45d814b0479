"""64 simultaneous streams through one gateway, each with its own answer: every client gets
exactly its own answer, its frames in order, in buffer and in progressive mode.

The upstream holds every request until all 64 have arrived, so the test cannot pass unless the
gateway really carries them at once; it then streams each answer cut at random byte boundaries
with small random delays. Requests alternate between openai-chat and anthropic-messages.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway_harness import run_gateway, write_policy
from tests.upstream_app import (
    FakeUpstream,
    Stream,
    anthropic_sse,
    openai_sse,
    serve,
    sse_events,
)

N = 64
ARRIVAL_TIMEOUT = 10.0

CITIES = ["Oslo", "Lyon", "Porto", "Graz", "Turku", "Cork", "Ghent", "Split", "Bergen", "Basel"]
COLOURS = ["amber", "teal", "crimson", "olive", "violet", "ochre", "slate", "ivory"]


@dataclass(frozen=True)
class Order:
    """One client's request and the answer only it may receive."""

    index: int
    protocol: str
    text: str  # the answer, one claim per fact, each citing its own chunk
    chunks: tuple[tuple[str, str], ...]  # (id, text)
    frames: tuple[bytes, ...]
    stream: Stream

    @property
    def key(self) -> str:
        return f"K{self.index:02d}"

    @property
    def message_id(self) -> str:
        prefix = "chatcmpl" if self.protocol == "openai-chat" else "msg"
        return f"{prefix}-{self.key}"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.protocol == "openai-chat" else "/v1/messages"

    def request(self) -> dict[str, Any]:
        system = "".join(f'<chunk id="{cid}">{text}</chunk>' for cid, text in self.chunks)
        question = f"Where is parcel {self.key}?"
        if self.protocol == "openai-chat":
            return {
                "model": "m",
                "stream": True,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
            }
        return {
            "model": "claude-m",
            "max_tokens": 256,
            "stream": True,
            "system": system,
            "messages": [{"role": "user", "content": question}],
        }


def make_order(index: int, rng: random.Random) -> Order:
    key = f"K{index:02d}"
    facts = [
        f"Parcel {key} left depot {rng.randint(2, 99)}",
        f"It weighs {rng.randint(1, 9)}.{rng.randint(10, 99)} kg and is {rng.choice(COLOURS)}",
        f"Delivery to {rng.choice(CITIES)} takes {rng.randint(2, 9)} days",
    ]
    chunks = tuple((f"k{index:02d}:{j}", f"{fact}.") for j, fact in enumerate(facts, 1))
    claims = [f"{fact} [{cid}]." for fact, (cid, _) in zip(facts, chunks, strict=True)]
    # Claims on one line and on separate paragraphs: progressive mode releases at line ends.
    text = claims[0]
    for claim in claims[1:]:
        text += rng.choice([" ", "\n\n", "\n"]) + claim
    protocol = "openai-chat" if index % 2 == 0 else "anthropic-messages"
    size = rng.randint(2, 12)
    if protocol == "openai-chat":
        frames = openai_sse(text, chunk_size=size, id=f"chatcmpl-{key}", model=f"model-{key}")
    else:
        frames = anthropic_sse(text, chunk_size=size, id=f"msg-{key}", model=f"model-{key}")
    stream = Stream(
        frames, seed=index, max_piece=rng.choice([7, 31, 97, 256]), delay=rng.choice([0.0, 0.001])
    )
    return Order(index, protocol, text, chunks, tuple(frames), stream)


@dataclass
class Rendezvous:
    """Answers nobody until all `n` requests have reached the upstream."""

    n: int
    arrived: int = 0
    everyone: asyncio.Event | None = None  # created in the upstream's event loop

    async def wait(self) -> None:
        if self.everyone is None:
            self.everyone = asyncio.Event()
        self.arrived += 1
        if self.arrived == self.n:
            self.everyone.set()
        await asyncio.wait_for(self.everyone.wait(), ARRIVAL_TIMEOUT)


@dataclass(frozen=True)
class Gated:
    """`inner`, once every request has arrived."""

    inner: Stream
    rendezvous: Rendezvous = field(compare=False)

    async def respond(self, scope: Any, receive: Any, send: Any) -> None:
        await self.rendezvous.wait()
        await self.inner.respond(scope, receive, send)


# --------------------------------------------------------------------------------------------
# Reading a stream back (tests.upstream_app.sse_events: independent of the gateway's SSE code)
# --------------------------------------------------------------------------------------------


def openai_text(order: Order, raw: bytes) -> str:
    """The answer of an OpenAI stream, checking the frames' order and identity on the way."""
    events = sse_events(raw)
    assert events and events[-1][1] == "[DONE]", raw[-200:]
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert all(c["id"] == order.message_id for c in chunks), order.key
    assert all(c["model"] == f"model-{order.key}" for c in chunks), order.key
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    text: list[str] = []
    finished = False
    for c in chunks:
        for choice in c["choices"]:
            assert choice["index"] == 0
            content = choice["delta"].get("content")
            if content:
                assert not finished, "content after finish_reason"
                text.append(content)
            if choice.get("finish_reason") is not None:
                assert choice["finish_reason"] == "stop"
                assert not finished, "two finish_reason frames"
                finished = True
    assert finished
    return "".join(text)


def anthropic_text(order: Order, raw: bytes) -> str:
    """The answer of an Anthropic stream, checking the event order on the way."""
    events = [(name, json.loads(data)) for name, data in sse_events(raw)]
    for name, data in events:
        assert name == data["type"]
    events = [(n, d) for n, d in events if n != "ping"]
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    assert names.count("message_start") == names.count("message_stop") == 1
    assert events[0][1]["message"]["id"] == order.message_id
    assert events[0][1]["message"]["model"] == f"model-{order.key}"
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    open_blocks: set[int] = set()
    seen_blocks: set[int] = set()
    text: list[str] = []
    for name, data in events[1:-2]:
        index = data.get("index")
        if name == "content_block_start":
            assert index not in seen_blocks
            open_blocks.add(index)
            seen_blocks.add(index)
        elif name == "content_block_stop":
            open_blocks.remove(index)
        elif name == "content_block_delta":
            assert index in open_blocks, "delta outside its block"
            if data["delta"]["type"] == "text_delta":
                text.append(data["delta"]["text"])
        else:
            raise AssertionError(f"unexpected event {name} inside the message")
    assert not open_blocks
    return "".join(text)


# --------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------


async def fetch(client: httpx.AsyncClient, base: str, order: Order) -> tuple[int, str, bytes]:
    async with client.stream("POST", base + order.path, json=order.request()) as r:
        raw = b"".join([piece async for piece in r.aiter_bytes()])
        return r.status_code, r.headers.get("x-citewarden-decision", ""), raw


@pytest.mark.parametrize("mode", ["buffer", "progressive"])
async def test_64_simultaneous_streams_each_get_their_own_answer(tmp_path: Path, mode: str) -> None:
    rng = random.Random(f"concurrency-{mode}")
    orders = [make_order(i, rng) for i in range(N)]
    assert len({o.text for o in orders}) == N
    rendezvous = Rendezvous(N)
    upstream = FakeUpstream({o.key: Gated(o.stream, rendezvous) for o in orders})  # type: ignore[misc]
    policy = write_policy(tmp_path, streaming=mode)
    with (
        serve(upstream) as up,
        run_gateway(up, [policy], read_timeout=15.0, total_timeout=30.0) as gw,
    ):
        limits = httpx.Limits(max_connections=N, max_keepalive_connections=N)
        async with httpx.AsyncClient(timeout=30.0, limits=limits) as client:
            results = await asyncio.gather(*(fetch(client, gw.url, o) for o in orders))
    assert rendezvous.arrived == N
    assert sorted(r.path for r in upstream.requests) == sorted(o.path for o in orders)
    for order, (status, decision, raw) in zip(orders, results, strict=True):
        assert status == 200, (order.key, raw[:300])
        assert decision == ("progressive" if mode == "progressive" else "released"), order.key
        if mode == "buffer":
            # Released unchanged: the upstream's own stream, byte for byte.
            assert raw == b"".join(order.frames), order.key
        read = openai_text if order.protocol == "openai-chat" else anthropic_text
        assert read(order, raw) == order.text, order.key

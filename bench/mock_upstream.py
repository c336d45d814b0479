"""A mock OpenAI-style upstream for the benchmarks: fixed latency, a ~1 KB cited answer.

The answer cites chunks that `REQUEST_BODY` carries as `<chunk id="doc:N">` tags, so every
deterministic check passes; `stream: true` returns the same answer as paced SSE frames.

    python bench/mock_upstream.py --port 9000 --latency-ms 20 --token-interval-ms 2 [--jitter 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time

from aiohttp import web

CHUNKS = {
    "doc:1": (
        "Orbit DB stores every table in columnar segments of 64 MB. Segments are compacted "
        "every 15 minutes by a background worker. Segments that stay cold for 30 days move "
        "to object storage."
    ),
    "doc:2": (
        "Replication keeps 3 replicas per shard. A write is acknowledged once 2 replicas "
        "have persisted it to disk."
    ),
    "doc:3": (
        "The query planner caches compiled plans for 10 minutes. Cache hit rates above 90% "
        "are typical for dashboard workloads."
    ),
}

ANSWER_TEXT = (
    "Orbit DB stores every table in columnar segments of 64 MB [doc:1]. "
    "Segments are compacted every 15 minutes by a background worker [doc:1]. "
    "Segments that stay cold for 30 days move to object storage [doc:1]. "
    "Replication keeps 3 replicas per shard [doc:2]. "
    "A write is acknowledged once 2 replicas have persisted it to disk [doc:2]. "
    'The planner "caches compiled plans for 10 minutes" [doc:3]. '
    "Cache hit rates above 90% are typical for dashboard workloads [doc:3]."
)

# The first claim ends with its citation; the client can only know it is complete once the
# next sentence starts, so the mock records when that next token was sent.
FIRST_CLAIM_END = ANSWER_TEXT.index("[doc:1].") + len("[doc:1].")

_CONTEXT = "\n".join(f'<chunk id="{cid}">{text}</chunk>' for cid, text in CHUNKS.items())

REQUEST = {
    "model": "bench-model",
    "messages": [
        {"role": "system", "content": "Answer only from the sources and cite them.\n" + _CONTEXT},
        {"role": "user", "content": "How does Orbit DB store and replicate data?"},
    ],
}
REQUEST_BODY = json.dumps(REQUEST).encode()
STREAM_REQUEST_BODY = json.dumps({**REQUEST, "stream": True}).encode()

CREATED = 1_700_000_000
ANSWER = {
    "id": "chatcmpl-bench0000000000000000000001",
    "object": "chat.completion",
    "created": CREATED,
    "model": "bench-model",
    "system_fingerprint": "fp_bench",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": ANSWER_TEXT, "refusal": None},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 210, "completion_tokens": 96, "total_tokens": 306},
}
ANSWER_BODY = json.dumps(ANSWER, indent=2).encode()

TOKENS = re.findall(r"\S+\s*", ANSWER_TEXT)


def _frame(delta: dict[str, object], finish: str | None = None) -> bytes:
    chunk = {
        "id": ANSWER["id"],
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": "bench-model",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


STREAM_FRAMES = (
    [_frame({"role": "assistant", "content": ""})]
    + [_frame({"content": tok}) for tok in TOKENS]
    + [_frame({}, "stop"), b"data: [DONE]\n\n"]
)
# Index (into STREAM_FRAMES) of the frame whose token starts the second sentence: only then
# can anyone know the first claim is complete (citations may still follow its period).
_pos = 0
FIRST_CLAIM_FRAME = len(STREAM_FRAMES) - 2
for _i, _tok in enumerate(TOKENS):
    if _pos >= FIRST_CLAIM_END and _tok.strip():
        FIRST_CLAIM_FRAME = _i + 1
        break
    _pos += len(_tok)


class Mock:
    def __init__(self, latency_s: float, token_interval_s: float, jitter: float = 0.0) -> None:
        self.latency_s = latency_s
        # Each answer waits latency x uniform(1 - jitter, 1 + jitter): the same mean, but
        # requests no longer return in lock-step waves as they do from a fixed delay.
        self.jitter = jitter
        self._rng = random.Random(5)
        self.token_interval_s = token_interval_s
        # request id -> (first-claim-complete time, last byte time), CLOCK_MONOTONIC
        self.stream_times: dict[str, tuple[float, float]] = {}

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        wait = self.latency_s
        if self.jitter:
            wait *= self._rng.uniform(1 - self.jitter, 1 + self.jitter)
        await asyncio.sleep(wait)
        if b'"stream": true' not in body and b'"stream":true' not in body:
            return web.Response(body=ANSWER_BODY, content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        first_claim_at = 0.0
        last = 0.0
        for i, frame in enumerate(STREAM_FRAMES):
            if i == FIRST_CLAIM_FRAME:
                first_claim_at = time.monotonic()
            await resp.write(frame)
            last = time.monotonic()  # the upstream's last byte is its last frame's
            if self.token_interval_s and i < len(STREAM_FRAMES) - 1:
                await asyncio.sleep(self.token_interval_s)
        rid = request.headers.get("x-request-id")
        if rid:
            self.stream_times[rid] = (first_claim_at, last)
        await resp.write_eof()
        return resp

    async def times(self, request: web.Request) -> web.Response:
        data = {k: list(v) for k, v in self.stream_times.items()}
        self.stream_times.clear()
        return web.json_response(data)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")


def build_app(latency_s: float, token_interval_s: float, jitter: float = 0.0) -> web.Application:
    mock = Mock(latency_s, token_interval_s, jitter)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", mock.chat)
    app.router.add_get("/_bench/stream-times", mock.times)
    app.router.add_get("/healthz", mock.health)
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    ap.add_argument("--jitter", type=float, default=0.0,
                    help="latency x uniform(1 - J, 1 + J) per answer (0: fixed)")
    ap.add_argument("--token-interval-ms", type=float, default=2.0)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    app = build_app(args.latency_ms / 1000, args.token_interval_ms / 1000, args.jitter)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None,
                backlog=1024)


if __name__ == "__main__":
    main()

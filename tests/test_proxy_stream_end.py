"""The end of a buffered stream: released at its terminal event, nothing after it relayed."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import httpx
from starlette.types import Receive, Scope, Send

from tests.gateway_harness import run_gateway, write_policy
from tests.upstream_app import Stream, create_upstream, openai_sse, serve, sse_frame

CONTEXT = '<chunk id="kb:1">The Orbit pump moves 40 litres per minute.</chunk>'
GOOD = "The Orbit pump moves 40 litres per minute [kb:1]."
JUNK = "The pump was designed on Mars [kb:404]."


def _request(key: str) -> dict[str, object]:
    return {
        "model": "m",
        "stream": True,
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}],
    }


@dataclass(frozen=True)
class Lingering:
    """Sends a whole stream, then keeps the connection open before closing it."""

    frames: list[bytes]
    linger: float

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"".join(self.frames), "more_body": True})
        await asyncio.sleep(self.linger)
        await send({"type": "http.response.body", "body": b""})


def test_release_at_the_terminal_event_and_never_relay_what_follows(tmp_path: Path) -> None:
    frames = openai_sse(GOOD, chunk_size=6)
    trailing = sse_frame({"choices": [{"index": 0, "delta": {"content": JUNK}}]})
    up = create_upstream(
        {
            "lingering": Lingering(frames, linger=60.0),
            "trailing": Stream([*frames, trailing], seed=4),
            "trailing-same-read": Lingering([*frames, trailing], linger=0.0),
            "clean": Stream(frames, seed=4),
        }
    )
    with serve(up) as url, run_gateway(url, [write_policy(tmp_path)]) as gw:
        clean = httpx.post(gw.url + "/v1/chat/completions", json=_request("clean"), timeout=10)
        assert clean.headers["x-citewarden-decision"] == "released"
        assert clean.content == b"".join(frames)  # byte-identical

        # The upstream keeps the connection open for a minute after [DONE]: a gateway that
        # waited for it to close would run into the client's timeout.
        r = httpx.post(gw.url + "/v1/chat/completions", json=_request("lingering"), timeout=10)
        assert r.content == b"".join(frames)

        for key in ("trailing", "trailing-same-read"):
            r = httpx.post(gw.url + "/v1/chat/completions", json=_request(key), timeout=10)
            assert r.status_code == 200
            assert r.headers["x-citewarden-decision"] == "released"
            assert "Mars" not in r.text  # bytes after [DONE] were never verified: not relayed
            assert r.text.rstrip().endswith("data: [DONE]")


def test_a_progressive_stream_ends_at_the_terminal_event(tmp_path: Path) -> None:
    """Progressive mode too: an upstream that keeps its connection open after [DONE] must not
    hold back the last claim (which is decided when the answer is whole) until a timeout."""
    frames = openai_sse(GOOD, chunk_size=6)
    up = create_upstream({"lingering": Lingering(frames, linger=60.0)})
    policy = write_policy(tmp_path, streaming="progressive")
    with serve(up) as url, run_gateway(url, [policy]) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=_request("lingering"), timeout=10)
        assert r.status_code == 200
        assert r.headers["x-citewarden-decision"] == "progressive"
        assert "error" not in r.text
        assert r.text.rstrip().endswith("data: [DONE]")
        text = "".join(
            c["delta"].get("content") or ""
            for line in r.text.splitlines() if line.startswith("data: {")
            for c in json.loads(line[6:]).get("choices", [])
        )
        assert text == GOOD

"""A scripted judge on loopback for the judge-pass tests: an OpenAI-compatible
`/v1/chat/completions` and a TEI `/predict`, whose behaviour per call is scripted.

The chat judge reads the claims the gateway sent (`<claim id="…" …>text</claim>`) and labels
each by `label_for(claim text)`; a script step can instead be slow, fail, rate-limit, or answer
out of shape. The `dup_*` steps answer with a JSON key written twice, its last value YES (or
a score above the threshold): a reader that keeps the last value passes what the first refused.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.upstream_app import serve

CLAIM = re.compile(r'<claim id="([^"]*)" cites="([^"]*)">(.*?)</claim>', re.S)

Step = str  # ok | slow | 500 | 429 | malformed | wrong_count | duplicate | extra | echo | schema400
#             | dup_label | dup_verdicts | dup_id | dup_key (a JSON key written twice, below)


def default_label(claim: str) -> str:
    """YES, unless the claim holds "unsupported" (NO) or "partly" (PARTIAL)."""
    if "unsupported" in claim.lower():
        return "NO"
    if "partly" in claim.lower():
        return "PARTIAL"
    return "YES"


@dataclass
class JudgeScript:
    steps: deque[Step] = field(default_factory=deque)  # consumed one per call; then `then`
    then: Step = "ok"
    delay: float = 0.0  # every call's latency
    slow: float = 1.0  # a `slow` step's latency
    slow_text: str = ""  # when set, a call whose user message holds it takes `slow` too
    retry_after: str = "0"
    label_for: Callable[[str], str] = default_label
    calls: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_step(self) -> Step:
        with self.lock:
            return self.steps.popleft() if self.steps else self.then

    def claims_of(self, body: dict[str, Any]) -> list[tuple[str, str, str]]:
        user = body["messages"][-1]["content"]
        return [(i, c, html.unescape(t)) for i, c, t in CLAIM.findall(user)]


def _chat(content: str) -> dict[str, Any]:
    return {
        "id": "judge-1",
        "object": "chat.completion",
        "model": "judge",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content},
             "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57},
    }


def make_app(script: JudgeScript) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        body = json.loads(raw) if raw else {}
        step = script.next_step()
        with script.lock:
            script.calls.append({"path": scope["path"], "body": body, "step": step,
                                 "headers": dict(scope["headers"])})
            script.in_flight += 1
            script.max_in_flight = max(script.max_in_flight, script.in_flight)
        try:
            slow = step == "slow" or (
                script.slow_text != "" and script.slow_text in str(body.get("messages"))
            )
            await asyncio.sleep(script.slow if slow else script.delay)
            status, headers, payload = _respond(script, step, scope["path"], body)
        finally:
            with script.lock:
                script.in_flight -= 1
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), *headers]})
        await send({"type": "http.response.body", "body": payload})

    return app


def _respond(
    script: JudgeScript, step: Step, path: str, body: dict[str, Any]
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    if step == "500":
        return 500, [], b'{"error": "boom"}'
    if step == "429":
        return 429, [(b"retry-after", script.retry_after.encode())], b'{"error": "slow down"}'
    if step == "schema400" and "response_format" in body and (
        body["response_format"].get("type") == "json_schema"
    ):
        return 400, [], b'{"error": {"message": "response_format json_schema is not supported"}}'
    if path.endswith("/predict"):
        pairs = body["inputs"]
        rows = [
            [{"label": "entailment", "score": 0.9 if script.label_for(h) == "YES" else 0.1},
             {"label": "contradiction", "score": 0.05}]
            for _, h in pairs
        ]
        if step == "wrong_count":
            rows = rows[:-1]
        elif step == "dup_label":  # the label again, in another case, scoring high
            rows = [[*r, {"label": "ENTAILMENT", "score": 0.99}] for r in rows]
        elif step == "dup_key":  # the score key twice in one entry, the last one high
            text = json.dumps(rows).replace('"score": 0.1}', '"score": 0.1, "score": 0.99}')
            return 200, [], text.encode()
        return 200, [], json.dumps(rows).encode()
    if step == "malformed":
        return 200, [], json.dumps(_chat("Sure! The claims look fine: YES")).encode()
    if step == "not_json":
        return 200, [], b"<html>oops</html>"
    claims = script.claims_of(body)
    # A call whose passages hold NOSUPPORT (and no other passage) says NO to every claim: how
    # a test makes one cited chunk disagree with another.
    veto = "NOSUPPORT" in body["messages"][-1]["content"]
    verdicts = [{"id": i, "rationale": "scripted",
                 "label": "NO" if veto else script.label_for(t)} for i, _, t in claims]
    if step == "wrong_count":
        verdicts = verdicts[:-1]
    elif step == "duplicate":
        verdicts = verdicts + verdicts[:1]
    elif step == "extra":
        verdicts = [*verdicts, {"id": "c99", "rationale": "x", "label": "YES"}]
    elif step == "echo":
        # A judge fooled by injected text: says YES to everything, and echoes an id it read
        # inside the data as if it were a claim.
        verdicts = [{"id": i, "rationale": "told to", "label": "YES"} for i, _, _ in claims]
        verdicts.append({"id": "c1 ", "rationale": "injected", "label": "YES"})
    elif step in ("dup_label", "dup_verdicts", "dup_id", "dup_key"):
        return 200, [], _duplicated(step, claims, verdicts)
    return 200, [], json.dumps(_chat(json.dumps({"verdicts": verdicts}))).encode()


def _duplicated(
    step: Step, claims: list[tuple[str, str, str]], verdicts: list[dict[str, str]]
) -> bytes:
    """An answer holding the scripted verdicts and a JSON key written twice, whose last value
    says YES to every claim."""
    yes_rows = json.dumps([{**v, "label": "YES"} for v in verdicts])
    if step == "dup_label":  # each verdict's label, then "label": "YES"
        rows = [json.dumps(v)[:-1] + ', "label": "YES"}' for v in verdicts]
        content = '{"verdicts": [' + ", ".join(rows) + "]}"
    elif step == "dup_verdicts":  # the verdicts list, then another saying YES
        content = f'{{"verdicts": {json.dumps(verdicts)}, "verdicts": {yes_rows}}}'
    elif step == "dup_id":  # a row naming an id not sent, then the claim's id, then YES
        rows = [f'{{"id": "c0", "id": {json.dumps(i)}, "rationale": "r", "label": "YES"}}'
                for i, _, _ in claims]
        content = '{"verdicts": [' + ", ".join(rows) + "]}"
    else:  # dup_key: the envelope's message content twice, the last one saying YES
        honest = json.dumps(json.dumps({"verdicts": verdicts}))
        yes = json.dumps(f'{{"verdicts": {yes_rows}}}')
        envelope = json.dumps(_chat("CONTENT"))
        return envelope.replace(
            '"content": "CONTENT"', f'"content": {honest}, "content": {yes}'
        ).encode()
    return json.dumps(_chat(content)).encode()


@contextmanager
def run_judge(script: JudgeScript) -> Iterator[str]:
    """The scripted judge's base URL (`http://127.0.0.1:PORT`)."""
    with serve(make_app(script)) as url:
        yield url

"""The embedded demo upstream: a pure ASGI app that answers OpenAI chat, Anthropic Messages and
rag-json requests with the canned answers in `answers.py`, as JSON or as an SSE stream.

Every answer carries the chunks the demo "retrieved" in the `x-citewarden-context` header (and,
for rag-json, in `sources`), so a client that sends a bare question is verifiable too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import responses_wire, wire
from .answers import ANSWERS, CannedAnswer, choose
from .documents import (
    CONTEXT_HEADER,
    DOCUMENTS,
    chunk_json,
    demo_context_system_prompt,
    encode_context_header,
)

DEMO_MODEL = "citewarden-demo"
MAX_CHOICES = 8
_MODEL_CREATED = 1_735_689_600  # 2025-01-01T00:00:00Z


class _BadRequest(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _text_of(content: object) -> str:
    """The text of a message `content`: a string, or the text parts/blocks of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _BadRequest("'messages' must be a list of message objects")
    return messages


def _last_user_text(messages: Sequence[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return _text_of(message.get("content"))
    raise _BadRequest("the request has no user message")


def _prompt_tokens(body: dict[str, Any]) -> int:
    texts = [_text_of(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict)]
    texts.append(_text_of(body.get("system")))
    return wire.estimate_tokens("\n".join(texts)) + 3 * len(texts)


def _request_id(prefix: str, raw: bytes) -> str:
    # Same request bytes, same id: the demo is deterministic end to end.
    return prefix + hashlib.sha256(raw).hexdigest()[:24]


def _input_user_text(value: object) -> str:
    """The last user text of a Responses `input`: a string, or a list of input items."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        for item in reversed(value):
            if isinstance(item, dict) and item.get("role") == "user":
                content = item.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, list):
                    return "\n".join(
                        str(p.get("text", "")) for p in content if isinstance(p, dict)
                    )
    raise _BadRequest("'input' has no user message")


STORED_RESPONSES = 64  # the demo keeps the last few responses for GET /v1/responses/{id}


def _context_headers(answer: CannedAnswer) -> dict[str, str]:
    return {CONTEXT_HEADER: encode_context_header(answer.retrieved)}


class DemoUpstream:
    """Request handlers; `token_delay` paces SSE pieces so progressive streaming is visible."""

    def __init__(self, token_delay: float, clock: Callable[[], float]) -> None:
        self.token_delay = token_delay
        self.clock = clock
        self.stored: dict[str, tuple[dict[str, Any], dict[str, str]]] = {}

    async def _body(self, request: Request) -> tuple[bytes, dict[str, Any]]:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _BadRequest(f"request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _BadRequest("request body must be a JSON object")
        return raw, body

    async def _paced(self, frames: Sequence[bytes]) -> AsyncIterator[bytes]:
        for frame in frames:
            yield frame
            if self.token_delay > 0:
                await asyncio.sleep(self.token_delay)

    def _stream(self, frames: Sequence[bytes], headers: dict[str, str]) -> StreamingResponse:
        return StreamingResponse(
            self._paced(frames),
            media_type="text/event-stream; charset=utf-8",
            headers={"cache-control": "no-cache", **headers},
        )

    async def chat_completions(self, request: Request) -> Response:
        try:
            raw, body = await self._body(request)
            answer = choose(_last_user_text(_messages(body)))
            n = body.get("n")
            n = 1 if n is None else n
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_CHOICES:
                raise _BadRequest(f"'n' must be an integer from 1 to {MAX_CHOICES}")
        except _BadRequest as exc:
            return JSONResponse(wire.openai_error(exc.message), status_code=400)
        pieces = wire.tokenize(answer.text)
        usage = wire.Usage(_prompt_tokens(body), len(pieces) * n)
        common: dict[str, Any] = {
            "id": _request_id("chatcmpl-demo-", raw),
            "model": str(body.get("model") or DEMO_MODEL),
            "created": int(self.clock()),
            "usage": usage,
            "n": n,
        }
        headers = _context_headers(answer)
        if body.get("stream"):
            options = body.get("stream_options") or {}
            include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
            chunks = wire.openai_chunks(pieces, include_usage=include_usage, **common)
            return self._stream(wire.openai_frames(chunks), headers)
        return JSONResponse(wire.openai_completion(answer.text, **common), headers=headers)

    async def messages(self, request: Request) -> Response:
        try:
            raw, body = await self._body(request)
            answer = choose(_last_user_text(_messages(body)))
        except _BadRequest as exc:
            return JSONResponse(wire.anthropic_error(exc.message), status_code=400)
        pieces = wire.tokenize(answer.text)
        usage = wire.Usage(_prompt_tokens(body), len(pieces))
        msg_id = _request_id("msg_demo_", raw)
        model = str(body.get("model") or DEMO_MODEL)
        headers = _context_headers(answer)
        if body.get("stream"):
            events = wire.anthropic_events(pieces, id=msg_id, model=model, usage=usage)
            return self._stream(wire.anthropic_frames(events), headers)
        message = wire.anthropic_message(answer.text, id=msg_id, model=model, usage=usage)
        return JSONResponse(message, headers=headers)

    async def responses(self, request: Request) -> Response:
        """`POST /v1/responses`: the canned answer as a response object or a typed stream;
        stored for `GET /v1/responses/{id}` (with `background: true`, answered as queued)."""
        try:
            raw, body = await self._body(request)
            answer = choose(_input_user_text(body.get("input")))
        except _BadRequest as exc:
            return JSONResponse(responses_wire.response_error(exc.message), status_code=400)
        rid = _request_id("resp_demo_", raw)
        instructions = body.get("instructions")
        prompt = wire.estimate_tokens(json.dumps(body.get("input")) + str(instructions or ""))
        resp = responses_wire.response_body(
            [responses_wire.message_item(answer.text, id="msg_" + rid[10:])],
            id=rid,
            model=str(body.get("model") or DEMO_MODEL),
            instructions=instructions if isinstance(instructions, str) else None,
            usage=(prompt, len(wire.tokenize(answer.text))),
            background=body.get("background") is True,
            extra={"created_at": int(self.clock()), "store": body.get("store") is not False},
        )
        headers = _context_headers(answer)
        self.stored[rid] = (resp, headers)
        while len(self.stored) > STORED_RESPONSES:
            del self.stored[next(iter(self.stored))]
        if body.get("background") is True:
            queued = {**resp, "status": "queued", "output": [], "usage": None}
            return JSONResponse(queued, headers=headers)
        if body.get("stream"):
            return self._stream(responses_wire.response_events(resp, chunk_size=6), headers)
        return JSONResponse(resp, headers=headers)

    async def stored_response(self, request: Request) -> Response:
        found = self.stored.get(request.path_params["response_id"])
        if found is None:
            error = responses_wire.response_error("No response with that id.", "not_found")
            return JSONResponse(error, status_code=404)
        resp, headers = found
        if request.query_params.get("stream") == "true":  # replayed as its event stream
            return self._stream(responses_wire.response_events(resp, chunk_size=6), headers)
        return JSONResponse(resp, headers=headers)

    async def rag_answer(self, request: Request) -> Response:
        try:
            _, body = await self._body(request)
            question = body.get("question", body.get("query"))
            if question is None and "messages" in body:
                question = _last_user_text(_messages(body))
            if not isinstance(question, str):
                raise _BadRequest("send {'question': '...'}")
        except _BadRequest as exc:
            return JSONResponse({"error": {"message": exc.message}}, status_code=400)
        answer = choose(question)
        return JSONResponse(
            {
                "status": "ok",
                "trace_id": hashlib.sha256(question.encode()).hexdigest()[:16],
                "answer": answer.text,
                "sources": [chunk_json(c) for c in answer.retrieved],
                "model": DEMO_MODEL,
                "retrieval": {"index": "k7-handbook", "hits": len(answer.retrieved)},
            },
            headers=_context_headers(answer),
        )

    async def models(self, request: Request) -> Response:
        if "anthropic-version" in request.headers:
            info = {
                "type": "model",
                "id": DEMO_MODEL,
                "display_name": "citewarden demo",
                "created_at": "2025-01-01T00:00:00Z",
            }
            return JSONResponse(
                {"data": [info], "has_more": False, "first_id": DEMO_MODEL, "last_id": DEMO_MODEL}
            )
        model = {
            "id": DEMO_MODEL,
            "object": "model",
            "created": _MODEL_CREATED,
            "owned_by": "citewarden",
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def documents(self, request: Request) -> Response:
        return JSONResponse(
            {
                "chunks": [chunk_json(c) for c in DOCUMENTS],
                "system_prompt": demo_context_system_prompt(),
                "answers": {kind: a.text for kind, a in ANSWERS.items()},
            }
        )


def create_demo_app(
    *, token_delay: float = 0.0, clock: Callable[[], float] = time.time
) -> Starlette:
    """The demo upstream as a Starlette app.

    Routes: `POST /v1/chat/completions`, `POST /v1/messages`, `POST /v1/responses` and
    `GET /v1/responses/{id}` (the last few responses), `POST /rag/answer`,
    `GET /v1/models` (Anthropic's list shape when the request has `anthropic-version`, else
    OpenAI's), and `GET /demo/documents` (chunks, context system prompt and canned answers).
    """
    demo = DemoUpstream(token_delay, clock)
    return Starlette(
        routes=[
            Route("/v1/chat/completions", demo.chat_completions, methods=["POST"]),
            Route("/v1/messages", demo.messages, methods=["POST"]),
            Route("/v1/responses", demo.responses, methods=["POST"]),
            Route("/v1/responses/{response_id}", demo.stored_response, methods=["GET"]),
            Route("/rag/answer", demo.rag_answer, methods=["POST"]),
            Route("/v1/models", demo.models, methods=["GET"]),
            Route("/demo/documents", demo.documents, methods=["GET"]),
        ]
    )

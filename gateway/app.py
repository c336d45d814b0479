"""The proxy as a raw ASGI app: route, forward, buffer, verify, release.

Per-request state lives in a fresh `_Exchange`, never on the shared app (as starlette's
body-rewriting middlewares do). Nothing reaches the client until the decision is made, except
in progressive streaming where each claim is released only once it has verified.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, cast

import orjson

from gateway import audit, paths, retry
from gateway.deferred import Deferred
from gateway.errors import BodyTooLarge, GatewayError, ProtocolError, map_exception
from gateway.jsonio import dumps
from gateway.judge.client import close_clients as close_judge_clients
from gateway.limits import HANGUP
from gateway.metrics import Metrics
from gateway.pipeline import Judgement, KnownVerdicts, Pipelines, RequestContext, RoutePipeline
from gateway.policy import PolicyStore
from gateway.protocols.base import RequestInfo
from gateway.protocols.fields import loads_unique
from gateway.stream import ProgressiveRelease, StreamVerifier
from gateway.turns import Turns
from gateway.types import Decision, Outcome, Report
from gateway.upstream import (
    Upstream,
    forward_request_headers,
    response_headers,
    verified_response_headers,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"
SSE = b"text/event-stream; charset=utf-8"

# The request path (with its query) in an audit line is cut here: it is the client's to choose.
_LOGGED_PATH_MAX = 256


def _verified_headers(up_headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """The upstream headers a verified route relays, in every decision (an allow-list of
    shape-checked values: gateway/upstream.py `verified_response_headers`)."""
    return [
        (k.encode("latin-1"), v.encode("latin-1")) for k, v in verified_response_headers(up_headers)
    ]


# Audited status of an exchange whose client hung up before its answer (nginx's convention).
_CLIENT_CLOSED = 499
# The methods of the APIs the gateway fronts; others (TRACE, CONNECT, WebDAV) are refused.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class _ClientGone(Exception):
    """The client's body ended short of its content-length: it went away mid-upload."""


def _encoded(raw_headers: list[tuple[bytes, bytes]]) -> bool:
    """A `content-encoding` other than `identity` on any of the request's header lines."""
    return any(
        coding.strip() not in (b"", b"identity")
        for k, v in raw_headers if k.lower() == b"content-encoding"
        for coding in v.lower().split(b",")
    )


def _gateway_error(code: str, message: str) -> bytes:
    return dumps({"error": {"type": code, "message": message, "source": "citewarden"}})


class ProxyApp:
    """The proxy port's ASGI application."""

    def __init__(
        self,
        store: PolicyStore,
        upstream: Upstream,
        metrics: Metrics,
        *,
        max_request_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        # The response size limit lives in the upstream client, which enforces it while reading.
        self.store = store
        self.upstream = upstream
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes
        self.pipelines = Pipelines()
        # Under load, a few answers start verifying per loop iteration; new requests go between.
        self.turns = Turns()
        # Metrics and audit lines, recorded just after the answers they account for are out.
        self.deferred = Deferred()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            exchange = _Exchange(self, scope, receive, send)
            try:
                await exchange.run()
            except Exception as exc:  # the last resort: never a bare 500, never a traceback
                await exchange.fail(exc)
        elif kind == "websocket":
            # Refused before accept: the server answers the upgrade with 403.
            await send({"type": "websocket.close", "code": 1008, "reason": "citewarden: refused"})
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    self.deferred.flush()
                    await self.upstream.aclose()
                    await close_judge_clients()
                    await send({"type": "lifespan.shutdown.complete"})
                    return


def _judge(
    pipeline: RoutePipeline,
    request_ctx: RequestContext,
    body: bytes,
    up_headers: list[tuple[str, str]],
    verifier: StreamVerifier | None,
) -> tuple[Any, Judgement, float]:
    """One whole 2xx upstream answer parsed (unless it was verified as it streamed) and judged:
    the CPU work an answer waits its turn for. (answer, judgement, verification seconds);
    raises ProtocolError / ValueError for an answer that cannot be used."""
    known: KnownVerdicts | None = None
    streamed_text: str | None = None
    if verifier is not None:
        _, answer = verifier.finish()
        ctx, known, streamed_text = verifier.ctx, verifier.known, verifier.text
    else:
        parsed = loads_unique(body)
        if not isinstance(parsed, dict):
            raise ProtocolError("upstream body is not a JSON object")
        answer = pipeline.adapter.parse(parsed, pipeline.route)
        ctx = pipeline.context(request_ctx, parsed, dict(up_headers))
    t0 = time.perf_counter()
    judgement = pipeline.safe_judge(answer, ctx, known, streamed_text)
    verify_seconds = time.perf_counter() - t0 + (verifier.seconds if verifier else 0.0)
    return answer, judgement, verify_seconds


class _Exchange:
    """One client request and everything the gateway learns while serving it."""

    def __init__(self, app: ProxyApp, scope: Scope, receive: Receive, send: Send) -> None:
        self.app = app
        self.scope = scope
        self.receive = receive
        self.send = send
        self.started = time.perf_counter()
        self.raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.headers: dict[str, str] = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.raw_headers
        }
        self.request_id = audit.request_id(self.headers.get("x-request-id"))
        # The path as the client sent it, forwarded byte for byte (DESIGN §7); never the
        # percent-decoded scope["path"]. Checked by `paths.refusal` before anything else.
        self.raw_path: bytes = scope.get("raw_path") or scope["path"].encode("utf-8")
        self.query: bytes = scope.get("query_string", b"")
        self.path: str = self.raw_path.decode("latin-1")
        qs = self.query
        self.path_qs = self.path + ("?" + qs.decode("latin-1") if qs else "")
        self.gone = False  # the client hung up before that
        self.route_label = "unrouted"
        self.policy_label: str | None = None
        self.first_byte: float | None = None
        self.upstream_seconds = 0.0
        self.streaming = False
        self.status = 0
        # What the failure boundary (`fail`) needs to know about the answer so far.
        self.pipeline: RoutePipeline | None = None
        self.content_type = b""
        self.ended = False  # the last body message went out
        self.audited = False  # the exchange's one audit line is written (or on its way)
        self.cause: str | None = None  # the class of the foreign exception behind a failure

    # -- plumbing ----------------------------------------------------------------------------

    def _base_headers(self) -> list[tuple[bytes, bytes]]:
        h = [(b"x-request-id", self.request_id.encode("latin-1"))]
        if self.policy_label is not None:
            h.append((b"x-citewarden-policy", self.policy_label.encode()))
        return h

    async def start(
        self,
        status: int,
        content_type: bytes,
        extra: list[tuple[bytes, bytes]] | None = None,
        decision: str | None = None,
        length: int | None = None,
    ) -> None:
        headers = [(b"content-type", content_type), *self._base_headers()]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        if decision is not None:
            headers.append((b"x-citewarden-decision", decision.encode()))
        if extra:
            headers.extend(extra)
        if status >= 400 and self.pipeline is not None:  # Bedrock's x-amzn-ErrorType
            headers.extend(self.pipeline.adapter.error_headers(status))
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        # Set once the head is taken: a head the server refused leaves `fail` free to answer.
        self.status = status
        self.content_type = content_type

    async def body(self, data: bytes, more: bool = False) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()
        self.ended = not more
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(
        self,
        status: int,
        body: bytes,
        content_type: bytes = JSON,
        extra: list[tuple[bytes, bytes]] | None = None,
        decision: str | None = None,
    ) -> None:
        # The whole body is known: framed by its length, not chunked.
        await self.start(status, content_type, extra, decision, len(body))
        await self.body(body)

    async def read_body(self) -> bytes:
        limit = self.app.max_request_bytes
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                # The client went away mid-upload: what arrived is never forwarded (DESIGN §7).
                raise _ClientGone("the client disconnected before its body was complete")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body over {limit} bytes")
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        if declared is not None and declared.isdigit() and size != int(declared):
            raise _ClientGone(f"the body ended after {size} of {declared} bytes")
        return b"".join(parts)

    async def _watch_hangup(self, hung_up: Callable[[], None]) -> None:
        """Once the body is in, the server's next message is `http.disconnect`: `hung_up`
        then decides (a disconnect after the response completed cancels nothing)."""
        message = await self.receive()
        # Anything else would be a server that does not block here (ASGI says it should):
        # watching stops rather than spin.
        if message["type"] == "http.disconnect":
            hung_up()

    async def _hangup_guarded(self, work: Awaitable[None]) -> None:
        """`work` (the upstream exchange and the response), cancelled if the client hangs up:
        told by the server's protocol (`limits.Hangup`), or else by a watcher task."""
        task = asyncio.current_task()
        assert task is not None
        hangup = self.scope.get("extensions", {}).get(HANGUP)

        def hung_up() -> None:
            # The client went away before the response completed: the exchange is cancelled,
            # and with it the upstream request (its connection is closed, never pooled).
            if not self.ended:
                self.gone = True
                task.cancel()

        if hangup is not None:
            hangup.watch(hung_up)
        else:
            watcher = asyncio.ensure_future(self._watch_hangup(hung_up))
        try:
            await work
        except asyncio.CancelledError:
            if not self.gone:
                raise
            task.uncancel()
            self.status = self.status or _CLIENT_CLOSED
        finally:
            if hangup is not None:
                hangup.unwatch(hung_up)
            else:
                watcher.cancel()

    # -- entry -------------------------------------------------------------------------------

    async def run(self) -> None:
        refused = paths.refusal(self.raw_path, self.query)
        if refused is not None:
            # Before routing: a path that could mean one thing here and another upstream.
            await self.respond(400, _gateway_error("bad_request", f"citewarden: {refused}"))
            self._account_unverified("refused", "bad_path")
            return
        method: str = self.scope["method"]
        policies = self.app.store.current
        segments = paths.segments(self.path)
        if "websocket" in self.headers.get("upgrade", "").lower():
            # Without a WebSocket library installed, uvicorn hands the upgrade over as plain
            # HTTP: refuse it here as the websocket scope is refused, on every path.
            await self._refuse(
                method, segments, 403, "forbidden", "WebSocket upgrades are refused", "websocket"
            )
            return
        if method not in _METHODS:
            # TRACE would echo the request, credentials included; CONNECT asks for a tunnel.
            await self._refuse(
                method, segments, 405, "method_not_allowed", f"{method} is refused", "method"
            )
            return
        matched = policies.match(method, segments, self.headers)
        if matched is None:
            if policies.is_passthrough(segments) and policies.aliases_route(
                method, segments, self.headers
            ):
                # Relayed, it would reach a verified route's handler upstream unverified.
                await self.respond(400, _gateway_error(
                    "bad_request",
                    "citewarden: the path is another spelling of a verified route's path",
                ))
                self._account_unverified("refused", "bad_path")
                return
            if policies.is_passthrough(segments):
                self.route_label = "passthrough"
                try:
                    if not await self._passthrough(method):
                        return
                except _ClientGone:
                    self._client_gone()
                    return
                if self.gone:
                    self._account_unverified("error", "client_disconnected")
                    return
                self._account_unverified("passthrough")
            else:
                await self.respond(
                    404,
                    _gateway_error("not_found", f"citewarden: no route for {method} {self.path}"),
                )
                self._account_unverified("refused", "no_route")
            return
        loaded, route = matched
        self.route_label = route.name
        self.policy_label = loaded.label
        pipeline = self.app.pipelines.get(loaded, route)
        with self.app.metrics.inflight(route.name):
            try:
                await self._verified(pipeline)
            except _ClientGone:
                self._client_gone(pipeline)
                return
            if self.gone:
                self._account(pipeline, "error", None, None, reason="client_disconnected")

    async def _refuse(
        self, method: str, segments: paths.Segments, status: int, kind: str, message: str,
        reason: str,
    ) -> None:
        """A request refused before it is read: in the error envelope of the route its path
        matches (the SDK on that path reads no other), the gateway's JSON error on a path that
        routes nowhere; audited `refused` with `reason`, never forwarded."""
        matched = self.app.store.current.match(method, segments, self.headers)
        message = f"citewarden: {message}"
        if matched is None:
            body = _gateway_error(kind, message)
        else:
            loaded, route = matched
            self.route_label, self.policy_label = route.name, loaded.label
            self.pipeline = self.app.pipelines.get(loaded, route)
            body = dumps(self.pipeline.adapter.error_envelope(status, message, kind))
        await self.respond(status, body)
        self._account_unverified("refused", reason)

    def _client_gone(self, pipeline: RoutePipeline | None = None) -> None:
        """A client that left mid-upload: nothing was forwarded, nothing can be answered."""
        self.status = _CLIENT_CLOSED
        if pipeline is None:
            self._account_unverified("error", "client_disconnected_mid_body")
        else:
            self._account(pipeline, "error", None, None, reason="client_disconnected_mid_body")

    async def _passthrough(self, method: str) -> bool:
        """Relay the request unverified; False when it was refused (answered and audited)."""
        try:
            body = await self.read_body()
        except BodyTooLarge as e:
            await self.respond(413, _gateway_error("request_too_large", f"citewarden: {e}"))
            self._account_unverified("error", "request_too_large")
            return False
        headers = forward_request_headers(self.raw_headers, self.request_id)
        await self._hangup_guarded(self._relay(method, headers, body))
        return True

    async def _relay(self, method: str, headers: list[tuple[str, str]], body: bytes) -> None:
        try:
            async with self.app.upstream.stream(method, self.path_qs, headers, body) as resp:
                relayed = response_headers(resp.headers, decoded=resp.decoded)  # lower-cased
                extra = [
                    (k.encode("latin-1"), v.encode("latin-1"))
                    for k, v in relayed
                    if k not in ("content-type", "x-request-id")
                ]
                ctype = next(
                    (v for k, v in relayed if k == "content-type"), "application/octet-stream"
                )
                await self.start(resp.status, ctype.encode("latin-1"), extra)
                async for chunk in resp.iter_bytes():
                    await self.body(chunk, more=True)
                await self.body(b"")
        except Exception as e:  # answered and audited at the exchange's one boundary
            await self.fail(e)

    # -- verified routes ---------------------------------------------------------------------

    async def _verified(self, pipeline: RoutePipeline) -> None:
        self.pipeline = pipeline
        adapter = pipeline.adapter
        try:
            raw = await self.read_body()
        except BodyTooLarge as e:
            await self._client_error(pipeline, 413, str(e), "request_too_large")
            return
        if _encoded(self.raw_headers):
            # The body is read as it arrived, never decoded: labelled with a coding, it would
            # be verified as plain bytes the upstream is told mean something else.
            await self._client_error(
                pipeline, 415, "a request body with a content-encoding is refused",
                "unsupported_media_type",
            )
            return
        if self.scope["method"] == "GET" and adapter.stored_answers and not raw.strip():
            # A stored answer (GET) has no request body: its request context is empty, and
            # its query says whether it is streamed.
            request: Any = {}
            try:
                info = adapter.stored_request_info(self.query.decode("latin-1"))
            except ProtocolError as e:
                await self._client_error(pipeline, 400, str(e), "invalid_request_error")
                return
        else:
            try:
                # A repeated key is refused: the upstream may read the other value than the
                # gateway does (`"role": "user", "role": "system"` would pass user text as
                # trusted).
                request = loads_unique(raw)
            except ProtocolError as e:
                await self._client_error(
                    pipeline, 400, f"invalid JSON body: {e}", "invalid_request_error"
                )
                return
            if not isinstance(request, dict):
                await self._client_error(
                    pipeline, 400, "request body must be a JSON object", "invalid_request_error"
                )
                return
            info = adapter.request_info(request)
        if (path_stream := adapter.streams_by_path(self.path)) is not None:
            info = dataclasses.replace(info, stream=path_stream)  # Bedrock's converse-stream
        self.streaming = info.stream
        raw = self._forwarded(pipeline, raw)
        headers = forward_request_headers(self.raw_headers, self.request_id)
        await self._hangup_guarded(self._answer(pipeline, request, raw, headers, info))

    async def _answer(
        self,
        pipeline: RoutePipeline,
        request: dict[str, Any],
        raw: bytes,
        headers: list[tuple[str, str]],
        info: RequestInfo,
    ) -> None:
        try:
            if (
                info.stream
                and pipeline.policy.streaming.mode == "progressive"
                and pipeline.policy.mode == "enforce"
            ):
                await self._progressive(pipeline, request, raw, headers, info.include_usage)
            else:
                await self._buffered(
                    pipeline, request, raw, headers, info.stream, info.include_usage
                )
        except Exception as e:
            await self._upstream_failure(pipeline, e)

    def _forwarded(self, pipeline: RoutePipeline, raw: bytes) -> bytes:
        """The body to forward: as received, unless the adapter rewrites requests (Responses
        asks for the file_search results its route's context comes from)."""
        return pipeline.adapter.forward_body(raw, self.path_qs, pipeline.policy)

    async def _error(
        self,
        pipeline: RoutePipeline,
        status: int,
        reason: str,
        message: str | None = None,
        *,
        body: bytes | None = None,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """An answer that is no verified answer (bad request, upstream failure): the protocol's
        error envelope (or the upstream's own `body`), decision `error`, audited with `reason`."""
        if body is None:
            envelope = pipeline.adapter.error_envelope(status, f"citewarden: {message}", reason)
            body = dumps(envelope)
        await self.respond(status, body, extra=extra, decision="error")
        self._account(pipeline, "error", None, None, reason=reason)

    async def _client_error(
        self, pipeline: RoutePipeline, status: int, message: str, kind: str
    ) -> None:
        await self._error(pipeline, status, kind, message)

    async def _upstream_failure(self, pipeline: RoutePipeline, e: Exception) -> None:
        await self.fail(e)

    def _mapped(self, exc: Exception) -> GatewayError:
        """`exc` as a gateway error; the class of a foreign one is kept for the audit line (its
        name only: its text may quote upstream bytes)."""
        err = map_exception(exc)
        if err is not exc:
            self.cause = type(exc).__name__
        return err

    async def fail(self, exc: Exception) -> None:
        """The exchange's one failure boundary: `exc`, mapped to a gateway error
        (gateway/errors.py), answered with the protocol's error envelope (the gateway's JSON
        error off verified routes) at the error's 502 / 504 — or, when the answer has begun,
        ended with the protocol's error event and never a clean end — and audited once, with
        decision `error`. Messages are the gateway's own: never upstream text."""
        err = self._mapped(exc)
        pipeline = self.pipeline
        if self.status == 0:
            if pipeline is not None:
                await self._error(pipeline, err.status, err.kind, str(err))
                return
            body = _gateway_error(err.kind, f"citewarden: {err}")
            await self.respond(err.status, body)
        elif not self.ended and pipeline is not None and self.content_type in (
            SSE,
            pipeline.codec.content_type,
        ):
            event = pipeline.adapter.error_event(f"citewarden: {err}", err.kind)
            await self.body(pipeline.codec.encode(event))
        # Else a passthrough body is under way: returning without its end makes the server cut
        # the connection, so the client sees a truncated answer, never a complete one.
        if pipeline is not None:
            self._account(pipeline, "error", None, None, reason=err.kind)
        else:
            self._account_unverified("error", err.kind)

    async def _call_upstream(
        self,
        pipeline: RoutePipeline,
        request_ctx: RequestContext,
        request_raw: bytes,
        headers: list[tuple[str, str]],
        stream: bool,
    ) -> tuple[int, list[tuple[str, str]], bytes, StreamVerifier | None]:
        """One whole upstream answer (JSON or SSE), bounded in size.

        A 2xx stream is verified claim by claim while it arrives (a StreamVerifier is returned
        with what it found), so little is left to check when it ends. Raises ProtocolError for
        a stream that does not parse or a malformed context header. The request's context is
        read while the upstream answers.
        """
        t0 = time.perf_counter()
        try:
            if not stream:
                method = self.scope["method"]
                resp = await self.app.upstream.request(
                    method, self.path_qs, headers, request_raw, meanwhile=request_ctx
                )
                return resp.status, resp.headers, resp.body, None
            async with self.app.upstream.stream(
                self.scope["method"], self.path_qs, headers, request_raw, meanwhile=request_ctx
            ) as s:
                if not 200 <= s.status < 300:
                    return s.status, s.headers, await s.read(), None
                ctx = pipeline.context(request_ctx, None, dict(s.headers))
                verifier = StreamVerifier(pipeline, ctx)
                decoder = pipeline.codec.decoder()
                parts: list[bytes] = []
                async for chunk in s.iter_bytes():
                    parts.append(chunk)
                    for event in decoder.feed(chunk):
                        verifier.feed(event)
                    if verifier.parser.done:
                        # [DONE] / message_stop: the answer is whole. An upstream that keeps
                        # the connection open a while longer must not delay the release.
                        break
                else:
                    for event in decoder.finish():
                        verifier.feed(event)
                verifier.sse_undefined = decoder.undefined
                return s.status, s.headers, b"".join(parts), verifier
        finally:
            self.upstream_seconds += time.perf_counter() - t0

    async def _relay_error(
        self, pipeline: RoutePipeline, status: int, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        """Upstream non-2xx (DESIGN §7): status and the allow-listed headers relayed. A 4xx body
        that is the protocol's error envelope is rebuilt from its known fields (the message
        capped); any other body, and every 5xx body, is replaced by a gateway envelope."""
        extra = _verified_headers(headers)
        rebuilt: dict[str, object] | None = None
        if 400 <= status < 500:
            try:
                parsed = orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = None
            rebuilt = pipeline.adapter.relay_error(parsed)
        relayed = dumps(rebuilt) if rebuilt is not None else None
        await self._error(
            pipeline,
            status,
            f"upstream_{status}",
            f"upstream answered {status}",
            body=relayed,
            extra=extra,
        )

    async def _buffered(
        self,
        pipeline: RoutePipeline,
        request: dict[str, Any],
        raw: bytes,
        headers: list[tuple[str, str]],
        stream: bool,
        include_usage: bool,
    ) -> None:
        # Shadow mode forwards the upstream's answer to the question asked: never re-asked.
        attempts = 1 + (
            pipeline.policy.release.retry
            if pipeline.adapter.retries
            and self.scope["method"] == "POST"
            and pipeline.policy.mode != "shadow"
            else 0
        )
        request_ctx = RequestContext(pipeline, request)  # a retry's request adds no context
        for attempt in range(attempts):
            try:
                status, up_headers, body, verifier = await self._call_upstream(
                    pipeline, request_ctx, raw, headers, stream
                )
                if not 200 <= status < 300:
                    await self._relay_error(pipeline, status, up_headers, body)
                    return
                args = (pipeline, request_ctx, body, up_headers, verifier)
                if verifier is None:
                    answer, judgement, verify_seconds = await self.app.turns.run(_judge, *args)
                else:
                    # The stream's claims were verified as they came: what is left is small,
                    # and queueing it behind whole answers would only delay its release.
                    answer, judgement, verify_seconds = _judge(*args)
                if pipeline.judge_pass is not None:  # claims the lexical tier left to the judge
                    judged = await pipeline.resolve_judge(
                        judgement, pipeline.adapter.question(request)
                    )
                    if judged.judge is not None:
                        verify_seconds += judged.judge.seconds
                    judgement = judged
            except Exception as e:  # an unusable answer, or the upstream failed
                await self.fail(e)
                return
            decision = judgement.outcome.decision
            if decision is Decision.RELEASED or attempt == attempts - 1:
                break
            # This attempt's tokens were billed and reach no one.
            self.app.deferred.call(
                self.app.metrics.observe_tokens, self.route_label, False, answer.usage
            )
            raw = dumps(retry.with_grounding(pipeline.adapter, request, judgement.outcome))
            raw = self._forwarded(pipeline, raw)
        await self._release(
            pipeline, answer, judgement, body, up_headers, stream, include_usage, verify_seconds
        )

    async def _release(
        self,
        pipeline: RoutePipeline,
        answer: Any,
        judgement: Judgement,
        upstream_body: bytes,
        up_headers: list[tuple[str, str]],
        stream: bool,
        include_usage: bool,
        verify_seconds: float,
    ) -> None:
        outcome = judgement.outcome
        decision = outcome.decision.value
        shadow = pipeline.policy.mode == "shadow"
        passthrough_headers = _verified_headers(up_headers)
        ctype = pipeline.codec.content_type if stream else JSON
        if shadow:
            extra = [*passthrough_headers, (b"x-citewarden-mode", b"shadow")]
            await self.respond(200, upstream_body, ctype, extra, decision=decision)
            served = True
        else:
            rendered = pipeline.render(
                answer,
                judgement,
                upstream_body,
                self.request_id,
                stream=stream,
                include_usage=include_usage,
            )
            extra = passthrough_headers
            content_type = ctype if rendered.status < 300 else JSON
            await self.respond(
                rendered.status, rendered.body, content_type, extra, decision=decision
            )
            served = outcome.decision in (Decision.RELEASED, Decision.PARTIAL)
            if served:
                self.app.metrics.observe_fields_dropped(
                    self.route_label, pipeline.dropped_levels(answer)
                )
        self.app.deferred.call(
            self.app.metrics.observe_tokens, self.route_label, served, answer.usage
        )
        self._account(pipeline, decision, judgement, verify_seconds, shadow=shadow)

    async def _progressive(
        self,
        pipeline: RoutePipeline,
        request: dict[str, Any],
        raw: bytes,
        headers: list[tuple[str, str]],
        include_usage: bool,
    ) -> None:
        t0 = time.perf_counter()
        request_ctx = RequestContext(pipeline, request)
        async with self.app.upstream.stream(
            self.scope["method"], self.path_qs, headers, raw, meanwhile=request_ctx
        ) as s:
            if not 200 <= s.status < 300:
                body = await s.read()
                self.upstream_seconds += time.perf_counter() - t0
                await self._relay_error(pipeline, s.status, s.headers, body)
                return
            try:
                ctx = pipeline.context(request_ctx, None, dict(s.headers))
            except ProtocolError as e:
                await self._error(pipeline, 502, "bad_upstream_answer", str(e))
                return
            release = ProgressiveRelease(pipeline, ctx, self.request_id, include_usage, request)
            codec = pipeline.codec
            await self.start(
                200, codec.content_type, _verified_headers(s.headers), decision="progressive"
            )
            decoder = codec.decoder()
            try:
                chunks = s.iter_bytes()
                if release.judged:  # verdicts arriving between chunks release their claims
                    chunks = release.interleave(chunks)
                async for chunk in chunks:
                    out = release.feed(decoder.feed(chunk))
                    if out:
                        await self.body(out, more=True)
                    if release.closed:
                        break  # blocked or broken: the upstream is hung up on as the block exits
                    if release.verifier.parser.done:
                        # The terminal event arrived: the answer is whole, and an upstream that
                        # keeps its connection open must not hold the last claims back.
                        break
                last = decoder.finish()
                release.verifier.sse_undefined = decoder.undefined
                out = release.feed(last)
                out += await release.afinish() if release.judged else release.finish()
            except Exception as e:  # mapped at the boundary (gateway/errors.py)
                out = release.abort(f"upstream failed: {self._mapped(e)}")
            self.upstream_seconds += time.perf_counter() - t0
            await self.body(out)
        if release.judgement is not None:
            self.app.deferred.call(
                self.app.metrics.observe_tokens, self.route_label, release.served, release.usage
            )
        self.app.metrics.observe_fields_dropped(self.route_label, release.dropped)
        self._account(
            pipeline,
            release.decision,
            release.summary(),
            release.verify_seconds,
            reason=release.reason,
        )

    # -- accounting --------------------------------------------------------------------------

    def _account_unverified(self, decision: str, reason: str | None = None) -> None:
        """Passthrough and refused requests: counted and audited, never verified. Recorded a
        moment later, with this moment's timings (gateway/deferred.py). Once per exchange."""
        if self.audited:
            return
        self.audited = True
        self.app.deferred.call(self._record_unverified, decision, reason, time.perf_counter())

    def _record_unverified(self, decision: str, reason: str | None, now: float) -> None:
        total = now - self.started
        first = None if self.first_byte is None else self.first_byte - self.started
        self.app.metrics.observe_request(self.route_label, decision, False, total, first)
        if self.upstream_seconds:
            self.app.metrics.observe_upstream(self.route_label, self.upstream_seconds)
        audit.audit_event(
            request_id=self.request_id,
            route=self.route_label,
            policy=self.policy_label or "-",
            status=self.status,
            decision=decision,
            reason=reason,
            total_ms=round(total * 1000, 3),
            cause=self.cause,
            path=self.path_qs[:_LOGGED_PATH_MAX],  # its credentials redacted by audit.py
        )

    def _account(
        self,
        pipeline: RoutePipeline,
        decision: str,
        judgement: Judgement | None,
        verify_seconds: float | None,
        shadow: bool = False,
        reason: str | None = None,
    ) -> None:
        """Metrics and the audit line of a verified route's exchange, recorded a moment later
        with this moment's timings (gateway/deferred.py). Once per exchange."""
        if self.audited:
            return
        self.audited = True
        self.app.deferred.call(
            self._record,
            pipeline,
            decision,
            judgement,
            verify_seconds,
            shadow,
            reason,
            time.perf_counter(),
        )

    def _record(
        self,
        pipeline: RoutePipeline,
        decision: str,
        judgement: Judgement | None,
        verify_seconds: float | None,
        shadow: bool,
        reason: str | None,
        now: float,
    ) -> None:
        total = now - self.started
        first = (self.first_byte - self.started) if self.first_byte is not None else total
        m = self.app.metrics
        route = self.route_label
        # Shadow traffic is served as released; its would-be decision keeps its own label
        # value so a roll-out can be watched on the dashboard before enforcing.
        m.observe_request(
            route, f"shadow_{decision}" if shadow else decision, self.streaming, total, first
        )
        if self.upstream_seconds:
            m.observe_upstream(route, self.upstream_seconds)
        report: Report | None = judgement.report if judgement is not None else None
        outcome: Outcome | None = judgement.outcome if judgement is not None else None
        if report is not None:
            m.observe_verification(route, report)
        judged = judgement.judge if judgement is not None else None
        if judged is not None:
            m.observe_judge(route, judged)
        try:
            audit.audit_event(
                request_id=self.request_id,
                route=route,
                policy=pipeline.loaded.label,
                status=self.status,
                report=report,
                outcome=outcome,
                decision=Decision.RELEASED.value if shadow else decision,
                reason=reason,
                streaming=self.streaming,
                mode="shadow" if shadow else pipeline.policy.mode,
                upstream_ms=round(self.upstream_seconds * 1000, 3),
                verification_ms=round((verify_seconds or 0.0) * 1000, 3),
                total_ms=round(total * 1000, 3),
                include_text=pipeline.policy.audit.include_text,
                cause=self.cause,
                path=self.path_qs[:_LOGGED_PATH_MAX],  # its credentials redacted by audit.py
                **cast(
                    "dict[str, Any]",
                    {"judge": judged.audit(pipeline.policy.audit.include_text)} if judged else {},
                ),
            )
        finally:  # a review is requested even if the audit line could not be written
            if report is not None and outcome is not None and outcome.decision is Decision.REVIEW:
                audit.review_requested(
                    request_id=self.request_id,
                    route=route,
                    policy=pipeline.loaded.label,
                    report=report,
                    include_text=pipeline.policy.audit.include_text,
                )

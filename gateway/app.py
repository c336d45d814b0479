"""The proxy as a raw ASGI app: route, forward, buffer, verify, release.

Per-request state lives in a fresh `_Exchange`, never on the shared app (as starlette's
body-rewriting middlewares do). Nothing reaches the client until the decision is made, except
in progressive streaming where each claim is released only once it has verified.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from gateway import audit, retry
from gateway.deferred import Deferred
from gateway.errors import BodyTooLarge, ProtocolError, UpstreamError
from gateway.metrics import Metrics
from gateway.pipeline import Judgement, KnownVerdicts, Pipelines, RoutePipeline, dumps
from gateway.policy import PolicyStore
from gateway.protocols.fields import loads_unique
from gateway.sse import SSEDecoder
from gateway.stream import ProgressiveRelease, StreamVerifier
from gateway.turns import Turns
from gateway.types import Decision, Outcome, Report
from gateway.upstream import Upstream, forward_request_headers, response_headers

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON = b"application/json"
SSE = b"text/event-stream; charset=utf-8"

# Upstream response headers relayed on a non-2xx answer (DESIGN §7: "safe headers").
SAFE_ERROR_HEADERS = frozenset(
    {
        "retry-after",
        "x-request-id",
        "request-id",
        "openai-processing-ms",
        "anthropic-ratelimit-unified-reset",
    }
)


def _safe_error_header(name: str) -> bool:
    return name in SAFE_ERROR_HEADERS or "ratelimit" in name or "rate-limit" in name


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
            await _Exchange(self, scope, receive, send).run()
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
                    await send({"type": "lifespan.shutdown.complete"})
                    return


def _judge(
    pipeline: RoutePipeline,
    request: dict[str, Any],
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
        ctx = pipeline.context(request, parsed, dict(up_headers))
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
        # 32 random hex digits, as uuid4().hex but without building a UUID object.
        self.request_id = self.headers.get("x-request-id") or os.urandom(16).hex()
        self.path: str = scope["path"]
        qs: bytes = scope.get("query_string", b"")
        self.path_qs = self.path + ("?" + qs.decode("latin-1") if qs else "")
        self.route_label = "unrouted"
        self.policy_label: str | None = None
        self.first_byte: float | None = None
        self.upstream_seconds = 0.0
        self.streaming = False
        self.status = 0

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
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool = False) -> None:
        if self.first_byte is None:
            self.first_byte = time.perf_counter()
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
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"request body over {limit} bytes")
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    # -- entry -------------------------------------------------------------------------------

    async def run(self) -> None:
        if "websocket" in self.headers.get("upgrade", "").lower():
            # Without a WebSocket library installed, uvicorn hands the upgrade over as plain
            # HTTP: refuse it here as the websocket scope is refused, on every path.
            await self.respond(
                403, _gateway_error("forbidden", "citewarden: WebSocket upgrades are refused")
            )
            self._account_unverified("refused", "websocket")
            return
        policies = self.app.store.current
        method: str = self.scope["method"]
        matched = policies.match(method, self.path, self.headers)
        if matched is None:
            if policies.is_passthrough(self.path):
                self.route_label = "passthrough"
                await self._passthrough(method)
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
            await self._verified(pipeline)

    async def _passthrough(self, method: str) -> None:
        try:
            body = await self.read_body()
        except BodyTooLarge as e:
            await self.respond(413, _gateway_error("request_too_large", str(e)))
            return
        headers = forward_request_headers(self.raw_headers, self.request_id)
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
        except UpstreamError as e:
            if self.status == 0:
                await self.respond(e.status, _gateway_error("upstream_error", str(e)))

    # -- verified routes ---------------------------------------------------------------------

    async def _verified(self, pipeline: RoutePipeline) -> None:
        adapter = pipeline.adapter
        try:
            raw = await self.read_body()
        except BodyTooLarge as e:
            await self._client_error(pipeline, 413, str(e), "request_too_large")
            return
        try:
            request = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
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
        self.streaming = info.stream
        headers = forward_request_headers(self.raw_headers, self.request_id)
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
        except UpstreamError as e:
            await self._upstream_failure(pipeline, e)

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

    async def _upstream_failure(self, pipeline: RoutePipeline, e: UpstreamError) -> None:
        if self.status != 0:
            return  # progressive stream: the error event was already sent by the streamer
        kind = "upstream_timeout" if e.status == 504 else "upstream_error"
        await self._error(pipeline, e.status, kind, f"upstream failed: {e}")

    async def _call_upstream(
        self,
        pipeline: RoutePipeline,
        request: dict[str, Any],
        request_raw: bytes,
        headers: list[tuple[str, str]],
        stream: bool,
    ) -> tuple[int, list[tuple[str, str]], bytes, StreamVerifier | None]:
        """One whole upstream answer (JSON or SSE), bounded in size.

        A 2xx stream is verified claim by claim while it arrives (a StreamVerifier is returned
        with what it found), so little is left to check when it ends. Raises ProtocolError for
        a stream that does not parse or a malformed context header.
        """
        t0 = time.perf_counter()
        try:
            if not stream:
                resp = await self.app.upstream.request("POST", self.path_qs, headers, request_raw)
                return resp.status, resp.headers, resp.body, None
            async with self.app.upstream.stream("POST", self.path_qs, headers, request_raw) as s:
                if not 200 <= s.status < 300:
                    return s.status, s.headers, await s.read(), None
                ctx = pipeline.context(request, None, dict(s.headers))
                verifier = StreamVerifier(pipeline, ctx)
                decoder = SSEDecoder()
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
        """Upstream non-2xx: status and safe headers relayed; its body only if it is an envelope."""
        # Header names arrive as the upstream spelled them ("Retry-After"): compare lowered.
        extra = [
            (k.lower().encode("latin-1"), v.encode("latin-1"))
            for k, v in headers
            if _safe_error_header(k.lower())
        ]
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        relayed = body if pipeline.is_error_envelope(parsed) else None
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
        attempts = 1 + (
            pipeline.policy.release.retry if pipeline.route.protocol != "rag-json" else 0
        )
        for attempt in range(attempts):
            try:
                status, up_headers, body, verifier = await self._call_upstream(
                    pipeline, request, raw, headers, stream
                )
                if not 200 <= status < 300:
                    await self._relay_error(pipeline, status, up_headers, body)
                    return
                args = (pipeline, request, body, up_headers, verifier)
                if verifier is None:
                    answer, judgement, verify_seconds = await self.app.turns.run(_judge, *args)
                else:
                    # The stream's claims were verified as they came: what is left is small,
                    # and queueing it behind whole answers would only delay its release.
                    answer, judgement, verify_seconds = _judge(*args)
            except (ProtocolError, ValueError, UnicodeDecodeError) as e:
                await self._error(
                    pipeline, 502, "bad_upstream_answer", f"unusable upstream answer: {e}"
                )
                return
            decision = judgement.outcome.decision
            if decision is Decision.RELEASED or attempt == attempts - 1:
                break
            raw = dumps(retry.with_grounding(pipeline.route.protocol, request, judgement.outcome))
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
        passthrough_headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in response_headers(up_headers, decoded=True)
            if k not in ("content-type", "x-request-id") and not k.startswith("x-citewarden-")
        ]
        ctype = SSE if stream else JSON
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
            extra = passthrough_headers if rendered.unchanged else []
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
        async with self.app.upstream.stream("POST", self.path_qs, headers, raw) as s:
            if not 200 <= s.status < 300:
                body = await s.read()
                self.upstream_seconds += time.perf_counter() - t0
                await self._relay_error(pipeline, s.status, s.headers, body)
                return
            try:
                ctx = pipeline.context(request, None, dict(s.headers))
            except ProtocolError as e:
                await self._error(pipeline, 502, "bad_upstream_answer", str(e))
                return
            release = ProgressiveRelease(pipeline, ctx, self.request_id, include_usage)
            await self.start(200, SSE, decision="progressive")
            decoder = SSEDecoder()
            try:
                async for chunk in s.iter_bytes():
                    out = release.feed(decoder.feed(chunk))
                    if out:
                        await self.body(out, more=True)
                last = decoder.finish()
                release.verifier.sse_undefined = decoder.undefined
                out = release.feed(last) + release.finish()
            except UpstreamError as e:
                out = release.abort(f"upstream failed: {e}")
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
        moment later, with this moment's timings (gateway/deferred.py)."""
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
        with this moment's timings (gateway/deferred.py)."""
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
        )
        if report is not None and outcome is not None and outcome.decision is Decision.REVIEW:
            audit.review_requested(
                request_id=self.request_id,
                route=route,
                policy=pipeline.loaded.label,
                report=report,
                include_text=pipeline.policy.audit.include_text,
            )

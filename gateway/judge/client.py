"""The judge endpoint's client: one POST per call, under the call timeout and the answer's
deadline, retried on transient faults only, behind a circuit breaker and a per-process limit
of calls in flight.

    JudgeError(kind)    every failure, by kind: timeout, deadline, circuit_open, connect,
                        rate_limited, http_5xx, http_4xx, bad_response
                        (all infrastructure errors: a claim never passes on one)

The HTTP/1.1 client is the gateway's own non-blocking upstream client (`gateway.http1`: its
keep-alive pool, timeouts and error mapping), and it never blocks the event loop. Its
connection settings (DESIGN §11: proxy, CA bundle, client certificate) come in through
`connect`, the factory that builds the pool, so the judge honours whatever the upstream does.
A call's request head is built once per path; an attempt is one exchange on the pool, bounded
by the call timeout or the answer's deadline, whichever comes first, with the one timer the
pool keeps per exchange.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ProtocolError, UpstreamConnectError, UpstreamError, UpstreamTimeout
from gateway.http1 import Pool, with_body
from gateway.judge.cache import VerdictCache
from gateway.judge.circuit import Circuit
from gateway.protocols.fields import loads_unique
from gateway.upstream import Limits, Timeouts, open_pool
from gateway.upstream_tls import UpstreamNetwork

__all__ = [
    "JudgeClient",
    "JudgeError",
    "UpstreamFactory",
    "client_for",
    "client_settings",
    "use_network",
]

UpstreamFactory = Callable[[str, Timeouts, Limits], Pool]

_MAX_BODY = 4 * 1024 * 1024
_BACKOFF_BASE = 0.05  # seconds; doubled per attempt, jittered ×[0.5, 1.5)
_BACKOFF_CAP = 2.0


class JudgeError(Exception):
    """A judge call that gave no usable answer. `kind` goes into the verdict and metrics."""

    def __init__(self, kind: str, detail: str = "", retry_after: float | None = None) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail
        self.retry_after: float | None = retry_after  # a 429's retry-after, in seconds


@dataclass(slots=True)
class CallRecord:
    """What one call cost: its outcome, seconds and token usage (openai-chat)."""

    outcome: str
    seconds: float
    usage: dict[str, int] = field(default_factory=dict)


# The proxy and TLS settings of DESIGN §11, shared with the upstream client: `serve` sets
# them once at start-up (`use_network`); None (tests, `eval` without them) means direct.
_NETWORK: UpstreamNetwork | None = None


def use_network(network: UpstreamNetwork | None) -> None:
    """Judge connections from now on go through `network` (proxy variables, CA, client cert)."""
    global _NETWORK
    _NETWORK = network


def _default_upstream(url: str, timeouts: Timeouts, limits: Limits) -> Pool:
    """The judge's connection pool, with the network settings `serve` set (else the process's
    proxy variables, as the upstream client's default)."""
    return open_pool(url, timeouts, limits, _NETWORK)


def _retry_after(headers: Any) -> float | None:
    for name, value in headers:
        if name.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None  # an HTTP date: treated as no hint
    return None


class JudgeClient:
    """One judge endpoint. Shared by every policy naming the same endpoint and settings."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str = "",
        timeout: float = 5.0,
        retries: int = 1,
        max_concurrency: int = 32,
        circuit: Circuit | None = None,
        cache: VerdictCache | None = None,
        connect: UpstreamFactory = _default_upstream,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.retries = retries
        self.max_concurrency = max_concurrency
        self.circuit = circuit if circuit is not None else Circuit(5, 30.0)
        self.cache = cache if cache is not None else VerdictCache(0, 1.0)
        # An attempt's bound is given to the pool per exchange; its own are a backstop.
        t = Timeouts(connect=timeout, read=timeout, total=timeout)
        self._pool = connect(url, t, Limits(max_response_bytes=_MAX_BODY, pool_size=256))
        self._heads: dict[str, bytes] = {}  # the request head per path, up to content-length
        self._headers: list[tuple[str, str]] = [
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ]
        if api_key:
            self._headers.append(("authorization", f"Bearer {api_key}"))
        self._sem: asyncio.Semaphore | None = None
        self._sem_loop: asyncio.AbstractEventLoop | None = None
        self.json_schema = True  # response_format json_schema, until the endpoint refuses it

    def __repr__(self) -> str:  # never the key
        return f"JudgeClient({self.url!r})"

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._sem is None or self._sem_loop is not loop:
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._sem_loop = loop
        return self._sem

    async def post(
        self,
        path: str,
        payload: Mapping[str, Any] | bytes,
        deadline: float,
        record: list[CallRecord],
    ) -> tuple[dict[str, Any] | list[Any], float]:
        """POST `payload` as JSON (or bytes, JSON already) to `url + path` and return the parsed
        JSON answer and the seconds it took; retried on connect errors, 429 and 5xx within
        `deadline` (a `time.monotonic()` value). Each attempt is appended to `record`.

        Every wait of a call ends by `deadline`: a concurrency slot is waited for until then,
        an attempt is bounded by the call timeout or the deadline, whichever comes first, and
        a retry starts only if its backoff ends before it; so the caller needs no timer."""
        body = (
            payload
            if isinstance(payload, bytes)
            else json.dumps(payload, ensure_ascii=False).encode()
        )
        attempt = 0
        while True:
            if not self.circuit.allow():
                record.append(CallRecord("circuit_open", 0.0))
                raise JudgeError("circuit_open")
            t0 = time.monotonic()
            try:
                result = await self._attempt(path, body, deadline)
            except JudgeError as e:
                record.append(CallRecord(e.kind, time.monotonic() - t0))
                if e.kind == "http_4xx_schema":
                    self.circuit.release_probe()
                    raise
                self.circuit.failure()
                wait = self._backoff(attempt, e)
                attempt += 1
                if (
                    wait is None
                    or attempt > self.retries
                    or time.monotonic() + wait >= deadline
                ):
                    raise
                await asyncio.sleep(wait)
                continue
            except BaseException:
                self.circuit.release_probe()  # cancelled (the deadline): no verdict either way
                raise
            seconds = time.monotonic() - t0
            self.circuit.success()
            record.append(CallRecord("ok", seconds))
            return result, seconds

    @staticmethod
    def _backoff(attempt: int, e: JudgeError) -> float | None:
        """Seconds to wait before retrying after `e`, or None when `e` is not transient."""
        if e.kind not in ("connect", "rate_limited", "http_5xx"):
            return None
        if e.kind == "rate_limited" and e.retry_after is not None:
            return e.retry_after
        base = min(_BACKOFF_CAP, _BACKOFF_BASE * (2.0**attempt))
        return base * (0.5 + random.random())

    async def _attempt(
        self, path: str, body: bytes, deadline: float
    ) -> dict[str, Any] | list[Any]:
        now = time.monotonic()
        if deadline <= now:
            raise JudgeError("deadline")
        sem = self._semaphore()
        if sem.locked():  # every slot taken: wait for one until the deadline (a timer only then)
            try:
                async with asyncio.timeout(deadline - now):
                    await sem.acquire()
            except TimeoutError:
                raise JudgeError("deadline") from None
        else:
            await sem.acquire()  # free: taken at once
        try:
            return await self._exchange(path, body, deadline)
        finally:
            sem.release()

    async def _exchange(
        self, path: str, body: bytes, deadline: float
    ) -> dict[str, Any] | list[Any]:
        head = self._heads.get(path)
        if head is None:
            head = self._heads[path] = self._pool.request_head("POST", path, self._headers)
        request = with_body(head, body)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        # The attempt's bound: the call timeout, or the answer's deadline when that is sooner
        # (the pool keeps loop time).
        if now + self.timeout < deadline:
            by, kind_on_timeout = now + self.timeout, "timeout"
        else:
            by, kind_on_timeout = deadline, "deadline"
        try:
            conn = await self._pool.exchange(request, loop.time() + (by - now))
            try:
                data = await conn.read_all()
            finally:
                conn.finish()  # pooled if read to the end on a keep-alive connection
        except (UpstreamTimeout, TimeoutError):
            raise JudgeError(kind_on_timeout) from None
        except UpstreamConnectError as e:
            raise JudgeError("connect", type(e).__name__) from None
        except (UpstreamError, ProtocolError) as e:
            raise JudgeError("bad_response", type(e).__name__) from None
        except OSError as e:
            raise JudgeError("connect", type(e).__name__) from None
        return self._answer(conn.status, conn.headers, data)

    @staticmethod
    def _answer(
        status: int, headers: list[tuple[str, str]], data: bytes
    ) -> dict[str, Any] | list[Any]:
        """The parsed JSON of a 2xx answer; every other answer is its JudgeError."""
        if status == 429:
            raise JudgeError("rate_limited", "429", _retry_after(headers))
        if status >= 500:
            raise JudgeError("http_5xx", str(status))
        if status >= 400:
            if status in (400, 422) and b"response_format" in data[:4096]:
                raise JudgeError("http_4xx_schema", str(status))
            raise JudgeError("http_4xx", str(status))
        if not 200 <= status < 300:
            raise JudgeError("bad_response", str(status))
        try:
            # Strict: a key written twice (the message content, a score) is ambiguous, and a
            # reader keeping the last value would take what the judge never settled on.
            parsed = loads_unique(data)
        except ProtocolError as e:
            raise JudgeError("bad_response", str(e)) from None
        if not isinstance(parsed, dict | list):
            raise JudgeError("bad_response", "not a JSON object or array")
        return parsed

    async def aclose(self) -> None:
        self._pool.close_idle()  # busy connections close as their exchanges end


_CLIENTS: dict[tuple[object, ...], JudgeClient] = {}


def client_settings(spec: Any, connect: UpstreamFactory | None = None) -> tuple[object, ...]:
    """What makes two `support.judge` specs share a client (the endpoint and its settings);
    computed once per pass, since `client_for` runs several times per judged answer."""
    return (
        spec.backend,
        spec.url,
        spec.key,
        spec.timeout,
        spec.retries,
        spec.max_concurrency,
        spec.circuit.failures,
        spec.circuit.reset_after,
        spec.cache.entries,
        spec.cache.ttl,
        connect,
    )


def client_for(
    spec: Any, connect: UpstreamFactory | None = None, settings: tuple[object, ...] | None = None
) -> JudgeClient:
    """The process's client for a `support.judge` spec: one per endpoint and settings, so the
    circuit, the concurrency limit and the cache outlive policy reloads that keep them.
    `settings`: `client_settings(spec, connect)`, when the caller has it already."""
    try:
        loop: object = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    # connections belong to one event loop (one per process when serving)
    key = (id(loop), *(settings if settings is not None else client_settings(spec, connect)))
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = JudgeClient(
            spec.url,
            api_key=spec.key,
            timeout=spec.timeout,
            retries=spec.retries,
            max_concurrency=spec.max_concurrency,
            circuit=Circuit(spec.circuit.failures, spec.circuit.reset_after),
            cache=VerdictCache(spec.cache.entries, spec.cache.ttl),
            connect=connect or _default_upstream,
        )
    return client


async def close_clients() -> None:
    """Close and forget the running loop's clients (at shutdown)."""
    here = id(asyncio.get_running_loop())
    for key, client in list(_CLIENTS.items()):
        if key[0] == here:
            del _CLIENTS[key]
            await client.aclose()


def reset_clients() -> None:
    """Forget every shared client (tests; a fresh process starts empty)."""
    _CLIENTS.clear()

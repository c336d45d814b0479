"""Prometheus collectors for the admin `/metrics` endpoint (DESIGN §8), and the calls the proxy
makes to feed them. Label children are bound once per route so a request costs a few lookups.

The `route` label is always a policy route name or one of the fixed values below, never a raw
path; as a last guard, more than `max_routes` distinct routes fold into `ROUTE_OVERFLOW`.
Counters and histograms also expose prometheus_client's standard `_created` series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import choose_encoder

from .types import Decision, Report

if TYPE_CHECKING:
    from .checks.judge import JudgeStats

ROUTE_PASSTHROUGH: Final = "passthrough"
ROUTE_UNROUTED: Final = "unrouted"
ROUTE_OVERFLOW: Final = "other"
# The `why` label of citewarden_context_rejected_total (gateway.context.REJECT_REASONS).
CONTEXT_REJECT_REASONS: Final = frozenset(
    {"untrusted_role", "untrusted_document", "unsigned", "bad_signature"}
)

# Verification is in-process and targets well under a millisecond: resolve 50µs steps.
VERIFICATION_BUCKETS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
UPSTREAM_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
)
# Whole requests include passthrough and refusals, which are much faster than an upstream call.
REQUEST_BUCKETS: Final = (0.001, 0.0025, *UPSTREAM_BUCKETS)

VERDICTS: Final = ("verified", "failed", "errored", "exempt")
# Levels of the protocols' field tables (gateway/protocols/fields.py); anything else is "other".
FIELD_LEVELS: Final = frozenset(
    {
        "top",
        "choice",
        "message",
        "tool_call",
        "annotation",
        "audio",
        "content_block",
        "citation",
        "delta",
        "frame",
        "sse",
    }
)
_DECISIONS: Final = tuple(d.value for d in Decision)
_UNKNOWN: Final = "unknown"


def _first_key(usage: Mapping[str, object], keys: tuple[str, ...]) -> object:
    return next((usage[k] for k in keys if k in usage), 0)


class _Inflight:
    """Re-usable, re-entrant context manager: it keeps no state of its own, only the gauge child."""

    __slots__ = ("_gauge",)

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge

    def __enter__(self) -> None:
        self._gauge.inc()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._gauge.dec()


class _RouteMetrics:
    """Every label child of one route, bound once on the route's first request."""

    __slots__ = (
        "_check_failures",
        "_errors",
        "_failures",
        "_requests_parent",
        "_verifier_errors",
        "claims",
        "first_byte",
        "inflight",
        "request_seconds",
        "requests",
        "route",
        "tokens",
        "upstream",
        "verification",
    )

    def __init__(self, m: Metrics, route: str) -> None:
        self.route = route
        self._requests_parent = m.requests
        self.requests = {d: m.requests.labels(route, d) for d in _DECISIONS}
        self.claims = {v: m.claims.labels(route, v) for v in VERDICTS}
        self.verification = m.verification_seconds.labels(route)
        self.upstream = m.upstream_seconds.labels(route)
        self.request_seconds = {
            s: m.request_seconds.labels(route, str(s).lower()) for s in (False, True)
        }
        self.first_byte = {
            s: m.first_byte_seconds.labels(route, str(s).lower()) for s in (False, True)
        }
        self.inflight = _Inflight(m.inflight_requests.labels(route))
        self.tokens = {
            (outcome, kind): m.upstream_tokens.labels(route, outcome, kind)
            for outcome in ("served", "withheld")
            for kind in ("input", "output")
        }
        self._check_failures = m.check_failures
        self._failures: dict[str, Counter] = {}
        self._verifier_errors = m.verifier_errors
        self._errors: dict[tuple[str, str], Counter] = {}

    def request(self, decision: str) -> Counter:
        child = self.requests.get(decision)
        if child is None:
            # Non-verification outcomes ("passthrough", "error", ...) come from a small fixed set
            # in the proxy, so caching them here stays bounded.
            child = self.requests[decision] = self._requests_parent.labels(self.route, decision)
        return child

    def failure(self, reason: str) -> Counter:
        child = self._failures.get(reason)
        if child is None:
            child = self._failures[reason] = self._check_failures.labels(self.route, reason)
        return child

    def error(self, check: str, kind: str) -> Counter:
        key = (check, kind)
        child = self._errors.get(key)
        if child is None:
            child = self._errors[key] = self._verifier_errors.labels(self.route, check, kind)
        return child


class Metrics:
    """The gateway's collectors, registered on `registry`.

    With no registry a private one is created (with the process, platform and GC collectors),
    so several gateways in one process, or in one test run, never collide on the global one.
    """

    def __init__(self, registry: CollectorRegistry | None = None, *, max_routes: int = 256) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        self._max_routes = max_routes
        r = registry
        # prometheus_client appends `_total` to counter names when it exposes them.
        self.requests = Counter(
            "citewarden_requests",
            "Requests by release decision.",
            ["route", "decision"],
            registry=r,
        )
        self.claims = Counter(
            "citewarden_claims", "Claims by verdict.", ["route", "verdict"], registry=r
        )
        self.check_failures = Counter(
            "citewarden_check_failures",
            "Failed claims by the reason that failed them.",
            ["route", "reason"],
            registry=r,
        )
        self.verifier_errors = Counter(
            "citewarden_verifier_errors",
            "Claims a check could not verify (infrastructure).",
            ["route", "check", "kind"],
            registry=r,
        )
        self.verification_seconds = Histogram(
            "citewarden_verification_seconds",
            "Time spent verifying one answer.",
            ["route"],
            buckets=VERIFICATION_BUCKETS,
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "citewarden_upstream_seconds",
            "Upstream response time (until the body is read).",
            ["route"],
            buckets=UPSTREAM_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "citewarden_request_seconds",
            "Whole request time, as seen by the gateway.",
            ["route", "streaming"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.first_byte_seconds = Histogram(
            "citewarden_first_byte_seconds",
            "Time until the first response byte to the client.",
            ["route", "streaming"],
            buckets=REQUEST_BUCKETS,
            registry=r,
        )
        self.inflight_requests = Gauge(
            "citewarden_inflight_requests",
            "Requests being handled.",
            ["route"],
            registry=r,
        )
        self.upstream_tokens = Counter(
            "citewarden_upstream_tokens",
            "Upstream token usage, by whether the answer was served.",
            ["route", "outcome", "kind"],
            registry=r,
        )
        self.context_rejected = Counter(
            "citewarden_context_rejected",
            "Chunk tags / document blocks of a request that were not context, by why.",
            ["route", "why"],
            registry=r,
        )
        self.fields_dropped = Counter(
            "citewarden_fields_dropped",
            "Upstream fields a protocol's field table dropped, by level.",
            ["route", "level"],
            registry=r,
        )
        self.policy_reloads = Counter(
            "citewarden_policy_reloads",
            "Policy reload attempts by outcome.",
            ["outcome"],
            registry=r,
        )
        self.policy_info = Gauge(
            "citewarden_policy_info",
            "Active policies (value 1), by name and version.",
            ["name", "version"],
            registry=r,
        )
        # The judge pass (DESIGN §10).
        self.judge_calls = Counter(
            "citewarden_judge_calls",
            "Judge calls (attempts) by outcome: ok, timeout, deadline, circuit_open, ...",
            ["route", "outcome"],
            registry=r,
        )
        self.judge_seconds = Histogram(
            "citewarden_judge_seconds",
            "Time one answer's judge pass took.",
            ["route"],
            buckets=UPSTREAM_BUCKETS,
            registry=r,
        )
        self.judge_verdicts = Counter(
            "citewarden_judge_verdicts",
            "Judge verdicts (YES, PARTIAL, NO) per judged unit.",
            ["route", "verdict"],
            registry=r,
        )
        self.judge_cache = Counter(
            "citewarden_judge_cache",
            "Judge verdict cache lookups by result (hit, miss).",
            ["route", "result"],
            registry=r,
        )
        self.judge_circuit_open = Gauge(
            "citewarden_judge_circuit_open",
            "1 while the judge endpoint's circuit breaker is open (or half-open), else 0.",
            ["route"],
            registry=r,
        )
        self.judge_tokens = Counter(
            "citewarden_judge_tokens",
            "Judge token usage by kind (prompt, completion).",
            ["route", "kind"],
            registry=r,
        )
        self._routes: dict[str, _RouteMetrics] = {}
        self._policies: set[tuple[str, str]] = set()

    def _route(self, route: str) -> _RouteMetrics:
        rm = self._routes.get(route)
        if rm is None:
            if len(self._routes) >= self._max_routes and route != ROUTE_OVERFLOW:
                return self._route(ROUTE_OVERFLOW)
            rm = self._routes[route] = _RouteMetrics(self, route)
        return rm

    # -- per request ------------------------------------------------------------------------

    def observe_verification(self, route: str, report: Report) -> None:
        """Claims by verdict, failure reasons, verifier errors and verification time."""
        rm = self._route(route)
        verified = failed = errored = exempt = 0
        for c in report.claims:
            v = c.verdict
            if v == "verified":
                verified += 1
            elif v == "exempt":
                exempt += 1
            elif v == "failed":
                failed += 1
                rm.failure(c.reason or _UNKNOWN).inc()
            else:
                errored += 1
                rm.error(c.check or _UNKNOWN, c.error_kind or _UNKNOWN).inc()
        # Touch every verdict child only when it moves: inc(0) still takes the lock.
        if verified:
            rm.claims["verified"].inc(verified)
        if failed:
            rm.claims["failed"].inc(failed)
        if errored:
            rm.claims["errored"].inc(errored)
        if exempt:
            rm.claims["exempt"].inc(exempt)
        rm.verification.observe(report.seconds)
        ctx = report.context
        if not isinstance(ctx, str) and ctx.rejected:
            self.observe_context_rejected(rm.route, ctx.rejected)

    def observe_judge(self, route: str, stats: JudgeStats) -> None:
        """One answer's judge pass (gateway.checks.judge.JudgeStats)."""
        route = self._route(route).route  # bounded like every other route label
        for call in stats.calls:
            self.judge_calls.labels(route, call.outcome).inc()
            for kind, n in call.usage.items():
                self.judge_tokens.labels(route, kind).inc(n)
        self.judge_seconds.labels(route).observe(stats.seconds)
        for verdict, n in stats.verdicts.items():
            self.judge_verdicts.labels(route, verdict).inc(n)
        if stats.cache_hits:
            self.judge_cache.labels(route, "hit").inc(stats.cache_hits)
        if stats.cache_misses:
            self.judge_cache.labels(route, "miss").inc(stats.cache_misses)
        self.judge_circuit_open.labels(route).set(1 if stats.circuit_open else 0)

    def observe_context_rejected(self, route: str, rejected: Mapping[str, int]) -> None:
        """Request chunks refused as context (`ContextSet.rejected`), by a fixed reason."""
        for why, n in rejected.items():
            label = why if why in CONTEXT_REJECT_REASONS else _UNKNOWN
            self.context_rejected.labels(route, label).inc(n)

    def observe_request(
        self,
        route: str,
        decision: str | Decision,
        streaming: bool,
        seconds: float,
        first_byte_seconds: float | None = None,
    ) -> None:
        """One finished request. `decision` is a Decision value or a fixed non-verification
        outcome of the proxy ("passthrough", "refused", "error"). `first_byte_seconds` is None
        when nothing was sent."""
        rm = self._route(route)
        rm.request(decision.value if isinstance(decision, Decision) else decision).inc()
        rm.request_seconds[streaming].observe(seconds)
        if first_byte_seconds is not None:
            rm.first_byte[streaming].observe(first_byte_seconds)

    def observe_upstream(self, route: str, seconds: float) -> None:
        self._route(route).upstream.observe(seconds)

    def inflight(self, route: str) -> AbstractContextManager[None]:
        """`with metrics.inflight(route): ...` counts the request as in flight."""
        return self._route(route).inflight

    def observe_tokens(self, route: str, served: bool, usage: Mapping[str, int]) -> None:
        """Upstream token usage. `served` is True when the answer reached the client unchanged
        or partially; False when it was withheld (abstained, blocked, review).

        `usage` is normally `Answer.usage` (keys `input` / `output`, as the adapters normalise
        it); the upstream's raw usage object (`input_tokens` / `output_tokens`, or OpenAI's
        `prompt_tokens` / `completion_tokens`) is read too, so a caller may pass it as is.
        """
        rm = self._route(route)
        outcome = "served" if served else "withheld"
        inp = _first_key(usage, ("input", "input_tokens", "prompt_tokens"))
        out = _first_key(usage, ("output", "output_tokens", "completion_tokens"))
        # Usage comes from the upstream's body: ignore anything that is not a sane count.
        if isinstance(inp, int) and not isinstance(inp, bool) and inp > 0:
            rm.tokens[(outcome, "input")].inc(inp)
        if isinstance(out, int) and not isinstance(out, bool) and out > 0:
            rm.tokens[(outcome, "output")].inc(out)

    def observe_fields_dropped(self, route: str, levels: Mapping[str, int]) -> None:
        """Fields of one answer dropped on a verified route, counted per field-table level."""
        if not levels:
            return
        label = self._route(route).route
        for level, n in levels.items():
            if n > 0:
                known = level if level in FIELD_LEVELS else "other"
                self.fields_dropped.labels(label, known).inc(n)

    # -- policy lifecycle -------------------------------------------------------------------

    def policy_reloaded(self, outcome: str) -> None:
        """A reload attempt: "success", or "error" (invalid; the last good policy is kept), as
        PolicyStore.poll reports it. Alerts and the dashboard select on these values."""
        self.policy_reloads.labels(outcome).inc()

    def set_policies(self, policies: Iterable[tuple[str, str]]) -> None:
        """Make `policies` (name, version) the active set: 1 for each, old versions removed."""
        current = set(policies)
        for name, version in self._policies - current:
            self.policy_info.remove(name, version)
        for name, version in current:
            self.policy_info.labels(name, version).set(1)
        self._policies = current

    # -- exposition ------------------------------------------------------------------------

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition body and its content type; OpenMetrics when the scraper asks for it."""
        return _render(self.registry, accept)


def _render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    if not accept:
        return generate_latest(registry), CONTENT_TYPE_LATEST
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type

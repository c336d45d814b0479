"""Logging set-up (structlog JSON lines on stdout), credential redaction, and the audit events:
one `audit` event per request, plus `review_requested` when an answer is held for review.

Draft text and claim text appear only with `include_text=True`; chunk text never does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import io
import logging
import os
import re
import sys
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any, Final, Literal, TextIO

import orjson
import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from .types import Citation, ClaimReport, ContextSet, Decision, Outcome, Report

REDACTED: Final = "[redacted]"
# DESIGN §7: credentials pass through to the upstream and are never logged.
SENSITIVE_HEADERS: Final = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "x-amz-security-token",
        "cookie",
        "set-cookie",
    }
)
# Key names that hold credentials whatever their container: `upstream_token`, `client_secret`,
# `password`, `openai_api_key`, ...
SENSITIVE_KEY_PATTERN: Final = r"token|secret|passw(?:or)?d|api[-_]?key|credential"

# A credential in a URL's query (Gemini's `key=`, `api_key=`, `access_token=`, a signature),
# inside any logged string: the value is replaced, the parameter name kept.
_QUERY_CREDENTIAL: Final = re.compile(
    r"(?i)((?:^|[?&;])[\w.-]*(?:key|token|secret|passw(?:or)?d|credential|signature|sig)=)"
    r"[^&#;\s\"']*"
)
QUERY_REDACTED: Final = "REDACTED"


# Any query parameter, for names written with percent-escapes or `+` (`%6Bey=`): an upstream
# decodes the name before it reads it, so the name is matched decoded.
_QUERY_PARAM: Final = re.compile(r"((?:^|[?&;])([^=&#;\s\"']*)=)[^&#;\s\"']*")
_CREDENTIAL_NAME: Final = re.compile(
    r"(?i)[\w.-]*(?:key|token|secret|passw(?:or)?d|credential|signature|sig)"
)


def _escaped_param(m: re.Match[str]) -> str:
    name = urllib.parse.unquote_plus(m.group(2))
    if _CREDENTIAL_NAME.search(name) is None:
        return m.group(0)
    return m.group(1) + QUERY_REDACTED


def redact_query(text: str) -> str:
    """`text` with the value of every credential-named query parameter replaced."""
    if "=" not in text:
        return text
    text = _QUERY_CREDENTIAL.sub(rf"\g<1>{QUERY_REDACTED}", text)
    if "%" in text or "+" in text:
        text = _QUERY_PARAM.sub(_escaped_param, text)
    return text


AUDIT_EVENTS: Final = frozenset({"audit", "review_requested"})
_CITED_ID_MAX: Final = 128
_MEMO_MAX: Final = 4096
_PLAIN: Final = frozenset({str, int, float, bool, type(None), bytes})


class _Vetted(list[Any]):
    """A list this module built from typed values under keys it chose: nothing to redact."""


class _VettedDict(dict[str, Any]):
    """A mapping this module built from typed values under keys it chose: nothing to redact."""


class Redactor:
    """A structlog processor that masks credentials anywhere in an event dict.

    A value is masked when its key is a credential header (`authorization`, `x-api-key`,
    `cookie`, `proxy-authorization`, ...) or matches `key_pattern`, at any depth: nested
    mappings, lists, and header lists of (name, value) pairs (ASGI raw headers included).
    In every string, a credential-named query parameter (`?key=…`, a logged path or URL) has
    its value replaced (`redact_query`). Nested containers are copied, never changed in place:
    they may be the proxy's own objects.
    Note that `*token*` keys are masked even when they hold counts: log usage as `usage`.
    """

    def __init__(
        self,
        headers: Iterable[str] = SENSITIVE_HEADERS,
        key_pattern: str = SENSITIVE_KEY_PATTERN,
    ) -> None:
        self._headers = frozenset(h.lower().replace("_", "-") for h in headers)
        self._pattern = re.compile(key_pattern, re.IGNORECASE)
        # Events reuse a handful of key names, so the verdict per key is memoised.
        self._memo: dict[object, bool] = {}

    def sensitive(self, key: object) -> bool:
        hit = self._memo.get(key)
        if hit is None:
            hit = self._classify(key)
            if len(self._memo) < _MEMO_MAX:
                self._memo[key] = hit
        return hit

    def _classify(self, key: object) -> bool:
        if isinstance(key, bytes):
            key = key.decode("latin-1")
        if not isinstance(key, str):
            return False
        norm = key.lower().replace("_", "-")
        return norm in self._headers or self._pattern.search(key) is not None

    def redact(self, value: Any) -> Any:
        """`value` with every credential masked (a copy when anything nested could change)."""
        t = type(value)
        if t is str:
            return redact_query(value)
        if t in _PLAIN or t is _Vetted or t is _VettedDict:
            return value
        if t is dict or isinstance(value, Mapping):
            return {k: REDACTED if self.sensitive(k) else self.redact(v) for k, v in value.items()}
        if t is list or t is tuple or isinstance(value, list | tuple):
            out = []
            for item in value:
                if (
                    type(item) is tuple
                    and len(item) == 2
                    and type(item[0]) in (str, bytes)
                    and self.sensitive(item[0])
                ):
                    out.append((item[0], REDACTED))
                else:
                    out.append(self.redact(item))
            return tuple(out) if isinstance(value, tuple) else out
        return value

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        memo = self._memo
        for key, value in event_dict.items():
            hit = memo.get(key)
            if hit is None:
                hit = self.sensitive(key)
            if hit:
                event_dict[key] = REDACTED
            elif type(value) is str:
                if "=" in value:
                    event_dict[key] = redact_query(value)
            elif type(value) not in _PLAIN:
                event_dict[key] = self.redact(value)
        return event_dict


REDACTOR: Final = Redactor()
# Resolved against the current configuration on every call (tests swap it in and out).
_LOGGER: Final = structlog.get_logger()


class _LevelFilter:
    """Drops events below the configured level, except audit events, which are records and
    not diagnostics: raising the log level must never silence them."""

    def __init__(self, min_level: int) -> None:
        self._min = min_level

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        level = logging.getLevelName(method_name.upper())
        if (
            isinstance(level, int)
            and level < self._min
            and event_dict.get("event") not in AUDIT_EVENTS
        ):
            raise structlog.DropEvent
        return event_dict


_installed: tuple[logging.Handler, int] | None = None
# The processors and writer configure_logging installed. While structlog still runs that very
# list (a test's capture_logs swaps it out), audit events go through it directly: the same
# processors and the same line, without building a bound logger per event.
_direct: tuple[list[Processor], _LineWriter] | None = None


def _level(level: str | int) -> int:
    if isinstance(level, int):
        return level
    value = logging.getLevelName(level.upper())
    if not isinstance(value, int):
        raise ValueError(f"unknown log level: {level!r}")
    return value


def _dumps(obj: object, **kw: Any) -> str:
    # One audit line per request is on the hot path: orjson is several times faster than the
    # stdlib encoder, and structlog's fallback for unknown types still applies via `default`.
    return orjson.dumps(obj, default=kw.get("default"), option=orjson.OPT_NON_STR_KEYS).decode()


class _Stamp:
    """`timestamp` as ISO 8601 UTC with microseconds (what structlog's TimeStamper(fmt="iso",
    utc=True) writes), with the date and time formatted once per second, not once per event."""

    __slots__ = ("_prefix", "_second")

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        now = time.time()
        second = int(now)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        event_dict["timestamp"] = f"{self._prefix}.{int((now - second) * 1e6):06d}Z"
        return event_dict


# PIPE_BUF on Linux: a write to a pipe of at most this many bytes is never interleaved with
# another process's (a container's stdout may be shared, e.g. with a log shipper's wrapper).
_ATOMIC_WRITE = 4096


class _LineWriter:
    """Writes log lines to a text stream: every structlog event and, through `_Handler`, every
    stdlib record, in the order they were emitted.

    Inside a running event loop the lines of one loop iteration are written together when it
    ends (a few write system calls per iteration instead of one per request); outside a loop
    every line is written at once. Writes go out in batches of whole lines of at most
    `_ATOMIC_WRITE` bytes, so lines from several processes sharing a pipe never mix
    (a single longer line is written alone).
    """

    __slots__ = ("__weakref__", "_binary", "_file", "_lines", "_lock", "_pending")

    def __init__(self, file: TextIO) -> None:
        _WRITERS.add(self)
        self._file = file
        # The byte stream under a TextIOWrapper (stdout): lines are encoded once, here.
        buffer = getattr(file, "buffer", None)
        self._binary: io.BufferedIOBase | None = (
            buffer if isinstance(buffer, io.BufferedIOBase) else None
        )
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._pending = False

    def msg(self, message: str) -> None:
        with self._lock:
            self._lines.append(message + "\n")
            if self._pending:
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self._write()
                return
            self._pending = True
        loop.call_soon(self.flush)

    def flush(self) -> None:
        with self._lock:
            self._pending = False
            self._write()

    def _write(self) -> None:
        lines, self._lines = self._lines, []
        if not lines:
            return
        binary = self._binary
        if binary is None:
            self._file.write("".join(lines))
            self._file.flush()
            return
        self._file.flush()  # whatever else was printed to the text stream goes first
        batch: list[bytes] = []
        size = 0
        for line in lines:
            data = line.encode()
            if batch and size + len(data) > _ATOMIC_WRITE:
                binary.write(b"".join(batch))
                binary.flush()
                batch, size = [], 0
            batch.append(data)
            size += len(data)
        binary.write(b"".join(batch))
        binary.flush()

    info = warning = error = critical = debug = exception = log = msg


# Every writer still in use, flushed at interpreter exit: lines written in a loop's last
# iteration must not wait for a callback that will never run.
_WRITERS: weakref.WeakSet[_LineWriter] = weakref.WeakSet()


@atexit.register
def _flush_writers() -> None:
    for writer in list(_WRITERS):
        with contextlib.suppress(Exception):  # a closed stream at exit: nothing left to do
            writer.flush()


class _Handler(logging.Handler):
    """Stdlib records (uvicorn, aiohttp) through the same writer as structlog events, so the
    two keep their relative order."""

    def __init__(self, writer: _LineWriter) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.msg(self.format(record))
        except Exception:
            self.handleError(record)


def configure_logging(stream: TextIO | None = None, level: str | int = "info") -> None:
    """Send structlog events, and stdlib logging records (uvicorn, aiohttp), to `stream`
    (default: stdout) as redacted JSON lines. Calling it again replaces the previous set-up."""
    reset_logging()
    global _installed, _direct
    out = sys.stdout if stream is None else stream
    min_level = _level(level)
    stamp = _Stamp()
    writer = _LineWriter(out)
    tail: list[Processor] = [
        structlog.processors.format_exc_info,
        REDACTOR,
        structlog.processors.JSONRenderer(serializer=_dumps),
    ]
    head: list[Processor] = [structlog.contextvars.merge_contextvars]
    if min_level > logging.INFO:
        head.append(_LevelFilter(min_level))
    processors: list[Processor] = [*head, structlog.processors.add_log_level, stamp, *tail]
    structlog.configure(
        processors=processors,
        # Below info, calls are no-ops; above it _LevelFilter decides so audit events survive.
        wrapper_class=structlog.make_filtering_bound_logger(min(min_level, logging.INFO)),
        logger_factory=lambda *args: writer,
        # Caching would pin loggers to this configuration; tests and reloads reconfigure.
        cache_logger_on_first_use=False,
    )
    handler = _Handler(writer)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.add_log_level,
                stamp,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
        )
    )
    root = logging.getLogger()
    _installed = (handler, root.level)
    _direct = (processors, writer)
    root.addHandler(handler)
    root.setLevel(min_level)
    # uvicorn's default dictConfig, applied by any server started in this process without
    # `log_config=None`, gives its loggers handlers of their own and stops them propagating:
    # their records would then bypass the redacting writer. Route them through the root.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi"):
        named = logging.getLogger(name)
        named.handlers.clear()
        named.propagate = True


def reset_logging() -> None:
    """Undo configure_logging: structlog defaults, and the root logger as it was."""
    global _installed, _direct
    _direct = None
    structlog.reset_defaults()
    if _installed is not None:
        handler, previous = _installed
        root = logging.getLogger()
        root.removeHandler(handler)
        root.setLevel(previous)
        _installed = None


# --------------------------------------------------------------------------------------------
# Audit events
# --------------------------------------------------------------------------------------------


# A client's x-request-id is propagated only in this shape (DESIGN §7); any other value is
# replaced by a fresh id, and is neither echoed nor logged.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(given: str | None) -> str:
    """The id of a request's answer and audit line: the client's `x-request-id` when it has
    the allowed shape, else 32 random hex digits (as `uuid4().hex`, without the object)."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return os.urandom(16).hex()


def _ms(seconds_ms: float | None) -> float | None:
    return None if seconds_ms is None else round(seconds_ms, 3)


def _cited_id(cit: Citation, context: ContextSet | str, include_text: bool) -> str | None:
    """A cited id as the log may hold it. Ids are written by the model: a malformed one (in
    `[<a sentence>, kb:1]` the sentence is one) is `null`. A well-formed id is logged as it
    is only when it names a chunk of the request's context (or is a native citation's
    `document:<index>`, which the gateway spells from an integer); any other id was invented,
    and may be a sentence written without spaces (`kb:The_pump_was_designed_by_…`), so without
    `include_text` it is `sha256:` and 16 hex digits of its digest (repeats can still be
    counted). An id logged as it is must be printable and spaceless (else `null`), and is
    bounded so a runaway marker cannot bloat the log."""
    i = cit.id
    if cit.malformed is not None:
        return None
    named = cit.native is not None or (isinstance(context, ContextSet) and i in context.chunks)
    if not named and not include_text:
        raw = i.encode("utf-8", "surrogatepass")
        return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]
    if not i.isprintable() or " " in i:
        return None
    return i[:_CITED_ID_MAX]


def _claim(c: ClaimReport, context: ContextSet | str, include_text: bool) -> dict[str, object]:
    entry: dict[str, object] = {
        "index": c.claim.index,
        "verdict": c.verdict,
        "reason": c.reason if c.verdict == "failed" else c.error_kind,
        "cited": [_cited_id(cit, context, include_text) for cit in c.claim.citations],
    }
    if c.check is not None:
        entry["check"] = c.check
    if include_text:
        entry["text"] = c.claim.text
        # Details are meant to be text-free, but they are written by many checks: gate them.
        if c.detail:
            entry["detail"] = c.detail
    return entry


def _reasons(problems: Iterable[ClaimReport]) -> list[str]:
    seen: dict[str, None] = {}
    for c in problems:
        r = c.reason if c.verdict == "failed" else c.error_kind
        seen.setdefault(r or "unknown", None)
    return list(seen)


def _problems(report: Report | None) -> list[ClaimReport]:
    if report is None:
        return []
    return [c for c in report.claims if c.verdict in ("failed", "errored")]


def _emit(event: str, fields: MutableMapping[str, object], extra: Mapping[str, object]) -> None:
    # Extra fields come from the proxy (method, upstream status, headers, ...): they are
    # redacted here too, so a pipeline without the Redactor (tests, a custom set-up) stays safe.
    for key, value in extra.items():
        if key not in fields:
            fields[key] = REDACTED if REDACTOR.sensitive(key) else REDACTOR.redact(value)
    direct = _direct
    if direct is not None and structlog.get_config()["processors"] is direct[0]:
        processors, writer = direct
        out: Any = {**fields, "event": event}
        try:
            for proc in processors:
                out = proc(writer, "info", out)
        except structlog.DropEvent:
            pass
        else:
            writer.msg(out)
    else:
        _LOGGER.info(event, **fields)
    fields["event"] = event


def audit_event(
    *,
    request_id: str,
    route: str,
    policy: str,
    status: int,
    report: Report | None = None,
    outcome: Outcome | None = None,
    decision: Decision | str | None = None,
    reason: str | None = None,
    streaming: bool = False,
    mode: Literal["enforce", "shadow"] = "enforce",
    upstream_ms: float | None = None,
    verification_ms: float | None = None,
    total_ms: float | None = None,
    include_text: bool = False,
    draft: str | None = None,
    cause: str | None = None,
    **extra: object,
) -> dict[str, object]:
    """Emit the one `audit` event of a request and return its fields.

    `policy` is `name@version`. `outcome` is the release decision of a verified answer; for a
    request that was not verified (passthrough, refused, upstream error) pass `decision`
    ("passthrough", "refused", "error") and `reason` instead. In shadow mode `decision` is what
    the client got ("released": the upstream answer was forwarded) and `shadow_decision` what
    enforce mode would have done. `verification_ms` defaults to the report's own timing.
    `draft` (the upstream's answer text) and claim texts are recorded only with `include_text`.
    `cause`, on a failure, names the class of the foreign exception behind it (never its text).
    """
    if outcome is not None:
        computed = outcome.decision.value
        reason = outcome.reason
        claim_index = outcome.claim_index
    elif decision is not None:
        computed = decision.value if isinstance(decision, Decision) else decision
        claim_index = None
    else:
        raise ValueError("audit_event needs an outcome or a decision")
    served = computed
    if isinstance(decision, Decision | str) and outcome is not None:
        served = decision.value if isinstance(decision, Decision) else decision
    elif mode == "shadow" and outcome is not None:
        served = Decision.RELEASED.value
    problems = _problems(report)
    reasons = _reasons(problems)
    if not reasons and reason is not None:
        reasons = [reason]
    if verification_ms is None and report is not None:
        verification_ms = report.seconds * 1000.0
    fields: dict[str, object] = {
        "request_id": request_id,
        "route": route,
        "policy": policy,
        "mode": mode,
        "decision": served,
        "reason": reason,
        "claim_index": claim_index,
        "reasons": _Vetted(reasons),
        "status": status,
        "streaming": streaming,
        "context_fingerprint": report.context_fingerprint if report is not None else None,
        "claims": _Vetted(_claim(c, report.context, include_text) for c in report.claims)
        if report is not None
        else _Vetted(),
        "timings": _VettedDict(
            upstream_ms=_ms(upstream_ms),
            verification_ms=_ms(verification_ms),
            total_ms=_ms(total_ms),
        ),
    }
    if mode == "shadow":
        fields["shadow_decision"] = computed
    if cause is not None:
        fields["cause"] = cause
    if include_text and draft is not None:
        fields["draft"] = draft
    _emit("audit", fields, extra)
    return fields


def review_requested(
    *,
    request_id: str,
    route: str,
    policy: str,
    report: Report,
    include_text: bool = False,
    draft: str | None = None,
    **extra: object,
) -> dict[str, object]:
    """Emit `review_requested` for an answer held for review (Decision.REVIEW) and return its
    fields: the failing / errored claims with their reasons; their text only with
    `include_text`."""
    problems = _problems(report)
    fields: dict[str, object] = {
        "request_id": request_id,
        "route": route,
        "policy": policy,
        "claim_indices": _Vetted(c.claim.index for c in problems),
        "reasons": _Vetted(_reasons(problems)),
        "claims": _Vetted(_claim(c, report.context, include_text) for c in problems),
        "context_fingerprint": report.context_fingerprint,
    }
    if include_text and draft is not None:
        fields["draft"] = draft
    _emit("review_requested", fields, extra)
    return fields

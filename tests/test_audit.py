from __future__ import annotations

import hashlib
import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from gateway.audit import (
    REDACTED,
    Redactor,
    audit_event,
    configure_logging,
    reset_logging,
    review_requested,
)
from gateway.types import (
    Chunk,
    Citation,
    Claim,
    ClaimReport,
    ContextSet,
    Decision,
    NativeLocation,
    Outcome,
    Report,
)

DRAFT = "The Zorblax reactor output rose 73% in 2023 [doc:1]. It is run by Quentin Marsh [doc:9]."
CREDENTIAL = "Bearer sk-live-5f0c1d2e3b4a"
CHUNK_TEXT = "Zorblax reactor quarterly output rose 73 percent"
CONTEXT = ContextSet({"doc:1": Chunk("doc:1", CHUNK_TEXT, "2")})


def digest(cid: str) -> str:
    """How the audit line names an id the model invented (it names no chunk of the context)."""
    return "sha256:" + hashlib.sha256(cid.encode()).hexdigest()[:16]


def blocked_report() -> tuple[Report, Outcome]:
    c0 = Claim(0, 0, DRAFT[:53], 0, 53, citations=(Citation("doc:1", "[doc:1]", 46, 53),))
    c1 = Claim(1, 0, DRAFT[54:], 54, len(DRAFT), citations=(Citation("doc:9", "[doc:9]", 80, 87),))
    report = Report(
        claims=(
            ClaimReport(c0, "verified"),
            ClaimReport(
                c1,
                "failed",
                reason="hallucinated_citation",
                check="hallucinated_citation",
                detail="id not in context",
            ),
        ),
        context=CONTEXT,
        seconds=0.00042,
    )
    return report, Outcome(Decision.BLOCKED, reason="hallucinated_citation", claim_index=1)


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    reset_logging()


def emit_blocked(include_text: bool) -> dict[str, object]:
    report, outcome = blocked_report()
    return audit_event(
        request_id="req-1",
        route="chat",
        policy="support-bot@1234abcd",
        status=422,
        report=report,
        outcome=outcome,
        upstream_ms=812.4567,
        total_ms=815.0,
        include_text=include_text,
        draft=DRAFT,
        method="POST",
        request_headers={"Authorization": CREDENTIAL, "user-agent": "sdk/1.0"},
    )


def test_audit_event_fields() -> None:
    with capture_logs() as events:
        returned = emit_blocked(include_text=False)
    assert len(events) == 1
    e = events[0]
    assert e["event"] == "audit" and e["log_level"] == "info"
    assert e["request_id"] == "req-1"
    assert e["route"] == "chat"
    assert e["policy"] == "support-bot@1234abcd"
    assert e["mode"] == "enforce"
    assert "shadow_decision" not in e
    assert e["decision"] == "blocked"
    assert e["reason"] == "hallucinated_citation"
    assert e["claim_index"] == 1
    assert e["reasons"] == ["hallucinated_citation"]
    assert e["status"] == 422
    assert e["streaming"] is False
    assert e["context_fingerprint"] == CONTEXT.fingerprint
    assert e["claims"] == [
        {"index": 0, "verdict": "verified", "reason": None, "cited": ["doc:1"]},
        {
            "index": 1,
            "verdict": "failed",
            "reason": "hallucinated_citation",
            "cited": [digest("doc:9")],  # invented: no chunk of the context
            "check": "hallucinated_citation",
        },
    ]
    assert e["timings"] == {"upstream_ms": 812.457, "verification_ms": 0.42, "total_ms": 815.0}
    assert e["method"] == "POST"
    assert e["request_headers"] == {"Authorization": REDACTED, "user-agent": "sdk/1.0"}
    assert returned["event"] == "audit"
    assert returned["decision"] == "blocked"


def test_blocked_draft_and_credential_never_logged() -> None:
    with capture_logs() as events:
        emit_blocked(include_text=False)
        review_requested(
            request_id="req-1",
            route="chat",
            policy="p@v",
            report=blocked_report()[0],
            draft=DRAFT,
            authorization=CREDENTIAL,
        )
    dumped = json.dumps(events)
    assert events and "Zorblax" not in dumped and "Quentin" not in dumped
    assert "sk-live" not in dumped
    assert CHUNK_TEXT not in dumped
    assert "id not in context" not in dumped  # check details are gated with the text


def test_include_text_records_text_but_never_the_credential() -> None:
    with capture_logs() as events:
        emit_blocked(include_text=True)
    e = events[0]
    assert e["draft"] == DRAFT
    claims = e["claims"]
    assert isinstance(claims, list)
    assert [c["text"] for c in claims] == [DRAFT[:53], DRAFT[54:]]
    assert claims[1]["detail"] == "id not in context"
    assert "sk-live" not in json.dumps(events)


def test_shadow_mode_records_served_and_shadow_decision() -> None:
    report, outcome = blocked_report()
    with capture_logs() as events:
        audit_event(
            request_id="r",
            route="chat",
            policy="p@v",
            status=200,
            report=report,
            outcome=outcome,
            mode="shadow",
            streaming=True,
        )
    e = events[0]
    assert e["mode"] == "shadow"
    assert e["decision"] == "released"
    assert e["shadow_decision"] == "blocked"
    assert e["streaming"] is True
    assert e["reason"] == "hallucinated_citation"


def test_unverified_request_and_errored_claims() -> None:
    with capture_logs() as events:
        audit_event(
            request_id="r2",
            route="unrouted",
            policy="p@v",
            status=504,
            decision="error",
            reason="upstream_timeout",
            total_ms=30000.0,
        )
        claim = Claim(0, 0, "x", 0, 1)
        report = Report(
            (ClaimReport(claim, "errored", error_kind="timeout", check="support"),), "f"
        )
        audit_event(
            request_id="r3",
            route="kb",
            policy="p@v",
            status=200,
            report=report,
            outcome=Outcome(Decision.ABSTAINED, reason="timeout", claim_index=0),
            verification_ms=1500.0,
        )
    e, f = events
    assert e["decision"] == "error"
    assert e["reasons"] == ["upstream_timeout"]
    assert e["claims"] == [] and e["context_fingerprint"] is None
    assert e["timings"] == {"upstream_ms": None, "verification_ms": None, "total_ms": 30000.0}
    assert f["decision"] == "abstained"
    assert f["reasons"] == ["timeout"]
    assert f["claims"] == [
        {"index": 0, "verdict": "errored", "reason": "timeout", "cited": [], "check": "support"}
    ]
    assert f["timings"]["verification_ms"] == 1500.0


def test_audit_event_needs_a_decision() -> None:
    with pytest.raises(ValueError):
        audit_event(request_id="r", route="chat", policy="p@v", status=200)


def test_review_requested_event() -> None:
    report, _ = blocked_report()
    with capture_logs() as events:
        review_requested(request_id="r", route="chat", policy="p@v", report=report)
        review_requested(
            request_id="r",
            route="chat",
            policy="p@v",
            report=report,
            include_text=True,
            draft=DRAFT,
        )
    plain, texty = events
    assert plain["event"] == "review_requested"
    assert plain["claim_indices"] == [1]
    assert plain["reasons"] == ["hallucinated_citation"]
    assert plain["claims"] == [
        {
            "index": 1,
            "verdict": "failed",
            "reason": "hallucinated_citation",
            "cited": [digest("doc:9")],
            "check": "hallucinated_citation",
        }
    ]
    assert "draft" not in plain
    assert texty["draft"] == DRAFT
    assert texty["claims"][0]["text"] == DRAFT[54:]
    assert texty["claims"][0]["cited"] == ["doc:9"]  # with the text, the id as written


def test_redactor_masks_nested_headers_and_credential_keys() -> None:
    r = Redactor()
    headers = {"X-Api-Key": "k1", "Cookie": "c=1", "accept": "json"}
    event = {
        "event": "upstream_request",
        "headers": headers,
        "raw_headers": [(b"authorization", b"Bearer a"), (b"host", b"h")],
        "pairs": [("Proxy-Authorization", "Basic b"), ("x", "y")],
        "nested": {"deeper": [{"client_secret": "s", "ok": 1}], "upstream_token": "t"},
        "password": "p",
        "OPENAI_API_KEY": "sk",
        "count": 3,
    }
    out = r(None, "info", event)
    assert out == {
        "event": "upstream_request",
        "headers": {"X-Api-Key": REDACTED, "Cookie": REDACTED, "accept": "json"},
        "raw_headers": [(b"authorization", REDACTED), (b"host", b"h")],
        "pairs": [("Proxy-Authorization", REDACTED), ("x", "y")],
        "nested": {"deeper": [{"client_secret": REDACTED, "ok": 1}], "upstream_token": REDACTED},
        "password": REDACTED,
        "OPENAI_API_KEY": REDACTED,
        "count": 3,
    }
    assert headers["X-Api-Key"] == "k1"  # the caller's object is left alone


def test_redactor_as_a_capture_processor() -> None:
    with capture_logs(processors=[Redactor()]) as events:
        structlog.get_logger().info("upstream_request", headers={"authorization": CREDENTIAL})
    assert "sk-live" not in json.dumps(events)


def test_configured_output_is_redacted_json_lines() -> None:
    out = io.StringIO()
    configure_logging(stream=out, level="info")
    # Context bound by middleware reaches every event, the audit event included: redacted too.
    structlog.contextvars.bind_contextvars(
        request_id="req-9", client={"headers": [("cookie", "sid=sk-live-cookie")]}
    )
    try:
        log = structlog.get_logger()
        log.debug("noise")
        log.info("upstream_request", headers={"Authorization": CREDENTIAL}, path="/v1/x")
        emit_blocked(include_text=False)
        logging.getLogger("uvicorn.error").warning("stdlib %s", "record", extra={})
        logging.getLogger("aiohttp").info("pool %s", "ready")
    finally:
        structlog.contextvars.clear_contextvars()
    lines = out.getvalue().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events] == [
        "upstream_request",
        "audit",
        "stdlib record",
        "pool ready",
    ]
    assert all(e["request_id"] == "req-9" for e in events[:1])
    assert events[0]["headers"] == {"Authorization": REDACTED}
    assert events[0]["level"] == "info" and "timestamp" in events[0]
    assert events[1]["request_id"] == "req-1"  # the explicit field wins over the bound one
    assert events[1]["client"] == {"headers": [["cookie", REDACTED]]}
    assert events[2]["level"] == "warning" and events[2]["logger"] == "uvicorn.error"
    assert "sk-live" not in out.getvalue()
    assert "Zorblax" not in out.getvalue()


def test_include_text_through_configured_output() -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    emit_blocked(include_text=True)
    (event,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert event["draft"] == DRAFT
    assert "sk-live" not in out.getvalue()


def test_raised_level_keeps_audit_events() -> None:
    out = io.StringIO()
    configure_logging(stream=out, level="error")
    log = structlog.get_logger()
    log.info("dropped")
    log.warning("dropped too")
    log.error("kept")
    emit_blocked(include_text=False)
    logging.getLogger("x").warning("dropped stdlib")
    assert [json.loads(line)["event"] for line in out.getvalue().splitlines()] == ["kept", "audit"]


def test_reconfigure_and_reset() -> None:
    first, second = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    handlers_before = list(root.handlers)
    configure_logging(stream=first)
    configure_logging(stream=second)
    structlog.get_logger().info("once")
    logging.getLogger("y").warning("std")
    assert first.getvalue() == ""
    assert len(second.getvalue().splitlines()) == 2
    reset_logging()
    assert root.handlers == handlers_before
    with capture_logs() as events:
        structlog.get_logger().info("captured")
    assert events == [{"event": "captured", "log_level": "info"}]


def test_unknown_level_is_rejected() -> None:
    with pytest.raises(ValueError):
        configure_logging(stream=io.StringIO(), level="chatty")


class _CountingStream(io.StringIO):
    """A stream that remembers what had reached it at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        super().flush()
        self.flushed.append(self.getvalue())


async def test_events_of_one_loop_iteration_share_one_flush() -> None:
    import asyncio

    out = _CountingStream()
    configure_logging(stream=out)
    log = structlog.get_logger()
    log.info("first")
    emit_blocked(include_text=False)
    log.info("third")
    assert out.flushed == []  # written, not yet flushed: the iteration is not over
    await asyncio.sleep(0)
    assert len(out.flushed) == 1
    assert [json.loads(line)["event"] for line in out.flushed[0].splitlines()] == [
        "first",
        "audit",
        "third",
    ]
    # A stdlib record goes through the same writer: it keeps its place among the events.
    log.info("fourth")
    logging.getLogger("uvicorn.error").warning("stdlib")
    log.info("sixth")
    assert len(out.flushed) == 1
    await asyncio.sleep(0)
    assert len(out.flushed) == 2
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert events == ["first", "audit", "third", "fourth", "stdlib", "sixth"]


def test_without_a_running_loop_every_line_is_flushed() -> None:
    out = _CountingStream()
    configure_logging(stream=out)
    structlog.get_logger().info("one")
    emit_blocked(include_text=False)
    assert [len(s.splitlines()) for s in out.flushed] == [1, 2]


def test_timestamp_is_iso_utc_with_microseconds() -> None:
    import re
    from datetime import UTC, datetime, timedelta

    out = io.StringIO()
    configure_logging(stream=out)
    before = datetime.now(UTC)
    structlog.get_logger().info("stamped")
    after = datetime.now(UTC)
    stamp = json.loads(out.getvalue())["timestamp"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", stamp)
    at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    slack = timedelta(milliseconds=1)  # float rounding of the fraction, not clock skew
    assert before - slack <= at <= after + slack


def test_capture_inside_a_configured_set_up_sees_audit_events() -> None:
    """Audit events take a direct route through the configured processors; a configuration
    swapped in later (capture_logs here) must still receive them, and the stream must not."""
    out = io.StringIO()
    configure_logging(stream=out)
    with capture_logs() as events:
        emit_blocked(include_text=False)
    assert [e["event"] for e in events] == ["audit"]
    assert out.getvalue() == ""
    emit_blocked(include_text=False)  # back on the configured route
    (line,) = out.getvalue().splitlines()
    event = json.loads(line)
    assert event["event"] == "audit" and event["level"] == "info"
    assert list(event)[-3:] == ["event", "level", "timestamp"]  # structlog's key order


async def test_a_pipe_gets_whole_lines_in_writes_no_longer_than_pipe_buf() -> None:
    """Worker processes share stdout (a pipe under Kubernetes): each write holds whole lines
    and, unless one line alone is longer, at most PIPE_BUF bytes, so lines never interleave."""
    import asyncio
    import os

    class RecordingPipe(io.RawIOBase):
        """The write end of a real pipe that remembers the size of every write."""

        def __init__(self, fd: int) -> None:
            self.fd = fd
            self.writes: list[bytes] = []

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            chunk = bytes(data)
            self.writes.append(chunk)
            return os.write(self.fd, chunk)

    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    raw = RecordingPipe(write_fd)
    stream = io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
    configure_logging(stream=stream)
    log = structlog.get_logger()
    for i in range(40):
        log.info("line", i=i, pad="x" * 300)
    log.info("long", pad="y" * 6000)
    await asyncio.sleep(0)
    reset_logging()
    received = b""
    while True:
        try:
            data = os.read(read_fd, 65536)
        except BlockingIOError:
            break
        received += data
    os.close(read_fd)
    os.close(write_fd)
    events = [json.loads(line) for line in received.decode().splitlines()]
    assert [e.get("i") for e in events] == [*range(40), None]
    assert 2 <= len(raw.writes) < 41  # batched: far fewer writes than lines
    assert all(w.endswith(b"\n") for w in raw.writes)  # whole lines only
    assert all(len(w) <= 4096 for w in raw.writes[:-1]) and len(raw.writes[-1]) > 6000


def test_lines_pending_when_the_interpreter_exits_are_written() -> None:
    """A line logged in a loop's last iteration waits for a flush callback that never runs;
    the exit hook writes it."""
    import subprocess
    import sys

    code = (
        "import asyncio, structlog\n"
        "from gateway.audit import configure_logging\n"
        "configure_logging()\n"
        "async def main():\n"
        "    asyncio.get_running_loop().stop()  # this iteration is the loop's last\n"
        "    structlog.get_logger().info('last words')  # its flush would run in the next\n"
        "loop = asyncio.new_event_loop()\n"
        "loop.create_task(main())\n"
        "loop.run_forever()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["event"] for line in out.stdout.splitlines()] == ["last words"]


def test_a_malformed_or_spaced_citation_id_is_not_logged() -> None:
    """A citation id is written by the model: in `[<a sentence>, kb:1]` the part without a
    colon is a malformed citation whose id is the sentence, and a `regex` format's id group
    may hold spaces. A malformed id is `null`; a well-formed one that names no chunk of the
    context is a digest (draft text never is logged, DESIGN §8); one per citation, so counts
    still add up."""
    prose = "The pump was secretly designed by ZQXMARKER in 1931"
    claim = Claim(0, 0, f"It was built [{prose}, kb:1].", 0, 70, citations=(
        Citation(prose, prose, 13, 60, malformed="a half without a colon"),
        Citation("kb:1", "kb:1", 62, 66),
        Citation("kb 1 by ZQXMARKER", "kb 1 by ZQXMARKER"),
    ))
    ctx = ContextSet({"kb:1": Chunk("kb:1", "The pump is blue.")})
    report = Report((ClaimReport(claim, "failed", reason="malformed_citation"),), ctx)
    with capture_logs() as events:
        audit_event(request_id="r", route="chat", policy="p@1", status=422, report=report,
                    outcome=Outcome(Decision.BLOCKED, "malformed_citation", 0),
                    include_text=False)
        review_requested(request_id="r", route="chat", policy="p@1", report=report)
    assert [e["claims"][0]["cited"] for e in events] == [
        [None, "kb:1", digest("kb 1 by ZQXMARKER")]
    ] * 2
    assert "ZQXMARKER" not in json.dumps(events)


INVENTED = "kb:The_Orbit_pump_was_designed_by_ZQXMARKER_in_1931"


def _cited(context: ContextSet | str, include_text: bool) -> list[object]:
    native = NativeLocation("char_location", "The pump is blue.", document_index=3)
    claim = Claim(0, 0, f"The pump is blue [kb:1][{INVENTED}].", 0, 80, citations=(
        Citation("kb:1", "kb:1"),
        Citation(INVENTED, INVENTED),
        Citation("document:3", "document:3", native=native),
    ))
    report = Report((ClaimReport(claim, "failed", reason="hallucinated_citation"),), context)
    with capture_logs() as events:
        audit_event(request_id="r", route="chat", policy="p@1", status=422, report=report,
                    outcome=Outcome(Decision.BLOCKED, "hallucinated_citation", 0),
                    include_text=include_text)
        review_requested(request_id="r", route="chat", policy="p@1", report=report,
                         include_text=include_text)
    audit, review = (e["claims"][0]["cited"] for e in events)
    assert audit == review
    assert isinstance(audit, list)
    return audit


def test_an_invented_citation_id_is_logged_as_a_digest() -> None:
    """An id written with underscores is well formed and spaceless, yet the model wrote it: it
    may be a sentence. Only an id that names a chunk of the request's context is logged as it
    is; an invented one is `sha256:` and 16 hex digits of its digest, so repeats can still be
    counted. A native citation's id is the gateway's own `document:<index>`, never model text.
    """
    ctx = ContextSet({"kb:1": Chunk("kb:1", "The pump is blue.")})
    assert _cited(ctx, include_text=False) == ["kb:1", digest(INVENTED), "document:3"]
    # Only a fingerprint of the context: no id can be shown to name a chunk.
    assert _cited(ctx.fingerprint, include_text=False) == [
        digest("kb:1"), digest(INVENTED), "document:3"
    ]


def test_with_include_text_an_invented_citation_id_is_logged_as_written() -> None:
    ctx = ContextSet({"kb:1": Chunk("kb:1", "The pump is blue.")})
    assert _cited(ctx, include_text=True) == ["kb:1", INVENTED, "document:3"]

"""Metrics and audit events after real requests through a running gateway.

Requests go through the proxy port with httpx or the real SDKs; `/metrics` is scraped over HTTP
from the admin port, and audit events are captured with `structlog.testing.capture_logs()` (the
gateway serves from a thread, and structlog's configuration is process-wide, so capture sees
its events) or read back as the JSON lines the production log set-up writes.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from gateway import audit
from tests.gateway_harness import Gateway, run_gateway, write_policy
from tests.upstream_app import (
    FakeUpstream,
    Html,
    Json,
    Slow,
    Stream,
    anthropic_body,
    create_upstream,
    openai_body,
    openai_sse,
    serve,
)

CONTEXT = (
    '<chunk id="bat:1" version="3">The Voltra pack stores 62.5 kWh and weighs 410 kg.</chunk>\n'
    '<chunk id="bat:2" version="1">Charging from 10% to 80% takes 28 minutes on a 150 kW '
    "charger.</chunk>"
)
CHUNK_ONLY_TEXT = "on a 150 kW charger"  # in the context, never in an answer
GOOD = "The Voltra pack stores 62.5 kWh [bat:1]. Charging from 10% to 80% takes 28 minutes [bat:2]."
BAD_CLAIM = "The pack is assembled on the Moon by volunteers"
MIXED = f"The Voltra pack stores 62.5 kWh [bat:1]. {BAD_CLAIM} [bat:9]. It weighs 410 kg [bat:1]."
INVENTED = "sha256:" + hashlib.sha256(b"bat:9").hexdigest()[:16]  # as the audit line names it
SECRET = "sk-secret-123"
AUTH = {"authorization": f"Bearer {SECRET}"}
REVIEW_TEMPLATE = "Held back: a reviewer from the trust team will look at this answer."

# Usage the upstream reports per scenario (prompt, completion): distinct so sums identify them.
USAGE = {"good": (11, 7), "mixed": (13, 5), "stream": (17, 3)}

REVIEW_POLICY = f"""\
name: review-bot
routes:
  - name: chat
    match: {{path: /v1/chat/completions}}
    protocol: openai-chat
  - name: messages
    match: {{path: /v1/messages}}
    protocol: anthropic-messages
citations: {{format: doc-chunk}}
checks: [missing_citation, malformed_citation, hallucinated_citation, quote_mismatch]
release:
  on_unverified: review
  templates: {{review_required: "{REVIEW_TEMPLATE}"}}
"""

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


def _upstream() -> FakeUpstream:
    up = create_upstream()
    up.on("good", Json(openai_body(GOOD, usage=USAGE["good"])))
    up.on("mixed", Json(openai_body(MIXED, usage=USAGE["mixed"])))
    frames = openai_sse(GOOD, chunk_size=5, include_usage=True, usage=USAGE["stream"])
    up.on("stream", Stream(frames, seed=3))
    up.on("html", Html(500, "<html><body>Internal Server Error</body></html>"))
    up.on("slow", Slow(5.0, Json(openai_body(GOOD))))
    up.on("claude-draft", Json(anthropic_body(MIXED)))
    up.default = Json({"object": "list", "data": [{"id": "m", "object": "model"}]})
    return up


@pytest.fixture(scope="module")
def upstream_url() -> Iterator[str]:
    with serve(_upstream()) as url:
        yield url


@pytest.fixture(scope="module")
def block(upstream_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    policy = write_policy(tmp_path_factory.mktemp("block"), name="ops-block")
    with run_gateway(upstream_url, [policy], read_timeout=0.5) as gw:
        yield gw


@pytest.fixture(scope="module")
def strip(upstream_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    policy = write_policy(
        tmp_path_factory.mktemp("strip"), name="ops-strip", on_unverified="strip", include_text=True
    )
    with run_gateway(upstream_url, [policy], read_timeout=0.5) as gw:
        yield gw


@pytest.fixture(scope="module")
def review(upstream_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    path = tmp_path_factory.mktemp("review") / "review.yaml"
    path.write_text(REVIEW_POLICY, encoding="utf-8")
    with run_gateway(upstream_url, [path], read_timeout=0.5) as gw:
        yield gw


def chat(
    gw: Gateway,
    key: str,
    *,
    stream: bool = False,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    body: dict[str, Any] = {
        "model": "fake-model",
        "messages": [{"role": "system", "content": CONTEXT}, {"role": "user", "content": key}],
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return httpx.post(
        f"{gw.url}/v1/chat/completions", json=body, headers={**AUTH, **(headers or {})}, timeout=10
    )


def scrape(gw: Gateway) -> Samples:
    r = httpx.get(f"{gw.admin_url}/metrics", timeout=5)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    """The gateway accounts for a request just after its last byte is sent: wait for it."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def scrape_after(gw: Gateway, before: Samples, requests: int, route: str = "chat") -> Samples:
    """Scrape once `requests` more requests on `route` have been counted."""

    def total(s: Samples) -> float:
        return sum(
            v
            for (name, labels), v in s.items()
            if name == "citewarden_requests_total" and ("route", route) in labels
        )

    latest: list[Samples] = [before]

    def done() -> bool:
        latest[0] = scrape(gw)
        return total(latest[0]) - total(before) >= requests

    eventually(done)
    return latest[0]


def audits(
    logs: Sequence[Mapping[str, Any]], request_id: str, event: str = "audit"
) -> list[Mapping[str, Any]]:
    return [e for e in logs if e.get("event") == event and e.get("request_id") == request_id]


def wait_for_audits(logs: Sequence[Mapping[str, Any]], request_ids: list[str]) -> None:
    eventually(lambda: all(audits(logs, rid) for rid in request_ids))


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def test_requests_claims_timings_and_tokens_move_per_outcome(block: Gateway) -> None:
    before = scrape(block)
    released = chat(block, "good")
    blocked = chat(block, "mixed")
    streamed = chat(block, "stream", stream=True)
    html = chat(block, "html")
    slow = chat(block, "slow")
    assert [r.status_code for r in (released, blocked, streamed, html, slow)] == [
        200,
        422,
        200,
        500,
        504,
    ]
    assert released.headers["x-citewarden-decision"] == "released"
    assert blocked.headers["x-citewarden-decision"] == "blocked"
    assert streamed.headers["x-citewarden-decision"] == "released"
    after = scrape_after(block, before, 5)

    def requests(decision: str) -> float:
        return delta(before, after, "citewarden_requests_total", route="chat", decision=decision)

    assert requests("released") == 2  # one JSON, one stream
    assert requests("blocked") == 1
    assert requests("error") == 2  # upstream 500 and upstream timeout
    assert requests("partial") == requests("abstained") == requests("review") == 0

    def claims(verdict: str) -> float:
        return delta(before, after, "citewarden_claims_total", route="chat", verdict=verdict)

    # good: 2 verified; mixed: 2 verified + 1 failed; stream: 2 verified. Errors verify nothing.
    assert claims("verified") == 6
    assert claims("failed") == 1
    assert claims("errored") == claims("exempt") == 0
    assert (
        delta(
            before,
            after,
            "citewarden_check_failures_total",
            route="chat",
            reason="hallucinated_citation",
        )
        == 1
    )
    assert delta(before, after, "citewarden_verification_seconds_count", route="chat") == 3
    assert delta(before, after, "citewarden_verification_seconds_sum", route="chat") > 0
    assert delta(before, after, "citewarden_upstream_seconds_count", route="chat") == 5
    # The timed-out call alone waited the 0.5 s read timeout.
    assert delta(before, after, "citewarden_upstream_seconds_sum", route="chat") >= 0.5
    for name in ("citewarden_request_seconds_count", "citewarden_first_byte_seconds_count"):
        assert delta(before, after, name, route="chat", streaming="true") == 1
        assert delta(before, after, name, route="chat", streaming="false") == 4
    assert (
        delta(before, after, "citewarden_request_seconds_sum", route="chat", streaming="true") > 0
    )
    assert value(after, "citewarden_inflight_requests", route="chat") == 0, (
        "in-flight gauge must return to zero"
    )

    def tokens(outcome: str, kind: str) -> float:
        return delta(
            before,
            after,
            "citewarden_upstream_tokens_total",
            route="chat",
            outcome=outcome,
            kind=kind,
        )

    # Served: the released JSON answer and the released stream; withheld: the blocked answer.
    assert tokens("served", "input") == USAGE["good"][0] + USAGE["stream"][0]
    assert tokens("served", "output") == USAGE["good"][1] + USAGE["stream"][1]
    assert tokens("withheld", "input") == USAGE["mixed"][0]
    assert tokens("withheld", "output") == USAGE["mixed"][1]

    label = released.headers["x-citewarden-policy"]
    name, short = label.split("@")
    info = {
        labels: v for (metric, labels), v in after.items() if metric == "citewarden_policy_info"
    }
    assert len(info) == 1
    ((labels, one),) = info.items()
    assert one == 1
    assert dict(labels)["name"] == name == "ops-block"
    assert dict(labels)["version"].startswith(short)


def test_partial_answer_is_counted_and_its_tokens_served(strip: Gateway) -> None:
    before = scrape(strip)
    r = chat(strip, "mixed")
    assert r.status_code == 200
    assert r.headers["x-citewarden-decision"] == "partial"
    assert BAD_CLAIM not in r.json()["choices"][0]["message"]["content"]
    after = scrape_after(strip, before, 1)
    assert delta(before, after, "citewarden_requests_total", route="chat", decision="partial") == 1
    assert delta(before, after, "citewarden_claims_total", route="chat", verdict="verified") == 2
    assert delta(before, after, "citewarden_claims_total", route="chat", verdict="failed") == 1
    assert (
        delta(
            before,
            after,
            "citewarden_upstream_tokens_total",
            route="chat",
            outcome="served",
            kind="output",
        )
        == USAGE["mixed"][1]
    )
    assert (
        delta(
            before,
            after,
            "citewarden_upstream_tokens_total",
            route="chat",
            outcome="withheld",
            kind="output",
        )
        == 0
    )


def test_metrics_and_probes_live_on_the_admin_port_only(block: Gateway) -> None:
    on_proxy = httpx.get(f"{block.url}/metrics", timeout=5)
    assert on_proxy.status_code == 404
    assert "citewarden_" not in on_proxy.text
    for path in ("/healthz", "/readyz"):
        assert httpx.get(f"{block.url}{path}", timeout=5).status_code == 404
        assert httpx.get(f"{block.admin_url}{path}", timeout=5).status_code == 200
    ready = httpx.get(f"{block.admin_url}/readyz", timeout=5).json()
    assert ready["policies"] == [p.label for p in block.store.current.policies]


def test_labels_stay_bounded_for_unrouted_paths_and_tenants(block: Gateway) -> None:
    token = uuid.uuid4().hex
    before = scrape(block)
    for method in ("GET", "POST"):
        r = httpx.request(
            method,
            f"{block.url}/zz-{token}/v1/chat/completions",
            headers={"x-tenant": f"tenant-{token}", **AUTH},
            json={"model": "m"},
            timeout=5,
        )
        assert r.status_code == 404
    r = chat(block, "good", headers={"x-tenant": f"tenant-{token}"})
    assert r.status_code == 200
    after = scrape_after(block, before, 1)
    label_values = {v for (_, labels) in after for _, v in labels}
    assert not [v for v in label_values if token in v]
    routes = {v for (_, labels) in after for k, v in labels if k == "route"}
    assert routes <= {"chat", "messages", "kb", "passthrough", "unrouted", "other"}


def test_passthrough_and_refused_requests_are_counted_and_audited(block: Gateway) -> None:
    before = scrape(block)
    with capture_logs() as logs:
        passed = httpx.get(f"{block.url}/v1/models", headers=AUTH, timeout=5)
        refused = httpx.get(f"{block.url}/v1/embeddings", headers=AUTH, timeout=5)
        upgrade = httpx.get(
            f"{block.url}/v1/models",
            headers={"upgrade": "websocket", "connection": "upgrade", **AUTH},
            timeout=5,
        )
        assert (passed.status_code, refused.status_code, upgrade.status_code) == (200, 404, 403)
        ids = [r.headers["x-request-id"] for r in (passed, refused, upgrade)]
        wait_for_audits(logs, ids)
    after = scrape_after(block, before, 1, route="passthrough")
    assert delta(before, after, "citewarden_requests_total", route="passthrough",
                 decision="passthrough") == 1
    eventually(lambda: delta(before, scrape(block), "citewarden_requests_total",
                             route="unrouted", decision="refused") == 2)
    decisions = [audits(logs, rid)[0]["decision"] for rid in ids]
    assert decisions == ["passthrough", "refused", "refused"]
    assert [audits(logs, rid)[0]["reason"] for rid in ids[1:]] == ["no_route", "websocket"]
    assert "sk-secret" not in json.dumps(list(logs), default=str)


# --------------------------------------------------------------------------------------------
# Audit events
# --------------------------------------------------------------------------------------------


def test_one_audit_event_per_request_with_its_fields(block: Gateway) -> None:
    chosen_id = f"req-{uuid.uuid4().hex[:12]}"
    with capture_logs() as logs:
        released = chat(block, "good", headers={"x-request-id": chosen_id})
        blocked = chat(block, "mixed")
        streamed = chat(block, "stream", stream=True)
        failed = chat(block, "html")
        responses = [released, blocked, streamed, failed]
        ids = [r.headers["x-request-id"] for r in responses]
        wait_for_audits(logs, ids)
    assert ids[0] == chosen_id
    assert len(set(ids)) == 4
    for rid in ids:
        assert len(audits(logs, rid)) == 1, rid
    label = released.headers["x-citewarden-policy"]

    ev = audits(logs, ids[0])[0]
    assert ev["route"] == "chat"
    assert ev["policy"] == label
    assert ev["decision"] == "released"
    assert ev["status"] == 200
    assert ev["streaming"] is False
    assert ev["reasons"] == []
    assert [(c["verdict"], c["cited"]) for c in ev["claims"]] == [
        ("verified", ["bat:1"]),
        ("verified", ["bat:2"]),
    ]
    assert isinstance(ev["context_fingerprint"], str) and len(ev["context_fingerprint"]) >= 16
    timings = ev["timings"]
    assert timings["total_ms"] >= timings["upstream_ms"] > 0
    assert timings["verification_ms"] > 0

    ev = audits(logs, ids[1])[0]
    assert ev["decision"] == "blocked"
    assert ev["status"] == 422
    assert ev["reasons"] == ["hallucinated_citation"]
    assert ev["claim_index"] == 1 == blocked.json()["citewarden"]["claim_index"]
    assert [(c["index"], c["verdict"], c["cited"]) for c in ev["claims"]] == [
        (0, "verified", ["bat:1"]),
        (1, "failed", [INVENTED]),  # an id no chunk has: logged as a digest
        (2, "verified", ["bat:1"]),
    ]
    assert ev["claims"][1]["reason"] == "hallucinated_citation"
    # Same context, same fingerprint.
    assert ev["context_fingerprint"] == audits(logs, ids[0])[0]["context_fingerprint"]

    ev = audits(logs, ids[2])[0]
    assert ev["decision"] == "released"
    assert ev["streaming"] is True
    assert [c["cited"] for c in ev["claims"]] == [["bat:1"], ["bat:2"]]

    ev = audits(logs, ids[3])[0]
    assert ev["decision"] == "error"
    assert ev["status"] == 500
    assert ev["claims"] == []
    assert ev["policy"] == label


def test_blocked_draft_and_credentials_appear_in_no_event(block: Gateway) -> None:
    with capture_logs() as logs:
        blocked = chat(block, "mixed")
        streamed = chat(block, "stream", stream=True)
        wait_for_audits(logs, [r.headers["x-request-id"] for r in (blocked, streamed)])
    assert blocked.status_code == 422
    assert BAD_CLAIM not in blocked.text
    dumped = json.dumps(logs, default=str)
    assert "hallucinated_citation" in dumped  # the events are there ...
    for secret in (SECRET, BAD_CLAIM, "Voltra", "It weighs 410 kg", CHUNK_ONLY_TEXT):
        assert secret not in dumped, secret  # ... the draft, the chunks and the key are not


def test_production_json_log_lines_hold_no_draft_or_credential(block: Gateway) -> None:
    """The JSON lines the gateway writes on stdout, stdlib records (uvicorn, aiohttp) included."""
    sink = io.StringIO()
    audit.configure_logging(sink, level="debug")
    try:
        blocked = chat(block, "mixed")
        rid = blocked.headers["x-request-id"]
        # The request id also shows in httpx's debug records: wait for the audit line itself.
        eventually(
            lambda: any(
                e.get("event") == "audit" and e.get("request_id") == rid
                for e in (json.loads(line) for line in sink.getvalue().splitlines() if line)
            )
        )
    finally:
        audit.reset_logging()
    lines = [json.loads(line) for line in sink.getvalue().splitlines() if line.strip()]
    matching = [e for e in lines if e.get("event") == "audit" and e.get("request_id") == rid]
    assert len(matching) == 1
    assert matching[0]["decision"] == "blocked"
    assert matching[0]["level"] == "info"
    text = sink.getvalue()
    for secret in (SECRET, BAD_CLAIM, "Voltra", CHUNK_ONLY_TEXT):
        assert secret not in text, secret


def test_include_text_logs_claim_text_but_never_the_credential(strip: Gateway) -> None:
    with capture_logs() as logs:
        r = chat(strip, "mixed")
        rid = r.headers["x-request-id"]
        wait_for_audits(logs, [rid])
    (ev,) = audits(logs, rid)
    assert ev["decision"] == "partial"
    texts = [c["text"] for c in ev["claims"]]
    assert any(BAD_CLAIM in t for t in texts)
    assert any("It weighs 410 kg" in t for t in texts)
    assert SECRET not in json.dumps(logs, default=str)


def test_review_emits_review_requested_and_answers_with_the_template(review: Gateway) -> None:
    with capture_logs() as logs:
        oa = openai.OpenAI(base_url=f"{review.url}/v1", api_key=SECRET, max_retries=0)
        an = anthropic.Anthropic(base_url=review.url, api_key=SECRET, max_retries=0)
        try:
            raw = oa.chat.completions.with_raw_response.create(
                model="fake-model",
                messages=[
                    {"role": "system", "content": CONTEXT},
                    {"role": "user", "content": "mixed"},
                ],
            )
            araw = an.messages.with_raw_response.create(
                model="claude-fake",
                max_tokens=100,
                system=CONTEXT,
                messages=[{"role": "user", "content": "claude-draft"}],
            )
        finally:
            oa.close()
            an.close()
        completion, message = raw.parse(), araw.parse()
        ids = [raw.headers["x-request-id"], araw.headers["x-request-id"]]
        eventually(lambda: all(audits(logs, rid, "review_requested") for rid in ids))
        wait_for_audits(logs, ids)

    assert raw.headers["x-citewarden-decision"] == "review"
    assert completion.choices[0].message.content == REVIEW_TEMPLATE
    assert completion.choices[0].finish_reason == "stop"
    assert araw.headers["x-citewarden-decision"] == "review"
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == REVIEW_TEMPLATE  # type: ignore[union-attr]

    for rid, route in zip(ids, ("chat", "messages"), strict=True):
        (req,) = audits(logs, rid, "review_requested")
        assert req["route"] == route
        assert req["policy"].startswith("review-bot@")
        assert req["claim_indices"] == [1]
        assert req["reasons"] == ["hallucinated_citation"]
        assert [c["cited"] for c in req["claims"]] == [[INVENTED]]
        (ev,) = audits(logs, rid)
        assert ev["decision"] == "review"
        assert ev["context_fingerprint"] == req["context_fingerprint"]
    dumped = json.dumps(logs, default=str)
    assert SECRET not in dumped
    assert BAD_CLAIM not in dumped

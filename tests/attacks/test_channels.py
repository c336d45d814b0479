"""Every field, frame, header and error body an upstream can put a marker in, per protocol and
streaming mode (DESIGN §2, §7): the marker must never reach the client, on any byte of the
response. Ambiguous or broken upstream answers (duplicate keys, unparseable bodies) fail closed.
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from tests.attacks.conftest import run_case
from tests.attacks.harness import (
    MARKER,
    GatewayProcess,
    RawResponse,
    assert_no_leak,
    eventstream_messages,
    leaks,
    parse_response,
)
from tests.attacks.protocols import (
    GOOD,
    HTML_ERRORS,
    QUESTION,
    REGISTRY,
    Mode,
    Plant,
    ProtocolSpec,
    error_behaviour,
    generic_plants,
)
from tests.upstream_app import FakeUpstream, Gzip, Json, sse_events


def _cases() -> list[Any]:
    out = []
    for spec in REGISTRY.values():
        plants = {**spec.plants, **generic_plants(spec)}
        for name, plant in plants.items():
            for mode in spec.modes:
                if (plant.json if mode == "json" else plant.stream) is None:
                    continue
                out.append(pytest.param(spec, mode, name, plant, id=f"{spec.name}-{mode}-{name}"))
    return out


def _clean_end(spec: ProtocolSpec, resp: RawResponse) -> bool:
    if spec.name == "bedrock-converse":  # a binary event-stream, not SSE
        kinds = [h.get(":event-type") or h.get(":message-type") for h, _ in
                 eventstream_messages(resp.body)]
        return "messageStop" in kinds and not {"exception", "error"} & set(kinds)
    events = sse_events(resp.body)
    if spec.name == "openai-chat":
        return any(data.strip() == "[DONE]" for _, data in events)
    if spec.name == "anthropic-messages":
        return any(name == "message_stop" for name, _ in events)
    if spec.name == "cohere-chat":
        return any(name == "message-end" and '"ERROR"' not in data for name, data in events)
    if spec.name == "openai-responses":
        names = {name for name, _ in events}
        return bool(names & {"response.completed", "response.incomplete"}) and not (
            names & {"error", "response.failed"}
        )
    if spec.name == "gemini":  # no terminal event: a clean end is one without an error chunk
        return resp.status < 300 and not any('"error"' in data[:12] for _, data in events)
    return resp.status < 300


def assert_failed_closed(spec: ProtocolSpec, mode: Mode, resp: RawResponse) -> None:
    """Nothing of the answer was released: a 502 in the protocol's error envelope, or (a
    progressive stream whose head went out already) no clean end of stream."""
    if mode == "progressive" and resp.status == 200:
        assert not _clean_end(spec, resp), f"a clean end after a fail-closed answer: {resp.raw!r}"
        return
    assert resp.status == 502, f"expected 502, got {resp.status_line}: {resp.body[:500]!r}"
    body = resp.json()
    assert isinstance(body, dict)
    assert "error" in body or "message" in body, body


@pytest.mark.parametrize(("spec", "mode", "name", "plant"), _cases())
def test_planted_marker_never_reaches_the_client(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
    plant: Plant,
) -> None:
    behaviour = error_behaviour(plant, mode) if plant.status != 200 else plant.behaviour(mode)
    assert behaviour is not None
    request = spec.request(QUESTION, mode != "json")
    if plant.request is not None:
        request = plant.request(request)
    resp = run_case(gateway, upstream, spec, mode, behaviour, request=request, path=plant.path)
    assert resp.decode_error is None, resp.decode_error
    if plant.status == 500:
        # The upstream's own 500 is relayed (DESIGN §7), its body replaced by the envelope.
        assert resp.status != 500 or "error" in resp.json() or "message" in resp.json()
    else:
        assert resp.status != 500, f"a bare 500: {resp.raw[:1000]!r}"
    assert_no_leak(resp)
    if plant.fail_closed:
        assert_failed_closed(spec, mode, resp)


def _non_envelope_cases() -> list[Any]:
    return [
        pytest.param(spec, mode, name, id=f"{spec.name}-{mode}-{name}")
        for spec in REGISTRY.values()
        for mode in spec.mode_free
        for name in HTML_ERRORS
    ]


@pytest.mark.parametrize(("spec", "mode", "name"), _non_envelope_cases())
def test_foreign_error_bodies_are_replaced(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    resp = run_case(gateway, upstream, spec, mode, HTML_ERRORS[name])
    assert_no_leak(resp)
    assert resp.status >= 400
    assert "json" in (resp.header("content-type") or ""), resp.headers


def _four_xx_cases() -> list[Any]:
    return [
        pytest.param(spec, mode, id=f"{spec.name}-{mode}")
        for spec in REGISTRY.values()
        for mode in spec.modes
    ]


@pytest.mark.parametrize(("spec", "mode"), _four_xx_cases())
def test_4xx_error_message_is_relayed_capped(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: ProtocolSpec, mode: Mode
) -> None:
    """DESIGN §7: a 4xx envelope's message is the one place upstream text reaches the client
    unverified, by design; it is capped at 512 characters and keeps the envelope's shape."""
    message = f"{MARKER} bad request " + "x" * 3000
    resp = run_case(gateway, upstream, spec, mode, Json(spec.error_envelope(message), status=400))
    assert resp.status == 400, resp.status_line
    body = resp.json()
    relayed = _error_message(body)
    assert relayed is not None, body
    assert relayed.startswith(MARKER), relayed[:100]
    assert len(relayed) <= 512, len(relayed)
    assert len(resp.body) < 2048, len(resp.body)


def _error_message(body: Any) -> str | None:
    if not isinstance(body, dict):
        return None
    err = body.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    msg = body.get("message")
    return str(msg) if isinstance(msg, str) else None


@pytest.mark.parametrize(
    ("spec", "mode"),
    [pytest.param(s, m, id=f"{s.name}-{m}") for s in REGISTRY.values() for m in s.modes],
)
def test_good_answer_is_released(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream], spec: ProtocolSpec, mode: Mode
) -> None:
    """The positive control: the matrix's gateway, policy and builders release a good answer."""
    behaviour = spec.good(GOOD).behaviour(mode)
    assert behaviour is not None
    resp = run_case(gateway, upstream, spec, mode, behaviour)
    assert resp.status == 200, resp.raw[:1000]
    assert resp.header("x-citewarden-decision") in ("released", "progressive"), resp.headers
    assert "40 litres per minute" in spec.answer_text(resp)
    assert not leaks(resp)


def test_scanner_sees_a_marker_through_passthrough(
    gateway: GatewayProcess, upstream: tuple[str, FakeUpstream]
) -> None:
    """The scan is not blind: a passthrough answer (not verified by design) carrying the marker
    in gzip'd JSON, as a \\u escape, is found."""
    _, up = upstream
    escaped = "".join(f"\\u{ord(c):04x}" for c in MARKER)
    up.on("passthrough-marker", Gzip(Json(('{"data": "' + escaped + '"}').encode())))
    resp = gateway.send("GET", "/v1/models", headers=[("x-test-scenario", "passthrough-marker")])
    assert resp.status == 200, resp.raw[:500]
    assert "a JSON string" in leaks(resp)


def test_scanner_undoes_chunking_and_compression() -> None:
    payload = gzip.compress(json.dumps({"x": MARKER.lower()}).encode())
    chunked = b"".join(
        f"{len(payload[i : i + 7]):x}\r\n".encode() + payload[i : i + 7] + b"\r\n"
        for i in range(0, len(payload), 7)
    )
    raw = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-encoding: gzip\r\n\r\n"
        + chunked
        + b"0\r\n\r\n"
    )
    resp = parse_response(raw)
    assert resp.decode_error is None
    assert MARKER.encode() not in raw.upper()
    assert leaks(resp) == ["decoded body", "a JSON string", "a streamed text"]
    with pytest.raises(AssertionError):
        assert_no_leak(resp)


def test_scanner_joins_a_marker_cut_across_stream_frames() -> None:
    frames = b"".join(
        b"data: " + json.dumps({"choices": [{"delta": {"content": piece}}]}).encode() + b"\n\n"
        for piece in ("The pump by ZQ", "XMAR", "KER moves water.")
    )
    raw = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(frames) + frames
    assert leaks(parse_response(raw)) == ["a streamed text"]

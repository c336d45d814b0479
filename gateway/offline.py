"""`citewarden verify`: judge one captured exchange exactly as the proxy would.

Exit 0 when the answer would be released unchanged (the upstream's bytes), 1 for anything
else (partial, abstained, blocked, review, or released with a withheld field), 2 for bad input.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from gateway.errors import InputError, ProtocolError, map_exception
from gateway.framing import SSE_CODEC
from gateway.pipeline import Judgement, RoutePipeline, claim_views
from gateway.policy import LoadedPolicy, PolicySet, Route, load_policy
from gateway.protocols import ADAPTERS
from gateway.protocols.fields import loads_unique
from gateway.stream import ProgressiveRelease, StreamVerifier
from gateway.types import Answer, ContextSet
from gateway.upstream import verified_response_headers

REQUEST_ID = "offline"
# What the proxy answers to an upstream body it cannot use on a verified route (DESIGN §7).
REFUSED = "the proxy answers 502"


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror or e}") from None


def _json(data: bytes, what: str, path: str, refusal: str) -> dict[str, Any]:
    """`data` read by the proxy's own JSON reader (`loads_unique`: no BOM, NaN or lone
    surrogate, a repeated key refused, an integer beyond 64 bits read as orjson reads it), so
    a body the proxy refuses is refused here, with what the proxy answers (`refusal`)."""
    try:
        value = loads_unique(data)
    except ProtocolError as e:
        raise InputError(f"{what} {path} is not valid JSON ({refusal}): {e}") from None
    if not isinstance(value, dict):
        raise InputError(f"{what} {path} must be a JSON object ({refusal})")
    return value


def _headers(path: str) -> list[tuple[str, str]]:
    """The upstream's response headers from a file of `name: value` lines, as `curl -D` writes
    them: a status line starts the headers of another response (the last one counts)."""
    out: list[tuple[str, str]] = []
    text = _read(path, "response headers").decode("latin-1")
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("HTTP/"):
            out = []
            continue
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        if not sep or not name.strip() or name != name.strip():
            raise InputError(f"{path}:{n}: not a header line (name: value)")
        out.append((name.lower(), value.strip(" \t")))
    return out


def _pick_route(
    loaded: LoadedPolicy, protocol: str, name: str | None, path: str | None
) -> Route:
    routes = list(loaded.policy.routes)
    if name is not None:
        for r in routes:
            if r.name == name:
                if r.protocol != protocol:
                    raise InputError(f"route {name!r} is {r.protocol}, not {protocol}")
                return r
        raise InputError(f"the policy has no route named {name!r}")
    if path is not None:  # the route the proxy takes for this path (no header conditions)
        found = PolicySet([loaded]).match("POST", path.split("?", 1)[0], {})
        if found is None:
            raise InputError(f"no route of the policy matches {path}")
        route = found[1]
        if route.protocol != protocol:
            raise InputError(f"{path} takes route {route.name!r}, which is {route.protocol}")
        return route
    for r in routes:
        if r.protocol == protocol:
            return r
    raise InputError(f"the policy has no {protocol} route; name one with --route")


def _looks_like_stream(path: str, data: bytes, pipeline: RoutePipeline) -> bool:
    """A capture the request does not classify: an `.sse` file, text that starts as SSE does,
    or (Bedrock) a binary event stream, never a JSON object."""
    if path.endswith(".sse"):
        return True
    head = data.lstrip()[:16]
    if head.startswith((b"data:", b"event:", b":", b"id:")):
        return True
    return pipeline.codec is not SSE_CODEC and not head.startswith(b"{")


def verify_exchange(
    *,
    policy_path: str,
    protocol: str,
    request_path: str,
    response_path: str,
    route_name: str | None,
    out: TextIO,
    err: TextIO | None = None,
    fmt: str = "json",
    path: str | None = None,
    response_headers_path: str | None = None,
) -> int:
    try:
        return _verify(
            policy_path, protocol, request_path, response_path, route_name, out, fmt,
            path, response_headers_path,
        )
    except InputError as e:
        # sys.stderr as it is now, not as it was at import (a test may have replaced it).
        print(f"citewarden verify: {e}", file=err or sys.stderr)
        return 2


async def _with_judge(
    pipeline: RoutePipeline, judgement: Judgement, request: dict[str, Any]
) -> Judgement:
    from gateway.judge.client import close_clients

    try:
        return await pipeline.resolve_judge(judgement, pipeline.adapter.question(request))
    finally:
        await close_clients()


def _stream_answer(
    pipeline: RoutePipeline, ctx: ContextSet, raw: bytes
) -> tuple[Answer, Judgement]:
    """A buffered stream as the proxy reads it: events verified as they come
    (`StreamVerifier`), the rest judged once it ended (ProtocolError if it is no stream)."""
    verifier = StreamVerifier(pipeline, ctx)
    decoder = pipeline.codec.decoder()
    for event in decoder.feed(raw):
        verifier.feed(event)
    if not verifier.parser.done:  # the proxy reads no further once the terminal event came
        for event in decoder.finish():
            verifier.feed(event)
    verifier.sse_undefined = decoder.undefined
    _, answer = verifier.finish()
    judgement = pipeline.safe_judge(answer, verifier.ctx, verifier.known, verifier.text)
    return answer, judgement


def _verify(
    policy_path: str,
    protocol: str,
    request_path: str,
    response_path: str,
    route_name: str | None,
    out: TextIO,
    fmt: str = "json",
    path: str | None = None,
    response_headers_path: str | None = None,
) -> int:
    if protocol not in ADAPTERS:
        raise InputError(f"unknown protocol {protocol!r} (expected one of {', '.join(ADAPTERS)})")
    loaded = load_policy(policy_path)
    route = _pick_route(loaded, protocol, route_name, path)
    pipeline = RoutePipeline(loaded, route)
    adapter = pipeline.adapter
    request_raw = _read(request_path, "request")
    request = _json(request_raw, "request", request_path, "the proxy answers 400")
    up_headers = [] if response_headers_path is None else _headers(response_headers_path)
    raw = _read(response_path, "response")
    # JSON or stream is the request's choice where it says (the proxy refuses a capture of the
    # other kind): its body's `stream`, or for Gemini and Bedrock the path `--path` gives.
    # Where it does not say, the capture does (DESIGN §1: a JSON body or an `.sse` capture).
    info = adapter.request_info(request)
    by_path = None if path is None else adapter.streams_by_path(path)
    if by_path is not None:
        stream, said = by_path, f"by its path {path}"
    elif adapter.streams_by_path("") is None and isinstance(request.get("stream"), bool):
        stream, said = info.stream, "by its body"
    else:
        stream, said = _looks_like_stream(response_path, raw, pipeline), ""
    refused = REFUSED
    if said:
        refused += f"; the request asks for {'a stream' if stream else 'JSON'} {said}"
    # What the client itself asked for (Responses `include`) is learnt from the request.
    adapter.forward_body(request_raw, path or "", loaded.policy)
    headers = dict(up_headers)
    include_usage = bool(info.include_usage)
    policy = loaded.policy
    # How the answer goes out: JSON, a stream released whole (`buffer`) or claim by claim
    # (`progressive`: the proxy's decision header then says `progressive`).
    streaming = None if not stream else (
        "progressive"
        if policy.streaming.mode == "progressive" and policy.mode == "enforce"
        else "buffer"
    )
    if streaming == "progressive":
        try:
            ctx = pipeline.context(request, None, headers)
        except ProtocolError as e:
            raise InputError(f"response headers: {e} ({REFUSED})") from None
        sent, release = asyncio.run(_progressive(pipeline, ctx, raw, include_usage, request))
        return _emit(
            out, fmt, _report(
                pipeline, release.decision, release.summary(), 200, sent, sent == raw,
                up_headers, streaming=streaming, reason=release.reason,
            ),
        )
    try:
        if stream:
            ctx = pipeline.context(request, None, headers)
            answer, judgement = _stream_answer(pipeline, ctx, raw)
        else:
            parsed = _json(raw, "response", response_path, refused)
            answer = adapter.parse(parsed, route)
            ctx = pipeline.context(request, parsed, headers)
            judgement = pipeline.safe_judge(answer, ctx)
    except ProtocolError as e:
        raise InputError(
            f"response {response_path} is not a valid {protocol} answer ({refused}): {e}"
        ) from None
    if pipeline.judge_pass is not None:  # the judge pass, exactly as the proxy runs it
        judgement = asyncio.run(_with_judge(pipeline, judgement, request))
    rendered = pipeline.render(
        answer, judgement, raw, REQUEST_ID, stream=stream, include_usage=include_usage
    )
    if policy.mode == "shadow":
        # The proxy forwards the upstream's answer as it came, whatever the decision (recorded
        # in its header, metrics and audit). The exit status still says what enforcing would do.
        report = _report(
            pipeline, judgement.outcome.decision.value, judgement, 200, raw, True, up_headers,
            streaming=streaming,
        )
        _emit(out, fmt, report)
        return 0 if rendered.unchanged else 1
    return _emit(
        out, fmt, _report(
            pipeline, judgement.outcome.decision.value, judgement, rendered.status,
            rendered.body, rendered.unchanged, up_headers, streaming=streaming,
        ),
    )


async def _progressive(
    pipeline: RoutePipeline,
    ctx: ContextSet,
    raw: bytes,
    include_usage: bool,
    request: dict[str, Any],
) -> tuple[bytes, ProgressiveRelease]:
    """The bytes a progressive stream sends for the capture `raw`, from the proxy's own
    `ProgressiveRelease` (its framer, its verdicts), fed the capture as one chunk."""
    from gateway.judge.client import close_clients

    release = ProgressiveRelease(pipeline, ctx, REQUEST_ID, include_usage, request)
    decoder = pipeline.codec.decoder()
    try:
        out = release.feed(decoder.feed(raw))
        last = decoder.finish()
        release.verifier.sse_undefined = decoder.undefined
        out += release.feed(last)
        out += await release.afinish() if release.judged else release.finish()
    except Exception as e:  # as the proxy's boundary maps it (gateway/errors.py)
        out = release.abort(f"upstream failed: {map_exception(e)}")
    finally:
        if release.judged:
            await close_clients()
    return out, release


def _client_body(pipeline: RoutePipeline, status: int, data: bytes, stream: bool) -> Any:
    """The bytes the client receives, readable in a JSON report."""
    if stream and status < 300 and pipeline.codec is not SSE_CODEC:
        decoder = pipeline.codec.decoder()  # binary framing: the events, one object each
        events = decoder.feed(data) + decoder.finish()
        return [{"event": e.event, "data": json.loads(e.data)} for e in events]
    if stream and status < 300:
        return data.decode()
    return json.loads(data)


def _report(
    pipeline: RoutePipeline,
    decision: str,
    judgement: Judgement | None,
    status: int,
    data: bytes,
    unchanged: bool,
    up_headers: list[tuple[str, str]],
    *,
    streaming: str | None,
    reason: str | None = None,
) -> dict[str, Any]:
    outcome = judgement.outcome if judgement is not None else None
    policy = pipeline.policy
    return {
        "decision": decision,
        "reason": outcome.reason if outcome is not None else reason,
        "claim_index": outcome.claim_index if outcome is not None else None,
        "status": status,
        "unchanged": unchanged,
        "claims": claim_views(judgement) if judgement is not None else [],
        "context_fingerprint": (
            judgement.report.context_fingerprint if judgement is not None else None
        ),
        "policy": pipeline.loaded.label,
        "route": pipeline.route.name,
        "mode": policy.mode,
        "streaming": streaming,
        # The upstream headers the client receives (DESIGN §7's allow-list), from
        # --response-headers; the gateway adds its own (decision, policy, request id).
        "headers": dict(verified_response_headers(up_headers)),
        "body": _client_body(pipeline, status, data, streaming is not None),
    }


def _emit(out: TextIO, fmt: str, report: dict[str, Any]) -> int:
    if fmt == "text":
        out.write(text_report(report))
    else:
        out.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0 if report["unchanged"] else 1


def _clip(text: str, width: int = 72) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def text_report(report: dict[str, Any]) -> str:
    """`verify --format text`: the decision and one line per claim, for a person to read."""
    decision = str(report["decision"])
    if report["reason"] is not None:
        where = "" if report["claim_index"] is None else f", claim {report['claim_index']}"
        decision += f" ({report['reason']}{where})"
    lines = [
        f"decision  {decision}",
        f"status    {report['status']}"
        + ("  (the upstream's bytes, unchanged)" if report["unchanged"] else ""),
        f"policy    {report['policy']}  route {report['route']}"
        + ("  (shadow: the client gets the upstream's answer)"
           if report.get("mode") == "shadow" else "")
        + ("  (progressive stream)" if report.get("streaming") == "progressive" else ""),
        f"context   {report['context_fingerprint']}",
        f"claims    {len(report['claims'])}",
    ]
    for c in report["claims"]:
        status = c["status"] + (f" {c['reason']}" if c.get("reason") else "")
        cited = " ".join(f"[{i}]" for i in c["citations"]) or "(no citation)"
        lines.append(f"  {c['index']:>3}  {status:<32} {cited}")
        if c.get("text"):
            lines.append(f"       {_clip(c['text'])}")
    lines.append("(--format json prints the whole report, with the body the client receives)")
    return "\n".join(lines) + "\n"

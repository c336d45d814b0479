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

from gateway.errors import InputError, ProtocolError
from gateway.framing import SSE_CODEC
from gateway.pipeline import Judgement, RoutePipeline, claim_views
from gateway.policy import Route, load_policy
from gateway.protocols import ADAPTERS
from gateway.protocols.fields import loads_unique

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


def _looks_like_sse(path: str, data: bytes) -> bool:
    if path.endswith(".sse"):
        return True
    head = data.lstrip()[:16]
    return head.startswith((b"data:", b"event:", b":", b"id:"))


def _pick_route(routes: list[Route], protocol: str, name: str | None) -> Route:
    if name is not None:
        for r in routes:
            if r.name == name:
                if r.protocol != protocol:
                    raise InputError(f"route {name!r} is {r.protocol}, not {protocol}")
                return r
        raise InputError(f"the policy has no route named {name!r}")
    for r in routes:
        if r.protocol == protocol:
            return r
    raise InputError(f"the policy has no {protocol} route; name one with --route")


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
) -> int:
    try:
        return _verify(policy_path, protocol, request_path, response_path, route_name, out, fmt)
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


def _verify(
    policy_path: str,
    protocol: str,
    request_path: str,
    response_path: str,
    route_name: str | None,
    out: TextIO,
    fmt: str = "json",
) -> int:
    if protocol not in ADAPTERS:
        raise InputError(f"unknown protocol {protocol!r} (expected one of {', '.join(ADAPTERS)})")
    loaded = load_policy(policy_path)
    route = _pick_route(list(loaded.policy.routes), protocol, route_name)
    pipeline = RoutePipeline(loaded, route)
    request_raw = _read(request_path, "request")
    request = _json(request_raw, "request", request_path, "the proxy answers 400")
    raw = _read(response_path, "response")
    stream = _looks_like_sse(response_path, raw) or (
        pipeline.codec is not SSE_CODEC and not raw.lstrip().startswith(b"{")
    )  # an event-stream capture (Bedrock): binary, never a JSON object
    # What the client itself asked for (Responses `include`) is learnt from the request.
    pipeline.adapter.forward_body(request_raw, "", loaded.policy)
    try:
        if stream:
            answer = pipeline.parse_stream(raw)
        else:
            parsed = _json(raw, "response", response_path, REFUSED)
            answer = pipeline.adapter.parse(parsed, route)
        ctx = pipeline.context(request, answer.body, None)
    except ProtocolError as e:
        raise InputError(
            f"response {response_path} is not a valid {protocol} answer ({REFUSED}): {e}"
        ) from None
    judgement = pipeline.safe_judge(answer, ctx)
    if pipeline.judge_pass is not None:  # the judge pass, exactly as the proxy runs it
        judgement = asyncio.run(_with_judge(pipeline, judgement, request))
    include_usage = bool(pipeline.adapter.request_info(request).include_usage)
    rendered = pipeline.render(
        answer, judgement, raw, REQUEST_ID, stream=stream, include_usage=include_usage
    )
    body: Any
    if stream and rendered.status < 300 and pipeline.codec is not SSE_CODEC:
        decoder = pipeline.codec.decoder()  # binary framing: the events, one object each
        events = decoder.feed(rendered.body) + decoder.finish()
        body = [{"event": e.event, "data": json.loads(e.data)} for e in events]
    elif stream and rendered.status < 300:
        body = rendered.body.decode()
    else:
        body = json.loads(rendered.body)
    outcome = judgement.outcome
    report = {
        "decision": outcome.decision.value,
        "reason": outcome.reason,
        "claim_index": outcome.claim_index,
        "status": rendered.status,
        "unchanged": rendered.unchanged,
        "claims": claim_views(judgement),
        "context_fingerprint": judgement.report.context_fingerprint,
        "policy": loaded.label,
        "route": route.name,
        "body": body,
    }
    if fmt == "text":
        out.write(text_report(report))
    else:
        out.write(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return 0 if rendered.unchanged else 1


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
        f"policy    {report['policy']}  route {report['route']}",
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

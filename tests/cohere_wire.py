"""Cohere `/v2/chat` wire builders for the tests, written apart from the adapter under test:
response bodies with span citations, and the SSE stream the API sends for one (`event:` and
`data:` lines; citations right after the text they cite, or all at the end)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Json = dict[str, Any]

DOCUMENTS: list[Any] = [
    {"id": "k7-spec", "data": {"title": "K7 spec sheet",
                                "snippet": "Usable capacity: 13.5 kWh per K7 unit. "
                                           "Round-trip efficiency is 90%."}},
    {"data": {"title": "Warranty", "snippet": "The warranty lasts ten years from installation."}},
    "Installation takes one day.",
]
SYSTEM = 'Answer from the documents.\n<chunk id="k7:safety">The K7 meets IEC 62619.</chunk>'


def request(question: str = "Tell me about the K7.", *, stream: bool = False) -> Json:
    body: Json = {
        "model": "command-a-03-2025",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "documents": DOCUMENTS,
    }
    if stream:
        body["stream"] = True
    return body


def cite(
    text: str,
    span: str,
    *ids: str,
    kind: str = "document",
    echo: Mapping[str, Any] | None = None,
    start: int | None = None,
    content_index: int | None = 0,
) -> Json:
    """A citation of `span` (its first occurrence in `text`, or at `start`)."""
    s = text.index(span) if start is None else start
    sources: list[Json] = []
    for i in ids:
        src: Json = {"type": kind, "id": i}
        if echo is not None:
            src["document" if kind == "document" else "tool_output"] = dict(echo)
        sources.append(src)
    out: Json = {"start": s, "end": s + len(span), "text": span, "sources": sources,
                 "type": "TEXT_CONTENT"}
    if content_index is not None:
        out["content_index"] = content_index
    return out


def body(
    text: str | None,
    citations: Sequence[Json] = (),
    *,
    id: str = "5f6e4c1a-1111-4e2b-9a55-c0ffee000001",
    tool_plan: str | None = None,
    tool_calls: Sequence[Json] = (),
    thinking: str | None = None,
    finish: str = "COMPLETE",
    usage: tuple[int, int] = (50, 20),
) -> Json:
    content: list[Json] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking})
    if text is not None:
        content.append({"type": "text", "text": text})
    message: Json = {"role": "assistant"}
    if tool_plan is not None:
        message["tool_plan"] = tool_plan
    if tool_calls:
        message["tool_calls"] = list(tool_calls)
    message["content"] = content
    if citations:
        message["citations"] = list(citations)
    return {
        "id": id,
        "message": message,
        "finish_reason": finish,
        "usage": {
            "billed_units": {"input_tokens": usage[0], "output_tokens": usage[1]},
            "tokens": {"input_tokens": usage[0] + 100, "output_tokens": usage[1]},
        },
    }


def tool_call(id: str, name: str, arguments: Mapping[str, Any]) -> Json:
    return {"id": id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def frame(data: Json) -> bytes:
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def events(
    b: Mapping[str, Any], *, chunk: int = 7, citations_at_end: bool = False,
    end: bool = True, error: str | None = None,
) -> bytes:
    """The stream for body `b`: text in `chunk`-character deltas; each citation right after the
    delta that completes its span (or all after the text, `citations_at_end`)."""
    msg = b["message"]
    out = [frame({"id": b["id"], "type": "message-start",
                  "delta": {"message": {"role": "assistant", "content": [], "tool_plan": "",
                                        "tool_calls": [], "citations": []}}})]
    plan = msg.get("tool_plan")
    if plan:
        for k in range(0, len(plan), chunk):
            out.append(frame({"type": "tool-plan-delta",
                              "delta": {"message": {"tool_plan": plan[k:k + chunk]}}}))
    for n, call in enumerate(msg.get("tool_calls") or []):
        fn = call["function"]
        out.append(frame({"type": "tool-call-start", "index": n, "delta": {"message": {
            "tool_calls": {"id": call["id"], "type": "function",
                           "function": {"name": fn["name"], "arguments": ""}}}}}))
        args = fn["arguments"]
        for k in range(0, len(args), chunk):
            out.append(frame({"type": "tool-call-delta", "index": n, "delta": {"message": {
                "tool_calls": {"function": {"arguments": args[k:k + chunk]}}}}}))
        out.append(frame({"type": "tool-call-end", "index": n}))
    pending: list[tuple[int, Json]] = list(enumerate(msg.get("citations") or []))
    for i, item in enumerate(msg.get("content") or []):
        kind = item["type"]
        text = item[kind]
        out.append(frame({"type": "content-start", "index": i,
                          "delta": {"message": {"content": {"type": kind, kind: ""}}}}))
        for k in range(0, len(text), chunk):
            out.append(frame({"type": "content-delta", "index": i,
                              "delta": {"message": {"content": {kind: text[k:k + chunk]}}}}))
            if citations_at_end or kind != "text":
                continue
            done = k + chunk
            for j, c in [p for p in pending if p[1]["end"] <= done]:
                out.extend(_citation(j, c))
                pending.remove((j, c))
        if citations_at_end or kind == "text":
            for j, c in pending:
                out.extend(_citation(j, c))
            pending = []
        out.append(frame({"type": "content-end", "index": i}))
    if error is not None:
        out.append(frame({"type": "message-end",
                          "delta": {"finish_reason": "ERROR", "error": error}}))
    elif end:
        out.append(frame({"type": "message-end",
                          "delta": {"finish_reason": b["finish_reason"], "usage": b["usage"]}}))
    return b"".join(out)


def _citation(j: int, c: Json) -> Iterable[bytes]:
    yield frame({"type": "citation-start", "index": j, "delta": {"message": {"citations": c}}})
    yield frame({"type": "citation-end", "index": j})


def sse_data(raw: bytes) -> list[Json]:
    """The JSON of every `data:` line a client received (read apart from the gateway's code)."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data:"):
            out.append(json.loads(line[5:].strip()))
    return out

"""Converse / ConverseStream wire data for the bedrock-converse tests: request pieces, response
bodies, and upstream event streams (padded as the service pads them)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.eventstream import encode_message

Json = dict[str, Any]

DOC_TEXT = (
    "The K7 battery stores 13.5 kWh of usable energy. "
    "Its warranty lasts ten years from installation. "
    "Round-trip efficiency is 90 percent."
)
CAPACITY = "The K7 battery stores 13.5 kWh of usable energy."
WARRANTY = "Its warranty lasts ten years from installation."
CHUNKS_DOC = ("The K7 battery stores 13.5 kWh.", "It weighs 114 kg.")
PLANTED = "PLANTED-b3d9"


def document(
    text: str = DOC_TEXT, name: str = "k7-spec", citations: bool = True, **source: object
) -> Json:
    src: Json = source or {"text": text}
    return {"document": {"format": "txt", "name": name, "source": src,
                         "citations": {"enabled": citations}}}


def request(question: str = "How much energy does the K7 store?", *blocks: Json,
            system: Sequence[str] = ()) -> Json:
    content = [*blocks, {"text": question}] if blocks else [document(), {"text": question}]
    body: Json = {"messages": [{"role": "user", "content": content}]}
    if system:
        body["system"] = [{"text": s} for s in system]
    return body


def char_citation(cited: str, doc_text: str = DOC_TEXT, index: int = 0, *,
                  start: int | None = None, end: int | None = None) -> Json:
    at = doc_text.find(cited)
    s = at if start is None else start
    e = at + len(cited) if end is None else end
    return {
        "title": "k7-spec",
        "sourceContent": [{"text": cited}],
        "location": {"documentChar": {"documentIndex": index, "start": s, "end": e}},
    }


def cited(text: str, *citations: Json) -> Json:
    return {"citationsContent": {"content": [{"text": text}], "citations": list(citations)}}


def body(*blocks: Json, stop: str = "end_turn", **extra: object) -> Json:
    out: Json = {
        "output": {"message": {"role": "assistant", "content": list(blocks)}},
        "stopReason": stop,
        "usage": {"inputTokens": 30, "outputTokens": 12, "totalTokens": 42},
        "metrics": {"latencyMs": 321},
    }
    out.update(extra)
    return out


def event(name: str, payload: Json, *, pad: bool = True) -> bytes:
    if pad:
        payload = {**payload, "p": "abcdefghijklmnopqrstuvwxyzABCDEFGH"[: 5 + len(name) % 20]}
    headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, json.dumps(payload).encode())


def exception(kind: str, message: str) -> bytes:
    headers = {":exception-type": kind, ":content-type": "application/json",
               ":message-type": "exception"}
    return encode_message(headers, json.dumps({"message": message}).encode())


def stream_of(content: Sequence[Json], *, stop: str = "end_turn",
              text_pieces: int = 3) -> bytes:
    """The upstream ConverseStream of a message with these content blocks: text split into
    a few deltas, citations before their text, tool input as one JSON string."""
    out = [event("messageStart", {"role": "assistant"})]
    for i, block in enumerate(content):
        if "text" in block or "citationsContent" in block:
            if "citationsContent" in block:
                cc = block["citationsContent"]
                for c in cc["citations"]:
                    out.append(event("contentBlockDelta",
                                     {"contentBlockIndex": i, "delta": {"citation": c}}))
                text = "".join(p["text"] for p in cc["content"])
            else:
                text = block["text"]
            step = max(1, len(text) // text_pieces)
            for k in range(0, len(text), step):
                out.append(event("contentBlockDelta",
                                 {"contentBlockIndex": i, "delta": {"text": text[k:k + step]}}))
        elif "toolUse" in block:
            tu = block["toolUse"]
            out.append(event("contentBlockStart", {"contentBlockIndex": i, "start": {
                "toolUse": {"toolUseId": tu["toolUseId"], "name": tu["name"]}}}))
            out.append(event("contentBlockDelta", {"contentBlockIndex": i, "delta": {
                "toolUse": {"input": json.dumps(tu["input"])}}}))
        elif "reasoningContent" in block:
            rt = block["reasoningContent"]["reasoningText"]
            out.append(event("contentBlockDelta", {"contentBlockIndex": i, "delta": {
                "reasoningContent": {"text": rt["text"]}}}))
            if rt.get("signature"):
                out.append(event("contentBlockDelta", {"contentBlockIndex": i, "delta": {
                    "reasoningContent": {"signature": rt["signature"]}}}))
        out.append(event("contentBlockStop", {"contentBlockIndex": i}))
    out.append(event("messageStop", {"stopReason": stop}))
    out.append(event("metadata", {
        "usage": {"inputTokens": 30, "outputTokens": 12, "totalTokens": 42},
        "metrics": {"latencyMs": 321}}))
    return b"".join(out)


def boto_parse(body: Json) -> Json:
    """`body` as boto3 parses a Converse response (its rest-json parser and output shape)."""
    import botocore.parsers
    import botocore.session

    model = botocore.session.get_session().get_service_model("bedrock-runtime")
    shape = model.operation_model("Converse").output_shape
    parser = botocore.parsers.create_parser("rest-json")
    response = {"status_code": 200, "headers": {}, "body": json.dumps(body).encode()}
    parsed: Json = parser.parse(response, shape)
    assert parsed["output"]["message"]["content"] is not None
    return parsed


def raw_event(name: str, payload: bytes | str, **headers: str) -> bytes:
    """An event message whose payload goes out as given (not necessarily JSON, nor UTF-8),
    with extra headers beside the protocol's own."""
    data = payload.encode() if isinstance(payload, str) else payload
    base = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
    return encode_message({**base, **headers}, data)


def message(headers: dict[str, str], payload: bytes = b"") -> bytes:
    """A message with exactly these headers (an error message, an unknown message type)."""
    return encode_message(headers, payload)

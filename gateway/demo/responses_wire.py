"""Response objects and typed SSE streams in the OpenAI Responses wire format, built from a
plain answer text (and optional annotations, reasoning, tool calls, file_search results): the
shapes the official SDK parses. Used by the demo upstream and the tests' scripted upstream.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .wire import split_fixed, sse

JSON = dict[str, Any]


def message_item(
    text: str, *, id: str = "msg_fake", annotations: Sequence[JSON] = (), status: str = "completed"
) -> JSON:
    part = {"type": "output_text", "text": text, "annotations": list(annotations), "logprobs": []}
    return {"id": id, "type": "message", "role": "assistant", "status": status, "content": [part]}


def reasoning_item(
    summary: str | None, *, id: str = "rs_fake", encrypted: str | None = None
) -> JSON:
    item: JSON = {"id": id, "type": "reasoning", "summary": []}
    if summary is not None:
        item["summary"] = [{"type": "summary_text", "text": summary}]
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def function_call_item(
    name: str, arguments: str, *, id: str = "fc_fake", call_id: str = "call_fake"
) -> JSON:
    return {
        "id": id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def file_search_item(
    results: Sequence[Mapping[str, Any]] | None,
    *,
    queries: Sequence[str] = ("search",),
    id: str = "fs_fake",
) -> JSON:
    return {
        "id": id,
        "type": "file_search_call",
        "status": "completed",
        "queries": list(queries),
        "results": [dict(r) for r in results] if results is not None else None,
    }


def response_body(
    output: Sequence[JSON],
    *,
    id: str = "resp_fake",
    model: str = "fake-model",
    status: str = "completed",
    instructions: str | None = None,
    usage: tuple[int, int] = (20, 10),
    background: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> JSON:
    """A `response` object with these output items."""
    body: JSON = {
        "id": id,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "background": background,
        "error": None,
        "incomplete_details": None,
        "instructions": instructions,
        "max_output_tokens": None,
        "model": model,
        "output": [copy.deepcopy(o) for o in output],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage[0] + usage[1],
        }
        if status == "completed"
        else None,
        "user": None,
        "metadata": {},
    }
    body.update(extra or {})
    return body


def response_text(text: str, **kwargs: Any) -> JSON:
    """A completed response whose one message says `text`."""
    return response_body([message_item(text)], **kwargs)


class _Seq:
    def __init__(self) -> None:
        self.n = 0
        self.frames: list[bytes] = []

    def __call__(self, data: JSON) -> None:
        data = {"type": data["type"], "sequence_number": self.n, **data}
        self.n += 1
        self.frames.append(sse(data, data["type"]))


def _annotation_point(ann: Mapping[str, Any]) -> int:
    return int(ann.get("end_index", ann.get("index", 0)))


def response_events(body: Mapping[str, Any], *, chunk_size: int = 4) -> list[bytes]:
    """The typed SSE frames the API streams for `body`: text in `chunk_size` deltas, each
    annotation announced as soon as the text it points at has been sent."""
    emit = _Seq()
    head = {k: copy.deepcopy(v) for k, v in body.items()}
    head.update(output=[], status="in_progress", usage=None)
    emit({"type": "response.created", "response": head})
    emit({"type": "response.in_progress", "response": head})
    for i, item in enumerate(body.get("output") or []):
        skeleton = copy.deepcopy(item)
        itype = item["type"]
        if itype == "message":
            skeleton.update(content=[], status="in_progress")
        elif itype == "function_call":
            skeleton.update(arguments="", status="in_progress")
        elif itype == "reasoning":
            skeleton["summary"] = []
        emit({"type": "response.output_item.added", "output_index": i, "item": skeleton})
        base = {"item_id": item.get("id"), "output_index": i}
        if itype == "message":
            for j, part in enumerate(item["content"]):
                b = {**base, "content_index": j}
                if part["type"] == "refusal":
                    emit({"type": "response.content_part.added", **b,
                          "part": {"type": "refusal", "refusal": ""}})
                    for piece in split_fixed(part["refusal"], chunk_size):
                        emit({"type": "response.refusal.delta", **b, "delta": piece})
                    emit({"type": "response.refusal.done", **b, "refusal": part["refusal"]})
                    emit({"type": "response.content_part.done", **b, "part": part})
                    continue
                empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                emit({"type": "response.content_part.added", **b, "part": empty})
                anns = list(enumerate(part.get("annotations") or []))
                sent = 0
                for piece in split_fixed(part["text"], chunk_size):
                    emit({"type": "response.output_text.delta", **b, "delta": piece,
                          "logprobs": []})
                    sent += len(piece)
                    while anns and _annotation_point(anns[0][1]) <= sent:
                        k, ann = anns.pop(0)
                        emit({"type": "response.output_text.annotation.added", **b,
                              "annotation_index": k, "annotation": ann})
                for k, ann in anns:
                    emit({"type": "response.output_text.annotation.added", **b,
                          "annotation_index": k, "annotation": ann})
                emit({"type": "response.output_text.done", **b, "text": part["text"],
                      "logprobs": []})
                emit({"type": "response.content_part.done", **b, "part": part})
        elif itype == "function_call":
            for piece in split_fixed(item["arguments"], chunk_size):
                emit({"type": "response.function_call_arguments.delta", **base, "delta": piece})
            emit({"type": "response.function_call_arguments.done", **base,
                  "arguments": item["arguments"]})
        elif itype == "reasoning":
            for k, part in enumerate(item.get("summary") or []):
                s = {**base, "summary_index": k}
                emit({"type": "response.reasoning_summary_part.added", **s,
                      "part": {"type": "summary_text", "text": ""}})
                for piece in split_fixed(part["text"], chunk_size):
                    emit({"type": "response.reasoning_summary_text.delta", **s, "delta": piece})
                emit({"type": "response.reasoning_summary_text.done", **s, "text": part["text"]})
                emit({"type": "response.reasoning_summary_part.done", **s, "part": part})
        elif itype == "file_search_call":
            for what in ("in_progress", "searching", "completed"):
                emit({"type": f"response.file_search_call.{what}", **base})
        emit({"type": "response.output_item.done", "output_index": i, "item": item})
    terminal = "response.incomplete" if body.get("status") == "incomplete" else "response.completed"
    emit({"type": terminal, "response": copy.deepcopy(dict(body))})
    return emit.frames


def response_error(message: str, type_: str = "invalid_request_error") -> JSON:
    return {"error": {"message": message, "type": type_, "param": None, "code": None}}


def dumps(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode()

"""Progressive release in the Responses shapes: verified claims of the first output_text part
go out as `response.output_text.delta` events as they verify; the rest of the answer follows
once the whole answer is judged, and every repeated copy of the text (`output_text.done`,
`content_part.done`, `output_item.done`, `response.completed`) is the text that went out.

Items are numbered as the upstream numbered them (an item the gateway removed leaves a gap),
and `sequence_number` counts the events this stream sent.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.protocols.base import Framer, field_allowed
from gateway.protocols.openai_responses.context import client_wants_encrypted
from gateway.protocols.openai_responses.fields import ITEM_KEYS, ITEM_SHAPES, shape_ok
from gateway.protocols.openai_responses.parse import parse_body, text_parts, top_unknown
from gateway.protocols.openai_responses.render import (
    Events,
    head_of,
    item_events,
    part_events,
    released_body,
    remap_annotations,
    skeleton,
    terminal_type,
)
from gateway.sse import encode
from gateway.types import Claim

__all__ = ["ResponsesFramer"]

Json = dict[str, Any]


def _known_head(resp: Mapping[str, Any]) -> Json:
    """The fields of a response head that go out before the answer is judged: known ones of
    their expected shape, echoes only as the client sent them (the final
    `response.completed` carries what the policy allows)."""
    bad = {path[0] for path in top_unknown(resp)}
    return {k: v for k, v in resp.items() if k not in bad}


def _known_item(item: Mapping[str, Any]) -> Json:
    keys = ITEM_KEYS.get(str(item.get("type")), frozenset())
    if not client_wants_encrypted():
        keys = keys - {"encrypted_content"}
    return {k: v for k, v in item.items() if k in keys and shape_ok(ITEM_SHAPES, k, v)}


def _identity(item: Mapping[str, Any]) -> tuple[object, ...]:
    return (item.get("type"), item.get("id"), item.get("call_id"))


class ResponsesFramer(Framer):
    """One progressive Responses stream's framing state."""

    def __init__(self, include_usage: bool = True) -> None:
        self.ev = Events()
        self.head: Json | None = None
        self.indices: dict[tuple[object, ...], int] = {}
        self.primary: tuple[int, int] | None = None  # (output index, content index)
        self.primary_item: Json | None = None
        self.announced: dict[int, Json] = {}  # each output item as output_item.added said
        self.primary_done: Json | None = None  # the upstream's finished primary message
        self.opened = False
        self.sent: list[str] = []
        self.sent_len = 0
        self.mapping: list[tuple[int, int, int]] = []  # (old start, old end, new start)

    @property
    def started(self) -> bool:
        """Whether any event went out (then a failure can no longer become a template)."""
        return self.opened

    def template_body(self, text: str) -> Json:
        """A whole completed response answering `text`, for a stream that ends in a template."""
        body = head_of(self.head or {"id": "", "object": "response"}, "completed")
        item_id = self.primary_item.get("id") if self.primary_item is not None else None
        body["output"] = [
            {
                "id": item_id if isinstance(item_id, str) else "msg_citewarden",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
                ],
            }
        ]
        return body

    def _flush(self) -> bytes:
        out = b"".join(encode(e) for e in self.ev.out)
        self.ev.out.clear()
        return out

    def observe(self, event: Any) -> None:
        try:
            data = json.loads(event.data)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        etype = data.get("type")
        if etype == "response.created" and self.head is None:
            resp = data.get("response")
            self.head = _known_head(resp) if isinstance(resp, dict) else None
        elif etype == "response.output_item.added":
            item, i = data.get("item"), data.get("output_index")
            if isinstance(item, dict) and isinstance(i, int):
                self.indices.setdefault(_identity(item), i)
                self.announced.setdefault(i, item)
                if self.primary is None and item.get("type") == "message":
                    self.primary_item = _known_item(item)
                    # Parts announced inside the item count first, as the parser counts them.
                    content = item.get("content")
                    for j, part in enumerate(content if isinstance(content, list) else []):
                        if isinstance(part, dict) and part.get("type") == "output_text":
                            self.primary = (i, j)
                            break
        elif etype == "response.content_part.added" and self.primary is None:
            part, at, k = data.get("part"), data.get("output_index"), data.get("content_index")
            owner = self.announced.get(at) if isinstance(at, int) else None
            if (
                isinstance(part, dict)
                and part.get("type") == "output_text"
                and isinstance(at, int)
                and isinstance(k, int)
                and owner is not None
                and owner.get("type") == "message"
            ):
                # The primary text is the stream's first output_text part, in whatever item
                # (the parser's channel ("output_text", 0)): its claims are the ones released.
                self.primary = (at, k)
                self.primary_item = _known_item(owner)
        elif etype == "response.output_item.done" and self.primary is not None:
            item = data.get("item")
            if isinstance(item, dict) and data.get("output_index") == self.primary[0]:
                self.primary_done = item

    # -- what goes out ---------------------------------------------------------------------

    def _announce(self) -> None:
        """response.created and response.in_progress, once."""
        if self.opened:
            return
        self.opened = True
        head = self.head or {"id": "", "object": "response", "output": []}
        self.ev.add({"type": "response.created", "response": head_of(head, "in_progress")})
        self.ev.add({"type": "response.in_progress", "response": head_of(head, "in_progress")})
        if self.primary is not None and self.primary_item is not None:
            i, j = self.primary
            item = self.primary_item
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.ev.add(
                {"type": "response.output_item.added", "output_index": i, "item": skeleton(item)}
            )
            self.ev.add(
                {
                    "type": "response.content_part.added",
                    "item_id": item.get("id", ""),
                    "output_index": i,
                    "content_index": j,
                    "part": empty,
                }
            )

    def opening(self) -> bytes:
        self._announce()
        return self._flush()

    def text(self, text: str, citations: Sequence[Claim] = ()) -> bytes:
        self._announce()
        if not text:
            return self._flush()
        if citations and self.primary is not None:
            # Only the claims' own spans carry annotations out: one on the text between
            # claims (whitespace, a title) cited nothing that was checked.
            begin = max(c.end for c in citations) - len(text)
            self.mapping.extend(
                (c.start, c.end, self.sent_len + c.start - begin) for c in citations
            )
        self.sent.append(text)
        self.sent_len += len(text)
        if self.primary is not None and self.primary_item is not None:
            i, j = self.primary
            self.ev.add({"type": "response.output_text.delta",
                         "item_id": self.primary_item.get("id", ""), "output_index": i,
                         "content_index": j, "delta": text, "logprobs": []})
        return self._flush()

    def tail(self, pipeline: Any, body: Mapping[str, Any]) -> bytes:
        """Everything of the final body but the text already sent, ending the stream."""
        self._announce()
        final = released_body(parse_body(body), pipeline.policy)
        sent = "".join(self.sent)
        keep_title = field_allowed(("title",), pipeline.policy)  # as partial_body decides
        next_index = max([*self.indices.values(), -1]) + 1
        # The primary part in the final body: its first output_text part, by the rule that
        # named it in the stream (the body drops no output_text part, only unknown ones).
        at = text_parts(final)
        for n, item in enumerate(final.get("output") or []):
            if not isinstance(item, dict):
                continue
            u = self.indices.get(_identity(item))
            if u is None:
                u, next_index = next_index, next_index + 1
            if self.primary is not None and at and at[0][0] == n:
                self._finish_primary(item, at[0][1], sent, keep_title)
            else:
                item_events(self.ev, u, item)
        if self.primary is None and sent:
            # No output_text part announced it: the text that went out is the whole answer.
            msg = {"id": "msg_citewarden", "type": "message", "role": "assistant",
                   "status": "completed", "content": [
                       {"type": "output_text", "text": sent, "annotations": [], "logprobs": []}]}
            final["output"] = [*(final.get("output") or []), msg]
            item_events(self.ev, next_index, msg)
        self.ev.add({"type": terminal_type(final), "response": final})
        return self._flush()

    def _finish_primary(self, item: Json, at: int, sent: str, keep_title: bool) -> None:
        """The primary message's end: its primary part (`at` in the final item) holds the text
        that went out and the annotations of the claims that went out, remapped into it, with
        the shapes every annotation must have; its other parts follow whole."""
        assert self.primary is not None
        i, j = self.primary
        content = item.get("content") or []
        part = content[at]
        src = (self.primary_done or {}).get("content") or []
        original = src[j] if j < len(src) and isinstance(src[j], dict) else {}
        old_text = original.get("text", "")
        anns = original.get("annotations")
        part["annotations"] = remap_annotations(
            old_text if isinstance(old_text, str) else "",
            anns if isinstance(anns, list) else [],
            self.mapping,
            keep_title,
        )
        part["text"] = sent
        part["logprobs"] = []
        base = {"item_id": item.get("id", ""), "output_index": i}
        for k, p in enumerate(content):
            # Numbered as announced: a part the body dropped before the primary one (of an
            # unknown type) leaves a gap, as a dropped item does.
            if isinstance(p, Mapping):
                part_events(self.ev, base, k + j - at if k >= at else k, p, text_sent=(k == at))
        self.ev.add({"type": "response.output_item.done", "output_index": i,
                     "item": copy.deepcopy(item)})

    def error(self, message: str, type_: str) -> bytes:
        """The stream's end on a failure: an `error` event and `response.failed`."""
        self._announce()
        self.ev.add({"type": "error", "code": type_, "message": message, "param": None})
        head = head_of(self.head or {"id": "", "object": "response"}, "failed")
        head["error"] = {"code": "server_error", "message": message}
        self.ev.add({"type": "response.failed", "response": head})
        return self._flush()

"""Progressive release in the `/v2/chat` shapes: verified claims of the first text item go out
as `content-delta` events (content index 0) as they verify, each followed by the citations
that lie inside it, moved to the offsets of the text that went out; the rest of the answer
(tool plan and calls, other items, `message-end`) follows once the whole answer is judged.
A failure ends the stream with `message-end` whose `finish_reason` is `ERROR` and whose
`delta.error` says why: the SDK's typed account of a failed generation, never a clean end.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.protocols.base import Framer
from gateway.protocols.cohere.parse import citation_target
from gateway.protocols.cohere.render import (
    citation_events,
    citation_json,
    content_events,
    message_end,
    message_start,
    tool_events,
)
from gateway.protocols.fields import is_token
from gateway.sse import SSEEvent, encode
from gateway.types import Claim

__all__ = ["CohereFramer"]

Json = dict[str, Any]


class CohereFramer(Framer):
    """One progressive `/v2/chat` stream's framing state."""

    def __init__(self, include_usage: bool = True) -> None:
        self.id: object = ""
        self.primary: int | None = None  # the upstream's content index of the first text item
        self.opened = False
        self.content_open = False
        self.sent: list[str] = []
        self.sent_len = 0
        self.mapping: list[tuple[int, int, int]] = []  # (old start, old end, new start)
        # Per piece of `mapping`: the source ids its verified claims were checked against.
        self.verified: list[frozenset[str]] = []
        self.citations: list[Json] = []  # the primary item's, as the upstream sent them
        self.emitted: set[int] = set()
        self.out: list[SSEEvent] = []
        self.count = 0  # citation events sent

    @property
    def started(self) -> bool:
        return self.opened

    def observe(self, event: SSEEvent) -> None:
        try:
            data = json.loads(event.data)
        except ValueError:
            return
        if not isinstance(data, dict):
            return
        etype = data.get("type")
        delta = data.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        message = delta.get("message")
        message = message if isinstance(message, dict) else {}
        if etype == "message-start" and is_token(data.get("id")):
            self.id = data["id"]
        elif etype == "content-start" and self.primary is None:
            content = message.get("content")
            if isinstance(content, dict) and content.get("type") == "text":
                i = data.get("index")
                self.primary = i if type(i) is int else None
        elif etype == "citation-start":
            c = message.get("citations")
            if isinstance(c, dict) and c.get("type", "TEXT_CONTENT") == "TEXT_CONTENT":
                ci = c.get("content_index")
                if ci is None or ci == self.primary:
                    self.citations.append(c)

    def template_body(self, text: str) -> Json:
        return {
            "id": self.id,
            "finish_reason": "COMPLETE",
            "message": {"role": "assistant", "content": [{"type": "text", "text": text}],
                        "citations": []},
        }

    def _flush(self) -> bytes:
        data = b"".join(encode(e) for e in self.out)
        self.out.clear()
        return data

    def _announce(self) -> None:
        if not self.opened:
            self.opened = True
            self.out.append(message_start(self.id))

    def opening(self) -> bytes:
        self._announce()
        return self._flush()

    def _open_content(self) -> None:
        if not self.content_open:
            self.content_open = True
            start = content_events(0, "text", "")[0]  # content-start of item 0
            self.out.append(start)

    def text(self, text: str, citations: Sequence[Claim] = ()) -> bytes:
        self._announce()
        if not text:
            return self._flush()
        self._open_content()
        delta = {"type": "content-delta", "index": 0,
                 "delta": {"message": {"content": {"text": text}}}}
        self.out.append(SSEEvent(data=json.dumps(delta, ensure_ascii=False), event="content-delta"))
        if citations:
            end = max(c.end for c in citations)
            self.mapping.append((end - len(text), end, self.sent_len))
            self.verified.append(frozenset(
                cit.id for c in citations for cit in c.citations if cit.malformed is None
            ))
        self.sent.append(text)
        self.sent_len += len(text)
        self._cite()
        return self._flush()

    def _piece(self, start: int, end: int) -> int | None:
        """The released piece a span lies whole inside (its index in `mapping`); as `remap`."""
        for n, (old_s, old_e, _) in enumerate(self.mapping):
            if old_s <= start and end <= old_e:
                return n
        return None

    def _cite(self) -> None:
        """Citations lying inside a released piece, at the offsets of the text sent, whose
        sources are all ids that piece's claims were verified with. A citation that came after
        its claim was judged (or lies beside it, on the text between claims) was never checked:
        any other source of it, a prose id or one the context lacks, is never sent, not even
        at the end, when what the client was sent can no longer be judged again."""
        sent = "".join(self.sent)
        for k, c in enumerate(self.citations):
            if k in self.emitted:
                continue
            s, e = c.get("start"), c.get("end")
            if type(s) is not int or type(e) is not int:
                continue
            piece = self._piece(s, e)
            if piece is None:
                continue
            old_s, _, new_s = self.mapping[piece]
            moved = (new_s + s - old_s, new_s + e - old_s)
            if moved[1] > len(sent) or c.get("text") != sent[moved[0] : moved[1]]:
                continue
            ids = {str(src.get("id")) for src in c.get("sources") or [] if isinstance(src, dict)}
            if not ids <= self.verified[piece]:
                continue
            self.emitted.add(k)
            released = citation_json(c, moved[0], moved[1], sent[moved[0] : moved[1]])
            if "content_index" in released:
                released["content_index"] = 0
            if released["sources"]:
                self.out.extend(citation_events(self.count, released))
                self.count += 1

    def tail(self, pipeline: Any, body: Mapping[str, Any]) -> bytes:
        """Everything of the final body but the text already sent, ending the stream."""
        self._announce()
        self._cite()
        if self.content_open:
            self.out.append(SSEEvent(data=json.dumps({"type": "content-end", "index": 0}),
                                     event="content-end"))
        message = body.get("message") or {}
        self.out.extend(tool_events(message))
        content = message.get("content") or []
        # The body's index of the primary item (it went out as index 0): the first text item.
        primary = next(
            (
                i for i, it in enumerate(content)
                if isinstance(it, Mapping) and it.get("type") == "text"
            ),
            None,
        )
        new_index: dict[int, int] = {}
        for i, item in enumerate(content):
            if i == primary or not isinstance(item, Mapping):
                continue
            kind = item.get("type")
            if kind not in ("text", "thinking"):
                continue
            n = new_index[i] = len(new_index) + 1
            self.out.extend(content_events(n, str(kind), str(item.get(kind, ""))))
        for c in message.get("citations") or []:
            target = citation_target(body, c)
            if target is None:
                continue
            moved = dict(c)
            if len(target) > 2:
                if target[2] == primary or int(target[2]) not in new_index:
                    continue  # the primary item's went out with its text
                moved["content_index"] = new_index[int(target[2])]
            self.out.extend(citation_events(self.count, moved))
            self.count += 1
        self.out.append(message_end(body))
        return self._flush()

    def error(self, message: str, type_: str) -> bytes:
        self._announce()
        self.out.append(SSEEvent(
            data=json.dumps({"type": "message-end",
                             "delta": {"finish_reason": "ERROR", "error": message}},
                            ensure_ascii=False),
            event="message-end",
        ))
        return self._flush()

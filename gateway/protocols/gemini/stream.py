"""`streamGenerateContent?alt=sse`: each SSE `data:` is a whole GenerateContentResponse chunk;
there is no terminal event (the stream ends with the connection). Chunks are assembled into the
body the JSON API would have sent: each candidate's text accumulates, consecutive thought text
too; grounding metadata may come early or be re-sent accumulated (a list that extends the one
held replaces it, any other is appended), and streamed segments index the candidate's
accumulated text (their `partIndex`, which names a part of one chunk, is dropped). A stream
whose candidates never finished (no `finishReason`) is cut short: ProtocolError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import ProtocolError
from gateway.policy import ContextSpec
from gateway.protocols.base import StreamParser, TextDelta, channel_key
from gateway.protocols.fields import FieldLog, clean, loads_unique
from gateway.protocols.gemini.context import grounding_chunks
from gateway.protocols.gemini.fields import BODY_TABLE
from gateway.protocols.gemini.parse import parse_body
from gateway.sse import SSEEvent
from gateway.types import Answer, ContextSet

__all__ = ["GeminiStreamParser", "merge_grounding"]

Json = dict[str, Any]

_CANDIDATE_LAST = (
    "finishReason",
    "safetyRatings",
    "tokenCount",
    "avgLogprobs",
    "finishMessage",
    "citationMetadata",
    "logprobsResult",
    "urlContextMetadata",
)
_TOP_LAST = ("responseId", "modelVersion", "createTime", "usageMetadata", "promptFeedback")


def _merge_list(held: list[Any] | None, new: list[Any]) -> list[Any]:
    if held is None or new[: len(held)] == held:
        return list(new)  # first, or re-sent accumulated
    if held[: len(new)] == new:
        return held  # an earlier part re-sent
    return held + new


def merge_grounding(held: Json | None, new: Mapping[str, Any]) -> Json:
    out: Json = dict(held or {})
    for key, value in new.items():
        if key in ("groundingChunks", "groundingSupports") and isinstance(value, list):
            if key == "groundingSupports":
                value = [_accumulated(s) for s in value]
            old = out.get(key)
            out[key] = _merge_list(old if isinstance(old, list) else None, value)
        else:
            out[key] = value
    return out


def _accumulated(support: object) -> object:
    if isinstance(support, Mapping) and isinstance(support.get("segment"), Mapping):
        seg = {k: v for k, v in support["segment"].items() if k != "partIndex"}
        return {**support, "segment": seg}
    return support


class _Candidate:
    __slots__ = ("extra", "grounding", "parts", "role")

    def __init__(self) -> None:
        self.parts: list[Json] = []
        self.extra: Json = {}
        self.grounding: Json | None = None
        self.role: object = None

    def add_part(self, part: Mapping[str, Any]) -> str:
        """Append one streamed part; the answer text it adds ("" for none)."""
        text = part.get("text")
        thought = part.get("thought") is True
        last = self.parts[-1] if self.parts else None
        if isinstance(text, str) and "functionCall" not in part:
            if (
                last is not None
                and isinstance(last.get("text"), str)
                and (last.get("thought") is True) == thought
            ):
                last["text"] += text
                if "thoughtSignature" in part and "thoughtSignature" not in last:
                    last["thoughtSignature"] = part["thoughtSignature"]
                extra = {k: v for k, v in part.items()
                         if k not in ("text", "thought", "thoughtSignature")}
                last.update(extra)  # unknown keys are kept, for the field table to see
            else:
                self.parts.append(dict(part))
            return "" if thought else text
        if set(part) == {"thoughtSignature"} and last is not None:
            last.setdefault("thoughtSignature", part["thoughtSignature"])
            return ""
        self.parts.append(dict(part))
        return ""

    def body(self, index: int) -> Json:
        cand: Json = {"content": {"role": self.role or "model", "parts": self.parts}}
        cand.update(self.extra)
        if self.grounding is not None:
            cand["groundingMetadata"] = self.grounding
        cand["index"] = index
        return cand


class GeminiStreamParser(StreamParser):
    """Assembles stream chunks into one GenerateContentResponse."""

    def __init__(self) -> None:
        self._candidates: dict[int, _Candidate] = {}
        self._top: Json = {}
        self._chunks = 0
        self._dropped: list[tuple[str, tuple[str | int, ...]]] = []
        self._ctx: ContextSet | None = None
        self._spec: ContextSpec | None = None

    @property
    def done(self) -> bool:
        return False  # no terminal event: the stream ends with the connection

    def bind_context(self, ctx: ContextSet, spec: ContextSpec) -> None:
        """Grounding chunks are context on routes whose `context.from` has `response`: they
        join `ctx` when the stream ends, before the answer is judged (it is judged whole: the
        supports come with the last chunk). Not earlier: a chunk's id (`grounding_ids`)
        depends on every chunk of the answer, so an id bound early could name another text."""
        if "response" in spec.from_:
            self._ctx, self._spec = ctx, spec

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if event.event is not None:
            self._dropped.append(("sse", ("event",)))  # the protocol names no events
        if not event.data.strip():
            return []
        chunk = loads_unique(event.data, stdlib=True)
        if not isinstance(chunk, dict):
            raise ProtocolError("gemini: a stream chunk is not a JSON object")
        if "error" in chunk:
            raise ProtocolError("gemini: the stream carried an error")
        log = FieldLog()
        clean(BODY_TABLE, chunk, log)
        # Anything the table would not relay as is: the stream is re-framed, never relayed.
        self._dropped.extend(("frame", p) for _, p in log.unknown + log.dropped)
        self._chunks += 1
        for key in _TOP_LAST:
            if key in chunk:
                self._top[key] = chunk[key]
        for key in chunk:
            if key not in _TOP_LAST and key != "candidates":
                self._top[key] = chunk[key]
        deltas: list[TextDelta] = []
        candidates = chunk.get("candidates")
        if candidates is not None and not isinstance(candidates, list):
            raise ProtocolError("gemini: candidates is not a list")
        seen: set[int] = set()
        for pos, cand in enumerate(candidates or []):
            if not isinstance(cand, Mapping):
                raise ProtocolError("gemini: a candidate is not an object")
            index = cand.get("index", pos)
            if type(index) is not int or not 0 <= index < 64:
                raise ProtocolError("gemini: a candidate index is out of range")
            if index in seen:  # as in a body: which one the client reads is the SDK's guess
                raise ProtocolError("gemini: two candidates of one chunk have the same index")
            seen.add(index)
            st = self._candidates.setdefault(index, _Candidate())
            self._candidate(st, index, cand, deltas)
        return deltas

    def _candidate(
        self, st: _Candidate, index: int, cand: Mapping[str, Any], deltas: list[TextDelta]
    ) -> None:
        content = cand.get("content")
        if content is not None:
            if not isinstance(content, Mapping):
                raise ProtocolError("gemini: a candidate's content is not an object")
            if "role" in content:
                st.role = content["role"]
            parts = content.get("parts") or []
            if not isinstance(parts, list):
                raise ProtocolError("gemini: parts is not a list")
            for part in parts:
                if not isinstance(part, Mapping):
                    raise ProtocolError("gemini: a content part is not an object")
                text = st.add_part(part)
                if text:
                    deltas.append((channel_key(("candidates", index, "text")), text))
        for key, value in cand.items():
            if key in ("content", "index"):
                continue
            if key == "groundingMetadata":
                if not isinstance(value, Mapping):
                    raise ProtocolError("gemini: groundingMetadata is not an object")
                st.grounding = merge_grounding(st.grounding, value)
            else:
                st.extra[key] = value

    def body(self) -> Json:
        body: Json = {}
        if self._candidates:
            body["candidates"] = [
                self._candidates[i].body(i) for i in sorted(self._candidates)
            ]
        body.update(self._top)
        return body

    def finish(self) -> Answer:
        if self._chunks == 0:
            raise ProtocolError("gemini: the stream carried no chunk")
        body = self.body()
        blocked = isinstance(body.get("promptFeedback"), Mapping) and body["promptFeedback"].get(
            "blockReason"
        )
        if not blocked and (
            not self._candidates
            or any("finishReason" not in c.extra for c in self._candidates.values())
        ):
            raise ProtocolError("gemini: the stream ended before its candidates finished")
        answer = parse_body(body)
        answer.dropped.extend(self._dropped)
        if self._ctx is not None:
            self._ctx.extend(grounding_chunks(body))
        return answer

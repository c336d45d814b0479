"""rag-json: any JSON RAG endpoint, read through the route's RFC 6901 pointers.

The answer text (`rag.answer`) is a content channel; a structured claims list (`rag.claims`,
items `{text, citations}`) is a content channel whose `structured` holds the claims.

Field table (DESIGN §2): the answer and claims are channels; the context list is trusted
retrieval output, kept as it came; the envelope fields named by `rag.keep` are checked metadata,
kept in every decision's body (released, partial, abstained, review, blocked) when their value
is a scalar of metadata shape (a number, a boolean, null, or a string shaped as a model name or
id, `fields.is_model`: no whitespace, at most 128 characters); everything else, an object, a
list or a string with a space in it, is dropped on every decision, as other adapters drop
metadata of the wrong shape, because a field of unknown meaning could repeat withheld text or
carry a sentence nobody verified. A body with a duplicate key is ambiguous and fails closed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway import jsonpointer
from gateway.context import Trust, generic_request_context
from gateway.errors import ProtocolError
from gateway.policy import Policy, RagSpec, Route
from gateway.protocols.base import (
    QUESTION_MAX,
    Adapter,
    RequestInfo,
    StreamParser,
    TextDelta,
    rebuild_text,
    split_claims,
)
from gateway.protocols.fields import is_model, loads_unique
from gateway.protocols.relay import relayed_code, relayed_fields, relayed_message, relayed_token
from gateway.sse import SSEEvent
from gateway.types import Answer, Channel, Claim, ContextSet, Outcome

__all__ = ["RagAnswer", "RagJson", "RagJsonStreamParser"]

NAME = "rag-json"
Json = dict[str, Any]


@dataclass(slots=True)
class RagAnswer(Answer):
    """An Answer that remembers the route's RagSpec, so rendering keeps that route's fields."""

    spec: RagSpec | None = None


def _keepable(value: object) -> bool:
    """Scalar metadata only: a container could carry anything, a string with a space (or
    longer than any id) a sentence. A status or trace id is token-shaped."""
    if isinstance(value, str):
        return is_model(value)
    return value is None or isinstance(value, bool | int | float)


def _spec(route: Route) -> RagSpec:
    return route.rag if route.rag is not None else RagSpec(answer="/answer")


def _citation_id(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, Mapping):
        # One level only: an `id` that is itself an object would go out with what it holds.
        inner = value.get("id")
        if isinstance(inner, str | int) and not isinstance(inner, bool):
            return _citation_id(inner)
    raise ProtocolError("rag-json: a claim citation is neither an id nor an object with one")


def _claim_item(item: object, rag: RagSpec) -> object:
    """A structured claim as the client gets it: its text and its citations' ids, nothing
    else (a `note` or a citation's `title` beside them would be unverified text)."""
    if not isinstance(item, Mapping):
        return item
    out: Json = {}
    if rag.claim_text in item:
        out[rag.claim_text] = item[rag.claim_text]
    cits = item.get(rag.claim_citations)
    if isinstance(cits, list):
        out[rag.claim_citations] = [
            {"id": c.get("id")} if isinstance(c, Mapping) else c for c in cits
        ]
    return out


def parse_body(body: object, rag: RagSpec) -> Answer:
    if not isinstance(body, Mapping):
        raise ProtocolError("rag-json: response body is not a JSON object")
    answer = RagAnswer(protocol=NAME, body=dict(body), spec=rag)
    found = False
    if rag.answer is not None:
        text = jsonpointer.resolve(body, rag.answer)
        if isinstance(text, str):
            answer.channels.append(Channel("content", jsonpointer.parse(rag.answer), text))
            found = True
        elif text is not jsonpointer.MISSING and text is not None:
            raise ProtocolError(f"rag-json: answer at {rag.answer!r} is not a string")
    if rag.claims is not None:
        items = jsonpointer.resolve(body, rag.claims)
        if isinstance(items, list):
            claims: list[tuple[str, tuple[str, ...]]] = []
            for i, item in enumerate(items):
                if not isinstance(item, Mapping) or not isinstance(item.get(rag.claim_text), str):
                    raise ProtocolError(f"rag-json: claim {i} has no text")
                cits = item.get(rag.claim_citations)
                if cits is None:
                    cits = []
                if not isinstance(cits, list):
                    raise ProtocolError(f"rag-json: claim {i} citations is not a list")
                claims.append((str(item[rag.claim_text]), tuple(_citation_id(c) for c in cits)))
            answer.channels.append(
                Channel(
                    "content",
                    jsonpointer.parse(rag.claims),
                    "\n".join(t for t, _ in claims),
                    structured=tuple(claims),
                )
            )
            found = True
        elif items is not jsonpointer.MISSING and items is not None:
            raise ProtocolError(f"rag-json: claims at {rag.claims!r} is not a list")
    if not found:
        raise ProtocolError("rag-json: the response has neither answer text nor claims")
    usage = body.get("usage")
    if isinstance(usage, Mapping):
        for dst, keys in (
            ("input", ("input_tokens", "prompt_tokens")),
            ("output", ("output_tokens", "completion_tokens")),
        ):
            for k in keys:
                v = usage.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    answer.usage = {**answer.usage, dst: v}
                    break
    return answer


def _project(node: Any, paths: list[tuple[str, ...]]) -> Any:
    """Only the parts of `node` on `paths` (list slots off every path become null)."""
    if any(not p for p in paths):
        return copy.deepcopy(node)
    heads: dict[str, list[tuple[str, ...]]] = {}
    for p in paths:
        heads.setdefault(p[0], []).append(p[1:])
    if isinstance(node, Mapping):
        return {k: _project(node[k], rest) for k, rest in heads.items() if k in node}
    if isinstance(node, list):
        out: list[Any] = [None] * len(node)
        for k, rest in heads.items():
            if k.isdigit() and int(k) < len(node):
                out[int(k)] = _project(node[int(k)], rest)
        return out
    return None


def _keep(out: Json, body: Mapping[str, Any], tokens: tuple[str, ...]) -> None:
    """Copy the field at `tokens` from `body` into `out` if it is keepable metadata. Kept
    pointers name fields of objects; a path through a list, or a non-scalar value, keeps
    nothing."""
    node: Any = body
    for t in tokens:
        if not isinstance(node, Mapping) or t not in node:
            return
        node = node[t]
    if not _keepable(node):
        return
    dst: Any = out
    for t in tokens[:-1]:
        dst = dst.setdefault(t, {})
        if not isinstance(dst, dict):
            return  # the answer or context already holds something else there
    dst.setdefault(tokens[-1], node)


def _set(doc: Any, tokens: Sequence[str], value: object) -> None:
    node = doc
    for t in tokens[:-1]:
        node = node[int(t)] if isinstance(node, list) else node.setdefault(t, {})
    if isinstance(node, list):
        node[int(tokens[-1])] = value
    else:
        node[tokens[-1]] = value


class RagJsonStreamParser(StreamParser):
    """rag-json has no token stream: each event carries a whole body; the last one counts."""

    def __init__(self, rag: RagSpec) -> None:
        self._rag = rag
        self._last: object = None

    @property
    def done(self) -> bool:
        """No terminal event exists: a rag-json stream ends with its connection."""
        return False

    def feed(self, event: SSEEvent) -> list[TextDelta]:
        if event.event == "error":
            raise ProtocolError("rag-json: the stream carried an error event")
        try:
            self._last = loads_unique(event.data, stdlib=True)
        except ProtocolError as exc:
            raise ProtocolError(f"rag-json: stream event: {exc}") from exc
        return []

    def finish(self) -> Answer:
        if self._last is None:
            raise ProtocolError("rag-json: the stream carried no body")
        return parse_body(self._last, self._rag)


class RagJson(Adapter):
    name = NAME
    reads_rag = True

    def request_info(self, body: Mapping[str, object]) -> RequestInfo:
        return RequestInfo(stream=False, include_usage=False, n=1)

    def question(self, body: Mapping[str, object] | None) -> str | None:
        # An in-house RAG API names its question one of a few ways, or sends chat messages.
        if not isinstance(body, Mapping):
            return None
        found = super().question(body)
        if found is not None:
            return found
        for key in ("question", "query", "prompt"):
            v = body.get(key)
            if isinstance(v, str) and v:
                return v[:QUESTION_MAX]
        return None

    def request_context(self, body: Mapping[str, object], ctx: ContextSet, trust: Trust) -> None:
        generic_request_context(body, ctx, trust.pattern, trust)

    def parse(self, body: Mapping[str, object], route: Route) -> Answer:
        return parse_body(body, _spec(route))

    def stream_parser(self, route: Route) -> RagJsonStreamParser:
        return RagJsonStreamParser(_spec(route))

    def needs_rewrite(self, answer: Answer, policy: Policy) -> bool:
        """Released bytes go out unchanged only when nothing outside the answer, claims,
        context and kept fields was in them."""
        return self._skeleton(answer, policy) != answer.body

    def kept_fields(self, answer: Answer) -> Json:
        """The `rag.keep` fields of this answer with scalar values, as a JSON skeleton (merged
        into the blocked envelope, under keys the envelope does not use)."""
        out: Json = {}
        spec = answer.spec if isinstance(answer, RagAnswer) else None
        for pointer in spec.keep if spec is not None else ():
            _keep(out, answer.body, jsonpointer.parse(pointer))
        return out

    def released_body(self, answer: Answer, policy: Policy) -> dict[str, object]:
        return self._skeleton(answer, policy)

    def partial_body(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> dict[str, object]:
        return self._partial(answer, claims, outcome, policy)

    def template_body(self, answer: Answer, text: str, policy: Policy) -> dict[str, object]:
        return self._template(answer, policy, text)

    @staticmethod
    def _paths(answer: Answer) -> list[tuple[str, ...]]:
        return [tuple(str(p) for p in c.path) for c in answer.channels]

    def _skeleton(self, answer: Answer, policy: Policy) -> Json:
        # The context list is trusted retrieval output, so it is kept alongside the answer.
        spec = answer.spec if isinstance(answer, RagAnswer) else None
        specs = [spec] if spec is not None else _routes_for(answer, policy)
        extra = [jsonpointer.parse(r.context) for r in specs if r.context is not None]
        body = _project(answer.body, [*self._paths(answer), *extra])
        if not isinstance(body, dict):
            return {}
        for pointer in spec.keep if spec is not None else ():
            _keep(body, answer.body, jsonpointer.parse(pointer))
        rag = spec if spec is not None else (specs[0] if specs else RagSpec(answer="/answer"))
        for c in answer.channels:
            if c.structured is not None:
                tokens = [str(p) for p in c.path]
                items = jsonpointer.resolve(body, tokens)
                if isinstance(items, list):
                    _set(body, tokens, [_claim_item(item, rag) for item in items])
        return body

    def _template(self, answer: Answer, policy: Policy, text: str) -> Json:
        body: Json = self._skeleton(answer, policy)
        for c in answer.channels:
            tokens = [str(p) for p in c.path]
            _set(body, tokens, [] if c.structured is not None else text)
        if not any(c.structured is None for c in answer.channels):
            body["answer"] = text
        return body

    def _partial(
        self, answer: Answer, claims: Sequence[Claim], outcome: Outcome, policy: Policy
    ) -> Json:
        body = self._skeleton(answer, policy)
        disclosure = policy.release.templates.partial
        kept, _failed = split_claims(claims, outcome)
        for idx, c in enumerate(answer.channels):
            tokens = [str(p) for p in c.path]
            mine = kept.get(idx, [])
            if c.structured is None:
                _set(body, tokens, rebuild_text(c.text, mine, disclosure))
                continue
            items = jsonpointer.resolve(answer.body, tokens)
            if not isinstance(items, list):
                raise ProtocolError("rag-json: claims list vanished from the answer body")
            all_mine = sorted((cl for cl in claims if cl.channel == idx), key=lambda cl: cl.index)
            keep_pos = {pos for pos, cl in enumerate(all_mine) if cl in mine and pos < len(items)}
            if len(all_mine) != len(items):
                # Claims do not line up one-to-one with items: match by text instead.
                texts = {cl.text for cl in mine}
                keep_pos = {i for i, (t, _) in enumerate(c.structured) if t in texts}
            rag = _rag_for(c, policy)
            # Each kept item as the released body keeps it: its text and citation ids only.
            new_items: list[Any] = [_claim_item(items[i], rag) for i in sorted(keep_pos)]
            new_items.append({rag.claim_text: disclosure, rag.claim_citations: []})
            _set(body, tokens, new_items)
        return body

    def error_envelope(self, status: int, message: str, type_: str) -> dict[str, object]:
        return {"error": {"message": message, "type": type_, "code": status}}

    def error_event(self, message: str, type_: str) -> SSEEvent:
        return SSEEvent(data=json.dumps(self.error_envelope(0, message, type_)), event="error")

    def relay_error(self, body: object) -> dict[str, object] | None:
        if not isinstance(body, Mapping) or not isinstance(body.get("error"), Mapping):
            return None
        error = body["error"]
        message = relayed_message(error.get("message"))
        if message is None:
            return None
        return {"error": relayed_fields(error, message, type=relayed_token, code=relayed_code)}

    def to_stream(self, body: Mapping[str, object], include_usage: bool) -> list[SSEEvent]:
        return [SSEEvent(data=json.dumps(body, ensure_ascii=False))]


def _routes_for(answer: Answer, policy: Policy) -> list[RagSpec]:
    """RagSpecs of the policy whose answer / claims pointers name this answer's channels."""
    paths = {tuple(str(p) for p in c.path) for c in answer.channels}
    out = []
    for route in policy.routes:
        rag = route.rag
        if rag is None:
            continue
        names = {jsonpointer.parse(p) for p in (rag.answer, rag.claims) if p is not None}
        if names & paths:
            out.append(rag)
    return out


def _rag_for(channel: Channel, policy: Policy) -> RagSpec:
    """The RagSpec whose claims pointer names this channel (for item field names)."""
    for route in policy.routes:
        rag = route.rag
        path = tuple(str(p) for p in channel.path)
        if rag is not None and rag.claims is not None and jsonpointer.parse(rag.claims) == path:
            return rag
    return RagSpec()

"""Where an openai-chat exchange's context comes from (DESIGN §3): chunk tags in the trusted
messages of the request, and the search results a Perplexity answer carries (`[N]` markers).

The search results are the upstream's own retrieval, and DESIGN makes them context for one
thing only: numeric `[N]` markers in the text, "the N-th result". So they join the context
only on a route whose `citations.format` is `numeric` (learnt per exchange when its request is
forwarded, `set_route_format`; unknown means no), and never for an answer that carries Mistral
`reference` chunks: those are native citations of the request's chunks, and a reference id
(`1`) must not land on "the first result" (`results_are_context`).
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Mapping

from gateway.context import DEFAULT_TRUST, Trust, content_texts, read_tags
from gateway.protocols.fields import is_url
from gateway.types import Chunk, ContextSet

__all__ = [
    "has_references",
    "numeric_route",
    "request_context",
    "response_context",
    "search_chunks",
    "set_route_format",
]

# Whether this exchange's route reads numeric `[N]` markers (set when its request is
# forwarded, per request task). Unknown means no: the results are then no context.
_NUMERIC: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "citewarden_openai_chat_numeric", default=False
)


def set_route_format(fmt: str) -> None:
    _NUMERIC.set(fmt == "numeric")


def numeric_route() -> bool:
    return _NUMERIC.get()

# OpenAI message roles whose text is read; assistant turns (earlier model output) never are.
_OPENAI_ROLES = {
    "system": "system",
    "developer": "developer",
    "user": "user",
    "tool": "tool",
    "function": "tool",
}


def request_context(
    body: Mapping[str, object],
    ctx: ContextSet,
    pattern: re.Pattern[str] | None,
    trust: Trust = DEFAULT_TRUST,
) -> None:
    """Chunks in the trusted messages of a chat completion request (`trust.roles`; `tool`
    covers the legacy `function` role); user text only with `user` trusted or when signed."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    roles = trust.roles
    for msg in messages:
        if not isinstance(msg, Mapping):
            continue
        role = msg.get("role")
        place = _OPENAI_ROLES.get(role) if isinstance(role, str) else None
        if place is None:
            continue
        trusted = place in roles
        for text in content_texts(msg.get("content")):
            read_tags(ctx, text, pattern, trust, trusted)


def search_chunks(body: object) -> list[Chunk]:
    """Context chunks of a Perplexity answer: the N-th search result (1-based) is chunk "N",
    its `snippet` the text when it has one (else known by id only, like each of `citations[]`,
    which are URLs). An entry that is not an object (or a citation that is not a URL) is no
    chunk, so a marker citing it is hallucinated."""
    if not isinstance(body, Mapping):
        return []
    out: list[Chunk] = []
    results = body.get("search_results")
    for pos, r in enumerate(results if isinstance(results, list) else [], start=1):
        if not isinstance(r, Mapping):
            continue
        snippet, url = r.get("snippet"), r.get("url")
        out.append(
            Chunk(
                id=str(pos),
                text=snippet if isinstance(snippet, str) and snippet.strip() else None,
                source=url if is_url(url) else None,
            )
        )
    urls = body.get("citations")
    for pos, url in enumerate(urls if isinstance(urls, list) else [], start=1):
        if is_url(url):
            out.append(Chunk(id=str(pos), source=url))
    return out


def has_references(body: object) -> bool:
    """Whether any choice's `message.content` is a list holding a Mistral `reference` chunk."""
    choices = body.get("choices") if isinstance(body, Mapping) else None
    for choice in choices if isinstance(choices, list) else []:
        msg = choice.get("message") if isinstance(choice, Mapping) else None
        content = msg.get("content") if isinstance(msg, Mapping) else None
        if isinstance(content, list) and any(
            isinstance(c, Mapping) and c.get("type") == "reference" for c in content
        ):
            return True
    return False


def response_context(body: object, ctx: ContextSet) -> None:
    """The context a whole answer carries: its Perplexity search results, on a numeric route
    and when it has no Mistral references (module docstring)."""
    if numeric_route() and not has_references(body):
        ctx.extend(search_chunks(body))

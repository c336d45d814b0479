"""Where a Responses exchange's context comes from, and the request rewrite that asks for it.

Request side (DESIGN §3): `instructions`, and input items from trusted places only — `system`
/ `developer` messages and tool results (`function_call_output`, `custom_tool_call_output`);
chunk tags in `user` (or earlier `assistant`) turns are not context. The roles follow
`context.trust.roles` when the policy has it, else that default. Responses roles are mapped to
trust roles explicitly (`_ROLES`): a message of a role the API does not have (`tool`,
`function`, …) matches no trust role, even one the policy names, so it is never trusted.

Response side (routes whose `context.from` has `response`): `file_search_call` results, one
chunk per file (its results' texts joined, id = `file_id`), only when file search was enabled
(`file_search_enabled`: a `file_search` tool in the request; for a stored response's GET, in its
echoed `tools`) — otherwise they are the upstream's own text; and the response's echo of
`instructions`, which is all a stored response (`GET /v1/responses/{id}`) says of its prompt.
To get the results the gateway adds `include: ["file_search_call.results"]` to the forwarded
request; whether the client asked for them itself is remembered for this exchange (a context
variable, set per request task) so they are removed from its copy otherwise.
"""

from __future__ import annotations

import contextvars
import json
import re
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from gateway.context import DEFAULT_TRUST, Trust, read_tags
from gateway.types import Chunk, ContextSet

__all__ = [
    "ENCRYPTED_INCLUDE",
    "RESULTS_INCLUDE",
    "client_request",
    "client_wants_encrypted",
    "client_wants_results",
    "file_search_chunks",
    "file_search_enabled",
    "forward_body",
    "had_request",
    "instructions_context",
    "remember_request",
    "request_context",
    "response_context",
    "set_client_wants_results",
]

RESULTS_INCLUDE = "file_search_call.results"
ENCRYPTED_INCLUDE = "reasoning.encrypted_content"
_TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
# The trust role of each Responses message role; `assistant` (earlier model output) is never
# read. Any other role is no Responses role: matching a trust role by name (a chat `tool`
# message pasted into `input`) must not make it a tool result.
_ROLES = {"system": "system", "developer": "developer", "user": "user"}

# Did this exchange's client ask for file_search results itself? Unknown means no: the
# results are then removed from the client's copy (the safe side).
_CLIENT_RESULTS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "citewarden_responses_client_results", default=False
)
# Did it ask for reasoning items' `encrypted_content`? The API answers it only then, and no
# shape check tells base64 from words joined by `_` or CamelCase: unasked, it is withheld.
_CLIENT_ENCRYPTED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "citewarden_responses_client_encrypted", default=False
)


# The body this exchange's client sent (raw; parsed when an echo needs comparing): a
# response's echoes of the request (`instructions`, `tools`, …) go out only as the client sent
# them. None: no request body (a stored response's GET, or no exchange at all).
_REQUEST: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "citewarden_responses_request", default=None
)


def remember_request(raw: bytes) -> None:
    _REQUEST.set([raw, None])


def client_request() -> Mapping[str, Any]:
    """The JSON object this exchange's client sent; empty when there was none."""
    held = _REQUEST.get()
    if held is None:
        return {}
    if held[1] is None:
        try:
            value = orjson.loads(held[0]) if held[0].strip() else {}
        except orjson.JSONDecodeError:
            value = {}
        held[1] = value if isinstance(value, dict) else {}
    parsed: Mapping[str, Any] = held[1]
    return parsed


def had_request() -> bool:
    """Whether this exchange's client sent a request body (a POST, even `{}`); False for a
    stored response's GET and outside an exchange."""
    held = _REQUEST.get()
    return held is not None and bool(held[0].strip())


def client_wants_results() -> bool:
    return _CLIENT_RESULTS.get()


def set_client_wants_results(value: bool) -> None:
    _CLIENT_RESULTS.set(value)


def client_wants_encrypted() -> bool:
    return _CLIENT_ENCRYPTED.get()


def _texts(content: object) -> Iterator[str]:
    """Text of a message `content` / tool `output`: a string or a list of text parts."""
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]


def _items_context(
    items: object, ctx: ContextSet, pattern: re.Pattern[str] | None, trust: Trust
) -> None:
    """Chunk tags of input items, each counted by `context.trust` / `context.signing` as the
    chat adapters count theirs (untrusted ones are rejected and counted)."""
    if isinstance(items, str):  # a bare string input is a user message
        read_tags(ctx, items, pattern, trust, "user" in trust.roles)
        return
    if not isinstance(items, list):
        return
    for item in items:
        if not isinstance(item, Mapping):
            continue
        itype = item.get("type")
        if itype in _TOOL_OUTPUTS:
            for text in _texts(item.get("output")):
                read_tags(ctx, text, pattern, trust, "tool" in trust.roles)
        elif itype in (None, "message"):
            role = item.get("role")
            if not isinstance(role, str) or role == "assistant":
                continue  # earlier model output is never context, signed or not
            place = _ROLES.get(role)
            trusted = place is not None and place in trust.roles
            for text in _texts(item.get("content")):
                read_tags(ctx, text, pattern, trust, trusted)


def request_context(
    body: Mapping[str, object],
    ctx: ContextSet,
    pattern: re.Pattern[str] | None,
    trust: Trust = DEFAULT_TRUST,
) -> None:
    """Chunks in `instructions` (the application's, trusted as a system message) and in the
    trusted input items of a create request."""
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        read_tags(ctx, instructions, pattern, trust, True)
    else:
        _items_context(instructions, ctx, pattern, trust)
    _items_context(body.get("input"), ctx, pattern, trust)


def file_search_chunks(body: Mapping[str, object]) -> list[Chunk]:
    """One chunk per file among the response's file_search results, texts joined in order."""
    texts: dict[str, list[str]] = {}
    names: dict[str, str | None] = {}
    output = body.get("output")
    for item in output if isinstance(output, list) else []:
        if not isinstance(item, Mapping) or item.get("type") != "file_search_call":
            continue
        results = item.get("results")
        for r in results if isinstance(results, list) else []:
            if not isinstance(r, Mapping):
                continue
            fid = r.get("file_id")
            if not isinstance(fid, str) or not fid:
                continue
            parts = texts.setdefault(fid, [])
            if isinstance(r.get("text"), str):
                parts.append(r["text"])
            filename = r.get("filename")
            names.setdefault(fid, filename if isinstance(filename, str) else None)
    return [
        Chunk(id=fid, text="\n\n".join(parts) if parts else None, source=names.get(fid))
        for fid, parts in texts.items()
    ]


def file_search_enabled(response: Mapping[str, object] | None) -> bool:
    """Whether this exchange's file_search results are context: the request enabled the tool
    (a `file_search` entry in its `tools`; the forwarded request has the client's tools). A
    `file_search_call` the request never asked for is the upstream's own text. A stored
    response's GET has no request body: there the stored response's echoed `tools` is all
    that says what its request enabled, so they count only when it lists file_search."""
    if had_request():
        tools = client_request().get("tools")
    else:
        tools = response.get("tools") if isinstance(response, Mapping) else None
    return isinstance(tools, list) and any(
        isinstance(t, Mapping) and t.get("type") == "file_search" for t in tools
    )


def response_context(
    body: object, ctx: ContextSet, pattern: re.Pattern[str] | None, trust: Trust = DEFAULT_TRUST
) -> None:
    """File-search results (when file search was enabled), and the echoed instructions of a
    response fetched without a request body (a stored response's GET): all it says of its
    prompt, counted as the request's instructions would be, signing included. With a request,
    only the request's instructions count: an echo that differs from them is the upstream's,
    not context."""
    if not isinstance(body, Mapping):
        return
    results = file_search_chunks(body)
    if results and file_search_enabled(body):  # the request is read only when there are any
        ctx.extend(results)
    if had_request():
        return  # the request's own instructions were read; the upstream's echo adds nothing
    instructions_context(body, ctx, trust, pattern)


def instructions_context(
    response: Mapping[str, object],
    ctx: ContextSet,
    trust: Trust,
    pattern: re.Pattern[str] | None = None,
) -> None:
    """A stored response's echoed instructions into `ctx`, read as the request's instructions
    would be (signing included); `pattern`: the policy's chunk pattern (default: the trust's)."""
    if pattern is None:
        pattern = trust.pattern
    instructions = response.get("instructions")
    if isinstance(instructions, str):
        read_tags(ctx, instructions, pattern, trust, True)
    else:
        _items_context(instructions, ctx, pattern, trust)


def _query_includes(path_qs: str, value: str = RESULTS_INCLUDE) -> bool:
    query = path_qs.partition("?")[2]
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return any(k in ("include", "include[]") and v == value for k, v in pairs)


def _body_includes(raw: bytes, value: str) -> bool:
    """Whether a request body's `include` list names `value` (parsed only when it may)."""
    if value.encode() not in raw:
        return False
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    include = body.get("include") if isinstance(body, dict) else None
    return isinstance(include, list) and value in include


def forward_body(raw: bytes, path_qs: str, spec: Any, *, shadow: bool = False) -> bytes:
    """The request body to forward, and this exchange's record of whether the client asked for
    file_search results and for reasoning's `encrypted_content`. With `response` among the
    context sources, a create request gets `include: ["file_search_call.results"]` added —
    except in shadow mode, which forwards the upstream's answer as it is and so must not change
    what the upstream answers. A body that is not a JSON object is forwarded as is (the
    upstream answers it)."""
    remember_request(raw)
    _CLIENT_ENCRYPTED.set(
        _query_includes(path_qs, ENCRYPTED_INCLUDE) or _body_includes(raw, ENCRYPTED_INCLUDE)
    )
    if not raw.strip():
        set_client_wants_results(_query_includes(path_qs))
        return raw
    rewrites = not shadow and "response" in getattr(spec, "from_", ())
    if not rewrites and RESULTS_INCLUDE.encode() not in raw:
        set_client_wants_results(_query_includes(path_qs))  # nothing to parse the body for
        return raw
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        set_client_wants_results(False)
        return raw
    if not isinstance(body, dict):
        set_client_wants_results(False)
        return raw
    include = body.get("include")
    asked = isinstance(include, list) and RESULTS_INCLUDE in include
    set_client_wants_results(asked or _query_includes(path_qs))
    if asked or not rewrites:
        return raw
    if include is not None and not isinstance(include, list):
        return raw  # the upstream rejects it; nothing to add to
    body["include"] = [*(include or []), RESULTS_INCLUDE]
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

"""A `chat.completion` body → the protocol-neutral Answer.

Channels per choice: content, refusal, tool call / legacy function call arguments,
reasoning_content / reasoning (and OpenRouter's readable `reasoning_details[]`, Mistral's
`thinking` chunks), audio transcript. The body is walked once through `BODY_TABLE` first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.fields import FieldLog, clean, is_index
from gateway.protocols.openai_chat.chunks import chunks_text, thinking_text
from gateway.protocols.openai_chat.context import numeric_route
from gateway.protocols.openai_chat.fields import BODY_TABLE, REASONING_KEYS, SEARCH_KEYS
from gateway.types import Answer, Channel

__all__ = ["NAME", "parse_body"]

NAME = "openai-chat"

Json = dict[str, Any]

# OpenRouter `reasoning_details[]`: the field holding the text of each readable entry type.
_DETAIL_TEXT = {"reasoning.text": "text", "reasoning.summary": "summary"}


def _usage(body: Mapping[str, object]) -> dict[str, int]:
    u = body.get("usage")
    if not isinstance(u, Mapping):
        return {}
    out: dict[str, int] = {}
    for src, dst in (
        ("prompt_tokens", "input"),
        ("completion_tokens", "output"),
        ("total_tokens", "total"),
    ):
        v = u.get(src)
        if isinstance(v, int) and not isinstance(v, bool):
            out[dst] = v
    return out


def _text_or_none(value: object, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise ProtocolError(f"openai-chat: {where} must be a string or null")


def _drop_search_lists(kept: Json, log: FieldLog) -> None:
    """Perplexity's lists are context for numeric `[N]` markers only (context.py); on any
    other route they cite nothing the gateway checked, and a URL is free text the upstream
    chose (`https://x.example/the-pump-was-built-in-1931`), so the body does not keep them,
    nor anything the field table found in them."""
    for key in SEARCH_KEYS:
        if key in kept:
            del kept[key]
            log.dropped.append(("top", (key,)))
    log.unknown[:] = [(lv, p) for lv, p in log.unknown if p[0] not in SEARCH_KEYS]


def _check_indices(choice: Mapping[str, object], ci: int) -> None:
    """An index the body carries (the choice's; a tool call's, which some servers copy from
    the stream) is an integer, or the answer is refused: the stream parser refuses the same
    values, so both modes of a route give one answer."""
    if choice.get("index") is not None and not is_index(choice["index"]):
        raise ProtocolError(f"openai-chat: choice {ci} has an index that is not an integer")
    message = choice["message"]
    calls = message.get("tool_calls") if isinstance(message, Mapping) else None
    for call in calls if isinstance(calls, list) else []:
        if (isinstance(call, Mapping) and call.get("index") is not None
                and not is_index(call["index"])):
            raise ProtocolError(f"openai-chat: a tool call of choice {ci} has an index that "
                                "is not an integer")


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping):
        raise ProtocolError("openai-chat: response body is not a JSON object")
    obj = body.get("object")
    if obj is not None and obj != "chat.completion":
        raise ProtocolError("openai-chat: the body is not a chat.completion object")
    if not isinstance(body.get("choices"), list):
        raise ProtocolError("openai-chat: response has no choices list")
    raw_choices: list[object] = body["choices"]  # type: ignore[assignment]
    for ci, choice in enumerate(raw_choices):
        if not isinstance(choice, Mapping) or not isinstance(choice.get("message"), Mapping):
            raise ProtocolError(f"openai-chat: choice {ci} has no message object")
        _check_indices(choice, ci)
    log = FieldLog()
    kept: Json = clean(BODY_TABLE, dict(body), log)  # type: ignore[assignment]
    choices = kept.get("choices")
    if not isinstance(choices, list):
        raise ProtocolError("openai-chat: response has no choices list")
    if ("citations" in kept or "search_results" in kept) and not numeric_route():
        _drop_search_lists(kept, log)
    answer = Answer(protocol=NAME, body=kept, usage=_usage(kept))
    answer.unknown_fields.extend(path for _, path in log.unknown)
    answer.dropped.extend(log.dropped)
    for ci, choice in enumerate(choices):
        base: tuple[str | int, ...] = ("choices", ci)
        msg: Mapping[str, object] = choice["message"]
        mpath = (*base, "message")
        if choice.get("logprobs") is not None:
            answer.has_logprobs = True

        def add(kind: Any, path: tuple[str | int, ...], text: str | None, ci: int = ci) -> None:
            if text is not None:
                answer.channels.append(Channel(kind=kind, path=path, text=text, choice=ci))

        content = msg.get("content")
        if isinstance(content, list):
            text, native = chunks_text(content)
            answer.channels.append(
                Channel(kind="content", path=(*mpath, "content"), text=text, choice=ci,
                        native=native)
            )
        else:
            add("content", (*mpath, "content"), _text_or_none(content, "content"))
        add("refusal", (*mpath, "refusal"), _text_or_none(msg.get("refusal"), "refusal"))
        for key in REASONING_KEYS:
            value = msg.get(key)
            if isinstance(value, str):
                add("reasoning", (*mpath, key), value)
        details = msg.get("reasoning_details")
        for di, entry in enumerate(details if isinstance(details, list) else []):
            kind = entry.get("type") if isinstance(entry, dict) else None
            field_name = _DETAIL_TEXT.get(kind) if isinstance(kind, str) else None
            if field_name is not None and isinstance(entry.get(field_name), str):
                add("reasoning", (*mpath, "reasoning_details", di, field_name), entry[field_name])
        for k, chunk in enumerate(content if isinstance(content, list) else []):
            if chunk.get("type") == "thinking":
                add("reasoning", (*mpath, "content", k), thinking_text(chunk))
        tool_calls = msg.get("tool_calls")
        if isinstance(tool_calls, list):
            for ti, call in enumerate(tool_calls):
                if not isinstance(call, Mapping):
                    raise ProtocolError("openai-chat: tool call is not an object")
                tpath = (*mpath, "tool_calls", ti)
                fn, custom = call.get("function"), call.get("custom")
                if isinstance(fn, Mapping):
                    args = _text_or_none(fn.get("arguments"), "tool arguments")
                    add("tool_arguments", (*tpath, "function", "arguments"), args or "")
                elif isinstance(custom, Mapping):
                    inp = _text_or_none(custom.get("input"), "custom tool input")
                    add("tool_arguments", (*tpath, "custom", "input"), inp or "")
                else:
                    raise ProtocolError("openai-chat: tool call without function")
        elif tool_calls is not None:
            raise ProtocolError("openai-chat: tool_calls is not a list")
        fc = msg.get("function_call")
        if isinstance(fc, Mapping):
            args = _text_or_none(fc.get("arguments"), "function_call arguments")
            add("tool_arguments", (*mpath, "function_call", "arguments"), args or "")
        audio = msg.get("audio")
        if isinstance(audio, Mapping):
            add(
                "transcript",
                (*mpath, "audio", "transcript"),
                _text_or_none(audio.get("transcript"), "audio transcript"),
            )
    return answer

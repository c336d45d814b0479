"""The Responses field table: every field the adapter knows, at every level, and the shape a
metadata field must have to be kept. A field not listed here is unknown and dropped on verified
routes unless `channels.allow_fields` names it (DESIGN §2, "Every field is decided").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from gateway.protocols.fields import is_opaque

__all__ = [
    "ANNOTATION_KEYS",
    "ANNOTATION_SHAPES",
    "BLANKED",
    "ECHOES",
    "ITEM_KEYS",
    "PART_KEYS",
    "RESULT_KEYS",
    "RESULT_SHAPES",
    "TOP_KEYS",
    "annotation_field_ok",
    "attribute_ok",
    "clean_annotation",
    "shape_ok",
]

_TOKEN = re.compile(r"[A-Za-z0-9_.:@/+=\-]{1,256}")
# A file's name: one path segment, no whitespace, no citation brackets, no control or
# invisible characters. Anything else (a sentence) is text nobody verifies: blanked like a title.
_FILENAME = re.compile(
    r"[^\s\x00-\x1f\x7f\u200b-\u200f\u202a-\u202e\u2066-\u2069/\\\[\]]{1,255}"
)
_URL = re.compile(r"https?://[^\s\x00-\x1f\x7f]{1,2048}")
# An id the provider made and nobody checks (a container's, a generated file's): a short
# prefix, one separator and letters and digits (`cntr_682e…`, `cfile_682e…`, `file-2dtb…`),
# so no sentence fits in it, only a bounded run of letters.
_PROVIDER_ID = re.compile(r"[A-Za-z]{1,16}[-_][A-Za-z0-9]{1,128}")


def _token(v: object) -> bool:
    return isinstance(v, str) and _TOKEN.fullmatch(v) is not None


def _provider_id(v: object) -> bool:
    return isinstance(v, str) and _PROVIDER_ID.fullmatch(v) is not None


def _offset(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _opt_token(v: object) -> bool:
    return v is None or _token(v)


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _opt_number(v: object) -> bool:
    return v is None or _number(v)


def _opt_int(v: object) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))


def _opt_bool(v: object) -> bool:
    return v is None or isinstance(v, bool)


def _any(v: object) -> bool:
    return True


def _opt_obj(v: object) -> bool:
    return v is None or isinstance(v, Mapping)


def _opt_list(v: object) -> bool:
    return v is None or isinstance(v, list)


def _numbers_tree(v: object) -> bool:
    """Usage: numbers, or objects of numbers, nothing else (no text can hide in it)."""
    if v is None or _number(v):
        return True
    if isinstance(v, Mapping):
        return all(_token(k) and _numbers_tree(x) for k, x in v.items())
    return False


def _error(v: object) -> bool:
    # A failed response's error message is upstream text: only its absence is kept.
    return v is None


def _incomplete(v: object) -> bool:
    if v is None:
        return True
    return isinstance(v, Mapping) and set(v) <= {"reason"} and _opt_token(v.get("reason"))


def _status(v: object) -> bool:
    return v in ("completed", "failed", "in_progress", "cancelled", "queued", "incomplete")


# Top-level fields of a Response object. Echoes of the client's own request (instructions,
# tools, text format, metadata, …) are decided against the request (ECHOES).
TOP_KEYS: dict[str, Callable[[object], bool]] = {
    "id": _token,
    "object": lambda v: v == "response",
    "created_at": _number,
    "completed_at": _opt_number,
    "status": _status,
    "background": _opt_bool,
    "error": _error,
    "incomplete_details": _incomplete,
    "instructions": _any,
    "max_output_tokens": _opt_int,
    "max_tool_calls": _opt_int,
    "model": _token,
    "output": lambda v: isinstance(v, list),
    "parallel_tool_calls": _opt_bool,
    "previous_response_id": _opt_token,
    "conversation": _opt_obj,
    "prompt": _opt_obj,
    "prompt_cache_key": _opt_token,
    "prompt_cache_retention": _opt_token,
    "reasoning": _opt_obj,
    "safety_identifier": _opt_token,
    "service_tier": _opt_token,
    "store": _opt_bool,
    "temperature": _opt_number,
    "text": _opt_obj,
    "tool_choice": _any,
    "tools": _opt_list,
    "top_logprobs": _opt_int,
    "top_p": _opt_number,
    "truncation": _opt_token,
    "usage": _numbers_tree,
    "user": _opt_token,
    "metadata": _opt_obj,
}

def _config_text(v: object) -> bool:
    """`text` as the API echoes a plain-text or JSON-mode request: no schema, no prose."""
    if v is None:
        return True
    if not isinstance(v, Mapping) or not set(v) <= {"format", "verbosity"}:
        return False
    fmt = v.get("format")
    return _opt_token(v.get("verbosity")) and fmt in (None, {"type": "text"},
                                                      {"type": "json_object"})


def _config_reasoning(v: object) -> bool:
    return v is None or (
        isinstance(v, Mapping)
        and set(v) <= {"effort", "summary", "generate_summary"}
        and all(_opt_token(x) for x in v.values())
    )


def _conversation(v: object) -> bool:
    return v is None or (isinstance(v, Mapping) and set(v) <= {"id"} and _token(v.get("id")))


# The request's fields a response echoes. The upstream writes the echo, so it goes out only
# when it is the client's own value (what the request said) or a bare setting of no text; else
# the response carries the request's value, or the API's default when the request had none.
ECHOES: dict[str, tuple[Callable[[object], bool], object]] = {
    "instructions": (lambda v: v is None, None),
    "tools": (lambda v: v is None or v == [], []),
    "tool_choice": (_opt_token, "auto"),
    "text": (_config_text, {"format": {"type": "text"}}),
    "reasoning": (_config_reasoning, {"effort": None, "summary": None}),
    "prompt": (lambda v: v is None, None),
    "conversation": (_conversation, None),
    "metadata": (lambda v: v is None or v == {}, {}),
}

# Known keys per output item type; the text-bearing ones are channels (parse.py).
ITEM_KEYS: dict[str, frozenset[str]] = {
    "message": frozenset({"id", "type", "role", "status", "content", "phase"}),
    "function_call": frozenset(
        {"id", "type", "call_id", "name", "arguments", "status", "namespace"}
    ),
    "custom_tool_call": frozenset({"id", "type", "call_id", "name", "input", "namespace"}),
    "reasoning": frozenset({"id", "type", "summary", "content", "encrypted_content", "status"}),
    "file_search_call": frozenset({"id", "type", "status", "queries", "results"}),
    "web_search_call": frozenset({"id", "type", "status", "action"}),
}
ITEM_SHAPES: dict[str, Callable[[object], bool]] = {
    "id": _token,
    "call_id": _token,
    "name": _token,
    "namespace": _opt_token,
    "status": lambda v: v is None or _token(v),
    "role": lambda v: v == "assistant",
    "phase": _opt_token,
    # The reasoning state a client hands back on its next turn: base64 (either alphabet,
    # `=` padded), never prose.
    "encrypted_content": lambda v: v is None or is_opaque(v),
}

PART_KEYS: dict[str, frozenset[str]] = {
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
    "refusal": frozenset({"type", "refusal"}),
}

ANNOTATION_KEYS: dict[str, frozenset[str]] = {
    "url_citation": frozenset({"type", "url", "start_index", "end_index", "title"}),
    "file_citation": frozenset({"type", "file_id", "filename", "index"}),
    "container_file_citation": frozenset(
        {"type", "container_id", "file_id", "filename", "start_index", "end_index"}
    ),
    "file_path": frozenset({"type", "file_id", "index"}),
}
# The shape of each annotation field. `url` (url_citation) and `file_id` (file_citation,
# container_file_citation) name the chunk a claim cites: they are checked against the context,
# and one of another shape makes the citation malformed. `title` is web page text: blanked
# unless allow-listed, like a `filename` not shaped like one.
ANNOTATION_SHAPES: dict[str, Callable[[object], bool]] = {
    "type": lambda v: isinstance(v, str) and v in ANNOTATION_KEYS,
    "url": lambda v: isinstance(v, str) and _URL.fullmatch(v) is not None,
    "file_id": _token,
    "container_id": _provider_id,
    "filename": lambda v: isinstance(v, str) and _FILENAME.fullmatch(v) is not None,
    "title": lambda v: isinstance(v, str),
    "index": _offset,
    "start_index": _offset,
    "end_index": _offset,
}
# Where a field means something else in one annotation type: a `file_path` names a file the
# answer produced, it cites nothing, so nothing checks its id against the context.
_ANNOTATION_TYPE_SHAPES: dict[tuple[str, str], Callable[[object], bool]] = {
    ("file_path", "file_id"): _provider_id,
}
# Fields whose words never go out unless allow-listed: blanked, the annotation keeps its shape.
BLANKED = frozenset({"title", "filename"})


def annotation_field_ok(atype: str, key: str, value: object) -> bool:
    """Whether field `key` of an annotation of type `atype` has its expected shape (`title`:
    any string, though it goes out only when allow-listed)."""
    check = _ANNOTATION_TYPE_SHAPES.get((atype, key)) or ANNOTATION_SHAPES.get(key)
    return check is not None and check(value)


def clean_annotation(raw: object, keep_title: bool = False) -> dict[str, object] | None:
    """An annotation as it may go out: its known fields only, its `title` blanked unless
    `keep_title` and a `filename` of another shape blanked; None when its type is unknown or
    an id, URL or offset has another shape (it could carry text nobody verifies)."""
    if not isinstance(raw, Mapping):
        return None
    atype = raw.get("type")
    if not isinstance(atype, str) or atype not in ANNOTATION_KEYS:
        return None
    known = ANNOTATION_KEYS[atype]
    out: dict[str, object] = {}
    for key, value in raw.items():
        if key not in known:
            continue
        if key in BLANKED:
            kept = annotation_field_ok(atype, key, value) and (key != "title" or keep_title)
            out[key] = value if kept else ""
        elif annotation_field_ok(atype, key, value):
            out[key] = value
        else:
            return None
    return out


def attribute_ok(key: str, value: object) -> bool:
    """One of a result's `attributes`: the vector store file's own scalars (numbers,
    booleans, token-like strings). A sentence there is text nobody verifies."""
    return _token(key) and (isinstance(value, bool) or _number(value) or _token(value))


# A `file_search_call` result. Its `text` is context (it verifies the answer's citations),
# which the client asked for: kept as it is; every other key has a shape, and each attribute
# (`attribute_ok`).
RESULT_KEYS = frozenset({"file_id", "filename", "score", "text", "attributes"})
RESULT_SHAPES: dict[str, Callable[[object], bool]] = {
    "file_id": _token,
    "filename": lambda v: v is None or (isinstance(v, str) and _FILENAME.fullmatch(v) is not None),
    "score": _opt_number,
    "text": lambda v: v is None or isinstance(v, str),
    "attributes": _opt_obj,
}


def shape_ok(table: Mapping[str, Callable[[object], bool]], key: str, value: object) -> bool:
    """Whether a known field's value has its expected type and shape (unlisted: any)."""
    check = table.get(key)
    return check is None or check(value)

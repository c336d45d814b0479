"""The gemini field table: every field of a `GenerateContentResponse` (and of each streamed
chunk, which has the same shape), decided (DESIGN §2).

Channels (`Text`) are read by parse.py; metadata (`Meta`) is kept only with the expected
shape; upstream prose nobody verifies (grounding chunk titles and texts, `finishMessage`,
search queries, the search entry point's HTML, recitation citations, logprobs) is `WITHHELD`:
logged as unknown, so it is removed from the client's copy unless `channels.allow_fields`
names it, yet stays in `Answer.body` where the context reader finds the chunks' text.
"""

from __future__ import annotations

import re

from gateway.protocols.fields import (
    FieldLog,
    Items,
    Key,
    Meta,
    Obj,
    Opaque,
    Path,
    Rule,
    Text,
    is_int,
    is_model,
    is_number,
    is_opaque,
    is_token,
    nullable,
)

__all__ = ["BODY_TABLE", "WITHHELD", "is_uri"]


class _Withheld(Rule):
    """Known, but upstream text no check covers: left in place and logged as unknown, so the
    renderer drops it unless the policy allow-lists it."""

    __slots__ = ()

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        log.unknown.append((level, (*path, key)))
        return value


WITHHELD = _Withheld()

_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]{0,31}:[!#-~]{1,2040}")
_DOMAIN = re.compile(r"[A-Za-z0-9.\-]{1,253}")
_RESOURCE = re.compile(r"[A-Za-z0-9._~/:@+\-]{1,1024}")
_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{1,20}Z")


def is_uri(v: object) -> bool:
    """A URI of printable ASCII without spaces (`https://…`, `gs://bucket/file.pdf`)."""
    return type(v) is str and _URI.fullmatch(v) is not None


def _is_bool(v: object) -> bool:
    return type(v) is bool


def _ints(v: object) -> bool:
    return type(v) is list and all(type(x) is int for x in v)


def _numbers(v: object) -> bool:
    return type(v) is list and all(is_number(x) for x in v)


def _flat(v: object) -> bool:
    """An object of token-like keys to numbers, booleans or token-like strings."""
    return type(v) is dict and all(
        is_token(k) and (is_number(x) or type(x) is bool or is_token(x)) for k, x in v.items()
    )


def _flat_list(v: object) -> bool:
    return type(v) is list and all(_flat(x) for x in v)


def _usage(v: object) -> bool:
    """usageMetadata: token counts, a traffic type, per-modality lists of counts."""
    if type(v) is not dict:
        return False
    for k, x in v.items():
        if not is_token(k):
            return False
        if not (type(x) is int or is_token(x) or _flat_list(x)):
            return False
    return True


_INT = Meta(is_int)
_TOKEN = Meta(is_token)
_SAFETY = Meta(nullable(_flat_list))

_FUNCTION_CALL = Obj(
    "tool_call",
    {"id": _TOKEN, "name": _TOKEN, "args": Text("tool_arguments")},
    required=frozenset({"name"}),
    vital=frozenset({"id"}),
    nullable=False,
)
_PART = Obj(
    "part",
    {
        "text": Text("content", strings_only=True),
        "thought": Meta(_is_bool),
        "thoughtSignature": Meta(is_opaque),
        "functionCall": _FUNCTION_CALL,
    },
    nullable=False,
)
_CONTENT = Obj(
    "content",
    {"role": Meta(lambda v: v == "model", fallback="model"), "parts": Items(_PART)},
)
_SEGMENT = Obj(
    "grounding",
    {
        "partIndex": _INT,
        "startIndex": _INT,
        "endIndex": _INT,
        "text": Opaque("rewritten from the released text"),
    },
    vital=frozenset({"partIndex", "startIndex", "endIndex"}),
)
_SUPPORT = Obj(
    "grounding",
    {
        "segment": _SEGMENT,
        "groundingChunkIndices": Meta(_ints),
        "confidenceScores": Meta(_numbers),
    },
    required=frozenset({"segment"}),
    vital=frozenset({"segment", "groundingChunkIndices"}),
    nullable=False,
)
_RETRIEVED = Obj(
    "grounding",
    {
        "uri": Meta(is_uri),
        "title": WITHHELD,
        "text": WITHHELD,
        # A resource name: `projects/…/ragCorpora/…/ragFiles/…`, `fileSearchStores/…`.
        "documentName": Meta(lambda v: type(v) is str and _RESOURCE.fullmatch(v) is not None),
    },
)
_WEB = Obj(
    "grounding",
    {
        "uri": Meta(is_uri),
        "title": WITHHELD,
        "domain": Meta(lambda v: type(v) is str and _DOMAIN.fullmatch(v) is not None),
    },
)
_CHUNK = Obj("grounding", {"retrievedContext": _RETRIEVED, "web": _WEB}, nullable=False)
_GROUNDING = Obj(
    "grounding",
    {
        "groundingChunks": Items(_CHUNK),
        "groundingSupports": Items(_SUPPORT),
        "retrievalMetadata": Meta(_flat),
        "webSearchQueries": WITHHELD,
        "retrievalQueries": WITHHELD,
        "searchEntryPoint": WITHHELD,
    },
)
_CANDIDATE = Obj(
    "candidate",
    {
        "index": _INT,
        "content": _CONTENT,
        "finishReason": _TOKEN,
        "safetyRatings": _SAFETY,
        "tokenCount": _INT,
        "avgLogprobs": Meta(is_number),
        "groundingMetadata": _GROUNDING,
        "finishMessage": WITHHELD,
        "citationMetadata": WITHHELD,
        "logprobsResult": WITHHELD,
        "urlContextMetadata": WITHHELD,
    },
    nullable=False,
)
_PROMPT_FEEDBACK = Obj(
    "top",
    {"blockReason": _TOKEN, "safetyRatings": _SAFETY, "blockReasonMessage": WITHHELD},
)
BODY_TABLE = Obj(
    "top",
    {
        "candidates": Items(_CANDIDATE),
        "promptFeedback": _PROMPT_FEEDBACK,
        "usageMetadata": Meta(nullable(_usage)),
        "modelVersion": Meta(is_model),
        "responseId": _TOKEN,
        "createTime": Meta(lambda v: type(v) is str and _TIME.fullmatch(v) is not None),
    },
    nullable=False,
)

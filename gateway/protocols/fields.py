"""Field tables: every field of a protocol's bodies and stream frames, decided (DESIGN §2).

Each adapter declares, per level, what each key is: a channel (`Text`, its fate set by the
channel rules), checked metadata (`Meta`, kept only when its value has the expected shape),
a field decided by a dedicated rule (`Opaque`, e.g. logprobs), a known field never relayed
(`DROP`), or a nested object / list. Anything else is unknown: dropped on verified routes
unless `channels.allow_fields` lists it. `clean` walks a body once with its table; shared
code reads the result. `loads_unique` parses JSON and refuses a duplicate key anywhere.
"""

from __future__ import annotations

import copy
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from gateway.errors import ProtocolError

__all__ = [
    "DROP",
    "Blank",
    "ByType",
    "Drop",
    "FieldLog",
    "Items",
    "Meta",
    "Obj",
    "Opaque",
    "Path",
    "Positional",
    "Rule",
    "Text",
    "allowed",
    "clean",
    "count_keys",
    "has_duplicate_keys",
    "int_value",
    "is_enum",
    "is_index",
    "is_int",
    "is_model",
    "is_number",
    "is_opaque",
    "is_token",
    "is_url",
    "level_of",
    "loads_unique",
    "nullable",
    "usage_check",
    "verified_token_logprobs",
]

Path = tuple[str | int, ...]
Check = Callable[[object], bool]


# -- shapes ----------------------------------------------------------------------------------

_LONG_DIGITS = re.compile(r"[0-9]{19}")
_LONG_DIGITS_B = re.compile(rb"[0-9]{19}")
_TOKEN = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_MODEL = re.compile(r"[A-Za-z0-9_.:/@+\-]{1,128}")
_OPAQUE = re.compile(r"[A-Za-z0-9+/=_\-]*")
_URL = re.compile(r"https?://[!#-~]{1,2040}")


def is_token(v: object) -> bool:
    """A short identifier: `chatcmpl-…`, `call_…`, `toolu_…`, `fp_…`; no spaces, no prose."""
    return type(v) is str and _TOKEN.fullmatch(v) is not None


def is_index(v: object) -> TypeGuard[int]:
    """A position an upstream numbers (a choice, a tool call, a content block, a candidate,
    a citation's item): a non-negative int. A bool is none: a dict keyed by index reads
    `false` as 0, a channel name as `False`."""
    return type(v) is int and v >= 0


def is_model(v: object) -> bool:
    """A model name: a short string without whitespace (`gpt-4o`, `org/model@v2`)."""
    return type(v) is str and _MODEL.fullmatch(v) is not None


def is_opaque(v: object) -> bool:
    """An opaque base64-style blob (signatures, redacted thinking, audio data)."""
    return type(v) is str and _OPAQUE.fullmatch(v) is not None


def is_url(v: object) -> bool:
    """An http(s) URL of printable ASCII without spaces."""
    return type(v) is str and _URL.fullmatch(v) is not None


def is_int(v: object) -> bool:
    return type(v) is int


def is_number(v: object) -> bool:
    return type(v) is int or type(v) is float


def int_value(v: object) -> int | None:
    return v if type(v) is int else None


def is_enum(*values: str) -> Check:
    allowed_values = frozenset(values)

    def check(v: object) -> bool:
        return type(v) is str and v in allowed_values

    return check


def nullable(check: Check) -> Check:
    def either(v: object) -> bool:
        return v is None or check(v)

    return either


_USAGE_KEYS = frozenset(
    {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "input_tokens",
        "output_tokens",
        "prompt_tokens_details",
        "completion_tokens_details",
        "cached_tokens",
        "reasoning_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    }
)


def usage_check(v: object, depth: int = 0) -> bool:
    """Token usage: a mapping of token-like keys to ints, null, short tokens (a tier name) or
    nested mappings of the same (`prompt_tokens_details`, `cache_creation`)."""
    if type(v) is not dict or depth > 2:
        return False
    for k, x in v.items():
        if k not in _USAGE_KEYS and not is_token(k):
            return False
        if x is None or type(x) is int or is_token(x):
            continue
        if not usage_check(x, depth + 1):
            return False
    return True


# -- the table -------------------------------------------------------------------------------
#
# Each rule walks its own value: `walk(value, path, key, log, level)` returns the value to keep
# (the very same object when nothing under it changed: a clean answer is not copied), or
# _MISSING when the field is dropped, logged at `level`; `path + (key,)` locates the field.


class _Invalid(Exception):
    """A required or vital field failed: the enclosing object is dropped."""


_MISSING: Any = object()
Key = str | int


@dataclass(slots=True)
class FieldLog:
    """What a walk found: unknown fields (left in place, dropped at render unless allowed) and
    fields removed because their value had the wrong shape, each with its level."""

    unknown: list[tuple[str, Path]] = field(default_factory=list)
    dropped: list[tuple[str, Path]] = field(default_factory=list)


class Rule(ABC):
    """What a field table says of one field: the subclasses below are the whole vocabulary."""

    __slots__ = ()

    @abstractmethod
    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        """The value as the client may receive it (`_MISSING`: the field leaves), logging
        what was unknown or dropped."""


class _NoFallback:
    def __repr__(self) -> str:
        return "NO_FALLBACK"


NO_FALLBACK: Any = _NoFallback()


@dataclass(frozen=True, slots=True)
class Meta(Rule):
    """Known metadata: kept only when `check(value)`. A value that fails is dropped, or, for a
    field clients' schemas require, replaced by `fallback` (an id becomes "")."""

    check: Check
    fallback: object = NO_FALLBACK

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        if self.check(value):
            return value
        log.dropped.append((level, (*path, key)))
        return _MISSING if self.fallback is NO_FALLBACK else copy.deepcopy(self.fallback)


@dataclass(frozen=True, slots=True)
class Text(Rule):
    """A text-bearing channel of this kind; the adapter reads it, the channel rules decide it.
    With `strings_only`, a value that is neither a string nor null is dropped (otherwise the
    adapter refuses it)."""

    kind: str
    strings_only: bool = False

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        if self.strings_only and value is not None and type(value) is not str:
            log.dropped.append((level, (*path, key)))
            return _MISSING
        return value


@dataclass(frozen=True, slots=True)
class Opaque(Rule):
    """Known, decided by a dedicated rule elsewhere (logprobs: `channels.logprobs`)."""

    name: str

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        return value


@dataclass(frozen=True, slots=True)
class Drop(Rule):
    """Known, never relayed: unverifiable text such as annotation titles."""

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        log.dropped.append((level, (*path, key)))
        return _MISSING


DROP = Drop()


@dataclass(frozen=True, slots=True)
class Blank(Rule):
    """Known, never relayed, but required by clients' schemas: its value is replaced by
    `value` (an OpenAI annotation's `title` becomes "")."""

    value: object

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        if value != self.value:
            log.dropped.append((level, (*path, key)))
            return self.value
        return value


@dataclass(frozen=True, slots=True)
class Obj(Rule):
    """An object at `level`. A `required` key must be present; a `required` or `vital` key
    whose value fails its rule makes the whole object invalid (a tool call whose id or name is
    not token-like is dropped as a whole). `other`, when set, is the rule of every key not in
    `fields` (such keys must be token-like)."""

    level: str
    fields: Mapping[str, Rule]
    required: frozenset[str] = frozenset()
    vital: frozenset[str] = frozenset()
    other: Rule | None = None
    nullable: bool = True

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        if value is None and self.nullable:
            return None
        if type(value) is not dict:
            if self.required:
                raise _Invalid
            log.dropped.append((level, (*path, key)))
            return _MISSING
        return self.walk_dict(value, (*path, key) if key != "" else path, log)

    def walk_dict(self, value: dict[str, object], here: Path, log: FieldLog) -> object:
        for name in self.required:
            if name not in value:
                raise _Invalid
        out: dict[str, object] | None = None
        fields, other, lvl = self.fields, self.other, self.level
        for k, v in value.items():
            sub = fields.get(k)
            if sub is None:
                if other is None or not is_token(k):
                    log.unknown.append((lvl, (*here, k)))
                    continue
                sub = other
            try:
                kept = sub.walk(v, here, k, log, lvl)
            except _Invalid:
                if k in self.required or k in self.vital:
                    raise
                log.dropped.append((_level(sub, lvl), (*here, k)))
                kept = _MISSING
            if kept is v:
                continue
            if kept is _MISSING and (k in self.required or k in self.vital):
                raise _Invalid
            if out is None:
                out = dict(value)
            if kept is _MISSING:
                del out[k]
            else:
                out[k] = kept
        return value if out is None else out


@dataclass(frozen=True, slots=True)
class Items(Rule):
    """A list (or null); an element that is invalid is removed from it, and so is an element
    of a type a `ByType` item table does not know (nothing a client could be shown safely)."""

    item: Rule

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        if value is None:
            return None
        if type(value) is not list:
            log.dropped.append((level, (*path, key)))
            return _MISSING
        here = (*path, key)
        item = self.item
        typed = item if isinstance(item, ByType) else None
        out: list[object] | None = None
        for i, x in enumerate(value):
            at = i if out is None else len(out)
            if typed is not None and type(x) is dict and type(x.get("type")) is not str:
                raise ProtocolError(f"a {typed.level} whose type is not a string")
            if typed is not None and type(x) is dict and x.get("type") not in typed.types:
                log.dropped.append((typed.level, (*here, i)))
                kept = _MISSING
            else:
                try:
                    kept = item.walk(x, here, at, log, level)
                except _Invalid:
                    log.dropped.append((_level(item, level), (*here, at)))
                    kept = _MISSING
            if out is None:
                if kept is x:
                    continue
                out = list(value[:i])
            if kept is not _MISSING:
                out.append(kept)
        return value if out is None else out


@dataclass(frozen=True, slots=True)
class Positional(Rule):
    """A list whose positions mean something (Perplexity's `search_results`, cited as `[N]`):
    like `Items`, except that when an element would be removed the whole list is dropped,
    so that no element ever moves to another position."""

    items: Items

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        kept = self.items.walk(value, path, key, log, level)
        if type(value) is list and type(kept) is list and len(kept) != len(value):
            here = (*path, key)
            # Unknown fields found inside are gone with the list: nothing left to drop.
            log.unknown[:] = [(lv, p) for lv, p in log.unknown if p[: len(here)] != here]
            log.dropped.append((level, here))
            return _MISSING
        return kept


@dataclass(frozen=True, slots=True)
class ByType(Rule):
    """An object whose table depends on its `type` key; an unknown type is an unknown field."""

    level: str
    types: Mapping[str, Obj]

    def walk(self, value: object, path: Path, key: Key, log: FieldLog, level: str) -> object:
        if type(value) is not dict:
            log.dropped.append((self.level, (*path, key)))
            return _MISSING
        kind = value.get("type")
        if type(kind) is not str:
            raise ProtocolError(f"a {self.level} whose type is not a string")
        table = self.types.get(kind)
        if table is None:
            log.unknown.append((self.level, (*path, key) if key != "" else path))
            return value
        return table.walk(value, path, key, log, level)


# -- walking ---------------------------------------------------------------------------------


def clean(rule: Rule, value: object, log: FieldLog, path: Path = ()) -> object:
    """`value` with every field its table does not keep removed (unknown fields stay, logged);
    `value` itself when nothing had to change. Raises ProtocolError when the top level does
    not have the table's shape."""
    try:
        out = rule.walk(value, path, "", log, "top")
    except _Invalid:
        raise ProtocolError("response body does not have the protocol's shape") from None
    if out is _MISSING:
        raise ProtocolError("response body does not have the protocol's shape")
    return out


def _level(rule: Rule, default: str) -> str:
    return rule.level if isinstance(rule, Obj | ByType) else default


def level_of(rule: Rule, path: Sequence[str | int]) -> str:
    """The level a field at `path` belongs to in this table (for the drop metric)."""
    level = "top"
    node: Rule | None = rule
    for p in path:
        if isinstance(node, Obj):
            level = node.level
            node = node.fields.get(p) if isinstance(p, str) else None
        elif isinstance(node, ByType):
            level = node.level
            node = None
        elif isinstance(node, Items):
            node = node.item
        else:
            break
    return level


# -- allow_fields ----------------------------------------------------------------------------


def allowed(path: Sequence[str | int], allow: Iterable[str]) -> bool:
    """Does an `allow_fields` entry keep the field at `path`?

    An entry is a dot-separated path from the body's root (`choices.*.message.x_trace`,
    `content.*.x_meta`), `*` standing for any one list index or key; an entry without a dot
    names a field at any level (`x_trace`)."""
    names = [str(p) for p in path]
    if not names or not isinstance(path[-1], str):
        return False
    for entry in allow:
        if "." not in entry:
            if entry == names[-1]:
                return True
            continue
        parts = entry.split(".")
        if len(parts) == len(names) and all(
            a in ("*", b) for a, b in zip(parts, names, strict=True)
        ):
            return True
    return False


# -- duplicate keys --------------------------------------------------------------------------

_ESCAPE_B = re.compile(rb"\\.", re.DOTALL)
_ESCAPE_S = re.compile(r"\\.", re.DOTALL)


def count_keys(value: object) -> int:
    """How many keys the parsed objects in `value` hold, all levels together."""
    return _keys_and_colons(value)[0]


def _keys_and_colons(value: object) -> tuple[int, int]:
    """How many keys the parsed objects in `value` hold, all levels together, and how many
    colons their keys and string values hold."""
    keys = colons = 0
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        x = pop()
        if type(x) is str:
            colons += x.count(":")
        elif type(x) is dict:
            keys += len(x)
            colons += "".join(x).count(":")
            extend(x.values())
        elif type(x) is list:
            extend(x)
    return keys, colons


def _structural_colons(raw: bytes | str) -> int:
    """The colons of a valid JSON text outside its strings: one per key it spells."""
    if isinstance(raw, bytes):
        if b"\\" in raw:
            raw = _ESCAPE_B.sub(b"", raw)
        return b"".join(raw.split(b'"')[::2]).count(b":")
    if "\\" in raw:
        raw = _ESCAPE_S.sub("", raw)
    return "".join(raw.split('"')[::2]).count(":")


def has_duplicate_keys(raw: bytes | str, parsed: object) -> bool:
    """Whether the valid JSON text `raw`, which parsed to `parsed`, repeats a key in some
    object. A parser keeps one value per key, so the parsed objects hold fewer keys than the
    text spells exactly when a key repeats; the text spells one key per colon outside its
    strings.

    Those colons are counted without splitting the text at its quotes: a colon inside a
    string is written as itself unless escaped as `\\u003a`, so without that escape the
    text's colons are its keys' plus those of its strings. Without a repeat, the parsed
    strings are the text's strings, and the text holds exactly as many colons as the parsed
    keys and strings together; with one, the parsed strings are fewer and the colons outside
    strings more, so the text holds more. The parsed value's colons are counted in its
    compact re-encoding (orjson writes a colon per key and never escapes one), or, for a value
    orjson cannot write (an integer beyond 64 bits, nesting beyond its depth), by a walk."""
    # `\u003` first: one search for both spellings of the escaped colon (and a few others).
    if isinstance(raw, bytes):
        total = raw.count(b":")
        escaped = b"\\u003" in raw and (b"\\u003a" in raw or b"\\u003A" in raw)
    else:
        total = raw.count(":")
        escaped = "\\u003" in raw and ("\\u003a" in raw or "\\u003A" in raw)
    if escaped:
        return _structural_colons(raw) != _keys_and_colons(parsed)[0]
    try:
        return total != orjson.dumps(parsed).count(b":")
    except orjson.JSONEncodeError:
        keys, colons = _keys_and_colons(parsed)
        return total != keys + colons


def loads_unique(raw: bytes | str, *, stdlib: bool = False) -> Any:
    """Parse JSON, refusing a duplicate key at any depth (ProtocolError): which of two values
    a client would read is ambiguous, so such a body fails closed. `stdlib`: the text may hold
    integers beyond 64 bits (stream frames relayed as the upstream wrote them), which are then
    parsed exactly by the standard library."""
    try:
        # orjson turns an integer beyond 64 bits into a float; such a number has at least 19
        # digits in a row, so only a text with such a run needs the standard library.
        if stdlib and (
            _LONG_DIGITS.search(raw) if isinstance(raw, str) else _LONG_DIGITS_B.search(raw)
        ):
            parsed = json.loads(raw)
        else:
            parsed = orjson.loads(raw)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    if (type(parsed) is dict or type(parsed) is list) and has_duplicate_keys(raw, parsed):
        raise ProtocolError("a JSON object repeats a key")
    return parsed


# -- logprobs --------------------------------------------------------------------------------


def verified_token_logprobs(entries: object, text: str | None) -> list[dict[str, object]] | None:
    """`channels.logprobs: verify` for one list of token logprobs describing `text`: the
    entries, each reduced to `token`, `logprob`, `bytes` (kept only when they are the token's
    own UTF-8) and an empty `top_logprobs`, when their tokens concatenate to `text` exactly;
    None when they do not (or are malformed): they would describe another text."""
    if type(entries) is not list:
        return None
    out: list[dict[str, object]] = []
    tokens: list[str] = []
    for e in entries:
        if type(e) is not dict:
            return None
        token, logprob, raw = e.get("token"), e.get("logprob"), e.get("bytes")
        if type(token) is not str or not is_number(logprob):
            return None
        if raw is not None and not (
            type(raw) is list
            and all(type(b) is int and 0 <= b < 256 for b in raw)
            and bytes(raw) == token.encode("utf-8", "surrogatepass")
        ):
            raw = None
        tokens.append(token)
        out.append({"token": token, "logprob": logprob, "bytes": raw, "top_logprobs": []})
    if "".join(tokens) != (text or ""):
        return None
    return out

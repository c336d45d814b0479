"""RFC 6901 JSON pointers, used by rag-json routes to find the answer, claims and context.

`resolve` returns the `MISSING` sentinel for a path that does not exist, so a JSON null at the
pointer is told apart from an absent field.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Final

__all__ = ["MISSING", "Missing", "parse", "resolve"]


class Missing(enum.Enum):
    MISSING = "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = Missing.MISSING


def parse(pointer: str) -> tuple[str, ...]:
    """Split a pointer into unescaped reference tokens; "" is the whole document."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer must be empty or start with '/': {pointer!r}")
    tokens = pointer[1:].split("/")
    for t in tokens:
        # "~" must be followed by 0 or 1; anything else is not a valid escape.
        rest = t.replace("~0", "").replace("~1", "")
        if "~" in rest:
            raise ValueError(f"invalid '~' escape in JSON pointer: {pointer!r}")
    # ~1 first, then ~0, so "~01" becomes "~1" and not "/".
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in tokens)


def _index(token: str, length: int) -> int | None:
    if not token.isascii() or not token.isdigit():
        return None
    if len(token) > 1 and token[0] == "0":
        return None
    i = int(token)
    return i if i < length else None


def resolve(document: object, pointer: str | Sequence[str]) -> object:
    """The value at `pointer` in `document`, or MISSING when any step does not exist."""
    tokens = parse(pointer) if isinstance(pointer, str) else tuple(pointer)
    node = document
    for token in tokens:
        if isinstance(node, Mapping):
            if token not in node:
                return MISSING
            node = node[token]
        elif isinstance(node, list):
            i = _index(token, len(node))
            if i is None:
                return MISSING
            node = node[i]
        else:
            return MISSING
    return node

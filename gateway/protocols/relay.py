"""Upstream 4xx error envelopes as a verified route relays them (DESIGN §7): rebuilt by each
adapter's `relay_error` from its known fields, through these helpers, never copied.

The message is the one upstream text a client gets unverified (the provider's account of a bad
request), capped; the envelope's other known fields are identifiers, and a value that is not
one is dropped, as it could carry any text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

__all__ = [
    "RELAYED_MESSAGE_MAX",
    "relayed_code",
    "relayed_fields",
    "relayed_message",
    "relayed_token",
]

RELAYED_MESSAGE_MAX = 512
_RELAYED_TOKEN = re.compile(r"[A-Za-z0-9_.:\[\]-]{1,128}")


def relayed_message(value: object) -> str | None:
    """An upstream error message as relayed: a string, capped at 512 characters."""
    return value[:RELAYED_MESSAGE_MAX] if isinstance(value, str) else None


def relayed_token(value: object) -> str | None:
    """An identifier field of an upstream error (type, code, param), or None if not one."""
    return value if isinstance(value, str) and _RELAYED_TOKEN.fullmatch(value) else None


def relayed_code(value: object) -> str | int | None:
    """An error code: an identifier or an integer (not a bool)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 10**9:
        return value
    return relayed_token(value)


def relayed_fields(
    error: Mapping[str, object], message: str, **known: Callable[[object], object]
) -> dict[str, object]:
    """`{"message": message}` plus each `known` field the upstream error has, through its
    filter (None where the value is not of its kind); every other field is dropped."""
    out: dict[str, object] = {"message": message}
    for name, keep in known.items():
        if name in error:
            out[name] = keep(error[name])
    return out

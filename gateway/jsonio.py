"""JSON as the gateway writes it: compact UTF-8, one function for every rendered body, stream
event and error envelope."""

from __future__ import annotations

import json

import orjson

__all__ = ["dumps"]


def dumps(obj: object) -> bytes:
    """Compact UTF-8 JSON. An integer beyond 64 bits, which orjson refuses and only an
    upstream's own fields could hold (stream events are parsed by the standard library), falls
    back to the standard library."""
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()

"""The scalar values of a policy file: names, URL paths and globs, JSON pointers, regexes,
durations, protocol names; each validator's ValueError becomes a policy error at its key."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, JsonValue

from gateway.policy.compiled import compile_regex

__all__ = [
    "ENV_NAME_RE",
    "Duration",
    "KeyedValueError",
    "LabelSafe",
    "PassthroughEntry",
    "ProtocolName",
    "RegexStr",
    "json_pointer",
    "url_glob",
    "url_path",
]


class KeyedValueError(ValueError):
    """A model-level validation failure that belongs to one key below the model.

    pydantic reports model validators at the model's own location; the loader appends `key`
    so the error points at the line of the offending key rather than its enclosing mapping.
    """

    def __init__(self, key: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.key = key


def _valid_regex(pattern: str) -> str:
    compile_regex(pattern)
    return pattern


RegexStr = Annotated[str, AfterValidator(_valid_regex)]

_LABEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")


def _label_safe(value: str) -> str:
    # Names end up in response headers, metric labels and audit events.
    if not _LABEL_RE.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid name: use letters, digits and _ . : - "
            "(starting with a letter or digit)"
        )
    return value


LabelSafe = Annotated[str, AfterValidator(_label_safe)]


def _known_protocol(value: object) -> str:
    # The registry, not a list here: adding an adapter adds its name. Imported when a route is
    # validated, since gateway.protocols imports this package.
    from gateway.protocols import ADAPTERS

    if isinstance(value, str) and value in ADAPTERS:
        return value
    names = [repr(name) for name in ADAPTERS]
    known = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    raise ValueError(f"Input should be {known}")


def _protocol_schema(schema: dict[str, JsonValue]) -> None:
    from gateway.protocols import ADAPTERS

    schema["enum"] = list(ADAPTERS)


# A route's `protocol`: the name of a registered adapter (`gateway.protocols.ADAPTERS`).
ProtocolName = Annotated[
    str, BeforeValidator(_known_protocol), Field(json_schema_extra=_protocol_schema)
]


def url_path(value: str, what: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{what} {value!r} must start with '/'")
    if "?" in value or "#" in value:
        raise ValueError(f"{what} {value!r} must not contain a query string or fragment")
    return value


def url_glob(value: str, what: str) -> str:
    url_path(value, what)
    for part in value.split("/"):
        if "**" in part and part != "**":
            raise ValueError(
                f"{what} {value!r}: '**' stands for whole segments only, as in /v1/files/**"
            )
    return value


def _passthrough_entry(entry: str) -> str:
    # The glob forms of `path_glob`: a trailing `/*` is one segment, `/**` the whole tree.
    return url_glob(entry, "passthrough entry")


PassthroughEntry = Annotated[str, AfterValidator(_passthrough_entry)]


def json_pointer(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError(
            f"JSON pointer {value!r} must start with '/' (RFC 6901), e.g. '/answer'"
        )
    return value


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def _duration(value: object) -> float:
    """Seconds from a number or a string such as `250ms`, `5s`, `30m`, `1h`."""
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string such as 5s, 250ms, 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.fullmatch(value.strip())):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError(
            f"{value!r} is not a duration: a number of seconds or a string such as 5s, 250ms, 1h"
        )
    if not seconds > 0:
        raise ValueError("a duration must be greater than zero")
    return seconds


Duration = Annotated[float, BeforeValidator(_duration)]

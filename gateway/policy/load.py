"""Loading policy files: read, parse, validate, and turn every failure into a PolicyError.

Each error names the file and the line of the offending key (`file:line: reason`); at start-up
the first one exits 2, and `policy check` prints them all.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from gateway.errors import PolicyError
from gateway.policy.loaded import LoadedPolicy, from_model
from gateway.policy.model import Policy
from gateway.policy.routing import PolicySet
from gateway.policy.values import KeyedValueError
from gateway.policy.yaml_lines import Loc, dotted, line_of, parse_yaml

__all__ = ["cross_file_errors", "load_all_errors", "load_policies", "load_policy"]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _keys_at(loc: Loc) -> list[str]:
    """The keys the model accepts at `loc`, for 'did you mean' hints."""
    model: type[BaseModel] | None = Policy
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        info = fields.get(part)
        model = _model_in(info.annotation) if info is not None else None
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _reason(err: Mapping[str, Any]) -> tuple[Loc, str]:
    loc: Loc = tuple(err["loc"])
    cause = err.get("ctx", {}).get("error")
    if isinstance(cause, KeyedValueError):
        loc = (*loc, *cause.key)
        return loc, f"{dotted(loc)}: {cause}"
    if err["type"] == "extra_forbidden":
        key, parent = str(loc[-1]), loc[:-1]
        where = f" in {dotted(parent)}" if parent else " at the top level"
        hint = difflib.get_close_matches(key, _keys_at(parent), n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return loc, f"unknown key {key!r}{where}{suggestion}"
    if err["type"] == "invalid_key":
        parent = loc[:-1]
        where = f" in {dotted(parent)}" if parent else ""
        return loc, f"key {loc[-1]!r}{where} must be a string; quote it"
    if err["type"] == "missing":
        parent = loc[:-1]
        where = f" in {dotted(parent)}" if parent else ""
        return loc, f"missing required key {loc[-1]!r}{where}"
    message = str(cause) if isinstance(cause, ValueError) else str(err["msg"])
    return loc, f"{dotted(loc)}: {message}" if loc else message


def _read(file: str) -> str:
    try:
        with open(file, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise PolicyError(file, None, f"cannot read policy file: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise PolicyError(file, line, "the file is not valid UTF-8") from None


def load_all_errors(file: str) -> tuple[LoadedPolicy | None, list[PolicyError]]:
    """One file: the LoadedPolicy, or every error it has (sorted by line)."""
    try:
        data, lines = parse_yaml(file, _read(file))
    except PolicyError as exc:
        return None, [exc]
    try:
        # Files a policy names (a judge prompt template or key file) are relative to it.
        policy = Policy.model_validate(
            data, context={"base_dir": os.path.dirname(os.path.abspath(file))}
        )
    except ValidationError as exc:
        errors = []
        for err in exc.errors(include_url=False):
            loc, message = _reason(err)
            errors.append(PolicyError(file, line_of(loc, lines), message))
        errors.sort(key=lambda e: e.line or 0)
        return None, errors
    return from_model(policy, file, lines), []


def cross_file_errors(policies: Sequence[LoadedPolicy]) -> list[PolicyError]:
    """What is wrong only across files: a route name used in two of them."""
    errors = []
    first: dict[str, tuple[LoadedPolicy, int]] = {}
    for loaded in policies:
        for i, route in enumerate(loaded.policy.routes):
            if route.name in first:
                other, j = first[route.name]
                errors.append(
                    PolicyError(
                        loaded.path,
                        loaded.line_of("routes", i, "name"),
                        f"route name {route.name!r} is already used in {other.path}:"
                        f"{other.line_of('routes', j, 'name')}; route names label metrics "
                        "and audit events, so they must be unique across policy files",
                    )
                )
            else:
                first[route.name] = (loaded, i)
    return errors


def load_policy(path: str | os.PathLike[str]) -> LoadedPolicy:
    """Load, validate and compile one policy file; raise the first PolicyError (by line)."""
    loaded, errors = load_all_errors(os.fspath(path))
    if errors:
        raise errors[0]
    assert loaded is not None
    return loaded


def load_policies(paths: Sequence[str | os.PathLike[str]]) -> PolicySet:
    """Load several files into one PolicySet; route names must be unique across files."""
    if not paths:
        raise PolicyError("<policy>", None, "no policy files given")
    policies = [load_policy(p) for p in paths]
    errors = cross_file_errors(policies)
    if errors:
        raise errors[0]
    return PolicySet(policies)

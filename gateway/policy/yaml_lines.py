"""A policy file's YAML, parsed with the 1-based line of every key and item (file:line errors).

Duplicate mapping keys are rejected here, since the YAML loader would keep the last silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from gateway.errors import PolicyError

__all__ = ["Loc", "dotted", "line_of", "parse_yaml"]

Loc = tuple[str | int, ...]


def _index_lines(
    node: yaml.Node, loc: Loc, lines: dict[Loc, int], seen: set[int], file: str
) -> None:
    """Record the 1-based line of every key and item; reject duplicate mapping keys."""
    lines.setdefault(loc, node.start_mark.line + 1)
    if id(node) in seen:
        # An alias: its keys are indexed where the anchor is, and walking it again would be
        # exponential for nested aliases. Errors inside it point at the alias's own key.
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key, line = str(key_node.value), key_node.start_mark.line + 1
            if key in first:
                raise PolicyError(
                    file, line, f"duplicate key {key!r} (first defined on line {first[key]})"
                )
            first[key] = line
            lines[(*loc, key)] = line
            if key_node.tag.endswith(":int"):
                # pydantic reports a non-string key by its constructed int value
                lines.setdefault((*loc, _yaml_int(key)), line)
            _index_lines(value_node, (*loc, key), lines, seen, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, (*loc, i), lines, seen, file)


def _yaml_int(text: str) -> int | str:
    try:
        return int(text.replace("_", ""), 0)
    except ValueError:
        return text


class _Loader(yaml.SafeLoader):
    """The safe loader, reading a number with an exponent and no point (`7e-1`) as YAML 1.2
    and every emitter do: a float, not the string YAML 1.1 makes of it (policy values are
    validated strictly, so the string would be refused)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(file: str, text: str) -> tuple[Any, dict[Loc, int]]:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise PolicyError(file, 1, "the file is empty; a policy is a YAML mapping")
        lines: dict[Loc, int] = {}
        _index_lines(node, (), lines, set(), file)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = exc.problem or exc.context or "invalid YAML"
        raise PolicyError(
            file, mark.line + 1 if mark else None, f"YAML syntax error: {reason}"
        ) from None
    except yaml.YAMLError as exc:
        raise PolicyError(file, None, f"YAML error: {exc}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise PolicyError(
            file, node.start_mark.line + 1, "a policy file must be a YAML mapping at the top level"
        )
    return data, lines


def line_of(loc: Loc, lines: Mapping[Loc, int]) -> int | None:
    for end in range(len(loc), -1, -1):
        line = lines.get(loc[:end])
        if line is not None:
            return line
    return None


def dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out

"""Stream events that repeat the last one except for one JSON string: read that string only.

A text stream is hundreds of events like `{...same head...,"delta":{"content":"<text>"}...}`.
Once one such event has been parsed in full, the text around its string literal is a template:
any event that is that prefix, one valid string literal, then that suffix parses to the same
value with only that string changed (a JSON tokenizer reads the prefix the same whatever
follows its opening quote, and a string literal is one token whatever it holds).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json import decoder

# The string scanner json.loads itself uses (C when available, strict); missing from the stubs.
scanstring: Callable[[str, int], tuple[str, int]] = decoder.scanstring  # type: ignore[attr-defined]

__all__ = ["StringSlot", "learn_slot"]


class StringSlot:
    """`prefix` (up to and including an opening quote) + a string's body + `suffix`."""

    __slots__ = ("_min", "prefix", "suffix")

    def __init__(self, prefix: str, suffix: str) -> None:
        self.prefix = prefix
        self.suffix = suffix
        self._min = len(prefix) + 1 + len(suffix)  # the closing quote at least

    def match(self, text: str) -> str | None:
        """The string's value when `text` is this template around one string literal."""
        if len(text) < self._min or not text.startswith(self.prefix):
            return None
        if not text.endswith(self.suffix):
            return None
        try:
            value, end = scanstring(text, len(self.prefix))
        except ValueError:
            return None
        return value if end == len(text) - len(self.suffix) else None


def learn_slot(
    text: str, key: str, value: str, holds: Callable[[object, str], bool]
) -> StringSlot | None:
    """The template of `text` around the literal of `"key": value`, or None.

    `text` parses to a value of the expected shape holding `value`; `holds(parsed, probe)`
    says whether a parse has that shape with `probe` in the same place. A candidate literal
    is accepted only if a different string put in its place shows up there: then it is the
    literal the parse read that value from."""
    needle = json.dumps(key)
    i = text.find(needle)
    for _ in range(4):  # a key spelt the same elsewhere (inside a string, say) is skipped
        if i < 0:
            return None
        j = i + len(needle)
        while text[j : j + 1] in (" ", "\t", "\n", "\r"):
            j += 1
        if text[j : j + 1] == ":":
            j += 1
            while text[j : j + 1] in (" ", "\t", "\n", "\r"):
                j += 1
            if text[j : j + 1] == '"':
                try:
                    found, end = scanstring(text, j + 1)
                except ValueError:
                    found, end = None, -1
                if found == value:
                    prefix, suffix = text[: j + 1], text[end:]
                    probe = "b" if value == "a" else "a"
                    try:
                        parsed = json.loads(prefix + probe + '"' + suffix)
                    except ValueError:
                        parsed = None
                    if parsed is not None and holds(parsed, probe):
                        return StringSlot(prefix, suffix)
        i = text.find(needle, i + 1)
    return None

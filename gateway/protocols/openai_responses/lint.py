"""`policy check`: passthrough entries that would return model output unverified.

Stored responses, file contents (which include files a model or a code interpreter wrote) and
Assistants threads are answers; relaying them through passthrough skips verification.
"""

from __future__ import annotations

import re

__all__ = ["MODEL_OUTPUT", "returns_model_output"]

# (what it is, an example path of it)
MODEL_OUTPUT: tuple[tuple[str, str], ...] = (
    ("responses (/v1/responses)", "/v1/responses"),
    ("stored responses (/v1/responses/**)", "/v1/responses/resp_0/input_items"),
    ("stored responses (/v1/responses/**)", "/v1/responses/resp_0"),
    ("file contents (/v1/files/*/content)", "/v1/files/file_0/content"),
    ("Assistants threads (/v1/threads/**)", "/v1/threads/thread_0/messages"),
    ("Assistants threads (/v1/threads/**)", "/v1/threads/thread_0/runs/run_0/steps"),
)


def _regex(entry: str) -> re.Pattern[str]:
    """An entry as a regex over paths, on the generous side: `**` and a trailing `*` reach
    any depth, another `*` stays within its segment."""
    out: list[str] = []
    i = 0
    while i < len(entry):
        if entry.startswith("**", i):
            out.append(".*")
            i += 2
        elif entry[i] == "*":
            out.append(".*" if i == len(entry) - 1 else "[^/]*")
            i += 1
        else:
            out.append(re.escape(entry[i]))
            i += 1
    return re.compile("".join(out))


_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("responses (/v1/responses)", re.compile(r"/v1/responses")),
    ("stored responses (/v1/responses/**)", re.compile(r"/v1/responses/.+")),
    ("file contents (/v1/files/*/content)", re.compile(r"/v1/files/[^/]+/content")),
    ("Assistants threads (/v1/threads/**)", re.compile(r"/v1/threads/.+")),
)


def returns_model_output(entry: str) -> str | None:
    """What model output a passthrough entry relays unverified, or None."""
    if "*" not in entry:
        return next((what for what, rx in _PATTERNS if rx.fullmatch(entry)), None)
    rx = _regex(entry)
    for what, example in MODEL_OUTPUT:
        if rx.fullmatch(example):
            return what
    return None

"""The request path as the gateway sees it (DESIGN §7): refused before routing when it could
mean one thing here and another upstream, split into percent-decoded segments for routing,
and otherwise forwarded byte for byte as the client sent it.

    refusal(raw_path, query) -> str | None    why a path is refused (400), or None
    segments(raw_path) -> Segments             split at literal '/', each segment decoded
    lenient(segments) -> Segments              how lenient upstream stacks read them
    Glob(pattern)                              `path`, `path_prefix` and `path_glob` forms

Segments are split at the literal `/` of the raw path only: an encoded `/` (`%2F`, as in
Bedrock model ARNs) stays inside its segment and never becomes a separator.
"""

from __future__ import annotations

import re
from functools import lru_cache
from urllib.parse import unquote_to_bytes

Segments = tuple[str, ...]

_HEX = frozenset(b"0123456789abcdefABCDEF")
_PRINTABLE = bytes(range(0x21, 0x7F))
# Bytes that no segment may carry, raw or decoded: every C0 control (NUL, CR, LF among them),
# DEL, and `\`, which some servers and frameworks treat as a separator.
_FORBIDDEN = re.compile(rb"[\x00-\x1f\x7f\\]")
# A path of plain segments (letters, digits, `-`, `_`): no escape, dot, control byte or `\`
# in it, so none of the checks below can refuse it. The usual path, decided in one match.
_PLAIN = re.compile(rb"(?:/[A-Za-z0-9_\-]+)+/?|/")
# Rounds of percent-decoding a path is checked through: `%252e%252e` is `..` to an upstream
# (or a framework behind it) that decodes twice.
_ROUNDS = 3


def _raw_ok(data: bytes) -> bool:
    """Printable ASCII only (no space, no controls, nothing above 0x7e)."""
    return not data.translate(None, _PRINTABLE)


def _escapes_ok(data: bytes) -> bool:
    """Every `%` starts a two-hex-digit escape."""
    i = data.find(b"%")
    while i >= 0:
        if i + 2 >= len(data) or data[i + 1] not in _HEX or data[i + 2] not in _HEX:
            return False
        i = data.find(b"%", i + 3)
    return True


def _dot_segment(segment: bytes) -> bool:
    # `..;jsessionid` is `..` to servlet containers: path parameters are cut before comparing.
    return segment.split(b";", 1)[0] in (b".", b"..")


def refusal(raw_path: bytes, query: bytes = b"") -> str | None:
    """Why the request target is refused with 400, or None if it may be routed and forwarded.

    Refused: a path not starting with `/`; raw bytes outside printable ASCII in the path or
    the query; a malformed `%` escape in the path; a dot segment (`.` or `..`) raw or after
    up to three rounds of percent-decoding; a `\\`, raw or decoded (some servers treat it as
    a separator); and, decoded, any control byte (NUL, CR, LF, …) or DEL.
    """
    if _PLAIN.fullmatch(raw_path) and _raw_ok(query):
        return None
    if not raw_path.startswith(b"/"):
        return "the path must start with '/'"
    if not _raw_ok(raw_path) or not _raw_ok(query):
        return "the request target has bytes outside printable ASCII"
    if not _escapes_ok(raw_path):
        return "the path has a malformed percent-escape"
    data = raw_path
    for _ in range(_ROUNDS + 1):
        if _FORBIDDEN.search(data):
            return "the path has a backslash or an encoded control character"
        if b"." in data and any(_dot_segment(s) for s in data.split(b"/")):
            return "the path has a dot segment ('.' or '..'), raw or percent-encoded"
        if b"%" not in data:
            break
        data = unquote_to_bytes(data)
    return None


def _decode(segment: str) -> str:
    if "%" not in segment:
        return segment
    return unquote_to_bytes(segment).decode("utf-8", "surrogateescape")


def segments(raw_path: str | bytes) -> Segments:
    """The path split at its literal `/` (the first, empty segment kept), each segment
    percent-decoded once. Any query string is cut off first."""
    path = raw_path.decode("latin-1") if isinstance(raw_path, bytes) else raw_path
    path = path.split("?", 1)[0]
    if "%" not in path:
        return tuple(path.split("/"))
    return tuple(_decode(s) for s in path.split("/"))


def lenient(path: Segments) -> Segments:
    """The path as lenient upstream stacks read it: an encoded `/` a separator (ASGI and WSGI
    servers route on the decoded path), empty segments merged away (`//`, a trailing `/`:
    nginx's merge_slashes, non-strict routers), path parameters cut (`;x=1`: servlet
    containers), letters case-folded (case-insensitive frameworks and API gateways), and
    escapes decoded through the rounds `refusal` checks (stacks that decode twice). Used to
    tell when a path that matched no route is another spelling of one that does."""
    out = [""]
    for segment in path[1:]:
        # Decoded once already; as many rounds more as `refusal` reads through.
        for _ in range(_ROUNDS - 1):
            if "%" not in segment:
                break
            raw = segment.encode("utf-8", "surrogateescape")
            segment = unquote_to_bytes(raw).decode("utf-8", "surrogateescape")
        for s in segment.split("/"):
            s = s.split(";", 1)[0].casefold()
            if s:
                out.append(s)
    return tuple(out)


@lru_cache(maxsize=1024)
def _segment_regex(pattern: str) -> re.Pattern[str]:
    # `*` is any run of characters within one segment; everything else is literal.
    return re.compile(".*".join(re.escape(p) for p in pattern.split("*")), re.DOTALL)


class Glob:
    """A path pattern matched segment by segment against `segments()` of a request.

    kind "path": every segment equal. kind "prefix": the pattern's segments but the last equal,
    the last a string prefix of the request's segment there (so `/rag/` matches `/rag/x` and
    not `/rag`, as a string prefix would, but never across an encoded `/`). kind "glob": a
    segment `**` matches any number of segments (none included); any other `*` matches any
    characters within one segment.
    """

    __slots__ = ("_regexes", "kind", "pattern", "segments")

    def __init__(self, pattern: str, kind: str = "glob") -> None:
        if kind not in ("path", "prefix", "glob"):
            raise ValueError(f"unknown path pattern kind {kind!r}")
        self.pattern = pattern
        self.kind = kind
        self.segments: Segments = segments(pattern)
        if kind == "glob" and "*" not in pattern:
            self.kind = "path"  # no wildcard: an exact path, compared as such
        self._regexes: tuple[re.Pattern[str] | None, ...] = tuple(
            None if s == "**" or "*" not in s else _segment_regex(s) for s in self.segments
        ) if self.kind == "glob" else ()

    def __repr__(self) -> str:
        return f"Glob({self.pattern!r}, {self.kind!r})"

    def matches(self, path: Segments) -> bool:
        mine = self.segments
        if self.kind == "path":
            return path == mine
        if self.kind == "prefix":
            n = len(mine)
            return (
                len(path) >= n
                and path[: n - 1] == mine[: n - 1]
                and path[n - 1].startswith(mine[n - 1])
            )
        return self._glob(0, path, 0)

    def covers(self, other: Glob) -> bool:
        """True when every path `other` matches is matched by self too (False when unsure)."""
        if other.kind == "path":
            return self.matches(other.segments)
        if (other.kind, other.segments) == (self.kind, self.segments):
            return True
        if self.kind != "prefix":
            return False
        if other.kind == "prefix":
            return self.matches(other.segments)
        n = len(self.segments)
        head = other.segments[:n]  # literal leading segments fix what every match starts with
        return len(head) == n and not any("*" in s for s in head) and self.matches(head)

    def _glob(self, i: int, path: Segments, j: int) -> bool:
        mine = self.segments
        while i < len(mine):
            if mine[i] == "**":
                # Collapse runs of `**`, then try every split point (patterns are short).
                while i + 1 < len(mine) and mine[i + 1] == "**":
                    i += 1
                if i + 1 == len(mine):
                    return True
                return any(self._glob(i + 1, path, k) for k in range(j, len(path) + 1))
            if j >= len(path):
                return False
            regex = self._regexes[i]
            if regex is None:
                if path[j] != mine[i]:
                    return False
            elif not regex.fullmatch(path[j]):
                return False
            i += 1
            j += 1
        return j == len(path)

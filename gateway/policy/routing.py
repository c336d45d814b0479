"""Which route a request takes: matchers compiled once per PolicySet, first match wins.

Also the passthrough list, and `Matcher.covers` for the unreachable-route lint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.paths import Glob, Segments, lenient, segments
from gateway.policy.loaded import LoadedPolicy
from gateway.policy.model import Match, Route

__all__ = ["Matcher", "PolicySet"]


@dataclass(frozen=True, slots=True)
class Matcher:
    """A route's `match:`, compiled: one Glob for the path condition, headers, methods."""

    glob: Glob | None  # path, path_prefix or path_glob, matched segment by segment
    headers: tuple[tuple[str, str], ...]  # lower-cased names
    methods: frozenset[str]  # empty = any

    @classmethod
    def of(cls, match: Match) -> Matcher:
        glob = (
            Glob(match.path, "path") if match.path is not None
            else Glob(match.path_prefix, "prefix") if match.path_prefix is not None
            else Glob(match.path_glob, "glob") if match.path_glob is not None
            else None
        )
        return cls(
            glob=glob,
            headers=tuple((k.lower(), v) for k, v in match.header.items()),
            methods=frozenset(match.methods),
        )

    def matches(self, method: str, path: Segments, headers: Mapping[str, str]) -> bool:
        if self.glob is not None and not self.glob.matches(path):
            return False
        return self.admits(method, headers)

    def admits(self, method: str, headers: Mapping[str, str]) -> bool:
        """The conditions other than the path: method and headers."""
        if self.methods and method.upper() not in self.methods:
            return False
        return all(_header(headers, name) == value for name, value in self.headers)

    def covers(self, other: Matcher) -> bool:
        """True when every request `other` matches is also matched by self (when unsure,
        False: the lint then stays silent rather than call a reachable route unreachable)."""
        if self.methods and not (other.methods and other.methods <= self.methods):
            return False
        if not set(self.headers) <= set(other.headers):
            return False
        if self.glob is None:
            return True
        return other.glob is not None and self.glob.covers(other.glob)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    # Starlette's Headers and HTTP/2 pseudo-dicts are already lower-case; a plain dict may not be.
    value = headers.get(name)
    if value is not None:
        return value
    for key, candidate in headers.items():
        if key.lower() == name:
            return candidate
    return None


class PolicySet:
    """Policies in load order. Routes match in order (files, then routes); first match wins.

    Passthrough entries take the `path_glob` forms: `/v1/models` exactly, `/v1/files/*` one
    segment below, `/v1/files/**` the whole tree. Paths are matched as `gateway.paths.segments`
    (a `str` given here is split and decoded first). Routes are consulted before passthrough,
    so a routed path is always verified.
    """

    __slots__ = ("_by_name", "_folded", "_passthrough", "_routes", "policies")

    def __init__(self, policies: Sequence[LoadedPolicy]) -> None:
        self.policies: tuple[LoadedPolicy, ...] = tuple(policies)
        self._routes = tuple(
            (Matcher.of(route.match), loaded, route)
            for loaded in self.policies
            for route in loaded.policy.routes
        )
        self._by_name: dict[str, tuple[LoadedPolicy, Route]] = {}
        for _, loaded, route in self._routes:
            self._by_name.setdefault(route.name, (loaded, route))
        self._passthrough = tuple(
            Glob(e) for loaded in self.policies for e in loaded.policy.passthrough
        )
        # Each route's path condition in lower case, for `aliases_route`.
        self._folded = tuple(
            Glob(m.glob.pattern.casefold(), m.glob.kind) if m.glob is not None else None
            for m, _, _ in self._routes
        )

    def match(
        self, method: str, path: str | Segments, headers: Mapping[str, str]
    ) -> tuple[LoadedPolicy, Route] | None:
        segs = segments(path) if isinstance(path, str) else path
        for matcher, loaded, route in self._routes:
            if matcher.matches(method, segs, headers):
                return loaded, route
        return None

    def is_passthrough(self, path: str | Segments) -> bool:
        segs = segments(path) if isinstance(path, str) else path
        return any(g.matches(segs) for g in self._passthrough)

    def aliases_route(self, method: str, path: Segments, headers: Mapping[str, str]) -> bool:
        """Whether a path that matched no route would reach one for an upstream that reads
        paths leniently (`paths.lenient`: `/v1//chat/completions/`, `;x=1`, `/V1/Chat/...`).
        Relayed through a passthrough entry, such a path would skip verification."""
        lenient_path = lenient(path)
        return any(
            (folded is None or folded.matches(lenient_path)) and matcher.admits(method, headers)
            for folded, (matcher, _, _) in zip(self._folded, self._routes, strict=True)
        )

    def route(self, name: str) -> tuple[LoadedPolicy, Route] | None:
        """The route called `name` (for `citewarden verify --route`)."""
        return self._by_name.get(name)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.policies)


"""`citewarden policy check`: validation errors and semantic warnings over policy files.

Protocol-specific warnings come from the adapters (`Adapter.lint_route`,
`Adapter.relays_model_output`); nothing here names a protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from gateway.policy.load import cross_file_errors, load_all_errors
from gateway.policy.loaded import LoadedPolicy
from gateway.policy.routing import Matcher
from gateway.policy.yaml_lines import Loc

__all__ = ["Diagnostic", "check_paths", "lint"]


@dataclass(frozen=True, slots=True)
class Diagnostic:
    file: str
    line: int | None
    severity: Literal["error", "warning", "note"]
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        return f"{where}: {self.severity}: {self.message}"


def lint(policies: Sequence[LoadedPolicy]) -> list[Diagnostic]:
    """Semantic warnings over valid policies, in load order (cross-file where it matters)."""
    # The registry is imported here: gateway.protocols imports this package.
    from gateway.protocols import ADAPTERS

    out: list[Diagnostic] = []

    def warn(loaded: LoadedPolicy, loc: Loc, message: str) -> None:
        out.append(Diagnostic(loaded.path, loaded.line_of(*loc), "warning", message))

    earlier: list[tuple[Matcher, LoadedPolicy, int]] = []
    for loaded in policies:
        p = loaded.policy
        if p.mode == "shadow":
            warn(
                loaded,
                ("mode",),
                "mode: shadow — NOTHING IS ENFORCED: answers are verified and the decision is "
                "recorded, but every upstream answer reaches the client unchanged, including "
                "hallucinated citations; use only for a rollout",
            )
        if not p.checks:
            warn(loaded, ("checks",), "checks is empty: every claim passes and nothing is verified")
        if "user" in p.context.trust.roles and p.context.signing is None:
            warn(
                loaded,
                ("context", "trust", "roles"),
                "context.trust.roles includes user: an end user can paste a chunk tag into a "
                "question and make a fabricated answer verify; sign chunks (context.signing) "
                "instead",
            )
        dupes = sorted({c for c in p.checks if p.checks.count(c) > 1})
        if dupes:
            warn(loaded, ("checks",), f"checks lists {', '.join(dupes)} more than once")
        if (
            p.release.on_unverified == "strip"
            and p.checks
            and "hallucinated_citation" not in p.checks
        ):
            warn(
                loaded,
                ("release", "on_unverified"),
                "on_unverified: strip without hallucinated_citation in checks: claims citing "
                "sources the model was never given are released",
            )
        if p.streaming.mode == "progressive" and p.release.on_unverified == "block":
            warn(
                loaded,
                ("streaming", "mode"),
                "streaming.mode: progressive with on_unverified: block: once claims have been "
                "sent the status can no longer become "
                f"{p.release.block_status}, so a block mid-stream ends the stream with the "
                "protocol's error event; use buffer to keep a clean block status",
            )
        if p.citations.pattern is not None and p.citations.format != "regex":
            warn(
                loaded,
                ("citations", "pattern"),
                f"citations.pattern is ignored with format: {p.citations.format}",
            )
        if p.claims.code == "exempt":
            out.append(
                Diagnostic(
                    loaded.path,
                    loaded.line_of("claims", "code"),
                    "note",
                    "claims.code: exempt — text in code fences is never checked; set "
                    "claims.code: check to verify it as claims",
                )
            )
        if "support" in p.model_fields_set and "unsupported" not in p.checks:
            warn(loaded, ("support",), "support is set but unsupported is not in checks")
        for i, entry in enumerate(p.passthrough):
            if entry.endswith("/*"):
                warn(
                    loaded,
                    ("passthrough", i),
                    f"passthrough entry {entry!r} matches one path segment below "
                    f"{entry[:-2] or '/'!r}, not the whole tree: write {entry + '*'!r} for "
                    "the tree (a trailing '/*' used to mean the tree)",
                )
        for k, entry in enumerate(p.passthrough):
            for adapter in ADAPTERS.values():
                what = adapter.relays_model_output(entry)
                if what is not None:
                    warn(
                        loaded,
                        ("passthrough", k),
                        f"passthrough entry {entry!r} relays {what} unverified: that is model "
                        "output; verify it on a route instead",
                    )
        for i, route in enumerate(p.routes):
            for at, message in ADAPTERS[route.protocol].lint_route(route, ("routes", i), p):
                warn(loaded, at, message)
            matcher = Matcher.of(route.match)
            for prior, prior_loaded, j in earlier:
                if prior.covers(matcher):
                    prior_route = prior_loaded.policy.routes[j]
                    where = f"{prior_loaded.path}:{prior_loaded.line_of('routes', j)}"
                    warn(
                        loaded,
                        ("routes", i),
                        f"route {route.name!r} is unreachable: every request it matches is "
                        f"taken first by route {prior_route.name!r} ({where})",
                    )
                    break
            earlier.append((matcher, loaded, i))
    return out


def check_paths(paths: Sequence[str], out: TextIO) -> int:
    """Validate and lint policy files; print diagnostics and `ok:` lines. 1 on any error."""
    if not paths:
        print("error: no policy files given", file=out)
        return 1
    by_file: dict[str, list[Diagnostic]] = {p: [] for p in paths}
    loaded: list[LoadedPolicy] = []
    for path in paths:
        result, errors = load_all_errors(path)
        by_file[path].extend(Diagnostic(e.file, e.line, "error", e.message) for e in errors)
        if result is not None:
            loaded.append(result)
    for e in cross_file_errors(loaded):
        by_file[e.file].append(Diagnostic(e.file, e.line, "error", e.message))
    for d in lint(loaded):
        by_file[d.file].append(d)
    labels = {p.path: p.label for p in loaded}
    failed = False
    for path, diagnostics in by_file.items():
        for d in sorted(diagnostics, key=lambda d: d.line or 0):
            print(d, file=out)
        if any(d.severity == "error" for d in diagnostics):
            failed = True
        else:
            print(f"ok: {path} ({labels[path]})", file=out)
    return 1 if failed else 0

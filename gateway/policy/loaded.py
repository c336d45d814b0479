"""A validated policy with its version (`name@version`) and the lines of its file's keys.

The version is the sha256 of the policy's canonical form, so equal policies share it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.policy.compiled import CompiledPolicy
from gateway.policy.model import Policy
from gateway.policy.yaml_lines import Loc, line_of

__all__ = [
    "SHORT_VERSION_LEN",
    "LoadedPolicy",
    "canonical_json",
    "from_model",
    "policy_version",
]

# The 12-hex-digit short version used in labels (`name@version[:12]`): 48 bits, ample to tell
# the handful of revisions a deployment sees apart, and short enough for headers and metrics.
SHORT_VERSION_LEN = 12


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy file. `version` is the full sha256; `label` is `name@version[:12]`.

    Equality and hashing go by (path, version, label): the version already digests the policy.
    """

    policy: Policy = field(compare=False)
    path: str
    version: str
    label: str
    lines: Mapping[Loc, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.policy.name

    @property
    def compiled(self) -> CompiledPolicy:
        """The policy's regexes and lookups, compiled once when it was validated."""
        return self.policy.compiled

    @property
    def files(self) -> tuple[str, ...]:
        """The other files this policy read when it was loaded (its judge's prompt template
        and key file), by path: watched for edits as the policy file is."""
        judge = self.policy.support.judge
        if judge is None:
            return ()
        base = os.path.dirname(os.path.abspath(self.path))
        named = [judge.api_key_file, None if judge.template is None else judge.prompt]
        return tuple(os.path.join(base, n) for n in named if n is not None)

    @functools.cached_property
    def contents(self) -> str:
        """A digest of what this policy read from those files, as loaded: with `version`, it
        tells two loads of the policy apart when only such a file changed. (A digest: the key
        itself never leaves the spec.) Computed once: `Pipelines.get` reads it per request."""
        judge = self.policy.support.judge
        if judge is None:
            return ""
        h = hashlib.sha256()
        for part in (judge.template or "", judge.key):
            h.update(hashlib.sha256(part.encode()).digest())
        return h.hexdigest()

    def line_of(self, *loc: str | int) -> int | None:
        """The line of the key or item at `loc` (or of its nearest enclosing one)."""
        return line_of(loc, self.lines)


def canonical_json(policy: Policy) -> str:
    """The canonical form the version hashes: defaults filled in, keys sorted, by alias."""
    return json.dumps(
        policy.model_dump(mode="json", by_alias=True),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def policy_version(policy: Policy) -> str:
    return hashlib.sha256(canonical_json(policy).encode("utf-8")).hexdigest()


def from_model(
    policy: Policy, path: str = "<memory>", lines: Mapping[Loc, int] | None = None
) -> LoadedPolicy:
    """Wrap an already validated Policy (tests, embedded defaults) as a LoadedPolicy."""
    version = policy_version(policy)
    return LoadedPolicy(
        policy=policy,
        path=path,
        version=version,
        label=f"{policy.name}@{version[:SHORT_VERSION_LEN]}",
        lines=types.MappingProxyType(lines) if lines is not None else {},
    )

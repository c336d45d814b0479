"""Policy files: the pydantic model, YAML loading with file:line errors, versioning, routing.

A policy is parsed, validated and compiled once; the hot path only reads compiled objects.

    load_policy(path) -> LoadedPolicy        one file: validated Policy + version + compiled regexes
    load_policies(paths) -> PolicySet        several files, routed in order; first match wins
    check_paths(paths, out) -> int           `citewarden policy check`: errors and lint warnings
    PolicyStore(paths)                       the live PolicySet; reload() and an async watch()

Every failure is a `PolicyError(file, line, reason)`; see docs/policy.md for the full reference.
The modules, one concern each:

    model.py       the pydantic model (values.py: its scalar values and their validators)
    compiled.py    CompiledPolicy: the regexes and lookups the hot path reads (`Policy.compiled`)
    yaml_lines.py  YAML -> data and the line of every key path
    loaded.py      LoadedPolicy: a validated policy, its version and lines
    load.py        loading one or several files; every failure a PolicyError at file:line
    routing.py     PolicySet: route matching and passthrough
    lint.py        `policy check`
    store.py       PolicyStore: hot reload
"""

from __future__ import annotations

from gateway.policy.compiled import CHUNK_PATTERN_FLAGS, CompiledPolicy
from gateway.policy.lint import Diagnostic, check_paths, lint
from gateway.policy.load import load_policies, load_policy
from gateway.policy.loaded import (
    SHORT_VERSION_LEN,
    LoadedPolicy,
    canonical_json,
    from_model,
    policy_version,
)
from gateway.policy.model import (
    DEFAULT_EXEMPT,
    JUDGE_PROMPTS,
    Audit,
    ChannelRule,
    Channels,
    CheckName,
    Citations,
    ClaimsSpec,
    ContextSigning,
    ContextSource,
    ContextSpec,
    ContextTrust,
    JudgeCache,
    JudgeCircuit,
    JudgeSpec,
    LexicalBounds,
    Match,
    Policy,
    RagSpec,
    Release,
    Route,
    Streaming,
    SupportSpec,
    Templates,
    TrustRole,
)
from gateway.policy.routing import PolicySet
from gateway.policy.store import PolicyStore, ReloadCallback, ReloadOutcome
from gateway.policy.values import Duration, PassthroughEntry, ProtocolName, RegexStr
from gateway.policy.yaml_lines import Loc

__all__ = [
    "CHUNK_PATTERN_FLAGS",
    "DEFAULT_EXEMPT",
    "JUDGE_PROMPTS",
    "SHORT_VERSION_LEN",
    "Audit",
    "ChannelRule",
    "Channels",
    "CheckName",
    "Citations",
    "ClaimsSpec",
    "CompiledPolicy",
    "ContextSigning",
    "ContextSource",
    "ContextSpec",
    "ContextTrust",
    "Diagnostic",
    "Duration",
    "JudgeCache",
    "JudgeCircuit",
    "JudgeSpec",
    "LexicalBounds",
    "LoadedPolicy",
    "Loc",
    "Match",
    "PassthroughEntry",
    "Policy",
    "PolicySet",
    "PolicyStore",
    "ProtocolName",
    "RagSpec",
    "RegexStr",
    "Release",
    "ReloadCallback",
    "ReloadOutcome",
    "Route",
    "Streaming",
    "SupportSpec",
    "Templates",
    "TrustRole",
    "canonical_json",
    "check_paths",
    "from_model",
    "lint",
    "load_policies",
    "load_policy",
    "policy_version",
]

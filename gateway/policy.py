"""Policy files: the pydantic model, YAML loading with file:line errors, versioning, routing.

A policy is parsed, validated and compiled once; the hot path only reads compiled objects.

    load_policy(path) -> LoadedPolicy        one file: validated Policy + version + compiled regexes
    load_policies(paths) -> PolicySet        several files, routed in order; first match wins
    check_paths(paths, out) -> int           `citewarden policy check`: errors and lint warnings
    PolicyStore(paths)                       the live PolicySet; reload() and an async watch()

Every failure is a `PolicyError(file, line, reason)`; see docs/policy.md for the full reference.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import json
import os
import re
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TextIO, get_args

import structlog
import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway import jsonpointer
from gateway.errors import PolicyError
from gateway.paths import Glob, Segments, segments

Protocol = Literal[
    "openai-chat", "openai-responses", "anthropic-messages", "rag-json",
    "bedrock-converse", "cohere-chat", "gemini"
]
CheckName = Literal[
    "missing_citation",
    "malformed_citation",
    "hallucinated_citation",
    "stale_source",
    "quote_mismatch",
    "number_mismatch",
    "unsupported",
]
ChannelRule = Literal["pass", "verify", "withhold"]

# The 12-hex-digit short version used in labels (`name@version[:12]`): 48 bits, ample to tell
# the handful of revisions a deployment sees apart, and short enough for headers and metrics.
SHORT_VERSION_LEN = 12


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class _KeyedValueError(ValueError):
    """A model-level validation failure that belongs to one key below the model.

    pydantic reports model validators at the model's own location; the loader appends `key`
    so the error points at the line of the offending key rather than its enclosing mapping.
    """

    def __init__(self, key: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.key = key


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from None


def _valid_regex(pattern: str) -> str:
    _compile(pattern)
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


def _url_path(value: str, what: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"{what} {value!r} must start with '/'")
    if "?" in value or "#" in value:
        raise ValueError(f"{what} {value!r} must not contain a query string or fragment")
    return value


def _url_glob(value: str, what: str) -> str:
    _url_path(value, what)
    for part in value.split("/"):
        if "**" in part and part != "**":
            raise ValueError(
                f"{what} {value!r}: '**' stands for whole segments only, as in /v1/files/**"
            )
    return value


def _json_pointer(value: str | None) -> str | None:
    if value is not None and not value.startswith("/"):
        raise ValueError(
            f"JSON pointer {value!r} must start with '/' (RFC 6901), e.g. '/answer'"
        )
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Match(_Model):
    """Request conditions of a route; all given conditions must hold."""

    path: str | None = None
    path_prefix: str | None = None
    path_glob: str | None = None  # `*` within one segment, `**` any number of segments
    header: dict[str, str] = Field(default_factory=dict)
    methods: list[str] = Field(default_factory=list)  # empty = any method

    @field_validator("path", "path_prefix")
    @classmethod
    def _is_path(cls, value: str | None) -> str | None:
        return None if value is None else _url_path(value, "path")

    @field_validator("path_glob")
    @classmethod
    def _is_glob(cls, value: str | None) -> str | None:
        return None if value is None else _url_glob(value, "path_glob")

    @field_validator("methods")
    @classmethod
    def _upper(cls, value: list[str]) -> list[str]:
        return [m.upper() for m in value]

    @model_validator(mode="after")
    def _conditions(self) -> Match:
        if (
            self.path is None
            and self.path_prefix is None
            and self.path_glob is None
            and not self.header
        ):
            raise ValueError("match needs at least one of path, path_prefix, path_glob or header")
        given = [k for k in ("path", "path_prefix", "path_glob") if getattr(self, k) is not None]
        if len(given) > 1:
            raise _KeyedValueError(
                (given[1],),
                "use only one of path, path_prefix and path_glob in one match, not "
                + " and ".join(given),
            )
        seen: set[str] = set()
        for name in self.header:
            if not name or name.lower() in seen:
                raise _KeyedValueError(
                    ("header", name), f"header {name!r} is empty or listed twice"
                )
            seen.add(name.lower())
        return self


class RagSpec(_Model):
    """JSON pointers (RFC 6901) into a rag-json response, and field names inside items."""

    answer: str | None = None
    claims: str | None = None
    context: str | None = None
    context_id: str = "id"
    context_text: str = "text"
    context_version: str = "version"
    context_source: str = "source"
    claim_text: str = "text"
    claim_citations: str = "citations"
    # Envelope fields (`/status`, `/trace_id`) kept in every decision's body; everything else
    # outside the answer, claims and context is dropped. Only scalar values are kept.
    keep: list[str] = Field(default_factory=list)

    _pointers = field_validator("answer", "claims", "context")(_json_pointer)

    @field_validator("keep")
    @classmethod
    def _keep_pointers(cls, value: list[str]) -> list[str]:
        for pointer in value:
            if pointer == "" or not pointer.startswith("/"):
                raise ValueError(
                    f"rag.keep entry {pointer!r} must be a JSON pointer to one field, "
                    "e.g. '/status'"
                )
            try:
                jsonpointer.parse(pointer)
            except ValueError as e:
                raise ValueError(str(e)) from None
        return value


class Route(_Model):
    name: Annotated[str, AfterValidator(_label_safe)]
    match: Match
    protocol: Protocol
    rag: RagSpec | None = None

    @model_validator(mode="after")
    def _rag_for_rag_json(self) -> Route:
        if self.protocol == "rag-json" and (
            self.rag is None or (self.rag.answer is None and self.rag.claims is None)
        ):
            raise _KeyedValueError(
                ("rag",),
                "protocol rag-json needs rag.answer or rag.claims (JSON pointers into the "
                "upstream response)",
            )
        return self


class Citations(_Model):
    format: Literal["doc-chunk", "numeric", "footnote", "regex"] = "doc-chunk"
    pattern: str | None = None  # for format: regex — a regex with a named group `id`

    @field_validator("pattern")
    @classmethod
    def _has_id_group(cls, value: str | None) -> str | None:
        if value is not None and "id" not in _compile(value).groupindex:
            raise ValueError("needs a named group `id`, e.g. (?P<id>[A-Za-z0-9:]+)")
        return value

    @model_validator(mode="after")
    def _regex_needs_pattern(self) -> Citations:
        if self.format == "regex" and self.pattern is None:
            raise _KeyedValueError(
                ("format",), "regex needs citations.pattern, a regex with a named group `id`"
            )
        return self


ContextSource = Literal["request", "response", "header"]


def _all_context_sources() -> list[ContextSource]:
    return ["request", "response", "header"]


# Where chunk tags count as context (DESIGN §3). `tool` covers OpenAI `tool` (and legacy
# `function`) messages and Anthropic `tool_result` blocks; assistant turns never count.
TrustRole = Literal["system", "developer", "user", "tool"]

# Chunk regexes match across lines, as the built-in `<chunk>` form does.
CHUNK_PATTERN_FLAGS = re.S


def _default_trust_roles() -> list[TrustRole]:
    return ["system", "developer", "tool"]


class ContextTrust(_Model):
    """The places of a request whose chunk tags are context (without signing)."""

    roles: list[TrustRole] = Field(default_factory=_default_trust_roles)
    documents: bool = True  # Anthropic document / search_result blocks of non-assistant turns


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ContextSigning(_Model):
    """`context.signing`: only HMAC-SHA256-signed chunk tags count, from any role.

    The key is the value of the environment variable `key_env`, read when the policy loads (a
    missing or empty variable is a policy error); it never enters the canonical form, the
    version, a repr or a log line.
    """

    key_env: str
    _key: bytes = PrivateAttr(default=b"")

    @field_validator("key_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if not _ENV_NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _read_key(self) -> ContextSigning:
        value = os.environ.get(self.key_env)
        if not value:
            state = "is empty" if value == "" else "is not set"
            raise _KeyedValueError(
                ("key_env",), f"the signing key's environment variable {self.key_env} {state}"
            )
        self._key = value.encode("utf-8")
        return self

    @property
    def key(self) -> bytes:
        return self._key


class ContextSpec(_Model):
    from_: list[ContextSource] = Field(default_factory=_all_context_sources, alias="from")
    chunk_pattern: str | None = None  # regex with named groups `id` and `text` (and `version`)
    trust: ContextTrust = Field(default_factory=ContextTrust)
    signing: ContextSigning | None = None
    # Compiled once at load (CHUNK_PATTERN_FLAGS); the hot path reads only this.
    _chunk_re: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("chunk_pattern")
    @classmethod
    def _has_groups(cls, value: str | None) -> str | None:
        if value is None:
            return value
        missing = {"id", "text"} - set(_compile(value).groupindex)
        if missing:
            names = " and ".join(f"`{g}`" for g in sorted(missing))
            raise ValueError(f"needs named groups `id` and `text`; missing {names}")
        return value

    @model_validator(mode="after")
    def _compile_chunk_pattern(self) -> ContextSpec:
        if self.chunk_pattern is not None:
            self._chunk_re = re.compile(self.chunk_pattern, CHUNK_PATTERN_FLAGS)
            if self.signing is not None and "sig" not in self._chunk_re.groupindex:
                raise _KeyedValueError(
                    ("chunk_pattern",),
                    "needs a named group `sig` (the chunk's signature) with context.signing",
                )
        return self

    @property
    def chunk_re(self) -> re.Pattern[str] | None:
        """The compiled `chunk_pattern` (None: the built-in `<chunk …>` tags)."""
        return self._chunk_re


# Matched against the whole claim (`re.fullmatch`, citation markers removed): an abstention
# followed by anything that is not one of these few words ("I don't know, but X.") is a claim.
DEFAULT_EXEMPT = [
    r"(?i)(?:(?:i (?:do not|don't|don’t|cannot|can't|can’t) (?:know|say|find|answer|tell)"
    r"|i'?m not sure|i am not sure|i’m not sure|there is no (?:answer|information)"
    r"|the (?:provided )?(?:context|sources?|documents?|passages?) (?:do|does) not "
    r"(?:contain|say|mention|answer|cover|include))"
    r"(?:[ ,]+(?:that|this|it|the|an?|answer|any|information|about|on|to|for|your|my"
    r"|question|in|from|provided|given|available|context|sources?|documents?|passages?"
    r"|here|based))*"
    # Or a refusal with a short topic ("I cannot answer questions about other employees'
    # salaries."): up to eight words of letters, none a clause word, verb or number word,
    # so "I can't help with that, but X" or "… the 42 reactors" stays a claim.
    r"|i (?:cannot|can't|can’t|won't|won’t|am unable to|am not able to) "
    r"(?:answer|help with|provide|discuss|share|disclose|assist with)(?: that| this| it)?"
    r"(?: (?!(?:but|because|since|although|though|which|that|who|whose|as|while|so|however"
    r"|yet|and|or|nor|is|are|was|were|be|been|has|have|had|does|did|will|would|can|could"
    r"|zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\w+teen|\w+ty"
    r"|hundred|thousand|million|billion|trillion|dozen)\b)"
    r"[^\W\d_]+(?:['’-][^\W\d_]*)?){0,8})\s*[.!]?",
]


class ClaimsSpec(_Model):
    exempt: list[RegexStr] = Field(default_factory=lambda: list(DEFAULT_EXEMPT))
    title_words: int = Field(default=8, ge=0)  # a longer heading, or one with a digit, is a claim
    code: Literal["exempt", "check"] = "exempt"  # text in a code fence: no claim / a claim


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


class LexicalBounds(_Model):
    """`support.lexical`: scores strictly above `pass_above` pass and strictly below
    `fail_below` fail without a judge call; the rest go to the judge (or `support.threshold`)."""

    pass_above: float = Field(default=0.8, ge=0.0, le=1.0)
    fail_below: float = Field(default=0.3, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> LexicalBounds:
        if self.fail_below > self.pass_above:
            raise _KeyedValueError(
                ("fail_below",),
                f"fail_below ({self.fail_below}) must not be greater than pass_above "
                f"({self.pass_above})",
            )
        return self


class JudgeCircuit(_Model):
    failures: int = Field(default=5, ge=1)
    reset_after: Duration = 30.0


class JudgeCache(_Model):
    entries: int = Field(default=100_000, ge=0)  # 0: no cache
    ttl: Duration = 3600.0


JUDGE_PROMPTS: tuple[str, ...] = ("default", "minicheck")


class JudgeSpec(_Model):
    """`support.judge`: the judge pass (DESIGN §10, docs/judge.md).

    The API key is read at load from `api_key_env` or `api_key_file` (a missing or empty one
    is a policy error); it never enters the canonical form, the version, a repr or a log line.
    A prompt template file is read at load too, relative to the policy file's directory.
    """

    backend: Literal["openai-chat", "tei"] = "openai-chat"
    url: str
    model: str = ""
    api_key_env: str | None = None
    api_key_file: str | None = None
    prompt: str = "default"
    group_by: Literal["chunk", "claim", "answer"] = "chunk"
    on_partial: Literal["fail", "pass"] = "fail"
    timeout: Duration = 5.0
    deadline: Duration = 8.0
    retries: int = Field(default=1, ge=0, le=5)
    max_concurrency: int = Field(default=32, ge=1, le=4096)
    circuit: JudgeCircuit = Field(default_factory=JudgeCircuit)
    cache: JudgeCache = Field(default_factory=JudgeCache)
    label: str = "entailment"  # tei: the label whose score decides
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)  # tei: YES at or above
    _key: str = PrivateAttr(default="")
    _template: str | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError(f"{value!r} is not an http(s) URL without query or fragment")
        return value.rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _key_env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> JudgeSpec:
        if self.backend == "openai-chat" and not self.model:
            raise _KeyedValueError(("backend",), "backend openai-chat needs a `model`")
        if self.api_key_env is not None and self.api_key_file is not None:
            raise _KeyedValueError(("api_key_file",), "give api_key_env or api_key_file, not both")
        if self.deadline < self.timeout:
            raise _KeyedValueError(
                ("deadline",), "the per-answer deadline must not be shorter than the call timeout"
            )
        base = (info.context or {}).get("base_dir", ".") if info is not None else "."
        if self.api_key_env is not None:
            value = os.environ.get(self.api_key_env)
            if not value:
                state = "is empty" if value == "" else "is not set"
                raise _KeyedValueError(
                    ("api_key_env",), f"the judge key's environment variable {self.api_key_env} "
                    f"{state}"
                )
            self._key = value.strip()
        elif self.api_key_file is not None:
            path = os.path.join(base, self.api_key_file)
            try:
                with open(path, encoding="utf-8") as fh:
                    self._key = fh.read().strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise _KeyedValueError(
                    ("api_key_file",), f"cannot read the judge key file: {type(exc).__name__}"
                ) from None
            if not self._key:
                raise _KeyedValueError(("api_key_file",), "the judge key file is empty")
        if self.prompt not in JUDGE_PROMPTS:
            path = os.path.join(base, self.prompt)
            try:
                with open(path, encoding="utf-8") as fh:
                    self._template = fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise _KeyedValueError(
                    ("prompt",), f"prompt is default, minicheck or a readable template file; "
                    f"cannot read {self.prompt!r}: {exc.__class__.__name__}"
                ) from None
            for field_name in ("{claims}", "{chunks}"):
                if field_name not in self._template:
                    raise _KeyedValueError(
                        ("prompt",), f"the prompt template {self.prompt!r} has no {field_name}"
                    )
        return self

    @property
    def key(self) -> str:
        return self._key

    @property
    def template(self) -> str | None:
        """The prompt template file's text (None for a built-in prompt)."""
        return self._template


class SupportSpec(_Model):
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)
    lexical: LexicalBounds | None = None
    judge: JudgeSpec | None = None


class Channels(_Model):
    tool_calls: ChannelRule = "verify"
    reasoning: ChannelRule = "withhold"
    logprobs: ChannelRule = "verify"  # verify = only when the content is released byte-identical
    allow_fields: list[str] = Field(default_factory=list)


class Templates(_Model):
    no_evidence: str = (
        "I can't provide a verified answer to this from the available sources."
    )
    verifier_unavailable: str = (
        "I can't verify an answer right now. Please try again shortly."
    )
    partial: str = (
        "Note: parts of this answer were removed because they could not be verified "
        "against the provided sources."
    )
    review_required: str = (
        "This answer needs review before it can be shared. It has been sent for review."
    )
    stale_source: str = (
        "I can't provide a verified answer: the sources cited have changed since they "
        "were retrieved."
    )


class Release(_Model):
    on_unverified: Literal["block", "strip", "abstain", "review"] = "block"
    on_infrastructure_failure: Literal["abstain", "block"] = "abstain"
    block_status: int = Field(default=422, ge=400, le=599)
    templates: Templates = Field(default_factory=Templates)
    retry: int = Field(default=0, ge=0, le=3)


class Streaming(_Model):
    mode: Literal["buffer", "progressive"] = "buffer"


class Audit(_Model):
    include_text: bool = False


def _passthrough_entry(entry: str) -> str:
    # The glob forms of `path_glob`: a trailing `/*` is one segment, `/**` the whole tree.
    return _url_glob(entry, "passthrough entry")


PassthroughEntry = Annotated[str, AfterValidator(_passthrough_entry)]


def _default_checks() -> list[CheckName]:
    return [
        "missing_citation",
        "malformed_citation",
        "hallucinated_citation",
        "stale_source",
        "quote_mismatch",
        "number_mismatch",
    ]


class Policy(_Model):
    name: Annotated[str, AfterValidator(_label_safe)]
    mode: Literal["enforce", "shadow"] = "enforce"
    routes: list[Route] = Field(min_length=1)
    passthrough: list[PassthroughEntry] = Field(default_factory=list)
    citations: Citations = Field(default_factory=Citations)
    context: ContextSpec = Field(default_factory=ContextSpec)
    claims: ClaimsSpec = Field(default_factory=ClaimsSpec)
    checks: list[CheckName] = Field(default_factory=_default_checks)
    support: SupportSpec = Field(default_factory=SupportSpec)
    channels: Channels = Field(default_factory=Channels)
    release: Release = Field(default_factory=Release)
    streaming: Streaming = Field(default_factory=Streaming)
    audit: Audit = Field(default_factory=Audit)

    @model_validator(mode="after")
    def _unique_route_names(self) -> Policy:
        seen: set[str] = set()
        for i, route in enumerate(self.routes):
            if route.name in seen:
                raise _KeyedValueError(
                    ("routes", i, "name"), f"duplicate route name {route.name!r}"
                )
            seen.add(route.name)
        return self


# --------------------------------------------------------------------------------------------
# YAML with line numbers
# --------------------------------------------------------------------------------------------

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


def _parse_yaml(file: str, text: str) -> tuple[Any, dict[Loc, int]]:
    loader = yaml.SafeLoader(text)
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


def _line_of(loc: Loc, lines: Mapping[Loc, int]) -> int | None:
    for end in range(len(loc), -1, -1):
        line = lines.get(loc[:end])
        if line is not None:
            return line
    return None


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


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
    if isinstance(cause, _KeyedValueError):
        loc = (*loc, *cause.key)
        return loc, f"{_dotted(loc)}: {cause}"
    if err["type"] == "extra_forbidden":
        key, parent = str(loc[-1]), loc[:-1]
        where = f" in {_dotted(parent)}" if parent else " at the top level"
        hint = difflib.get_close_matches(key, _keys_at(parent), n=1)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        return loc, f"unknown key {key!r}{where}{suggestion}"
    if err["type"] == "invalid_key":
        parent = loc[:-1]
        where = f" in {_dotted(parent)}" if parent else ""
        return loc, f"key {loc[-1]!r}{where} must be a string; quote it"
    if err["type"] == "missing":
        parent = loc[:-1]
        where = f" in {_dotted(parent)}" if parent else ""
        return loc, f"missing required key {loc[-1]!r}{where}"
    message = str(cause) if isinstance(cause, ValueError) else str(err["msg"])
    return loc, f"{_dotted(loc)}: {message}" if loc else message


# --------------------------------------------------------------------------------------------
# Loaded, versioned and compiled policies
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    """Everything the hot path needs, compiled once at load."""

    citation_pattern: re.Pattern[str] | None  # format: regex only
    chunk_pattern: re.Pattern[str] | None  # None: the built-in <chunk …> form
    exempt: tuple[re.Pattern[str], ...]
    checks: frozenset[str]
    routes: Mapping[str, Route]  # by name


@dataclass(frozen=True)
class LoadedPolicy:
    """A validated policy file. `version` is the full sha256; `label` is `name@version[:12]`.

    Equality and hashing go by (path, version, label): the version already digests the policy.
    """

    policy: Policy = field(compare=False)
    path: str
    version: str
    label: str
    compiled: CompiledPolicy = field(repr=False, compare=False)
    lines: Mapping[Loc, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.policy.name

    def line_of(self, *loc: str | int) -> int | None:
        """The line of the key or item at `loc` (or of its nearest enclosing one)."""
        return _line_of(loc, self.lines)


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


def _compile_policy(policy: Policy) -> CompiledPolicy:
    pattern = policy.citations.pattern
    return CompiledPolicy(
        citation_pattern=(
            re.compile(pattern) if pattern is not None and policy.citations.format == "regex"
            else None
        ),
        chunk_pattern=policy.context.chunk_re,
        exempt=tuple(re.compile(p) for p in policy.claims.exempt),
        checks=frozenset(policy.checks),
        routes=types.MappingProxyType({r.name: r for r in policy.routes}),
    )


def from_model(policy: Policy, path: str = "<memory>") -> LoadedPolicy:
    """Wrap an already validated Policy (tests, embedded defaults) as a LoadedPolicy."""
    version = policy_version(policy)
    return LoadedPolicy(
        policy=policy,
        path=path,
        version=version,
        label=f"{policy.name}@{version[:SHORT_VERSION_LEN]}",
        compiled=_compile_policy(policy),
    )


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


def _load_all_errors(file: str) -> tuple[LoadedPolicy | None, list[PolicyError]]:
    try:
        data, lines = _parse_yaml(file, _read(file))
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
            errors.append(PolicyError(file, _line_of(loc, lines), message))
        errors.sort(key=lambda e: e.line or 0)
        return None, errors
    loaded = from_model(policy, file)
    return LoadedPolicy(
        policy=loaded.policy,
        path=file,
        version=loaded.version,
        label=loaded.label,
        compiled=loaded.compiled,
        lines=types.MappingProxyType(lines),
    ), []


def load_policy(path: str | os.PathLike[str]) -> LoadedPolicy:
    """Load, validate and compile one policy file; raise the first PolicyError (by line)."""
    loaded, errors = _load_all_errors(os.fspath(path))
    if errors:
        raise errors[0]
    assert loaded is not None
    return loaded


def load_policies(paths: Sequence[str | os.PathLike[str]]) -> PolicySet:
    """Load several files into one PolicySet; route names must be unique across files."""
    if not paths:
        raise PolicyError("<policy>", None, "no policy files given")
    policies = [load_policy(p) for p in paths]
    errors = _cross_file_errors(policies)
    if errors:
        raise errors[0]
    return PolicySet(policies)


# --------------------------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Matcher:
    glob: Glob | None  # path, path_prefix or path_glob, matched segment by segment
    headers: tuple[tuple[str, str], ...]  # lower-cased names
    methods: frozenset[str]  # empty = any

    @classmethod
    def of(cls, match: Match) -> _Matcher:
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
        if self.methods and method.upper() not in self.methods:
            return False
        return all(_header(headers, name) == value for name, value in self.headers)

    def covers(self, other: _Matcher) -> bool:
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

    __slots__ = ("_by_name", "_passthrough", "_routes", "policies")

    def __init__(self, policies: Sequence[LoadedPolicy]) -> None:
        self.policies: tuple[LoadedPolicy, ...] = tuple(policies)
        self._routes = tuple(
            (_Matcher.of(route.match), loaded, route)
            for loaded in self.policies
            for route in loaded.policy.routes
        )
        self._by_name: dict[str, tuple[LoadedPolicy, Route]] = {}
        for _, loaded, route in self._routes:
            self._by_name.setdefault(route.name, (loaded, route))
        self._passthrough = tuple(
            Glob(e) for loaded in self.policies for e in loaded.policy.passthrough
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

    def route(self, name: str) -> tuple[LoadedPolicy, Route] | None:
        """The route called `name` (for `citewarden verify --route`)."""
        return self._by_name.get(name)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(p.label for p in self.policies)


def _cross_file_errors(policies: Sequence[LoadedPolicy]) -> list[PolicyError]:
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


# --------------------------------------------------------------------------------------------
# `citewarden policy check`
# --------------------------------------------------------------------------------------------


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
    out: list[Diagnostic] = []

    def warn(loaded: LoadedPolicy, loc: Loc, message: str) -> None:
        out.append(Diagnostic(loaded.path, loaded.line_of(*loc), "warning", message))

    earlier: list[tuple[_Matcher, LoadedPolicy, int]] = []
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
        from gateway.protocols.openai_responses.lint import returns_model_output

        for k, entry in enumerate(p.passthrough):
            what = returns_model_output(entry)
            if what is not None:
                warn(
                    loaded,
                    ("passthrough", k),
                    f"passthrough entry {entry!r} relays {what} unverified: that is model "
                    "output; verify it on a route instead",
                )
        for i, route in enumerate(p.routes):
            if route.protocol == "bedrock-converse" and p.release.retry:
                warn(
                    loaded,
                    ("release", "retry"),
                    f"release.retry is not applied on route {route.name!r} (bedrock-converse): "
                    "a re-asked request would need a new body, which the client's SigV4 "
                    "signature does not cover",
                )
            if route.rag is not None and route.protocol != "rag-json":
                warn(
                    loaded,
                    ("routes", i, "rag"),
                    f"rag is ignored for protocol {route.protocol}",
                )
            matcher = _Matcher.of(route.match)
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
        result, errors = _load_all_errors(path)
        by_file[path].extend(Diagnostic(e.file, e.line, "error", e.message) for e in errors)
        if result is not None:
            loaded.append(result)
    for e in _cross_file_errors(loaded):
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


# --------------------------------------------------------------------------------------------
# Hot reload
# --------------------------------------------------------------------------------------------

ReloadOutcome = Literal["success", "error"]
ReloadCallback = Callable[[ReloadOutcome, PolicyError | None], None]

_log = structlog.get_logger(__name__)


def _stat(path: str) -> tuple[object, ...]:
    # realpath: a ConfigMap swaps its `..data` symlink, so the target changes while every
    # stat field of the new file may look old; the inode catches an atomic rename.
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError as exc:
        return ("unreadable", exc.errno)
    return (real, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def _digest(paths: Sequence[str]) -> str:
    h = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as fh:
                h.update(hashlib.sha256(fh.read()).digest())
        except OSError as exc:
            h.update(f"unreadable:{exc.errno}".encode())
    return h.hexdigest()


class PolicyStore:
    """The live PolicySet. Readers take `store.current` once per request; swaps are atomic.

    The constructor raises PolicyError when the initial load fails (start-up exit 2); later
    reloads that fail keep the last good set.
    """

    def __init__(self, paths: Sequence[str | os.PathLike[str]]) -> None:
        self.paths: tuple[str, ...] = tuple(os.fspath(p) for p in paths)
        # Snapshot before loading so an edit racing the first load is seen by the next poll.
        self._stats = tuple(_stat(p) for p in self.paths)
        self._digest = _digest(self.paths)
        self.current: PolicySet = load_policies(self.paths)
        self.last_error: PolicyError | None = None

    def reload(self) -> bool:
        """Load the files again; swap in the result, or keep the last good set and say False."""
        try:
            fresh = load_policies(self.paths)
        except PolicyError as exc:
            self.last_error = exc
            return False
        self.current = fresh
        self.last_error = None
        return True

    def poll(self) -> ReloadOutcome | None:
        """One watch tick: reload if any file changed. None when nothing changed."""
        stats = tuple(_stat(p) for p in self.paths)
        if stats == self._stats:
            return None
        self._stats = stats
        digest = _digest(self.paths)
        if digest == self._digest:  # touched, or swapped for identical content
            return None
        self._digest = digest
        return "success" if self.reload() else "error"

    async def watch(self, interval_s: float = 2.0, on_event: ReloadCallback | None = None) -> None:
        """Poll every `interval_s` seconds until cancelled; report each reload to `on_event`."""
        while True:
            await asyncio.sleep(interval_s)
            outcome = self.poll()
            if outcome is None or on_event is None:
                continue
            try:
                on_event(outcome, self.last_error if outcome == "error" else None)
            except Exception:
                # A broken metrics/logging hook must not stop hot reload.
                _log.exception("policy_reload_callback_failed")

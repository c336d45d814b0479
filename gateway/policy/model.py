"""The policy file's pydantic model: every key, its default and its validation.

Sections that carry a regex compile it here, once; `Policy.compiled` gathers them for the hot path.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway import jsonpointer
from gateway.policy.compiled import CompiledPolicy, chunk_regex, compile_policy, compile_regex
from gateway.policy.values import (
    ENV_NAME_RE,
    Duration,
    KeyedValueError,
    LabelSafe,
    PassthroughEntry,
    ProtocolName,
    RegexStr,
    json_pointer,
    url_glob,
    url_path,
)

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
# The methods a route may name: those the gateway serves at all (gateway/app.py).
HTTP_METHODS: tuple[str, ...] = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


class _Model(BaseModel):
    # strict: values are taken as written (`block_status: "422"`, `retry: true`,
    # `include_text: 1`, `documents: "off"` are errors, not coerced); an int is still a float.
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


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
        return None if value is None else url_path(value, "path")

    @field_validator("path_glob")
    @classmethod
    def _is_glob(cls, value: str | None) -> str | None:
        return None if value is None else url_glob(value, "path_glob")

    @field_validator("methods")
    @classmethod
    def _upper(cls, value: list[str]) -> list[str]:
        methods = [m.upper() for m in value]
        for i, m in enumerate(methods):
            if m not in HTTP_METHODS:
                raise KeyedValueError(
                    (i,), f"{value[i]!r} is not an HTTP method ({', '.join(HTTP_METHODS)})"
                )
        return methods

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
            raise KeyedValueError(
                (given[1],),
                "use only one of path, path_prefix and path_glob in one match, not "
                + " and ".join(given),
            )
        seen: set[str] = set()
        for name in self.header:
            if not name or name.lower() in seen:
                raise KeyedValueError(
                    ("header", name), f"header {name!r} is empty or listed twice"
                )
            seen.add(name.lower())
        return self


def _overlap(a: Sequence[str], b: Sequence[str]) -> bool:
    """Whether one pointer's tokens are a prefix of the other's (the same field, or one
    inside the other)."""
    n = min(len(a), len(b))
    return list(a[:n]) == list(b[:n])


class RagSpec(_Model):
    """JSON pointers (RFC 6901) into a JSON RAG response, and field names inside items."""

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

    _pointers = field_validator("answer", "claims", "context")(json_pointer)

    @model_validator(mode="after")
    def _keep_apart(self) -> RagSpec:
        # A kept field goes out in every decision, the blocked envelope too: one that is (or
        # holds, or lies in) the answer, the claims or the context would carry them unchecked.
        for pointer in self.keep:
            for name in ("answer", "claims", "context"):
                other = getattr(self, name)
                if other is not None and _overlap(jsonpointer.parse(pointer),
                                                  jsonpointer.parse(other)):
                    raise KeyedValueError(
                        ("keep",), f"rag.keep entry {pointer!r} overlaps rag.{name} {other!r}"
                    )
        # Context that is, holds or lies in the model's own answer or claims would let a claim
        # cite itself: everything invented would verify.
        if self.context is not None:
            for name in ("answer", "claims"):
                other = getattr(self, name)
                if other is not None and _overlap(jsonpointer.parse(self.context),
                                                  jsonpointer.parse(other)):
                    raise KeyedValueError(
                        ("context",),
                        f"rag.context {self.context!r} overlaps rag.{name} {other!r}: the "
                        "model's own text would be its context",
                    )
        return self

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
    name: LabelSafe
    match: Match
    protocol: ProtocolName
    rag: RagSpec | None = None

    @model_validator(mode="after")
    def _rag_when_read(self) -> Route:
        # A protocol that reads `rag:` (the adapter's `reads_rag`) finds its answer there.
        from gateway.protocols import ADAPTERS

        if ADAPTERS[self.protocol].reads_rag and (
            self.rag is None or (self.rag.answer is None and self.rag.claims is None)
        ):
            raise KeyedValueError(
                ("rag",),
                f"protocol {self.protocol} needs rag.answer or rag.claims (JSON pointers into "
                "the upstream response)",
            )
        return self


class Citations(_Model):
    format: Literal["doc-chunk", "numeric", "footnote", "regex"] = "doc-chunk"
    pattern: str | None = None  # for format: regex — a regex with a named group `id`
    # Compiled once at load; the hot path reads only this.
    _regex: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("pattern")
    @classmethod
    def _has_id_group(cls, value: str | None) -> str | None:
        if value is not None and "id" not in compile_regex(value).groupindex:
            raise ValueError("needs a named group `id`, e.g. (?P<id>[A-Za-z0-9:]+)")
        return value

    @model_validator(mode="after")
    def _regex_needs_pattern(self) -> Citations:
        if self.format == "regex" and self.pattern is None:
            raise KeyedValueError(
                ("format",), "regex needs citations.pattern, a regex with a named group `id`"
            )
        if self.pattern is not None:
            self._regex = compile_regex(self.pattern)
        return self

    @property
    def regex(self) -> re.Pattern[str] | None:
        """The compiled `pattern` (None when there is none)."""
        return self._regex


ContextSource = Literal["request", "response", "header"]


def _all_context_sources() -> list[ContextSource]:
    return ["request", "response", "header"]


# Where chunk tags count as context (DESIGN §3). `tool` covers OpenAI `tool` (and legacy
# `function`) messages and Anthropic `tool_result` blocks; assistant turns never count.
TrustRole = Literal["system", "developer", "user", "tool"]

def _default_trust_roles() -> list[TrustRole]:
    return ["system", "developer", "tool"]


class ContextTrust(_Model):
    """The places of a request whose chunk tags are context (without signing)."""

    roles: list[TrustRole] = Field(default_factory=_default_trust_roles)
    documents: bool = True  # Anthropic document / search_result blocks of non-assistant turns


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
        if not ENV_NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _read_key(self) -> ContextSigning:
        value = os.environ.get(self.key_env)
        if not value:
            state = "is empty" if value == "" else "is not set"
            raise KeyedValueError(
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
    # Compiled once at load (`chunk_regex`); the hot path reads only this.
    _chunk_re: re.Pattern[str] | None = PrivateAttr(default=None)

    @field_validator("chunk_pattern")
    @classmethod
    def _has_groups(cls, value: str | None) -> str | None:
        if value is None:
            return value
        missing = {"id", "text"} - set(chunk_regex(value).groupindex)
        if missing:
            names = " and ".join(f"`{g}`" for g in sorted(missing))
            raise ValueError(f"needs named groups `id` and `text`; missing {names}")
        return value

    @model_validator(mode="after")
    def _compile_chunk_pattern(self) -> ContextSpec:
        if self.chunk_pattern is not None:
            self._chunk_re = chunk_regex(self.chunk_pattern)
            if self.signing is not None and "sig" not in self._chunk_re.groupindex:
                raise KeyedValueError(
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
    # so "I can't help with that, but X", "… the 42 reactors" or "… why the plant exploded"
    # (which asserts that it did) stays a claim.
    r"|i (?:cannot|can't|can’t|won't|won’t|am unable to|am not able to) "
    r"(?:answer|help with|provide|discuss|share|disclose|assist with)(?: that| this| it)?"
    r"(?: (?!(?:but|because|why|since|although|though|which|that|who|whose|as|while|so|however"
    r"|yet|and|or|nor|is|are|was|were|be|been|has|have|had|does|did|will|would|can|could"
    r"|zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|\w+teen|\w+ty"
    r"|hundred|thousand|million|billion|trillion|dozen)\b)"
    r"[^\W\d_]+(?:['’-][^\W\d_]*)?){0,8})\s*[.!]?",
]


class ClaimsSpec(_Model):
    exempt: list[RegexStr] = Field(default_factory=lambda: list(DEFAULT_EXEMPT))
    title_words: int = Field(default=8, ge=0)  # a longer heading, or one with a digit, is a claim
    code: Literal["exempt", "check"] = "exempt"  # text in a code fence: no claim / a claim
    # Compiled once at load; the hot path reads only this.
    _exempt_re: tuple[re.Pattern[str], ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _compile_exempt(self) -> ClaimsSpec:
        self._exempt_re = tuple(compile_regex(p) for p in self.exempt)
        return self

    @property
    def exempt_re(self) -> tuple[re.Pattern[str], ...]:
        """The compiled `exempt` patterns, in order."""
        return self._exempt_re


class LexicalBounds(_Model):
    """`support.lexical`: scores strictly above `pass_above` pass and strictly below
    `fail_below` fail without a judge call; the rest go to the judge (or `support.threshold`)."""

    pass_above: float = Field(default=0.8, ge=0.0, le=1.0)
    fail_below: float = Field(default=0.3, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> LexicalBounds:
        if self.fail_below > self.pass_above:
            raise KeyedValueError(
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
        if value is not None and not ENV_NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _load(self, info: ValidationInfo) -> JudgeSpec:
        if self.backend == "openai-chat" and not self.model:
            raise KeyedValueError(("backend",), "backend openai-chat needs a `model`")
        if self.api_key_env is not None and self.api_key_file is not None:
            raise KeyedValueError(("api_key_file",), "give api_key_env or api_key_file, not both")
        if self.deadline < self.timeout:
            raise KeyedValueError(
                ("deadline",), "the per-answer deadline must not be shorter than the call timeout"
            )
        base = (info.context or {}).get("base_dir", ".") if info is not None else "."
        if self.api_key_env is not None:
            value = os.environ.get(self.api_key_env)
            if not value:
                state = "is empty" if value == "" else "is not set"
                raise KeyedValueError(
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
                raise KeyedValueError(
                    ("api_key_file",), f"cannot read the judge key file: {type(exc).__name__}"
                ) from None
            if not self._key:
                raise KeyedValueError(("api_key_file",), "the judge key file is empty")
        if self.prompt not in JUDGE_PROMPTS:
            path = os.path.join(base, self.prompt)
            try:
                with open(path, encoding="utf-8") as fh:
                    self._template = fh.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise KeyedValueError(
                    ("prompt",), f"prompt is default, minicheck or a readable template file; "
                    f"cannot read {self.prompt!r}: {exc.__class__.__name__}"
                ) from None
            for field_name in ("{claims}", "{chunks}"):
                if field_name not in self._template:
                    raise KeyedValueError(
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
    name: LabelSafe
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
    _compiled: CompiledPolicy | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _unique_route_names(self) -> Policy:
        seen: set[str] = set()
        for i, route in enumerate(self.routes):
            if route.name in seen:
                raise KeyedValueError(
                    ("routes", i, "name"), f"duplicate route name {route.name!r}"
                )
            seen.add(route.name)
        return self

    @model_validator(mode="after")
    def _compile(self) -> Policy:
        self._compiled = compile_policy(self)
        return self

    @property
    def compiled(self) -> CompiledPolicy:
        """The policy's regexes and lookups, compiled when it was validated."""
        compiled = self._compiled
        if compiled is None:  # built with model_construct: nothing was validated
            compiled = self._compiled = compile_policy(self)
        return compiled

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copy = super().model_copy(update=update, deep=deep)
        if update:
            # A copy is not validated again; its compiled form must still follow its fields.
            copy._compiled = compile_policy(copy)
        return copy


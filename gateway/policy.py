"""Policy files: the pydantic model, YAML loading with file:line errors, versioning, routing.

A policy is parsed, validated and compiled once; the hot path only reads compiled objects.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Protocol = Literal["openai-chat", "anthropic-messages", "rag-json"]
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


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Match(_Model):
    path: str | None = None
    path_prefix: str | None = None
    header: dict[str, str] = Field(default_factory=dict)


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


class Route(_Model):
    name: str
    match: Match
    protocol: Protocol
    rag: RagSpec | None = None


class Citations(_Model):
    format: Literal["doc-chunk", "numeric", "footnote", "regex"] = "doc-chunk"
    pattern: str | None = None  # for format: regex — a regex with a named group `id`


class ContextSpec(_Model):
    from_: list[Literal["request", "response", "header"]] = Field(
        default_factory=lambda: ["request", "response", "header"], alias="from"
    )
    chunk_pattern: str | None = None  # regex with named groups `id` and `text` (and `version`)


DEFAULT_EXEMPT = [
    r"(?i)^\s*(i (do not|don't) know|i'?m not sure|i cannot (find|answer)|"
    r"the (provided )?(context|sources?|documents?) (do|does) not (contain|say|mention))\b",
]


class ClaimsSpec(_Model):
    exempt: list[str] = Field(default_factory=lambda: list(DEFAULT_EXEMPT))


class SupportSpec(_Model):
    threshold: float = Field(default=0.5, ge=0.0, le=1.0)


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


class Policy(_Model):
    name: str
    mode: Literal["enforce", "shadow"] = "enforce"
    routes: list[Route] = Field(min_length=1)
    passthrough: list[str] = Field(default_factory=list)
    citations: Citations = Field(default_factory=Citations)
    context: ContextSpec = Field(default_factory=ContextSpec)
    claims: ClaimsSpec = Field(default_factory=ClaimsSpec)
    checks: list[CheckName] = Field(
        default_factory=lambda: [
            "missing_citation",
            "malformed_citation",
            "hallucinated_citation",
            "stale_source",
            "quote_mismatch",
            "number_mismatch",
        ]
    )
    support: SupportSpec = Field(default_factory=SupportSpec)
    channels: Channels = Field(default_factory=Channels)
    release: Release = Field(default_factory=Release)
    streaming: Streaming = Field(default_factory=Streaming)
    audit: Audit = Field(default_factory=Audit)

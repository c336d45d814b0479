"""Values shared by every layer: chunks, citations, claims, check outcomes, reports, decisions.

Nothing here does I/O or knows a protocol; these are the nouns the rest of the gateway speaks.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

_T = TypeVar("_T")


def frozen_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an `__init__` that sets each slot through its
    descriptor rather than `object.__setattr__` (which a frozen class needs for its own
    fields): the same signature, defaults and result in about half the time. For the values
    made per claim of every answer; a field with a default factory or `init=False`, or a
    keyword-only one, is refused at import."""
    params: list[str] = []
    body: list[str] = []
    ns: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init or f.default_factory is not dataclasses.MISSING or f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: only plain fields are supported")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            ns[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        ns[f"_s_{f.name}"] = getattr(cls, f.name).__set__
        body.append(f"    _s_{f.name}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body), ns)
    init: Callable[..., None] = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


# --------------------------------------------------------------------------------------------
# Context
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of trusted context: what the model was actually given."""

    id: str
    text: str | None = None
    version: str | None = None
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Document:
    """An Anthropic `document` or `search_result` block of the request, for native citations.

    `kind` is the source type: "text" (plain text; char offsets index `text`), "content"
    (custom content; `blocks` are its text blocks), "pdf" (text unknown unless extracted),
    or "search_result" (`blocks` are its text blocks). `blocks` for "text" documents is empty.
    """

    index: int
    kind: Literal["text", "content", "pdf", "search_result"]
    text: str | None = None
    blocks: tuple[str, ...] = ()
    title: str | None = None
    source: str | None = None


# Text from a JSON document may hold a lone surrogate (`"\udfff"` is valid JSON): digests
# take it as it is rather than fail, since a fingerprint that raised would lose the audit event.
_SURROGATES = "surrogatepass"


@functools.lru_cache(maxsize=1024)
def _cached_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", _SURROGATES)).hexdigest()


def _text_digest(text: str) -> str:
    # The same chunks recur across requests (multi-turn chats, popular documents); small ones
    # keep their digest, so the cache stays at a few MiB at most.
    if len(text) > 8 * 1024:
        return hashlib.sha256(text.encode("utf-8", _SURROGATES)).hexdigest()
    return _cached_digest(text)


def _fingerprint(chunks: Iterable[Chunk]) -> str:
    triples = sorted(
        (
            c.id,
            _text_digest(c.text) if c.text is not None else "",
            c.version or "",
        )
        for c in chunks
    )
    # Length-prefix each field so ("a", "bc") and ("ab", "c") never collide. One update of
    # the joined fields hashes the same bytes as one update per field, with less overhead.
    out: list[bytes] = []
    for triple in triples:
        for part in triple:
            b = part.encode("utf-8", _SURROGATES)
            out.append(len(b).to_bytes(4, "big"))
            out.append(b)
    return hashlib.sha256(b"".join(out)).hexdigest()


@dataclass(slots=True)
class ContextSet:
    """Every chunk the upstream was given, keyed by exact id (code points, no normalisation).

    Later sources do not overwrite an earlier chunk with the same id unless the earlier one had
    no text (an id-only header chunk is upgraded by a chunk with text).
    """

    chunks: dict[str, Chunk] = field(default_factory=dict)
    documents: list[Document] = field(default_factory=list)
    search_results: list[Document] = field(default_factory=list)
    # Chunk tags / document blocks the request carried that were not context, by why
    # (gateway.context.REJECT_REASONS); counted in citewarden_context_rejected_total.
    rejected: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    # The last fingerprint and the chunks it was computed from.
    _fp: tuple[tuple[Chunk, ...], str] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def add(self, chunk: Chunk) -> None:
        have = self.chunks.get(chunk.id)
        if have is None or (have.text is None and chunk.text is not None):
            self.chunks[chunk.id] = chunk
            self._fp = None

    def extend(self, chunks: Iterable[Chunk]) -> None:
        for c in chunks:
            self.add(c)

    def update(self, other: ContextSet) -> None:
        """Add what `other` holds, as if its sources had been read into this set: its chunks
        in order (`add` keeps the first with text, whichever set holds it), its documents and
        search results after these, its rejections counted with these."""
        for c in other.chunks.values():
            self.add(c)
        self.documents += other.documents
        self.search_results += other.search_results
        for why, n in other.rejected.items():
            self.rejected[why] = self.rejected.get(why, 0) + n

    def get(self, chunk_id: str) -> Chunk | None:
        return self.chunks.get(chunk_id)

    @property
    def fingerprint(self) -> str:
        """sha256 over the sorted (id, sha256(text), version) triples of the chunks.

        Cached: `chunks` is a public dict that may be changed without `add`, so the cached
        value is reused only while it holds the very same (frozen) chunks, in the same order.
        """
        now = tuple(self.chunks.values())
        got = self._fp
        if got is not None and got[0] == now:
            return got[1]
        fp = _fingerprint(now)
        self._fp = (now, fp)
        return fp


# --------------------------------------------------------------------------------------------
# Citations and claims
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NativeLocation:
    """An Anthropic native citation, as received (indices exactly as the API gives them)."""

    type: Literal[
        "char_location", "page_location", "content_block_location", "search_result_location"
    ]
    cited_text: str
    document_index: int | None = None  # for document citations
    search_result_index: int | None = None  # for search_result_location
    start: int | None = None  # start_char_index / start_page_number / start_block_index
    end: int | None = None  # end_char_index / end_page_number / end_block_index (exclusive)


@frozen_init
@dataclass(frozen=True, slots=True)
class Citation:
    """A citation attached to a claim.

    `id` is the chunk id exactly as written. `start`/`end` are offsets of the marker in the
    channel text (-1 for structured and native citations, which have no marker). `malformed`
    holds why the marker fails the shape rule, or None when well formed.
    """

    id: str
    raw: str
    start: int = -1
    end: int = -1
    version: str | None = None
    malformed: str | None = None
    native: NativeLocation | None = None


@frozen_init
@dataclass(frozen=True, slots=True)
class Claim:
    """A sentence or list item whose truth depends on its citations.

    `index` is 0-based across the whole answer (all channels, in channel order). `start`/`end`
    delimit the claim in its channel's text, trailing citation markers included, so that the
    text of a partial answer is rebuilt by slicing. `exempt` claims (abstention phrases, policy
    exempt patterns) need no citation and are never failed.
    """

    index: int
    channel: int  # index into Answer.channels
    text: str
    start: int
    end: int
    citations: tuple[Citation, ...] = ()
    exempt: bool = False


# --------------------------------------------------------------------------------------------
# Check outcomes
# --------------------------------------------------------------------------------------------

Reason = Literal[
    "missing_citation",
    "malformed_citation",
    "hallucinated_citation",
    "stale_source",
    "quote_mismatch",
    "number_mismatch",
    "source_text_unavailable",
    "unsupported",
]
REASONS: tuple[Reason, ...] = (
    "missing_citation",
    "malformed_citation",
    "hallucinated_citation",
    "stale_source",
    "quote_mismatch",
    "number_mismatch",
    "source_text_unavailable",
    "unsupported",
)


class Status(enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


@frozen_init
@dataclass(frozen=True, slots=True)
class CheckResult:
    """The outcome of one check on one claim. A value, never an exception.

    `reason` is set for FAIL (one of REASONS); `kind` names the infrastructure failure for
    ERROR ("timeout", "circuit_open", "crash", ...). `detail` is a short human explanation
    that must not quote chunk text (it ends up in audit logs).
    """

    status: Status
    check: str
    reason: Reason | None = None
    kind: str | None = None
    detail: str = ""

    @staticmethod
    def ok(check: str) -> CheckResult:
        return CheckResult(Status.PASS, check)

    @staticmethod
    def fail(check: str, reason: Reason, detail: str = "") -> CheckResult:
        return CheckResult(Status.FAIL, check, reason=reason, detail=detail)

    @staticmethod
    def error(check: str, kind: str, detail: str = "") -> CheckResult:
        return CheckResult(Status.ERROR, check, kind=kind, detail=detail)


Verdict = Literal["verified", "failed", "errored", "exempt"]


@frozen_init
@dataclass(frozen=True, slots=True)
class ClaimReport:
    """A claim's verdict: the first non-pass result in policy check order decides it."""

    claim: Claim
    verdict: Verdict
    reason: Reason | None = None  # set when failed
    error_kind: str | None = None  # set when errored
    check: str | None = None  # the check that decided a failed / errored verdict
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Report:
    """Verification of a whole answer."""

    claims: tuple[ClaimReport, ...]
    # The context the claims were checked against, or its fingerprint. Only the audit line
    # reads the fingerprint, after the answer has left, so it is not hashed on the way out.
    context: ContextSet | str
    seconds: float = 0.0

    @property
    def context_fingerprint(self) -> str:
        c = self.context
        return c if isinstance(c, str) else c.fingerprint

    @property
    def first_problem(self) -> ClaimReport | None:
        for c in self.claims:
            if c.verdict in ("failed", "errored"):
                return c
        return None

    @property
    def all_verified(self) -> bool:
        return all(c.verdict in ("verified", "exempt") for c in self.claims)

    @property
    def any_errored(self) -> bool:
        return any(c.verdict == "errored" for c in self.claims)


# --------------------------------------------------------------------------------------------
# The protocol-neutral answer
# --------------------------------------------------------------------------------------------

ChannelKind = Literal[
    "content",  # assistant text: message.content, Anthropic text blocks, rag-json answer
    "refusal",
    "tool_arguments",  # tool_calls[].function.arguments, legacy function_call, tool_use input
    "reasoning",  # reasoning_content / reasoning / Anthropic thinking
    "transcript",  # audio.transcript
]


@dataclass(slots=True)
class Channel:
    """One text-bearing field of an answer.

    `path` locates it in the protocol body (e.g. ("choices", 0, "message", "content")) so a
    renderer can rewrite or remove it. `choice` groups channels of one OpenAI choice (0 for
    single-answer protocols). `native` lists (start, end, citation) spans for Anthropic
    citations attached to text blocks; `structured` holds rag-json claims as given
    (text, citation ids) — when it is not None the text is not segmented, the list is the claims.
    """

    kind: ChannelKind
    path: tuple[str | int, ...]
    text: str
    choice: int = 0
    native: tuple[tuple[int, int, Citation], ...] = ()
    structured: tuple[tuple[str, tuple[str, ...]], ...] | None = None


@dataclass(slots=True)
class Answer:
    """What the upstream answered, in protocol-neutral form, plus the parsed body it came from.

    `body` is the decoded JSON of a non-streaming answer, or the equivalent body assembled from
    a stream. `has_logprobs` tells whether any logprobs were present; `unknown_fields` lists
    paths of fields the adapter does not know (dropped on verified routes unless allow-listed).
    `usage` is the upstream's token usage (input/output/total) when it reported one.
    """

    protocol: str
    body: dict[str, object]
    channels: list[Channel] = field(default_factory=list)
    has_logprobs: bool = False
    unknown_fields: list[tuple[str | int, ...]] = field(default_factory=list)
    usage: Mapping[str, int] = field(default_factory=dict)
    # (level, path) of what the adapter's field table removed while parsing: known fields with
    # a value of the wrong shape, stream framing the body does not carry (frame keys, SSE
    # lines). An answer with any is never relayed byte-identical.
    dropped: list[tuple[str, tuple[str | int, ...]]] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Decisions
# --------------------------------------------------------------------------------------------


class Decision(enum.Enum):
    RELEASED = "released"
    PARTIAL = "partial"
    ABSTAINED = "abstained"
    BLOCKED = "blocked"
    REVIEW = "review"


TemplateName = Literal[
    "no_evidence", "verifier_unavailable", "partial", "review_required", "stale_source"
]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The release decision for one answer and what a renderer needs to carry it out.

    `reason` is the first failing check reason, the infrastructure error kind, or None when
    released. `claim_index` is the 0-based index of the first failing / errored claim. `template`
    names the template an abstained / review / partial body uses. `kept` holds the indices of
    claims a partial answer keeps (every verified or exempt claim).
    """

    decision: Decision
    reason: str | None = None
    claim_index: int | None = None
    template: TemplateName | None = None
    kept: frozenset[int] = frozenset()

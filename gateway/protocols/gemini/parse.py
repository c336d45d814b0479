"""A `GenerateContentResponse` → the protocol-neutral Answer.

Channels per candidate (its position in `candidates`): the answer text (its non-thought `text`
parts joined in order; path `("candidates", c, "text")`), each `thought: true` part
(reasoning), each `functionCall`'s `args` (tool arguments, as JSON text). Native citations:
each `groundingSupports[]` entry cites, for the span of the answer its `segment` locates, the
grounding chunks its `groundingChunkIndices` name (a chunk's id: `grounding_ids`). Segment
offsets are UTF-8 **byte** offsets into the candidate's answer text, or into part `partIndex`
when that is given (the answer's own text parts only).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.errors import ProtocolError
from gateway.protocols.fields import FieldLog, clean, is_index
from gateway.protocols.gemini.fields import BODY_TABLE, is_uri
from gateway.protocols.gemini.offsets import byte_len, to_chars
from gateway.types import Answer, Channel, Citation

__all__ = [
    "NAME",
    "CandidateText",
    "answer_text",
    "candidate_numbers",
    "chunk_text",
    "grounding_ids",
    "locate_supports",
    "parse_body",
    "support_citations",
]

NAME = "gemini"

Json = dict[str, Any]

# Why a support's citation fails (a malformed citation: its segment is no slice of the answer).
SEGMENT_MISMATCH = "grounding segment text differs from the answer text it locates"


@dataclass(frozen=True, slots=True)
class CandidateText:
    """A candidate's answer text and where each of its text parts starts in it (part index,
    str offset, byte offset, byte length)."""

    text: str
    parts: tuple[tuple[int, int, int, int], ...]


def _parts(candidate: Mapping[str, Any]) -> list[Any]:
    content = candidate.get("content")
    if not isinstance(content, Mapping):
        return []
    parts = content.get("parts")
    return parts if isinstance(parts, list) else []


def is_thought(part: Mapping[str, Any]) -> bool:
    return part.get("thought") is True


def answer_text(candidate: Mapping[str, Any]) -> CandidateText:
    texts: list[str] = []
    where: list[tuple[int, int, int, int]] = []
    chars = nbytes = 0
    for pi, part in enumerate(_parts(candidate)):
        if not isinstance(part, Mapping) or is_thought(part):
            continue
        text = part.get("text")
        if not isinstance(text, str):
            continue
        size = byte_len(text)
        where.append((pi, chars, nbytes, size))
        texts.append(text)
        chars += len(text)
        nbytes += size
    return CandidateText("".join(texts), tuple(where))


def position_id(ci: int, i: int) -> str:
    """The id of grounding chunk `i` of candidate number `ci` whose URI does not name it alone
    (or that does not exist)."""
    return f"groundingChunks[{i}]" if ci == 0 else f"candidates[{ci}].groundingChunks[{i}]"


def candidate_number(candidate: object, position: int) -> int:
    """A candidate's `index`, or its position in `candidates` when it has none; any other
    value than an integer 0–63 is refused, as the stream refuses it (`false` is no 0)."""
    if not isinstance(candidate, Mapping) or "index" not in candidate:
        return position
    index = candidate["index"]
    if not is_index(index) or index >= 64:
        raise ProtocolError("gemini: a candidate index is out of range")
    return index


def candidate_numbers(candidates: Sequence[Any]) -> list[int]:
    """Each candidate's number (`candidate_number`). Two candidates of one number would share
    their positional chunk ids (and a stream merges them): the answer is ambiguous
    (ProtocolError)."""
    out = [candidate_number(c, pos) for pos, c in enumerate(candidates)]
    if len(out) > 1 and len(set(out)) != len(out):
        raise ProtocolError("gemini: two candidates have the same index")
    return out


def _chunks(candidate: object) -> list[Any]:
    gm = candidate.get("groundingMetadata") if type(candidate) is dict else None
    chunks = gm.get("groundingChunks") if type(gm) is dict else None
    return chunks if type(chunks) is list else []


def _chunk_uri(chunk: object) -> str | None:
    # JSON bodies: exact dict checks, cheaper than Mapping's on every chunk of every answer.
    if type(chunk) is dict:
        for kind in ("retrievedContext", "web"):
            src = chunk.get(kind)
            if type(src) is dict and is_uri(uri := src.get("uri")):
                return str(uri)
    return None


def chunk_text(chunk: object) -> str | None:
    """A grounding chunk's text: a `retrievedContext` chunk's `text` (a `web` chunk has none)."""
    rc = chunk.get("retrievedContext") if type(chunk) is dict else None
    text = rc.get("text") if type(rc) is dict else None
    return text if type(text) is str else None


def grounding_ids(candidates: Sequence[Any]) -> list[list[str]]:
    """The id of each grounding chunk of each candidate (by position in `candidates`).

    A chunk's id is its `retrievedContext` / `web` uri when every grounding chunk of the answer
    with that uri has the same text (so a request's chunk tag of that id can be cited), else
    its position (`position_id`, by candidate number): several chunks of one file (Vertex AI
    Search, RAG Engine) share the file's uri, and each support must be checked against the
    chunk it names, not the first chunk of that uri in the context.
    """
    numbers = candidate_numbers(candidates)
    uris: list[list[str | None]] = []
    first: dict[str, object] = {}  # uri -> its first chunk (texts compared on a repeat only)
    shared: set[str] = set()
    for cand in candidates:
        cand_uris: list[str | None] = []
        for chunk in _chunks(cand):
            uri = _chunk_uri(chunk)
            cand_uris.append(uri)
            if uri is None or uri in shared:
                continue
            seen = first.setdefault(uri, chunk)
            if seen is not chunk and chunk_text(seen) != chunk_text(chunk):
                shared.add(uri)
        uris.append(cand_uris)
    return [
        [
            uri if uri is not None and uri not in shared else position_id(number, i)
            for i, uri in enumerate(cand_uris)
        ]
        for number, cand_uris in zip(numbers, uris, strict=True)
    ]


def _int(value: object, default: int | None = None) -> int | None:
    if value is None:
        return default
    return value if type(value) is int else None


def locate_supports(
    candidate: Mapping[str, Any], ct: CandidateText
) -> list[tuple[int, int, bool] | None]:
    """Per `groundingSupports[]` entry: the (start, end) str span of the answer text its
    segment locates and whether `segment.text` (when given) equals that slice; None for an
    entry without a segment. An offset outside its text, inside a character's UTF-8 encoding,
    or a `partIndex` that names no answer text part makes the answer ambiguous
    (ProtocolError)."""
    gm = candidate.get("groundingMetadata")
    supports = gm.get("groundingSupports") if isinstance(gm, Mapping) else None
    out: list[tuple[int, int, bool] | None] = []
    total = byte_len(ct.text)
    for support in supports if isinstance(supports, list) else []:
        seg = support.get("segment") if isinstance(support, Mapping) else None
        if not isinstance(seg, Mapping):
            out.append(None)
            continue
        start, end = _int(seg.get("startIndex"), 0), _int(seg.get("endIndex"), 0)
        part = seg.get("partIndex")
        base, limit = 0, total
        if part is not None:
            found = next((p for p in ct.parts if p[0] == part), None)
            if found is None:
                raise ProtocolError("gemini: a grounding segment's partIndex names no text part")
            base, limit = found[2], found[3]
        if start is None or end is None or not 0 <= start <= end <= limit:
            raise ProtocolError("gemini: a grounding segment lies outside its text")
        s, e = to_chars(ct.text, base + start), to_chars(ct.text, base + end)
        if s is None or e is None:
            raise ProtocolError("gemini: a grounding segment splits a character")
        given = seg.get("text")
        out.append((s, e, given is None or given == ct.text[s:e]))
    return out


def support_citations(
    candidate: Mapping[str, Any], ct: CandidateText, ids: Sequence[str], number: int
) -> list[list[tuple[int, int, Citation]]]:
    """Per `groundingSupports[]` entry, the citations it makes (a malformed one when its
    segment text is no slice of the answer; none for an entry without a segment): the content
    channel's `native` is their concatenation, in this order, so a renderer can tell which
    support made which citation. `ids`: the candidate's chunk ids (`grounding_ids`)."""
    gm = candidate.get("groundingMetadata")
    supports = gm.get("groundingSupports") if isinstance(gm, Mapping) else None
    if not isinstance(supports, list):
        return []
    out: list[list[tuple[int, int, Citation]]] = []
    for support, where in zip(supports, locate_supports(candidate, ct), strict=True):
        spans: list[tuple[int, int, Citation]] = []
        out.append(spans)
        if where is None:
            continue
        s, e, same = where
        if not same:
            spans.append((s, e, Citation(id="", raw="", malformed=SEGMENT_MISMATCH)))
            continue
        for j in support.get("groundingChunkIndices") or []:
            # An index past the chunks names an id no chunk has: a hallucinated citation.
            cid = ids[j] if 0 <= j < len(ids) else position_id(number, j)
            spans.append((s, e, Citation(id=cid, raw=cid)))
    return out


def _usage(body: Mapping[str, object]) -> dict[str, int]:
    u = body.get("usageMetadata")
    if not isinstance(u, Mapping):
        return {}
    out: dict[str, int] = {}
    names = (
        ("promptTokenCount", "input"),
        ("candidatesTokenCount", "output"),
        ("totalTokenCount", "total"),
    )
    for src, dst in names:
        v = u.get(src)
        if type(v) is int:
            out[dst] = v
    return out


def parse_body(body: Mapping[str, object]) -> Answer:
    if not isinstance(body, Mapping):
        raise ProtocolError("gemini: response body is not a JSON object")
    if "error" in body:
        raise ProtocolError("gemini: the body is an error envelope")
    candidates = body.get("candidates")
    if candidates is not None and not isinstance(candidates, list):
        raise ProtocolError("gemini: candidates is not a list")
    log = FieldLog()
    kept: Json = clean(BODY_TABLE, dict(body), log)  # type: ignore[assignment]
    answer = Answer(protocol=NAME, body=kept, usage=_usage(kept))
    answer.unknown_fields.extend(path for _, path in log.unknown)
    answer.dropped.extend(log.dropped)
    # The field table drops a candidate or grounding chunk that is no object, which would
    # shift the positions chunk ids and `groundingChunkIndices` count: refused instead.
    for pos, cand in enumerate(candidates or []):
        if not isinstance(cand, Mapping):
            raise ProtocolError("gemini: a candidate is not an object")
        candidate_number(cand, pos)  # an index the table would drop is refused, as streamed
        if not all(isinstance(chunk, Mapping) for chunk in _chunks(cand)):
            raise ProtocolError("gemini: a grounding chunk is not an object")
    kept_candidates = candidate_list(kept)
    ids = grounding_ids(kept_candidates)  # refuses candidates of one number
    numbers = [candidate_number(c, pos) for pos, c in enumerate(kept_candidates)]
    for ci, cand in enumerate(kept_candidates):
        _candidate_channels(answer, ci, cand, ids[ci], numbers[ci])
    return answer


def _candidate_channels(
    answer: Answer, ci: int, cand: Mapping[str, Any], ids: Sequence[str], number: int
) -> None:
    ct = answer_text(cand)
    native = [c for group in support_citations(cand, ct, ids, number) for c in group]
    if ct.parts or native:
        path: tuple[str | int, ...] = ("candidates", ci, "text")
        answer.channels.append(Channel("content", path, ct.text, choice=ci, native=tuple(native)))
    for pi, part in enumerate(_parts(cand)):
        if not isinstance(part, Mapping):
            raise ProtocolError("gemini: a content part is not an object")
        call = part.get("functionCall")
        if call is not None and "text" in part:
            raise ProtocolError("gemini: a part holds both text and a function call")
        if isinstance(call, Mapping):
            args = call.get("args")
            if args is not None and not isinstance(args, Mapping):
                raise ProtocolError("gemini: functionCall args is not an object")
            text = json.dumps(args or {}, ensure_ascii=False)
            path = ("candidates", ci, "content", "parts", pi, "functionCall", "args")
            answer.channels.append(Channel("tool_arguments", path, text, choice=ci))
        elif is_thought(part) and isinstance(part.get("text"), str):
            path = ("candidates", ci, "thought", pi)
            answer.channels.append(Channel("reasoning", path, str(part["text"]), choice=ci))


def candidate_list(body: Mapping[str, Any]) -> Sequence[Any]:
    c = body.get("candidates")
    return c if isinstance(c, list) else []

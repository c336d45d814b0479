"""Citation markers in answer text: find every citation-shaped marker and apply the shape rule.

A `CitationParser` is compiled once per policy; `find` is pure and linear in the text scanned.

What counts as citation-shaped (a marker never spans a line):

* ``doc-chunk`` — a ``[...]`` group (no nested brackets, no newline) that is not a markdown
  link or image (``[text](url)``) and whose content has a colon either touching non-space text
  on both sides (``[a:1]``, ``[my doc:1]``) or at an edge of the group or of a comma-separated
  part (``[:1]``, ``[a:]``, ``[a:1, :2]``), and is not a URL (``[https://x]``). Prose such as
  ``[Note: see above]`` (colon followed by a space), ``[see above]``, ``[1/2]`` or ``[x]`` is
  not a citation. One id-like token on each side of a colon with spaces beside it
  (``[hr :leave]``, ``[doc: 3]``) is citation-shaped — and malformed — when it has a digit or
  no capital letter, so ``[Warning: deprecated]`` stays prose. Several ids are written
  ``[a:1, b:2]`` (one Citation per part, ``raw`` is the part) or ``[a:1][b:2]``;
  ``[DOC:CHUNK@V]`` carries version ``V``.
* ``numeric`` — ``[N]`` / ``[N, M]``: a group of digits, commas and spaces (forbidden characters
  make it malformed rather than invisible). The id is the digits.
* ``footnote`` — ``[^N]``; the id is ``N``.
* ``regex`` — every match of the policy pattern (named group ``id``, optional ``version``).

The shape rule (``Citation.malformed`` says which part failed): an empty half or empty id, a
colon or whitespace inside a half, an empty version, and any control, zero-width (U+200B-U+200D,
U+2060, U+FEFF) or bidi (U+200E/F, U+061C, U+202A-U+202E, U+2066-U+2069) character. Ids are
kept as exact code points; nothing is normalised, so a homoglyph id never matches a chunk.
"""

from __future__ import annotations

import re

from gateway import policy
from gateway.types import Citation

__all__ = ["BRACKET", "CitationParser", "Marker", "forbidden_char"]

# A marker as found in text: its span and the citations it carries (one per id).
Marker = tuple[int, int, tuple[Citation, ...]]

_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u00ad\u180e")
_BIDI = frozenset("\u200e\u200f\u061c\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")

# A bracket group, with the `(` that makes it a markdown link; a `!` before it makes an image.
BRACKET = re.compile(r"!?\[([^\[\]\n]*)\](\()?")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# A colon touching non-space on both sides, or at the edge of the group / of a part.
_COLON_SHAPE = re.compile(r"(?:^|,)\s*:|:\s*(?:,|$)|\S:\S")
# One id-like token on each side of a colon with spaces next to it: `[hr :leave]`, `[doc: 3]`.
# Citation-shaped (and then malformed: whitespace inside a half) when it carries a digit or is
# all lower-case, so prose such as `[Warning: deprecated]` stays prose. Any whitespace counts
# beside the colon (NBSP, tab, ideographic space), not only a space: `[kb:\u00a0x]` is
# malformed as `[kb: x]` is, never prose that would let a bogus citation be shown.
_SPACED_PART = re.compile(r"\s*[^\s:,\[\]]+\s*:\s*[^\s:,\[\]]+\s*")
# One well-formed id with an optional version: word characters, dots and hyphens only (no
# space, colon, comma, `@` or forbidden character inside a half), so the shape rule passes.
_PLAIN_DOC_CHUNK = re.compile(r"([\w.\-]+):([\w.\-]+)(?:@([\w.\-]+))?")
_NUMERIC_BODY = re.compile(r"^[\d,\s\u200b-\u200f\u2060\ufeff\u061c\u202a-\u202e\u2066-\u2069]+$")
_HAS_DIGIT = re.compile(r"\d")
# C0/C1 controls except tab and newline (those are whitespace), zero-width and bidi marks.
_FORBIDDEN = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u180e\u200b-\u200f\u2060-\u2064\ufeff"
    r"\u061c\u202a-\u202e\u2066-\u2069]"
)
_SPACE = re.compile(r"\s")


def forbidden_char(s: str) -> str | None:
    """Why `s` holds a forbidden character (control, zero-width or bidi), or None."""
    m = _FORBIDDEN.search(s)
    if m is None:
        return None
    ch = m.group()
    if ch in _ZERO_WIDTH:
        kind = "zero-width"
    elif ch in _BIDI:
        kind = "bidi"
    else:
        kind = "control"
    return f"{kind} character U+{ord(ch):04X}"


def _doc_chunk_part(part: str, start: int, end: int) -> Citation:
    """One ``DOC:CHUNK[@V]`` part of a doc-chunk group, with the shape rule applied."""
    bad = forbidden_char(part)
    doc, colon, rest = part.partition(":")
    chunk, at, version = rest.partition("@")
    cid = f"{doc}:{chunk}" if colon else part
    ver = version if at else None
    if bad is None:
        if not colon:
            bad = "no colon between document and chunk"
        elif not doc or not chunk:
            bad = "empty half"
        elif ":" in chunk:
            bad = "colon inside a half"
        elif _SPACE.search(doc) or _SPACE.search(chunk):
            bad = "whitespace inside a half"
        elif at and not version:
            bad = "empty version"
        elif at and (_SPACE.search(version) or ":" in version or "@" in version):
            bad = "bad version"
    return Citation(id=cid, raw=part, start=start, end=end, version=ver, malformed=bad)


def _split_parts(body: str, offset: int) -> list[tuple[str, int, int]]:
    """Comma-separated parts of a group body, stripped of surrounding spaces, absolute spans."""
    parts: list[tuple[str, int, int]] = []
    pos = 0
    for piece in body.split(","):
        lead = len(piece) - len(piece.lstrip(" "))
        text = piece.strip(" ")
        s = offset + pos + lead
        parts.append((text, s, s + len(text)))
        pos += len(piece) + 1
    return parts


def _spaced_id(body: str) -> bool:
    if not (_HAS_DIGIT.search(body) or body == body.lower()):
        return False
    return all(_SPACED_PART.fullmatch(part) for part in body.split(","))


class CitationParser:
    """Finds citation markers of one policy's `citations.format`; compiled once."""

    __slots__ = ("_format", "_regex")

    def __init__(self, spec: policy.Citations) -> None:
        self._format = spec.format
        self._regex: re.Pattern[str] | None = None
        if spec.format == "regex":
            # Compiled (and its `id` group checked) once, when the policy was validated.
            rx = spec.regex
            if rx is None:
                raise ValueError("citations.format 'regex' needs citations.pattern")
            if "id" not in rx.groupindex:
                raise ValueError("citations.pattern needs a named group 'id'")
            self._regex = rx

    @property
    def format(self) -> str:
        return self._format

    def find(
        self, text: str, start: int = 0, end: int | None = None, *, base: int = 0
    ) -> list[Citation]:
        """Every citation in text[start:end]; offsets are absolute in `text` plus `base`."""
        return [c for _, _, cits in self.markers(text, start, end, base=base) for c in cits]

    def markers(
        self, text: str, start: int = 0, end: int | None = None, *, base: int = 0
    ) -> list[Marker]:
        """Citation markers in text[start:end] as (start, end, citations), in text order."""
        stop = len(text) if end is None else end
        if self._regex is not None:
            return self._find_regex(text, start, stop, base)
        out: list[Marker] = []
        for m in BRACKET.finditer(text, start, stop):
            if m.group(2) is not None or m.group().startswith("!"):
                continue  # markdown link or image
            cits = self.bracket(m.group(1), m.start(1) + base)
            if cits:
                out.append((m.start() + base, m.end() + base, cits))
        return out

    def bracket(self, body: str, offset: int) -> tuple[Citation, ...]:
        """The citations of one bracket group's body at `offset` (none when it is prose)."""
        fmt = self._format
        if fmt == "doc-chunk":
            plain = _PLAIN_DOC_CHUNK.fullmatch(body)
            if plain is not None:  # the usual `[doc:chunk]`: well formed, nothing to strip
                doc, chunk, version = plain.groups()
                cid = body if version is None else f"{doc}:{chunk}"
                return (Citation(cid, body, offset, offset + len(body), version),)
            shaped = ":" in body and not _URL.match(body) and (
                _COLON_SHAPE.search(body) or _spaced_id(body)
            )
            if not shaped and not (":" in body and forbidden_char(body)):
                return ()
            return tuple(_doc_chunk_part(p, s, e) for p, s, e in _split_parts(body, offset))
        if fmt == "numeric":
            if not _NUMERIC_BODY.match(body) or not _HAS_DIGIT.search(body):
                return ()
            cits = []
            for p, s, e in _split_parts(body, offset):
                bad = forbidden_char(p)
                if bad is None and not p:
                    bad = "empty id"
                elif bad is None and not p.isdigit():
                    bad = "whitespace inside an id"
                cits.append(Citation(id=p, raw=p, start=s, end=e, malformed=bad))
            return tuple(cits)
        # footnote
        if not body.startswith("^"):
            return ()
        cid = body[1:]
        bad = forbidden_char(cid)
        if bad is None and not cid:
            bad = "empty id"
        elif bad is None and (_SPACE.search(cid) or ":" in cid):
            bad = "whitespace or colon inside an id"
        return (Citation(id=cid, raw=body, start=offset, end=offset + len(body), malformed=bad),)

    def _find_regex(self, text: str, start: int, stop: int, base: int) -> list[Marker]:
        assert self._regex is not None
        out: list[Marker] = []
        has_version = "version" in self._regex.groupindex
        for m in self._regex.finditer(text, start, stop):
            if m.end() == m.start():
                continue
            cid = m.group("id") or ""
            version = m.group("version") if has_version else None
            bad = forbidden_char(m.group())
            if bad is None and not cid:
                bad = "empty id"
            elif bad is None and version == "":
                bad = "empty version"
            cit = Citation(id=cid, raw=m.group(), start=m.start() + base, end=m.end() + base,
                           version=version, malformed=bad)
            out.append((m.start() + base, m.end() + base, (cit,)))
        return out

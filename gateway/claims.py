"""Claim segmentation: split answer text into sentences and list items, incrementally.

`ClaimSegmenter` is sans-io (`feed(delta) -> segments`, `finish() -> segments`) and linear in
input size: it decides at line granularity, each line is scanned once, and only the text of the
claim still open is held.

Rules:

* A claim is a sentence or a list item (``-``, ``*``, ``+``, ``1.``, ``1)``); the list marker is
  not part of the claim. Headings (``#``) and fenced code blocks (``` / ~~~) are not claims;
  they, thematic breaks (``---``), blank lines and list items end the claim before them. A
  single newline inside a paragraph does not.
* A sentence ends at ``.``, ``!``, ``?`` or ``…`` (plus closing quotes / parentheses) followed
  by whitespace, unless the next text starts with a lowercase letter or the word before a single
  ``.`` is an abbreviation (``e.g.``, ``Dr.``, ``Sec.``), an initial (``J.``) or dotted initials
  (``U.S.``). A ``.`` not followed by whitespace (``3.1``, ``v2.1.3``) never ends one.
* Citation markers after the terminator (``Foo is 3. [a:1]``), up to the next non-space,
  non-citation text, belong to the sentence; so in a stream a claim is final only once that
  text begins, or at `finish()`.
* A segment without a letter or digit outside its citation markers (``---``, a lone ``[a:1]``)
  is not a claim. A claim matching a policy exempt pattern (searched in its text) is exempt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.citations import CitationParser, Marker
from gateway.types import Citation

__all__ = ["ClaimSegmenter", "Segment", "segment"]


@dataclass(frozen=True, slots=True)
class Segment:
    """One claim: `text == source[start:end]`, trailing citation markers included."""

    start: int
    end: int
    text: str
    citations: tuple[Citation, ...]
    exempt: bool = False


_FENCE = re.compile(r"[ ]{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"[ ]{0,3}#{1,6}(?:[ \t]|$)")
_LIST = re.compile(r"[ \t]*(?:[-*+]|\d{1,9}[.)])(?:[ \t]+|$)")
_BLANK = re.compile(r"[ \t\r\f\v]*$")
_RULE = re.compile(r"[ ]{0,3}(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,}|=+[ \t]*)$")
_TERMINATOR = re.compile(r"(?:[.!?]+|…)[\"'”’)»*_]*(?=\s|$)")
_NONSPACE = re.compile(r"\S")
_WORD = re.compile(r"[^\W_]")
_DOTTED_INITIALS = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$|^[A-Z]$")
_LEADING_PUNCT = "(\"'“‘[*_"

# Lowercased words that a single "." after them does not end a sentence.
_ABBREVIATIONS_WORDS = """
    e.g i.e etc cf vs al approx ca dr mr mrs ms prof sr jr st mt sec secs fig figs eq eqs
    no nos vol vols pp p ch chap art ref refs dept est inc ltd co corp jan feb mar apr jun
    jul aug sep sept oct nov dec mon tue wed thu fri sat sun min max avg gen col lt sgt
    rev ed eds op viz approx incl excl resp
    """
ABBREVIATIONS = frozenset(_ABBREVIATIONS_WORDS.split())

_IN, _AFTER = 0, 1  # open-claim states: inside the sentence / after its terminator


class ClaimSegmenter:
    """Incremental claim segmentation of one channel's text (offsets from its first byte)."""

    __slots__ = (
        "_base",
        "_cits",
        "_end",
        "_exempt",
        "_fence",
        "_held",
        "_line_start",
        "_parser",
        "_start",
        "_state",
        "_tail",
    )

    def __init__(self, parser: CitationParser, exempt: Sequence[str | re.Pattern[str]] = ()):
        self._parser = parser
        self._exempt = [re.compile(p) if isinstance(p, str) else p for p in exempt]
        self._tail: list[str] = []  # pieces of the incomplete current line
        self._line_start = 0  # absolute offset of the current line
        self._held = ""  # complete lines from `_base` that hold the open claim
        self._base = 0
        self._fence: str | None = None  # the opening fence while inside a code block
        self._start = -1  # open claim start, -1 when none
        self._end = -1  # open claim end (exclusive), trailing markers included
        self._cits: list[Citation] = []
        self._state = _IN

    def feed(self, delta: str) -> list[Segment]:
        """Take more text; return the claims whose end is now certain."""
        out: list[Segment] = []
        nl = delta.find("\n")
        if nl < 0:
            if delta:
                self._tail.append(delta)
            return out
        pos = 0
        while nl >= 0:
            self._tail.append(delta[pos : nl + 1])
            self._line("".join(self._tail), out)
            self._tail.clear()
            pos = nl + 1
            nl = delta.find("\n", pos)
        if pos < len(delta):
            self._tail.append(delta[pos:])
        return out

    def finish(self) -> list[Segment]:
        """End of text: return every remaining claim."""
        out: list[Segment] = []
        if self._tail:
            self._line("".join(self._tail), out)
            self._tail.clear()
        self._close(out)
        return out

    # -- one complete line -------------------------------------------------------------------

    def _line(self, line: str, out: list[Segment]) -> None:
        off = self._line_start
        self._line_start = off + len(line)
        if self._start >= 0:
            self._held += line
        else:
            self._held, self._base = line, off
        self._scan(line, off, out)
        if self._start < 0:
            self._held, self._base = "", self._line_start
        elif self._start > self._base:
            self._held = self._held[self._start - self._base :]
            self._base = self._start

    def _scan(self, line: str, off: int, out: list[Segment]) -> None:
        body = line.rstrip("\n").rstrip("\r")
        if self._fence is not None:
            m = _FENCE.match(body)
            if (
                m
                and m.group(1)[0] == self._fence[0]
                and len(m.group(1)) >= len(self._fence)
                and _BLANK.match(body, m.end())
            ):
                self._fence = None
            return
        if _BLANK.match(body):
            self._close(out)
            return
        m = _FENCE.match(body)
        if m:
            self._close(out)
            self._fence = m.group(1)
            return
        if _HEADING.match(body) or _RULE.match(body):
            self._close(out)
            return
        pos = 0
        m = _LIST.match(body)
        if m:
            self._close(out)
            pos = m.end()
        self._sentences(body, pos, off, out)

    def _sentences(self, body: str, pos: int, off: int, out: list[Segment]) -> None:
        """Walk markers, terminators and words of one line from `pos` (line-relative)."""
        n = len(body)
        markers: list[Marker] = self._parser.markers(body, pos, n)
        mi = 0
        terms = _TERMINATOR.finditer(body, pos)
        term = next(terms, None)
        while pos < n:
            ws = _NONSPACE.search(body, pos)
            if ws is None:
                return
            pos = ws.start()
            if mi < len(markers) and markers[mi][0] == pos:
                ms, me, cits = markers[mi]
                mi += 1
                if self._start < 0:
                    self._start = ms + off
                self._cits.extend(_shift(cits, off))
                self._end = me + off
                pos = me
                continue
            # Plain text: runs to the next marker or whitespace-followed terminator.
            while term is not None and term.start() < pos:
                term = next(terms, None)
            if self._state == _AFTER:
                if body[pos].islower():
                    self._state = _IN
                else:
                    self._close(out)
            if self._start < 0:
                self._start = pos + off
            stop = markers[mi][0] if mi < len(markers) else n
            if term is not None and term.start() < stop:
                self._end = term.end() + off
                if not self._abbreviation(body, pos, term):
                    self._state = _AFTER
                pos = term.end()
                term = next(terms, None)
                # Text after the terminator but still inside it (e.g. "?!") is skipped above.
                continue
            # No terminator before the next marker: the text up to it is all sentence.
            seg_end = stop
            j = seg_end
            while j > pos and body[j - 1].isspace():
                j -= 1
            self._end = j + off
            pos = stop

    @staticmethod
    def _abbreviation(body: str, pos: int, term: re.Match[str]) -> bool:
        if term.group() != ".":
            return False
        ts = term.start()
        ws = body.rfind(" ", pos, ts)
        tab = body.rfind("\t", pos, ts)
        word = body[max(ws, tab, pos - 1) + 1 : ts].lstrip(_LEADING_PUNCT)
        return word.lower() in ABBREVIATIONS or bool(_DOTTED_INITIALS.match(word))

    def _close(self, out: list[Segment]) -> None:
        if self._start >= 0:
            text = self._held[self._start - self._base : self._end - self._base]
            cits = tuple(self._cits)
            if _has_words(text, self._start, cits):
                exempt = any(p.search(text) for p in self._exempt)
                out.append(Segment(self._start, self._end, text, cits, exempt))
        self._start = self._end = -1
        self._cits = []
        self._state = _IN


def _shift(cits: tuple[Citation, ...], off: int) -> list[Citation]:
    if off == 0:
        return list(cits)
    return [
        Citation(c.id, c.raw, c.start + off, c.end + off, c.version, c.malformed, c.native)
        for c in cits
    ]


def _has_words(text: str, start: int, cits: tuple[Citation, ...]) -> bool:
    """Whether `text` has a letter or digit outside its citation markers."""
    if not cits:
        return _WORD.search(text) is not None
    pos = 0
    for c in cits:
        s = c.start - start
        if s > pos and _WORD.search(text, pos, s):
            return True
        pos = max(pos, c.end - start)
    return _WORD.search(text, pos) is not None


def segment(
    text: str, parser: CitationParser, exempt: Sequence[str | re.Pattern[str]] = ()
) -> list[Segment]:
    """Segment a whole text: the same claims as feeding it in any pieces."""
    seg = ClaimSegmenter(parser, exempt)
    return seg.feed(text) + seg.finish()

"""Claim segmentation: split answer text into sentences and list items, incrementally.

`ClaimSegmenter` is sans-io (`feed(delta) -> segments`, `finish() -> segments`) and linear in
input size: one cursor walks the text once, and only a bounded window is held (the word being
written, an unfinished marker or terminator, and the open claim's text).

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
  non-citation text, belong to the sentence.
* A segment without a letter or digit outside its citation markers (``---``, a lone ``[a:1]``)
  is not a claim. A claim matching a policy exempt pattern (searched in its text) is exempt.

When a claim is emitted: as soon as its end is certain, which never depends on how the text
was split. Inside a line that is the first character of the next sentence that is neither
whitespace nor the start of a citation marker (so ``Foo. [a:1] Bar`` waits for ``B``, and a
terminator at the end of the text seen so far waits for the character after it). A line's kind
(text, list item, heading, rule, fence, blank) is known once it holds a character that none
of those markers uses — a letter, say — or once it ends; until then it is not walked. With the
``regex`` citation format a user pattern's matches cannot be bounded, so lines are decided
whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.citations import BRACKET, CitationParser, Marker
from gateway.types import Citation, _quick_init

__all__ = ["ClaimSegmenter", "Segment", "segment"]


@_quick_init
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
# `[.!?]+` or `…`, written to start with a character set so that searching is fast.
_TERMINATOR = re.compile(r"[.!?…](?:(?<=[.!?])[.!?]*)?[\"'”’)»*_]*(?=\s|$)")
_TERMINATOR_CHARS = frozenset(".!?…\"'”’)»*_")
_NONSPACE = re.compile(r"\S")
_WORD = re.compile(r"[^\W_]")
_DOTTED_INITIALS = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$|^[A-Z]$")
_LEADING_PUNCT = "(\"'“‘[*_"
# A character that none of the line-start patterns above can consume: once a partial line
# holds one, its kind is the same whatever follows.
_DECIDER = re.compile(r"[^\s\d#`~*+_=.)\-]")

# What new text can let a sleeping segmenter decide more (anything, when no pattern is set).
_WAKE_LINE = re.compile(r"\n")
_WAKE_KIND = re.compile(r"[^\s\d#`~*+_=.)\-]|\n")
_WAKE_RUN = re.compile(r"[\s\[\]]")  # a terminator needs whitespace after it; a marker its ]
# In a run with no terminator character at its end, whitespace decides nothing: only a
# terminator, a bracket or the line's end can.
_WAKE_TERM = re.compile(r"[.!?…\[\]\n]")
_WAKE_BRACKET = re.compile(r"[\[\]\n]")
_BRACKET_CHARS = re.compile(r"[\[\]]")

# Lowercased words that a single "." after them does not end a sentence.
_ABBREVIATIONS_WORDS = """
    e.g i.e etc cf vs al approx ca dr mr mrs ms prof sr jr st mt sec secs fig figs eq eqs
    no nos vol vols pp p ch chap art ref refs dept est inc ltd co corp jan feb mar apr jun
    jul aug sep sept oct nov dec mon tue wed thu fri sat sun min max avg gen col lt sgt
    rev ed eds op viz approx incl excl resp
    """
ABBREVIATIONS = frozenset(_ABBREVIATIONS_WORDS.split())

_IN, _AFTER = 0, 1  # open-claim states: inside the sentence / after its terminator
_UNDECIDED, _TEXT, _SKIP, _CODE = 0, 1, 2, 3  # kinds of the current line


class ClaimSegmenter:
    """Incremental claim segmentation of one channel's text (offsets from its first byte)."""

    __slots__ = (
        "_bb",
        "_buf",
        "_cits",
        "_end",
        "_exempt",
        "_fence",
        "_kind",
        "_ls",
        "_marker",
        "_mscan",
        "_mwait",
        "_nl",
        "_parser",
        "_parts",
        "_pend",
        "_pos",
        "_regex",
        "_rlast",
        "_run",
        "_start",
        "_state",
        "_tscan",
        "_wake",
    )

    def __init__(self, parser: CitationParser, exempt: Sequence[str | re.Pattern[str]] = ()):
        self._parser = parser
        self._regex = parser.format == "regex"
        self._exempt = [re.compile(p) if isinstance(p, str) else p for p in exempt]
        self._buf = ""  # text from absolute offset `_bb` on that may still be read
        self._bb = 0
        self._pend: list[str] = []  # received but not yet appended to `_buf`
        self._wake: re.Pattern[str] | None = None  # asleep until new text matches this
        self._ls = 0  # start of the current line
        self._nl = 0  # the current line's newline is searched from here
        self._kind = _UNDECIDED
        self._fence: str | None = None  # the opening fence while inside a code block
        # The walk over a text line: the cursor, the plain-text run it is in (-1 between
        # runs), where the next terminator and the next citation marker are searched from,
        # that marker once known, and what could decide a marker that is not yet certain.
        self._pos = 0
        self._run = -1
        self._rlast = -1  # end of the run's last non-space character already dropped
        self._tscan = 0
        self._mscan = 0
        self._marker: Marker | None = None
        self._mwait: re.Pattern[str] | None = None
        # The open claim: start (-1 when none), end (trailing markers included), citations,
        # state, and its text before `_bb`.
        self._start = -1
        self._end = -1
        self._cits: list[Citation] = []
        self._state = _IN
        self._parts: list[str] = []

    def feed(self, delta: str) -> list[Segment]:
        """Take more text; return the claims whose end is now certain."""
        out: list[Segment] = []
        if delta:
            self._pend.append(delta)
            if self._wake is None or self._wake.search(delta) is not None:
                self._advance(False, out)
        return out

    def finish(self) -> list[Segment]:
        """End of text: return every remaining claim."""
        out: list[Segment] = []
        self._advance(True, out)
        self._close(out)
        return out

    def whole(self, text: str) -> list[Segment]:
        """Segment a whole text in one call: exactly `feed(text) + finish()` on a fresh
        segmenter of this parser and exempt patterns, but several times cheaper.

        Every line is complete, so nothing waits for more text and each line is walked once
        by `_whole_lines`. This segmenter's own incremental state is neither read nor changed:
        one segmenter can segment any number of whole texts, before or between its deltas.
        """
        if self._regex:  # user patterns are matched per line by the incremental walk
            seg = ClaimSegmenter(self._parser, self._exempt)
            return seg.feed(text) + seg.finish()
        return _whole_lines(text, self._parser, self._exempt)

    # -- lines -------------------------------------------------------------------------------

    def _advance(self, final: bool, out: list[Segment]) -> None:
        pend = self._pend
        new = pend[0] if len(pend) == 1 else "".join(pend)
        pend.clear()
        buf = self._buf = self._buf + new if self._buf else new
        bb = self._bb
        total = bb + len(buf)
        while True:
            nl = buf.find("\n", self._nl - bb)
            end = nl + bb if nl >= 0 else total
            self._nl = end
            self._line(end, nl >= 0 or final, out)
            if nl < 0:
                break
            self._ls = self._nl = end + 1
            self._kind = _UNDECIDED
        self._trim()

    def _line(self, end: int, complete: bool, out: list[Segment]) -> None:
        """Walk the current line as far as the text up to `end` decides it."""
        self._wake = None
        if complete:  # the line's body ends before "\r\n"
            buf, lo = self._buf, max(self._ls, self._bb) - self._bb
            e = end - self._bb
            while e > lo and buf[e - 1] == "\r":
                e -= 1
            end = e + self._bb
        if self._kind == _UNDECIDED:
            if self._fence is not None:
                self._kind = _CODE
            elif complete or _DECIDER.search(self._buf, self._ls - self._bb, end - self._bb):
                self._classify(end, out)
            else:
                self._wake = _WAKE_KIND
                return
        kind = self._kind
        if kind == _TEXT:
            if not self._regex:
                self._walk(end, complete, out)
            elif complete:
                self._walk_line(end, out)
            else:
                self._wake = _WAKE_LINE
        elif not complete:
            self._wake = _WAKE_LINE
        elif kind == _CODE:
            buf, s, e = self._buf, self._ls - self._bb, end - self._bb
            m = _FENCE.match(buf, s, e)
            fence = self._fence
            if (
                m
                and fence is not None
                and m.group(1)[0] == fence[0]
                and len(m.group(1)) >= len(fence)
                and _BLANK.match(buf, m.end(), e)
            ):
                self._fence = None

    def _classify(self, end: int, out: list[Segment]) -> None:
        buf, s, e = self._buf, self._ls - self._bb, end - self._bb
        self._kind = _SKIP
        if _BLANK.match(buf, s, e):
            self._close(out)
            return
        m = _FENCE.match(buf, s, e)
        if m:
            self._close(out)
            self._fence = m.group(1)
            return
        if _HEADING.match(buf, s, e) or _RULE.match(buf, s, e):
            self._close(out)
            return
        pos = self._ls
        m = _LIST.match(buf, s, e)
        if m:
            self._close(out)
            pos = m.end() + self._bb
        self._kind = _TEXT
        self._pos = self._tscan = self._mscan = pos
        self._run = -1
        self._marker = self._mwait = None

    # -- the walk over a text line -----------------------------------------------------------

    def _walk(self, end: int, complete: bool, out: list[Segment]) -> None:
        """Markers, terminators and plain-text runs from the cursor, while they are certain."""
        buf, bb = self._buf, self._bb
        pos = self._pos
        while True:
            run = self._run
            if run < 0:
                m = _NONSPACE.search(buf, pos - bb, end - bb)
                if m is None:
                    pos = end
                    break
                p = m.start() + bb
                lim = self._scan_markers(end, complete)
                marker = self._marker
                # An undecided group at `p` may be a marker, more text will tell; one that
                # starts with "!" is an image or text, so plain text starts here either way.
                if lim == p and marker is None and buf[p - bb] == "[":
                    pos = p
                    self._wake = self._mwait
                    break
                if lim == p and marker is not None:
                    ms, me, cits = marker
                    if self._start < 0:
                        self._start = ms
                    self._cits.extend(cits)
                    self._end = pos = self._mscan = me
                    self._marker = None
                    continue
                # Plain text: it starts the next sentence unless it continues this one.
                if self._state == _AFTER:
                    if buf[p - bb].islower():
                        self._state = _IN
                    else:
                        self._close(out)
                if self._start < 0:
                    self._start = p
                self._run = run = pos = p
                if self._tscan < p:
                    self._tscan = p
            # In a run: it ends at the first terminator or citation marker.
            lim = self._scan_markers(end, complete)
            t = _TERMINATOR.search(buf, self._tscan - bb, end - bb)
            if t is not None and t.start() + bb < lim:
                ts, te = t.start() + bb, t.end() + bb
                if te == end and not complete:  # it may grow, or not be followed by space
                    self._tscan = ts
                    break
                self._end = pos = self._tscan = te
                if not _abbreviation(buf, max(run - bb, 0), t):
                    self._state = _AFTER
                self._run = -1
                continue
            if t is not None:
                self._tscan = t.start() + bb
            else:
                # No terminator yet: only a run of terminator characters at the end can
                # still become one (searching again from here keeps the walk linear).
                j = end - bb
                lo = self._tscan - bb
                while j > lo and buf[j - 1] in _TERMINATOR_CHARS:
                    j -= 1
                self._tscan = j + bb
            if self._marker is not None or complete:
                self._end = self._trim_back(lim, run)
                self._run = -1
                pos = lim
                if lim == end:
                    break
                continue
            if self._mwait is not None:
                self._wake = self._mwait
            else:
                self._wake = _WAKE_RUN if self._tscan < end else _WAKE_TERM
            break
        self._pos = pos

    def _scan_markers(self, end: int, complete: bool) -> int:
        """Advance the citation-marker scan; return the offset before which none starts.

        At that offset is `_marker` when it is known; otherwise, if it is short of `end`, a
        bracket that more text will decide starts there (`_mwait` says what text)."""
        if self._marker is not None:
            return self._marker[0]
        self._mwait = None
        buf, bb = self._buf, self._bb
        i, e = self._mscan - bb, end - bb
        while True:
            k = buf.find("[", i, e)
            if k < 0:
                self._mscan = end
                return end
            st = k - 1 if k > 0 and buf[k - 1] == "!" else k
            b = BRACKET.match(buf, st, e)
            if b is None:
                if not complete and _BRACKET_CHARS.search(buf, k + 1, e) is None:
                    self._mwait = _WAKE_BRACKET  # still open: a "]" may close it
                    self._mscan = st + bb
                    return st + bb
                i = k + 1
                continue
            if b.end() == e and b.group(2) is None and not complete:
                self._mwait = _WAKE_ANY  # a "(" next would make it a link
                self._mscan = st + bb
                return st + bb
            i = b.end()
            if b.group(2) is not None or st != k:
                continue  # markdown link or image
            cits = self._parser.bracket(b.group(1), b.start(1) + bb)
            if cits:
                self._marker = (k + bb, i + bb, cits)
                self._mscan = k + bb
                return k + bb

    def _trim_back(self, stop: int, run: int) -> int:
        """`stop` moved back over whitespace, not past the run's start."""
        buf, bb = self._buf, self._bb
        lo = max(run, bb) - bb
        j = stop - bb
        while j > lo and buf[j - 1].isspace():
            j -= 1
        if j == lo and bb > run:
            return self._rlast
        return j + bb

    def _walk_line(self, end: int, out: list[Segment]) -> None:
        """A whole line at once, with markers found up front (the regex citation format)."""
        off = self._ls
        body = self._buf[off - self._bb : end - self._bb]
        pos = self._pos - off
        n = len(body)
        markers: list[Marker] = self._parser.markers(body, pos, n, base=off)
        mi = 0
        terms = _TERMINATOR.finditer(body, pos)
        term = next(terms, None)
        while pos < n:
            ws = _NONSPACE.search(body, pos)
            if ws is None:
                return
            pos = ws.start()
            if mi < len(markers) and markers[mi][0] == pos + off:
                ms, me, cits = markers[mi]
                mi += 1
                if self._start < 0:
                    self._start = ms
                self._cits.extend(cits)
                self._end = me
                pos = me - off
                continue
            while term is not None and term.start() < pos:
                term = next(terms, None)
            if self._state == _AFTER:
                if body[pos].islower():
                    self._state = _IN
                else:
                    self._close(out)
            if self._start < 0:
                self._start = pos + off
            stop = markers[mi][0] - off if mi < len(markers) else n
            if term is not None and term.start() < stop:
                self._end = term.end() + off
                if not _abbreviation(body, pos, term):
                    self._state = _AFTER
                pos = term.end()
                term = next(terms, None)
                continue
            j = stop
            while j > pos and body[j - 1].isspace():
                j -= 1
            self._end = j + off
            pos = stop

    # -- the window and the open claim -------------------------------------------------------

    def _trim(self) -> None:
        """Drop text no decision will read again; keep the open claim's part of it."""
        buf, bb = self._buf, self._bb
        run = self._run
        if self._kind != _TEXT or self._regex:
            keep = self._ls
        elif run < 0:
            keep = self._pos
        else:
            bound = self._tscan
            if self._marker is None and self._mwait is not None:
                bound = min(bound, self._mscan)
            lo = max(run, bb) - bb
            k = max(buf.rfind(" ", lo, bound - bb), buf.rfind("\t", lo, bound - bb))
            # Cut only after a space or tab inside the run: the word before a terminator
            # (for abbreviations) then reads the same.
            keep = k + 1 + bb if k >= 0 else lo + bb
        if keep <= bb:
            return
        # Nothing before `keep` is searched again.
        self._mscan = max(self._mscan, keep)
        self._tscan = max(self._tscan, keep)
        cut = keep - bb
        start = self._start
        if 0 <= start < keep:
            self._parts.append(buf[max(start - bb, 0) : cut])
        if 0 <= run < keep:
            lo = max(run - bb, 0)
            r = len(buf[lo:cut].rstrip())
            if r:
                self._rlast = lo + r + bb
        self._buf = buf[cut:]
        self._bb = keep

    def _close(self, out: list[Segment]) -> None:
        start = self._start
        if start >= 0:
            end, bb = self._end, self._bb
            if self._parts:
                head = "".join(self._parts)
                text = head[: end - start] if end <= bb else head + self._buf[: end - bb]
                self._parts = []
            else:
                text = self._buf[start - bb : end - bb]
            cits = tuple(self._cits)
            if _has_words(text, start, cits):
                exempt = any(p.search(text) for p in self._exempt)
                out.append(Segment(start, end, text, cits, exempt))
            self._start = self._end = -1
            self._cits = []
        self._state = _IN


_WAKE_ANY = re.compile(r"[\s\S]")


def _abbreviation(text: str, lo: int, term: re.Match[str]) -> bool:
    """Whether a "." terminator ends an abbreviation or initials (the word from `lo` on)."""
    return term.group() == "." and _abbreviated(text, lo, term.start())


def _abbreviated(text: str, lo: int, ts: int) -> bool:
    """Whether the word from `lo` on before the "." at `ts` is an abbreviation or initials."""
    ws = text.rfind(" ", lo, ts)
    tab = text.rfind("\t", lo, ts)
    word = text[max(ws, tab, lo - 1) + 1 : ts].lstrip(_LEADING_PUNCT)
    return word.lower() in ABBREVIATIONS or bool(_DOTTED_INITIALS.match(word))


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
    return ClaimSegmenter(parser, exempt).whole(text)


# -- whole texts ---------------------------------------------------------------------------------
#
# With every line complete, the walk above reduces to: per line, its kind from the same
# patterns as `_classify`, then for a text line the same events in the same order, each found
# once. Citation markers are the bracket groups `_scan_markers` accepts: a group never spans a
# line and whether it is a link or an image depends only on the characters around it, so
# `_markers` over the whole text finds the same ones (those on lines that are not walked are
# passed over). Terminators are `_TERMINATOR` matches: a match does not depend on
# where the search began, and the characters after a line's body ("\r", "\n") are whitespace
# as the end of the line is, so the next one is searched in the whole text, and again only once
# the walk has passed it. A run of plain text ends at the first terminator before the next
# marker, else at that marker or the line's end, trimmed of trailing whitespace.
# `tests/test_claims_fast.py` checks that the segments equal the incremental walk's for any
# split of the text.


def _whole_lines(
    text: str, parser: CitationParser, exempt: Sequence[re.Pattern[str]]
) -> list[Segment]:
    out: list[Segment] = []
    find = text.find
    nonspace = _NONSPACE.search
    terminator = _TERMINATOR.search
    n = len(text)
    markers = _markers(text, parser) if "[" in text else []
    nm = len(markers)
    mi = 0  # the next marker not yet passed
    # The open claim: start (-1 when none), end, citations, whether a run of it starts with a
    # letter or digit (then it has words), and whether it is after its terminator.
    start = end = -1
    cits: list[Citation] = []
    words = after = False
    fence: str | None = None
    ts = te = -1  # the next terminator (ts == n: none)
    ls = 0
    while True:
        nl = find("\n", ls)
        e = n if nl < 0 else nl
        while e > ls and text[e - 1] == "\r":
            e -= 1
        pos = ls  # where the walk of a text line starts; -1 for other lines
        if fence is not None:
            m = _FENCE.match(text, ls, e)
            if (
                m
                and m.group(1)[0] == fence[0]
                and len(m.group(1)) >= len(fence)
                and _BLANK.match(text, m.end(), e)
            ):
                fence = None
            pos = -1
        elif ls == e or not text[ls].isalpha():  # a letter first makes a plain text line
            # `_classify`; a line starting with a list bullet or an ASCII digit can only be
            # a rule or list item, or a list item.
            c = text[ls] if ls < e else ""
            pos = -1
            if c in _BULLETS:
                if _RULE.match(text, ls, e):
                    pass
                elif m := _LIST.match(text, ls, e):
                    pos = m.end()
                else:
                    pos = ls
            elif c in _ASCII_DIGITS:
                pos = m.end() if (m := _LIST.match(text, ls, e)) else ls
            elif _BLANK.match(text, ls, e):
                pass
            elif m := _FENCE.match(text, ls, e):
                fence = m.group(1)
            elif _HEADING.match(text, ls, e) or _RULE.match(text, ls, e):
                pass
            elif m := _LIST.match(text, ls, e):
                pos = m.end()
            else:
                pos = ls
            if pos != ls:  # not a paragraph line: the open claim ends before it
                if start >= 0:
                    _emit(out, text, start, end, cits, words, exempt)
                    start = -1
                    cits = []
                    words = False
                after = False
        if pos >= 0:
            while mi < nm and markers[mi][0] < pos:
                mi += 1
            ms, me, mc = _marker_before(markers, mi, e)
            while pos < e:
                # The next non-space character, most often right here or one space on.
                if not text[pos].isspace():
                    p = pos
                elif pos + 1 < e and not text[pos + 1].isspace():
                    p = pos + 1
                else:
                    sp = nonspace(text, pos, e)
                    if sp is None:
                        break
                    p = sp.start()
                if p == ms:  # a citation marker joins the open claim
                    if start < 0:
                        start = p
                    cits.extend(mc)
                    end = pos = me
                    mi += 1
                    ms, me, mc = _marker_before(markers, mi, e)
                    if ts == pos and not after:
                        # `[a:1].`: the terminator is a run of its own, no abbreviation, and
                        # the next marker is after it; it ends the sentence.
                        end = pos = te
                        after = True
                    continue
                # Plain text: it starts the next sentence unless it continues this one.
                if after:
                    after = False
                    if not text[p].islower():
                        if start >= 0:
                            _emit(out, text, start, end, cits, words, exempt)
                            cits = []
                            words = False
                        start = -1
                if start < 0:
                    start = p
                if not words and text[p].isalnum():
                    words = True
                if ts < p:
                    t = terminator(text, p)
                    if t is None:
                        ts = te = n
                    else:
                        ts, te = t.span()
                if ts < ms:  # the run ends at a terminator
                    end = pos = te
                    if not (
                        te == ts + 1
                        and text[ts] == "."
                        and ts > p
                        and not (
                            ts - _LONG_WORD_LEN >= p
                            and text[ts - 2] != "."
                            and _LONG_WORD.fullmatch(text, ts - _LONG_WORD_LEN, ts)
                        )
                        and _abbreviated(text, p, ts)
                    ):
                        after = True
                    continue
                end = p + len(text[p:ms].rstrip())
                pos = ms
        if nl < 0:
            break
        ls = nl + 1
    if start >= 0:
        _emit(out, text, start, end, cits, words, exempt)
    return out


# Characters that begin a non-blank, non-fence, non-heading line kind (`_RULE`, `_LIST`).
_BULLETS = frozenset("-*+")
_ASCII_DIGITS = frozenset("0123456789")
# The end of a word before a "." that is no abbreviation: longer than any in ABBREVIATIONS,
# so even `_LEADING_PUNCT` stripped from it leaves it too long, and (no "." before its last
# letter) not dotted initials either.
_LONG_WORD_LEN = max(map(len, ABBREVIATIONS)) + 1
_LONG_WORD = re.compile(rf"[^ \t{re.escape(_LEADING_PUNCT)}]{{{_LONG_WORD_LEN}}}")

# `BRACKET` without its optional "!": a literal first character makes searching much faster.
_GROUP = re.compile(r"\[([^\[\]\n]*)\](\()?")


def _marker_before(markers: list[Marker], mi: int, e: int) -> Marker:
    """Marker `mi` if there is one and it starts before `e` (the line's end), else `(e, e, ())`:
    the walk's next stop is then the end of the line."""
    if mi < len(markers) and markers[mi][0] < e:
        return markers[mi]
    return (e, e, ())


def _markers(text: str, parser: CitationParser) -> list[Marker]:
    """The citation markers of a whole text, as `_scan_markers` accepts them on its lines."""
    out: list[Marker] = []
    bracket = parser.bracket
    for g in _GROUP.finditer(text):
        body, link = g.groups()
        k = g.start()
        if link is None and (k == 0 or text[k - 1] != "!"):  # not a link or an image
            cits = bracket(body, k + 1)
            if cits:
                out.append((k, g.end(), cits))
    return out


def _emit(
    out: list[Segment],
    text: str,
    start: int,
    end: int,
    cits: list[Citation],
    words: bool,
    exempt: Sequence[re.Pattern[str]],
) -> None:
    """Close a claim of a whole text: as `ClaimSegmenter._close` (`words` proves a word)."""
    body = text[start:end]
    found = tuple(cits)
    if words or _has_words(body, start, found):
        ex = False
        for pat in exempt:
            if pat.search(body):
                ex = True
                break
        out.append(Segment(start, end, body, found, ex))

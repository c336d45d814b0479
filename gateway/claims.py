"""Claim segmentation: split answer text into sentences and list items, incrementally.

One segmenter serves whole texts and streams: `ClaimSegmenter` is sans-io (`feed(delta) ->
segments`, `finish() -> segments`, `whole(text)` for a whole text) and linear in input size.
Every rule below is written once, in `_walk` (a line's text) and `_line_kind` (a line's kind).

Rules (DESIGN §4):

* A claim is a sentence or a list item; the list label is not part of the claim. Labels:
  bullets ``- * + • ◦ ▪ ‣ –``; ``1.`` ``1)`` ``(1)`` with up to three digits (a longer number,
  ``1970.``, starts an item but stays in the claim: it is more likely a year than a label);
  ``a.`` ``a)`` ``(a)`` ``A)`` ``(A)``; lower-case roman ``iv.`` ``iv)`` ``(iv)``.
* Lines end at ``\n``, ``\r\n`` or a lone ``\r`` (CommonMark), for every rule below.
* Headings (``#``) are claims unless they are a title: at most `title_words` words (a closing
  ``#`` sequence not counted; words are split at whitespace and at the characters shown as
  blanks, U+2800 U+3164 U+115F U+1160 U+FFA0), no numeric character (``⑨``, ``⁹``, ``½``,
  ``Ⅻ``), no number the number check reads (``forty-two``, ``a dozen``) and no citation
  marker (a heading that cites is a claim, so an invented citation cannot ride on a title).
  A heading is a claim of its own: it ends the claim before it and its last sentence ends
  with its line.
* Fenced code (``` / ~~~, opened with 0-3 spaces of indent): with `code="exempt"` (the
  default) no claim; with `code="check"` each line of a fence is checked like a paragraph of
  one line. A line of three backticks with another backtick later on it (a line ``x`` between
  triple backticks) is inline code, not a fence: a backtick fence's info string holds no
  backtick. A non-blank line indented less than its opening fence (a tab counts as indent
  enough) ends the code block and is read as any other line, so a fence in a list item ends
  with the item; a closing fence so indented still closes the block. This is stricter than
  CommonMark for a top-level fence indented 1-3 spaces, whose less indented lines are read as
  prose (fail closed). Indented text is prose, never code: an indented line cannot hide a
  claim. An unclosed fence runs to the end of the text, as a renderer shows it.
* HTML blocks (CommonMark types 1-7): a markdown renderer shows their lines as raw HTML, so a
  fence line inside one opens no code block and a heading line inside one is no heading:
  both are text lines, checked. A block starts (outside a code block) at a text line whose
  text, after at most three spaces or after a list label, starts with ``<`` and a letter,
  ``/``, ``!`` or ``?``: liberally, so also where CommonMark starts none (fail closed: the
  block only makes more text prose). It ends, with its line, at the first line holding, after
  its start, ``</script>`` ``</pre>`` ``</style>`` or ``</textarea>`` (any case; started by
  ``<script`` ``<pre`` ``<style`` ``<textarea`` and a space, tab, ``>`` or the line end),
  ``-->`` (``<!--``), ``?>`` (``<?``), ``]]>`` (``<![CDATA[``) or ``>`` (``<!`` and a
  letter); every other block ends at a blank line (spaces and tabs only).
* Blank lines, thematic breaks (``---``), fences, headings and list items end the claim before
  them. A single line end inside a paragraph does not.
* A sentence ends at ``.``, ``!``, ``?`` or ``…`` (plus closing quotes / parentheses) followed
  by whitespace (so do ``؟ ۔ । ॥ ։ ． ‼ ⁇ ⁈ ⁉``; the ideographic ``。！？｡`` need no whitespace
  after them), unless the next text starts with a lowercase letter or the word before a single
  ``.`` is an abbreviation (``e.g.``, ``Dr.``, ``Sec.``), an initial (``J.``) or dotted initials
  (``U.S.``). A ``.`` not followed by whitespace (``3.1``, ``v2.1.3``) never ends one.
* Citation markers after the terminator (``Foo is 3. [a:1]``), up to the next non-space,
  non-citation text, belong to the sentence. A bracket group longer than `MAX_GROUP`
  characters is prose, never a marker.
* A segment without a letter or digit outside its citation markers (``---``) is not a claim,
  unless it cites: a lone ``[a:1]`` is a claim, so that its citations are checked. A claim
  is exempt when an exempt pattern matches the **whole** claim (`re.fullmatch`) once its
  citation markers are removed and whitespace trimmed: "I don't know, but the base has 42
  reactors." is a claim. (A claim that cites is never exempt: `gateway.verify` checks it.)

Streaming. A text line is walked up to a *cut*: the end of its last space or tab that is not
inside a bracket group that may still become a marker. Text before a cut is decided whatever
follows it (a terminator needs whitespace after it and a marker its ``]`` and the character
after that, all before the cut), so the walk never goes back: each character is walked once,
and the only text kept is the open claim's and the part after the cut. A claim is emitted as
soon as its end is certain: when the first character after it that is neither whitespace nor
``[`` is seen (a ``[`` waits for a cut after it). A line's kind is known once it is complete,
or once it holds a character that no rule or blank line has and its first word is followed by
a space or tab; a line that opens with a backtick fence (a backtick later on it unmakes the
fence) is known once complete, and a line inside a fence indented n spaces once its first n
characters are seen (once complete when one of them is a fence character: it may close the
block). Headings, fence lines and (with the ``regex`` citation format, whose matches cannot
be bounded) every line are walked when complete. Whether a text line starts or ends an HTML
block is read as the line is walked (its first word is whole before the first cut after it,
and no end text holds a space or tab, so none spans a cut); it decides the next line's kind.
A ``\r`` at the end of the text seen waits for the next character (``\r\n`` is one line end).
Whatever the split of a text into deltas, the claims and the moment each is emitted depend
only on the text seen so far.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.checks.numbers import numbers_in
from gateway.citations import CitationParser, Marker
from gateway.types import Citation, frozen_init

__all__ = [
    "MAX_GROUP",
    "ClaimSegmenter",
    "Segment",
    "exempt_match",
    "list_label_end",
    "segment",
]

CodeRule = Literal["exempt", "check"]


@frozen_init
@dataclass(frozen=True, slots=True)
class Segment:
    """One claim: `text == source[start:end]`, trailing citation markers included."""

    start: int
    end: int
    text: str
    citations: tuple[Citation, ...]
    exempt: bool = False


MAX_GROUP = 256  # longest bracket-group body that can be a citation marker

_FENCE = re.compile(r"[ ]{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"[ ]{0,3}#{1,6}(?:[ \t]+|$)")
_LABEL = (
    r"(?:[-*+•◦▪‣–]|\d{1,9}[.)]|\(\d{1,9}\)|[a-z][.)]|\([a-z]\)|[A-Z]\)|\([A-Z]\)"
    r"|[ivxlc]{1,7}[.)]|\([ivxlc]{1,7}\))"
)
_LIST = re.compile(rf"[ \t]*({_LABEL})(?:[ \t]+|$)")
_LABEL_ONLY = re.compile(rf"\s*({_LABEL})(?:\s+|$)")
_MAX_NUMBERING = 3  # digits of a numbered label that are dropped from the claim
_BLANK = re.compile(r"[ \t\r\f\v]*$")
# Two letters, the first no lowercase roman digit: a text line (no label, heading, rule,
# fence or blank line starts so).
_PLAIN_START = re.compile(r"[^\W\d_ivxlc][^\W\d_]")
# An HTML block (CommonMark types 1-7) starts at a line whose text (after at most three spaces,
# or after a list label) starts so; started liberally, so it may start where CommonMark has
# none. The groups name the types that end at a line holding their end text (`_HTML_ENDS`);
# every other start ends at a blank line.
_HTML_LEAD = re.compile(r"[ ]{0,3}<")
_HTML_START = re.compile(
    r"<(?:((?i:script|pre|style|textarea))(?=[ \t>]|$)|(!--)|(\?)|(!\[CDATA\[)|(![A-Za-z])"
    r"|[A-Za-z/!])"
)
_HTML_ENDS = (
    re.compile(r"</(?:script|pre|style|textarea)>", re.IGNORECASE),
    re.compile(r"-->"),
    re.compile(r"\?>"),
    re.compile(r"\]\]>"),
    re.compile(r">"),
)
_HTML_BLANK_END = re.compile(r"(?!)")  # the block ends at a blank line: nothing to search
_STRICT_BLANK = re.compile(r"[ \t]*$")  # a blank line for CommonMark (a "\f" line is none)
_RULE = re.compile(r"[ ]{0,3}(?:(?:-[ \t]*){3,}|(?:\*[ \t]*){3,}|(?:_[ \t]*){3,}|=+[ \t]*)$")
# `[.!?]+` or `…`, written to start with a character set so that searching is fast.
_TERMINATOR = re.compile(r"[.!?…](?:(?<=[.!?])[.!?]*)?[\"'”’)»*_]*(?=\s|$)")
# The same for text beyond ASCII, with other scripts' sentence ends: those that whitespace
# follows (Arabic and Urdu, Devanagari, Armenian, the fullwidth full stop, doubled marks), and
# the ideographic ones, which need none. Searching for it is slower: text that is all ASCII,
# where both find the same, searches for `_TERMINATOR`.
_SPACED_ENDS = "؟۔।॥։．‼⁇⁈⁉"
_IDEOGRAPHIC_ENDS = "。！？｡"
_CLOSERS = "\"'”’)»*_」』）"
_TERMINATOR_WIDE = re.compile(
    rf"[.!?…{_SPACED_ENDS}{_IDEOGRAPHIC_ENDS}](?:(?<=[.!?])[.!?]*)?"
    rf"(?:(?<=[{_IDEOGRAPHIC_ENDS}])[{_IDEOGRAPHIC_ENDS}]*[{_CLOSERS}]*|[{_CLOSERS}]*(?=\s|$))"
)
_NONSPACE = re.compile(r"\S")
_WORD = re.compile(r"[^\W_]")
_DIGIT = re.compile(r"\d")
# Characters that are no whitespace (`str.split` keeps them) but are shown as a blank.
_BLANK_LOOKING = str.maketrans(dict.fromkeys("\u2800\u3164\u115f\u1160\uffa0", " "))
_DOTTED_INITIALS = re.compile(r"^(?:[A-Za-z]\.)+[A-Za-z]$|^[A-Z]$")
_LEADING_PUNCT = "(\"'“‘[*_"
# A character no rule or blank line holds: with one, and the first word complete, a partial
# line's kind is the same whatever follows.
_DECIDER = re.compile(r"[^\s\-*_=]")
_SPACE_TAB = re.compile(r"[ \t]")
# A bracket group, with the `(` that makes it a markdown link (a `!` before it: an image).
# It never spans a line end ("\n" or "\r").
_GROUP = re.compile(rf"\[([^\[\]\n\r]{{0,{MAX_GROUP}}})\](\()?")
# What new text can let a waiting segmenter decide more.
_WAKE_LINE = re.compile(r"[\n\r]")
_WAKE_CUT = re.compile(r"[ \t\n\r\]]")
_WAKE_TERM = re.compile(rf"[.!?…{_SPACED_ENDS}{_IDEOGRAPHIC_ENDS}\n\r]")
_TERM_CHAR = re.compile(r"[.!?…]")
_TERM_CHAR_WIDE = re.compile(rf"[.!?…{_SPACED_ENDS}{_IDEOGRAPHIC_ENDS}]")

# Lowercased words that a single "." after them does not end a sentence.
_ABBREVIATIONS_WORDS = """
    e.g i.e etc cf vs al approx ca dr mr mrs ms prof sr jr st mt sec secs fig figs eq eqs
    no nos vol vols pp p ch chap art ref refs dept est inc ltd co corp jan feb mar apr jun
    jul aug sep sept oct nov dec mon tue wed thu fri sat sun min max avg gen col lt sgt
    rev ed eds op viz approx incl excl resp
    """
ABBREVIATIONS = frozenset(_ABBREVIATIONS_WORDS.split())
# The end of a word before a "." that is no abbreviation: longer than any in ABBREVIATIONS,
# so even `_LEADING_PUNCT` stripped from it leaves it too long, and (no "." before its last
# letter) not dotted initials either.
_LONG_WORD_LEN = max(map(len, ABBREVIATIONS)) + 1
_LONG_WORD = re.compile(rf"[^\s{re.escape(_LEADING_PUNCT)}]{{{_LONG_WORD_LEN}}}")

# Kinds of the current line (`_WAIT`: undecided until it is complete, a backtick fence line).
_UNDECIDED, _TEXT, _SKIP, _CODE, _HEAD, _WAIT = 0, 1, 2, 3, 4, 5
_NO = -(1 << 62)  # no open claim (relative offsets of an open claim may be negative)


class ClaimSegmenter:
    """Incremental claim segmentation of one channel's text (offsets from its first byte)."""

    __slots__ = (
        "_after",
        "_bb",
        "_buf",
        "_cits",
        "_code",
        "_cr",
        "_cscan",
        "_end",
        "_exempt",
        "_fence",
        "_findent",
        "_fullmatch",
        "_hs",
        "_html",
        "_kd",
        "_kf",
        "_kind",
        "_kw",
        "_ls",
        "_mall",
        "_marks",
        "_mi",
        "_nscan",
        "_parser",
        "_parts",
        "_pend",
        "_pos",
        "_regex",
        "_rscan",
        "_start",
        "_title",
        "_wake",
        "_words",
    )

    def __init__(
        self,
        parser: CitationParser,
        exempt: Sequence[re.Pattern[str]] = (),
        *,
        title_words: int = 8,
        code: CodeRule = "exempt",
    ) -> None:
        self._parser = parser
        self._regex = parser.format == "regex"
        # Compiled once with the policy (`ClaimsSpec.exempt_re`); nothing is compiled here.
        self._exempt = tuple(exempt)
        self._fullmatch = [p.fullmatch for p in self._exempt]
        self._title = title_words
        self._code = code
        self._buf = ""  # text from absolute offset `_bb` on that may still be read
        self._bb = 0
        self._pend: list[str] = []  # received but not yet appended to `_buf`
        self._wake: re.Pattern[str] | None = None  # asleep until new text matches this
        self._ls = 0  # start of the current line (absolute)
        self._nscan = 0  # its newline is searched from here
        # The next "\r" (absolute), known when at or after `_nscan`; else "\r" is searched
        # from `_rscan` on. Kept so that each character is searched once.
        self._cr = -1
        self._rscan = 0
        self._kind = _UNDECIDED
        self._kf = self._kw = self._kd = False  # kind flags: first word seen, complete, decider
        self._fence: str | None = None  # the opening fence while inside a code block
        self._findent = 0  # and its indent
        # The open HTML block's end (`_HTML_ENDS`, `_HTML_BLANK_END`), None outside one; and
        # where a walk of the current text line reads on for an HTML block's start (no block
        # open) or end (-1: nothing to read).
        self._html: re.Pattern[str] | None = None
        self._hs = -1
        self._pos = 0  # a text line is walked up to here
        self._cscan = 0  # a cut is searched from here
        # The open claim: start and end (absolute; start `_NO` when none), citations, the
        # spans of its markers, whether a letter or digit was seen, whether it is after its
        # terminator, and its text before `_bb`.
        self._start = _NO
        self._end = _NO
        self._cits: list[Citation] = []
        self._marks: list[tuple[int, int]] = []
        self._words = False
        self._after = False
        self._parts: list[str] = []
        # `whole`: every marker of the text (offsets in `_buf`, which is never trimmed then),
        # and the first one no walk has passed yet.
        self._mall: list[Marker] | None = None
        self._mi = 0

    # -- the interface -----------------------------------------------------------------------

    def feed(self, delta: str) -> list[Segment]:
        """Take more text; return the claims whose end is now certain."""
        out: list[Segment] = []
        if not delta:
            return out
        self._pend.append(delta)
        wake = self._wake
        if wake is not None and wake.search(delta) is None:
            if self._kind != _UNDECIDED or self._fence is not None:
                return out
            decided = self._note_kind(delta, 0, len(delta))
            self._cscan += len(delta)  # an undecided line's kind is read up to `_cscan`
            if not decided:
                return out
        self._advance(False, out)
        return out

    def finish(self) -> list[Segment]:
        """End of text: return every remaining claim."""
        out: list[Segment] = []
        self._advance(True, out)
        self._close(out)
        return out

    def whole(self, text: str) -> list[Segment]:
        """Segment a whole text: exactly `feed(text) + finish()` on a fresh segmenter of this
        one's settings. This segmenter's own state is neither read nor changed."""
        seg = ClaimSegmenter(
            self._parser, self._exempt, title_words=self._title, code=self._code
        )
        out: list[Segment] = []
        if text:
            seg._pend.append(text)
            if not self._regex and "[" in text:
                # Every line is complete and a marker never spans one: find them all at once.
                seg._buf = text
                seg._pend.clear()
                seg._mall = seg._markers(0, len(text))
        seg._advance(True, out)
        seg._close(out)
        return out

    # -- lines -------------------------------------------------------------------------------

    def _advance(self, final: bool, out: list[Segment]) -> None:
        pend = self._pend
        if pend:
            new = pend[0] if len(pend) == 1 else "".join(pend)
            pend.clear()
            self._buf = self._buf + new if self._buf else new
        buf, bb = self._buf, self._bb
        n = len(buf)
        self._wake = None
        while True:
            ls = self._ls - bb
            ns = self._nscan - bb
            # A line ends at "\n", "\r\n" or a lone "\r". The usual text has no "\r": one
            # search per call finds none, and a "\r" found is kept until its line ends.
            if self._cr >= self._nscan:
                cr = self._cr - bb
            elif self._rscan - bb >= n:
                cr = -1
            else:
                cr = buf.find("\r", max(self._rscan - bb, ns))
                if cr < 0:
                    self._rscan = n + bb
                else:
                    self._cr = cr + bb
                    self._rscan = cr + 1 + bb
            nl = buf.find("\n", ns) if cr < 0 else buf.find("\n", ns, cr)
            if nl >= 0:
                e, nxt = nl, nl + 1
            elif cr >= 0:
                e = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == "\n" else cr + 1
                elif final:
                    nxt = n
                else:
                    # The line ends here; whether the next starts after a "\n" is not known.
                    self._nscan = cr + bb
                    self._partial(ls, cr, out)
                    self._wake = None  # any character decides
                    break
            else:
                self._nscan = n + bb
                if not final:
                    self._partial(ls, n, out)
                    break
                e, nxt = n, -1
            self._complete(ls, e, out)
            if nxt < 0:
                break
            self._ls = self._nscan = self._pos = self._cscan = nxt + bb
            self._kind = _UNDECIDED
            html = self._html
            self._hs = nxt + bb if html is not None and html is not _HTML_BLANK_END else -1
            self._kf = self._kw = self._kd = False
        self._trim()

    def _note_kind(self, s: str, i: int, j: int) -> bool:
        """Read s[i:j] (more of the current, undecided line); whether its kind is now known."""
        if not self._kf:
            m = _NONSPACE.search(s, i, j)
            if m is None:
                return False
            self._kf = True
            i = m.start()
        if not self._kw and _SPACE_TAB.search(s, i, j) is not None:
            self._kw = True
        if not self._kd and _DECIDER.search(s, i, j) is not None:
            self._kd = True
        return self._kw and self._kd

    def _in_fence(self, ls: int, e: int, complete: bool) -> bool | None:
        """Whether the line buf[ls:e] (complete, or so far) stays in the open code block of a
        fence indented n > 0 spaces; None while that is not known yet. A line indented less
        than n ends the block unless it is blank (CommonMark: its container, a list item,
        ended) or a closing fence, which closes the block rather than open another; a tab
        reaches column 4, past any fence's indent."""
        buf = self._buf
        k, stop = ls, ls + self._findent
        while k < stop and k < e and buf[k] == " ":
            k += 1
        if k == stop or (k < e and buf[k] == "\t"):
            return True
        if k == e:  # spaces only so far
            return True if complete else None
        if self._fence is not None and buf[k] == self._fence[0]:
            return self._closes(ls, e) if complete else None
        return False

    def _closes(self, ls: int, e: int) -> bool:
        """Whether the complete line buf[ls:e] closes the open fence."""
        buf, fence = self._buf, self._fence
        m = _FENCE.match(buf, ls, e)
        return (
            m is not None
            and fence is not None
            and m.group(1)[0] == fence[0]
            and len(m.group(1)) >= len(fence)
            and _BLANK.match(buf, m.end(), e) is not None
        )

    def _line_kind(self, ls: int, e: int, out: list[Segment], partial: bool = False) -> None:
        """Classify the line at buf[ls:e] (complete, or decided by `_note_kind`: `partial`)."""
        buf = self._buf
        if self._fence is not None:  # `_partial` decides this for a partial line
            if self._findent == 0 or self._in_fence(ls, e, True):
                self._kind = _CODE
                return
            self._fence = None
        if _PLAIN_START.match(buf, ls, e):  # the usual line: no other kind starts so
            self._kind = _TEXT
            self._pos = self._cscan = ls + self._bb
            return
        self._kind = _SKIP
        html = self._html
        if _BLANK.match(buf, ls, e) or _RULE.match(buf, ls, e):
            if html is _HTML_BLANK_END and _STRICT_BLANK.match(buf, ls, e):
                self._html = None
            self._close(out)
            return
        if html is None:  # in an HTML block, fence and heading lines are raw text
            m = _FENCE.match(buf, ls, e)
            if m:
                fence = m.group(1)
                if fence[0] == "`" and partial:
                    self._kind = _WAIT  # a backtick later on the line makes it inline code
                    return
                if fence[0] != "`" or buf.find("`", m.end(), e) < 0:
                    self._close(out)
                    self._fence = fence
                    self._findent = m.start(1) - ls
                    return
            m = _HEADING.match(buf, ls, e)
            if m:
                self._close(out)
                self._kind = _HEAD
                self._pos = m.end() + self._bb
                return
        pos = ls
        m = _LIST.match(buf, ls, e)
        if m:
            self._close(out)
            label = m.group(1)
            if not (label[0].isdigit() and len(label) > _MAX_NUMBERING + 1):
                pos = m.end()
            else:
                pos = m.start(1)
            if html is None:  # the item's text may start an HTML block
                self._hs = m.end() + self._bb
        elif html is None:
            m = _HTML_LEAD.match(buf, ls, e)
            if m:
                self._hs = m.end() - 1 + self._bb
        self._kind = _TEXT
        self._pos = self._cscan = pos + self._bb

    def _complete(self, ls: int, e: int, out: list[Segment]) -> None:
        """The line at buf[ls:e] is complete: walk what is left of it."""
        if self._kind == _UNDECIDED or self._kind == _WAIT:
            self._line_kind(ls, e, out)
        kind = self._kind
        bb = self._bb
        if kind == _TEXT:
            lo = max(self._pos - bb, ls)
            if self._hs >= 0:
                self._html_look(lo, e, True)
            self._walk(lo, e, True, out)
        elif kind == _HEAD:
            p = self._pos - bb
            if not self._is_title(p, e):
                self._walk(p, e, True, out)
                self._close(out)
        elif kind == _CODE:
            if self._closes(ls, e):
                self._fence = None
            elif self._code == "check":
                self._walk(ls, e, True, out)
                self._close(out)

    def _partial(self, ls: int, n: int, out: list[Segment]) -> None:
        """The current line is buf[ls:n] so far: walk what is certain, set what to wait for."""
        if self._kind == _UNDECIDED:
            if self._fence is not None:
                inside = True if self._findent == 0 else self._in_fence(ls, n, False)
                if inside is None:
                    # Spaces only so far: the next character decides (at most three spaces
                    # on); a fence character: the line's end (it may close the block).
                    blank = _NONSPACE.search(self._buf, ls, n) is None
                    self._wake = None if blank else _WAKE_LINE
                    return
                if inside:
                    self._kind = _CODE
                else:
                    self._fence = None
            if self._kind == _UNDECIDED:
                # Read once: from where `feed` (which reads each delta it keeps) stopped.
                decided = self._note_kind(self._buf, max(ls, self._cscan - self._bb), n)
                self._cscan = n + self._bb
                if not decided:
                    self._wake = _WAKE_LINE
                    return
                self._line_kind(ls, n, out, True)
        if self._kind != _TEXT or self._regex:
            self._wake = _WAKE_LINE
            return
        self._cut(n, out)

    def _html_look(self, lo: int, hi: int, eol: bool) -> None:
        """Read buf[lo:hi], the next part of a text line (its rest: `eol`; else it ends after a
        space or tab), from `_hs` on: for the start of an HTML block when none is open (its
        first word is whole in it), then for the open block's end text."""
        buf, bb = self._buf, self._bb
        hs = self._hs - bb
        if hs >= hi:
            return
        end = self._html
        if end is None:
            k = hs
            while k < hi and buf[k] in " \t":
                k += 1
            if k == hi:  # only spaces so far
                self._hs = -1 if eol else hi + bb
                return
            m = _HTML_START.match(buf, k, hi)
            self._hs = -1
            if m is None:
                return
            if m.lastindex is None:
                self._html = _HTML_BLANK_END
                return
            end = self._html = _HTML_ENDS[m.lastindex - 1]
            hs = m.end()
        if end.search(buf, hs, hi) is not None:
            self._html = None  # this line is the block's last
            self._hs = -1
        else:
            self._hs = hi + bb

    def _is_title(self, p: int, e: int) -> bool:
        """Whether the heading text buf[p:e] is a title: few words (a closing `#` sequence not
        counted; words split at whitespace and at the characters shown as blanks), no numeric
        character, no number that `numbers_in` reads (``forty-two``) and no citation marker."""
        if self._markers(p, e):
            return False
        text = self._buf[p:e]
        if text.isascii():
            words = text.split()
            numeric = _DIGIT.search(text) is not None
        else:
            words = text.translate(_BLANK_LOOKING).split()
            numeric = any(c.isnumeric() for c in text)
        if words and words[-1].strip("#") == "":
            words.pop()
        return len(words) <= self._title and not numeric and not numbers_in(text)

    # -- the walk over a text line -----------------------------------------------------------

    def _cut(self, n: int, out: list[Segment]) -> None:
        """Walk a partial text line buf[pos:n] up to its last cut, then look past the cut."""
        buf, bb = self._buf, self._bb
        pos = self._pos - bb
        scan = max(self._cscan - bb, pos)  # no cut before this is left to find
        block = n
        q = max(buf.rfind(" ", scan, n), buf.rfind("\t", scan, n)) + 1
        while q > pos:
            # The cut must not split a bracket group that is, or may still become, a marker:
            # the last "[" before it either closed before it or can no longer close.
            lb = buf.rfind("[", max(pos, q - MAX_GROUP - 2), q)
            if lb < 0 or buf.find("]", lb, q) >= 0:
                break
            if buf.find("]", q, min(n, lb + MAX_GROUP + 2)) < 0:
                if n >= lb + MAX_GROUP + 2:
                    break  # too long to be a marker
                block = lb  # may still close: look again from here when more text comes
            q = max(buf.rfind(" ", scan, lb), buf.rfind("\t", scan, lb)) + 1
        self._cscan = block + bb
        if q > pos:
            if self._hs >= 0:
                self._html_look(pos, q, False)
            self._walk(pos, q, False, out)
            pos = q
        # Past the cut: a claim after its terminator ends at the next sentence's first
        # character, unless a lowercase letter continues it; "[" and other whitespace wait.
        if self._after:
            if pos == n:
                self._wake = None  # any character decides
                return
            c = buf[pos]
            if c != "[" and not c.isspace():
                self._after = False
                if not c.islower():
                    self._close(out)
            if self._after:
                self._wake = _WAKE_CUT
                return
        # Inside a sentence only a terminator can end it (or a line end): until the text
        # after the cut holds a terminator character, nothing else is worth a look.
        term = _TERM_CHAR if buf.isascii() else _TERM_CHAR_WIDE
        self._wake = _WAKE_CUT if term.search(buf, pos, n) else _WAKE_TERM

    def _walk(self, lo: int, hi: int, eol: bool, out: list[Segment]) -> None:
        """Markers, terminators and plain-text runs of buf[lo:hi], which is a whole line's
        rest (`eol`) or ends after a space or tab with no marker across its end."""
        text, bb = self._buf, self._bb
        mall = self._mall
        if mall is not None:  # a whole text's markers, found up front: skip those before lo
            markers = mall
            mi = self._mi
            while mi < len(mall) and mall[mi][0] < lo:
                mi += 1
            nm = mi
            while nm < len(mall) and mall[nm][0] < hi:
                nm += 1
            self._mi = nm
        else:
            markers = self._markers(lo, hi) if text.find("[", lo, hi) >= 0 or self._regex else []
            nm = len(markers)
            mi = 0
        ms, me, mc = markers[mi] if mi < nm else (hi, hi, ())
        start = self._start - bb if self._start != _NO else _NO
        end = self._end - bb
        cits, marks = self._cits, self._marks
        words, after = self._words, self._after
        nonspace = _NONSPACE.search
        terminator = (_TERMINATOR if text.isascii() else _TERMINATOR_WIDE).search
        ts = te = -1  # the next terminator (ts == hi: none)
        pos = lo
        while pos < hi:
            # The next non-space character, most often right here or one space on.
            if not text[pos].isspace():
                p = pos
            elif pos + 1 < hi and not text[pos + 1].isspace():
                p = pos + 1
            else:
                sp = nonspace(text, pos, hi)
                if sp is None:
                    break
                p = sp.start()
            if p == ms:  # a citation marker joins the open claim
                if start == _NO:
                    start = p
                cits.extend(mc)
                marks.append((ms + bb, me + bb))
                end = pos = me
                mi += 1
                ms, me, mc = markers[mi] if mi < nm else (hi, hi, ())
                continue
            # Plain text: it starts the next sentence unless it continues this one.
            if after:
                after = False
                if not text[p].islower() and start != _NO:
                    self._start, self._end, self._words = start + bb, end + bb, words
                    self._close(out)
                    cits, marks = self._cits, self._marks
                    start = _NO
                    words = False
            if start == _NO:
                start = p
            if not words and text[p].isalnum():
                words = True
            if ts < p:
                t = terminator(text, p, hi)
                if t is None:
                    ts = te = hi
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
        self._start = start + bb if start != _NO else _NO
        self._end = end + bb
        self._words, self._after = words, after
        self._pos = hi + bb
        if eol:
            self._cscan = hi + bb

    def _markers(self, lo: int, hi: int) -> list[Marker]:
        """The citation markers in buf[lo:hi], offsets relative to `_buf`, citations' absolute."""
        buf, bb = self._buf, self._bb
        if self._regex:
            found = self._parser.markers(buf, lo, hi, base=bb)
            return [(s - bb, e - bb, c) for s, e, c in found]
        out: list[Marker] = []
        bracket = self._parser.bracket
        for g in _GROUP.finditer(buf, lo, hi):
            body, link = g.groups()
            k = g.start()
            if link is None and (k == 0 or buf[k - 1] != "!"):  # not a link or an image
                cits = bracket(body, k + 1 + bb)
                if cits:
                    out.append((k, g.end(), cits))
        return out

    # -- the window and the open claim -------------------------------------------------------

    def _trim(self) -> None:
        """Drop text no decision will read again; keep the open claim's part of it."""
        buf, bb = self._buf, self._bb
        keep = self._pos if self._kind == _TEXT and not self._regex else self._ls
        cut = keep - bb
        if cut <= 0:
            return
        start = self._start
        if start != _NO and start < keep:
            self._parts.append(buf[max(start - bb, 0) : cut])
        self._buf = buf[cut:]
        self._bb = keep

    def _close(self, out: list[Segment]) -> None:
        start = self._start
        if start != _NO:
            end, bb = self._end, self._bb
            if self._parts:
                head = "".join(self._parts)
                text = head[: end - start] if end <= bb else head + self._buf[: end - bb]
                self._parts = []
            else:
                text = self._buf[start - bb : end - bb]
            cits = tuple(self._cits)
            # A lone marker is no sentence, but what it cites is shown: it is checked too.
            if self._words or cits or _has_words(text, start, cits):
                exempt = False
                if self._exempt:
                    marks = self._marks
                    if len(marks) == 1:  # the usual claim: `exempt_match`, inlined
                        s, e = marks[0]
                        bare = (text[: s - start].rstrip() + text[e - start :]).strip()
                        for fullmatch in self._fullmatch:
                            if fullmatch(bare) is not None:
                                exempt = True
                                break
                    else:
                        rel = [(s - start, e - start) for s, e in marks]
                        exempt = exempt_match(text, rel, self._exempt)
                out.append(Segment(start, end, text, cits, exempt))
            self._start = self._end = _NO
            self._cits = []
            self._marks = []
            self._words = False
        self._after = False


def _abbreviated(text: str, lo: int, ts: int) -> bool:
    """Whether the word from `lo` on before the "." at `ts` is an abbreviation or initials."""
    ws = text.rfind(" ", lo, ts)
    tab = text.rfind("\t", lo, ts)
    word = text[max(ws, tab, lo - 1) + 1 : ts]
    if not word.isprintable():  # other whitespace splits words too ("\r", "\u00a0")
        parts = word.split()
        word = parts[-1] if parts and not word[-1].isspace() else ""
    word = word.lstrip(_LEADING_PUNCT)
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


def exempt_match(
    text: str, marks: Sequence[tuple[int, int]], patterns: Sequence[re.Pattern[str]]
) -> bool:
    """Whether an exempt pattern matches the whole claim `text`: `fullmatch` on the text with
    its citation markers (`marks`: spans in `text`, each with the whitespace before it)
    removed and its ends stripped of whitespace."""
    if not patterns:
        return False
    if len(marks) == 1:  # the usual claim
        s, e = marks[0]
        text = text[:s].rstrip() + text[e:]
    elif marks:
        parts: list[str] = []
        pos = 0
        for s, e in sorted(marks):
            if s < pos:
                continue
            parts.append(text[pos:s].rstrip())
            pos = e
        parts.append(text[pos:])
        text = "".join(parts)
    text = text.strip()
    return any(p.fullmatch(text) is not None for p in patterns)


def list_label_end(text: str) -> int:
    """Where a structured claim's text starts once its list label (``1.``, ``(a)``, ``-``)
    and the whitespace around it are dropped; 0 when it has none. A numbered label of more
    than three digits (``1970.``) is kept, as in text."""
    m = _LABEL_ONLY.match(text)
    if m is None or m.end() == len(text):
        return 0
    label = m.group(1)
    if label[0].isdigit() and len(label) > _MAX_NUMBERING + 1:
        return 0
    return m.end()


def segment(
    text: str,
    parser: CitationParser,
    exempt: Sequence[re.Pattern[str]] = (),
    *,
    title_words: int = 8,
    code: CodeRule = "exempt",
) -> list[Segment]:
    """Segment a whole text: the same claims as feeding it in any pieces."""
    return ClaimSegmenter(parser, exempt, title_words=title_words, code=code).whole(text)

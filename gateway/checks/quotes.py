"""quote_mismatch: quoted text in a claim, and native `cited_text`, must be in the cited source.

Quotes checked: straight double quotes, “…”, «…», »…«, „…“ (or „…”), fullwidth ＂…＂, the corner
brackets 「…」 and 『…』, ❝…❞ and HTML's <q>…</q> of at least two words (characters shown as a
blank, `BLANKS`, separate words as spaces do); ‘…’, straight single quotes, ’…’ (Swedish), ‚…‘
(German), ‹…› and ›…‹ and LaTeX's ``…'' of at least three words (’ and ' are mostly
apostrophes: one after a word character, as in "don’t" or "the workers’", opens no quote).
Matching is exact and case-sensitive after normalising curly/straight quotes and whitespace;
trailing sentence punctuation inside the quote is ignored, and an elided quote ("a … b")
matches when every fragment is in one source. HTML character references ("&quot;", "&ldquo;",
"&#8220;") are read both as written and decoded, in the claim and in its sources.

Native citations: the document / search result must exist; `char_location` compares
`cited_text` with `text[start:end]`, `content_block_location` and `search_result_location`
with the concatenated blocks `[start:end]` (after the same normalisation, since the API trims
whitespace). `page_location`: the page range must be sane (1-based, non-empty); with the PDF's
text unknown a non-empty `cited_text` cannot be checked → source_text_unavailable; with
extracted text, `cited_text` must occur in it.
"""

from __future__ import annotations

import re

from gateway.checks.base import (
    ClaimFacts,
    FactsCheck,
    as_unescaped,
    native_source,
    normalise,
    source_text,
)
from gateway.types import CheckResult, ContextSet, NativeLocation

__all__ = ["QuoteMismatch", "quotes_in"]

# Every double quotation mark: a quote may open with any of them and close with any (mixed pairs
# such as “…" are common in generated text, so a quote in them is checked too).
_MARKS = '"“”„‟«»＂〝〞〟'


def _inside(excluded: str, lines: bool) -> str:
    """A character of a quotation: not one of `excluded` nor a line break, or (`lines`) a
    single line break, not one that makes a blank line (a soft break inside a claim)."""
    if lines:
        return f"(?:[^{excluded}\\n]|\\n(?![^\\S\\n]*\\n))"
    return f"[^{excluded}\\n]"


def _patterns(lines: bool) -> tuple[re.Pattern[str], ...]:
    """The quotation patterns, within a line or over single line breaks (`lines`): proper
    pairs, any double mark to the next one, ‘…’, straight single quotes, single guillemets
    (‹…›, ›…‹), German single quotes (‚…‘), Swedish ones (’…’) and LaTeX's (``…''). A straight
    single quote, or a Swedish one, opens after no word character (not "don't") and not on a
    decade or an elision ("the '90s", "'em"); inside, its mark only stands between word
    characters ("the plant's"), so each opener's search stops at the next other mark, and it
    closes after a non-space before no word character. Inside a LaTeX quote a "'" not before
    another is an apostrophe; each opener's search stops at the next "`"."""
    def i(x: str) -> str:
        return _inside(x, lines)

    def like_straight(mark: str) -> re.Pattern[str]:
        # The mark first: a search then skips to it in C (a lookbehind first is slow).
        return re.compile(
            f"{mark}(?<![\\w{mark}]{mark})(?!\\s|(?:\\d0s|em|tis|twas|cause|til|n)\\b)"
            f"((?:{i(mark)}|(?<=\\w){mark}(?=\\w))+?)(?<!\\s){mark}(?!\\w)"
        )

    # A quotation holds neither of its own marks: each opener's search then stops at the next
    # one ("“a“a“a…" is read in linear time).
    double = re.compile(
        f'"({i(chr(34))}+)"|“({i("“”")}+)”|«({i("«»")}+)»|„({i("„“”")}+)[“”]|»({i("»«")}+)«'
        f"|＂({i('＂')}+)＂|「({i('「」')}+)」|『({i('『』')}+)』|❝({i('❝❞')}+)❞"
    )
    mixed = re.compile(f"[{_MARKS}]({i(_MARKS)}+)[{_MARKS}]")
    straight = re.compile(f'"({i(chr(34))}+)"')
    single = re.compile(f"(?<!\\w)‘({i('‘')}+?)’(?!\\w)")
    apostrophe = like_straight("'")
    swedish = like_straight("’")
    guillemets = re.compile(f"‹({i('‹›')}+)›|›({i('›‹')}+)‹")
    german = re.compile(f"‚({i('‚‘')}+)‘")
    latex = re.compile(f"``((?:{i('`' + chr(39))}|'(?!'))+)''")
    return double, mixed, straight, single, apostrophe, swedish, guillemets, german, latex


_DOUBLE, _MIXED, _STRAIGHT, _SINGLE, _APOSTROPHE, *_OTHERS = _patterns(False)
(_DOUBLE_LINES, _MIXED_LINES, _STRAIGHT_LINES, _SINGLE_LINES, _APOSTROPHE_LINES,
 *_OTHERS_LINES) = _patterns(True)
_SWEDISH, _GUILLEMETS, _GERMAN, _LATEX = _OTHERS
_SWEDISH_LINES, _GUILLEMETS_LINES, _GERMAN_LINES, _LATEX_LINES = _OTHERS_LINES
# The characters that open a quote other than the straight one.
_OPENERS = re.compile(f"[{_MARKS[1:]}「『❝]")
# HTML's inline quotation, <q>…</q> (any case, with attributes). It holds no other <q> tag:
# each opener's search stops at the next one.
_Q_TAG = re.compile(r"<[qQ](?:\s[^<>]*)?>((?:[^<]|<(?!/?[qQ][\s>]))+)</[qQ]>")
_ELLIPSIS = re.compile(r"\s*(?:\.\.\.|…|\[\.\.\.\]|\[…\])\s*")
_TRAIL = ".,;:!?"


def quotes_in(text: str) -> list[str]:
    """The quoted passages of `text` worth checking, normalised. Where a pairing of quotation
    marks is unclear (a pair of different marks, a quote over a line break) each reading's
    quotes are checked: one that pairs the marks otherwise cannot hide a quote."""
    found: list[str] = []
    lines = "\n" in text  # over a line break the pairs may differ: read both ways
    ascii_text = text.isascii()
    # Each pattern only where its opening character occurs (`_SINGLE` starts with a
    # lookbehind, which makes a scan of every position slow).
    if not ascii_text and _OPENERS.search(text) is not None:
        for double, mixed in ((_DOUBLE, _MIXED), (_DOUBLE_LINES, _MIXED_LINES))[: 1 + lines]:
            _keep(["".join(groups) for groups in double.findall(text)], 2, found)
            _keep(mixed.findall(text), 2, found)
    elif '"' in text:  # `_DOUBLE` and `_MIXED` find only `_STRAIGHT`'s quotes
        _keep(_STRAIGHT.findall(text), 2, found)
        if lines:
            _keep(_STRAIGHT_LINES.findall(text), 2, found)
    if "<q" in text or "<Q" in text:
        _keep(_Q_TAG.findall(text), 2, found)
    if "‘" in text:
        _keep(_SINGLE.findall(text), 3, found)
        if lines:
            _keep(_SINGLE_LINES.findall(text), 3, found)
    if "'" in text:  # mostly apostrophes: the pattern wants three words between marks
        _keep(_APOSTROPHE.findall(text), 3, found)
        if lines:
            _keep(_APOSTROPHE_LINES.findall(text), 3, found)
        if "``" in text:  # closes with "''"
            _keep(_LATEX.findall(text), 3, found)
            if lines:
                _keep(_LATEX_LINES.findall(text), 3, found)
    if not ascii_text:  # three words, as in straight single quotes
        if "’" in text:  # mostly apostrophes too
            _keep(_SWEDISH.findall(text), 3, found)
            if lines:
                _keep(_SWEDISH_LINES.findall(text), 3, found)
        if "‹" in text or "›" in text:
            for p in (_GUILLEMETS, _GUILLEMETS_LINES)[: 1 + lines]:
                _keep(["".join(groups) for groups in p.findall(text)], 3, found)
        if "‚" in text:
            _keep(_GERMAN.findall(text), 3, found)
            if lines:
                _keep(_GERMAN_LINES.findall(text), 3, found)
    return list(dict.fromkeys(found)) if len(found) > 1 else found


def _keep(quoted: list[str], words: int, found: list[str]) -> None:
    """Append the normalised quotes of at least `words` words, trailing punctuation dropped."""
    for q in quoted:
        n = normalise(q)  # the words `BLANKS` separate count too
        if n.count(" ") + 1 >= words:
            n = n.rstrip(_TRAIL).strip()
            if n:
                found.append(n)


def _quote_in(quote: str, sources: list[str]) -> bool:
    if "..." not in quote and "…" not in quote:  # no ellipsis: one fragment, the quote
        return any(quote in src for src in sources)
    fragments = [f for f in _ELLIPSIS.split(quote) if f]
    return any(all(f in src for f in fragments) for src in sources)


_OK = CheckResult.ok("quote_mismatch")


class QuoteMismatch(FactsCheck):
    name = "quote_mismatch"

    def check(self, facts: ClaimFacts) -> CheckResult:
        ctx = facts.ctx
        for c in facts.claim.citations:
            if c.native is not None:
                problem = self._native(c.native, ctx)
                if problem is not None:
                    return problem
        body = facts.body
        quotes = quotes_in(body)  # looks only where a quote can open
        if "&" in body and (shown := as_unescaped(body)) is not None:
            # Character references show as what they name ("&quot;", "&ldquo;"); a plain-text
            # client shows them as written: the quotes of both readings are checked.
            quotes = list(dict.fromkeys([*quotes, *quotes_in(shown)]))
        if not quotes:
            return _OK
        indexed, textless = facts.sources()
        sources = [s.normalised for s in indexed]
        for s in indexed:  # a chunk is read through its references too
            if "&" in s.text and (shown := as_unescaped(s.text)) is not None:
                sources.append(source_text(shown).normalised)
        for q in quotes:
            if not _quote_in(q, sources):
                if textless:
                    return CheckResult.fail(
                        self.name, "source_text_unavailable", "a cited chunk has no text"
                    )
                return CheckResult.fail(
                    self.name, "quote_mismatch", "quoted text is in none of the cited sources"
                )
        return _OK

    def _native(self, loc: NativeLocation, ctx: ContextSet) -> CheckResult | None:
        text, reason, why = native_source(ctx, loc)
        if reason is not None:
            return CheckResult.fail(self.name, reason, why)
        if text is not None and normalise(text) != normalise(loc.cited_text):
            return CheckResult.fail(
                self.name, "quote_mismatch", "cited_text differs from the cited slice"
            )
        return None

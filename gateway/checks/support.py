"""unsupported (lexical): a claim's content words must overlap its cited sources enough.

Content words are lowercased word tokens of at least three characters, not stopwords and not
pure numbers (numbers are number_mismatch's job). Support = |claim words found in the union of
cited sources| / |claim words|. A claim without content words passes.

Markup a markdown client does not show (an HTML comment, a tag, a link's destination and
title) could carry a cited source's words and raise the score of a sentence the reader sees
without them: a claim with such markup is scored both with and without it, and the lower
score counts.

With `support.lexical` (or a judge) the score settles clear cases: strictly above `pass_above`
passes, strictly below `fail_below` fails. Between the bounds, a policy with `support.judge`
leaves the claim to the judge pass (error kind `judge_pending`, which only the judge pass
resolves: unresolved, it is an infrastructure error); without one, `threshold` decides.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gateway.checks.base import ClaimFacts, FactsCheck
from gateway.types import CheckResult

__all__ = ["LexicalSupport", "content_words", "lexical_score", "shown_words"]

_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*")
_STOPWORDS_WORDS = """
    a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can cannot could did do does doing don't down during
    each few for from further had has have having he her here hers herself him himself his how
    i if in into is isn't it it's its itself just let me more most my myself no nor not now of
    off on once only or other our ours ourselves out over own same she should so some such than
    that the their theirs them themselves then there these they this those through to too under
    until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves according per via said says say stated states show shows shown
    based however therefore thus may might must shall one two three also e.g i.e etc
    """
STOPWORDS = frozenset(_STOPWORDS_WORDS.split())


# ASCII text: lowercase letters and digits stay, apostrophes stay (a token may hold one
# between letters), everything else becomes a space; split then yields the tokens, lowercased.
_ASCII_FOLD = bytes.maketrans(
    bytes(range(128)),
    bytes(
        c + 32 if 65 <= c <= 90 else c if 97 <= c <= 122 or 48 <= c <= 57 or c == 39 else 32
        for c in range(128)
    ),
)
_ASCII_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z0-9]+)*")


def content_words(text: str) -> frozenset[str]:
    words: set[str]
    if text.isascii():
        # `_TOKEN` on ASCII text, lowercased, without a regex scan: for ASCII, `[^\W_]` is
        # [A-Za-z0-9] and lowercasing is per character. Only pieces with an apostrophe need
        # the pattern (it drops a leading / trailing / doubled one).
        pieces = text.encode().translate(_ASCII_FOLD).decode().split()
        if "'" in text:
            words = set()
            for p in pieces:
                if "'" in p:
                    words.update(_ASCII_TOKEN.findall(p))
                else:
                    words.add(p)
        else:
            words = set(pieces)
    else:
        if "’" in text:  # the token pattern treats ’ and ' alike, so fold before splitting
            text = text.replace("’", "'")
        words = set(map(str.lower, _TOKEN.findall(text)))
    words -= STOPWORDS
    return frozenset([w for w in words if len(w) >= 3 and not w.isdigit()])


# What a markdown client does not show: HTML comments (one left open runs to the end), tags
# (their text stays), and the destination and title of an inline link or image.
_HIDDEN = re.compile(
    r"<!--.*?(?:-->|$)|</?[A-Za-z][^<>]*>"
    r"|(?<=\])\([^()\s]*(?:\s+(?:\"[^\"]*\"|'[^']*'))?\)",
    re.DOTALL,
)


def shown_words(text: str, words: frozenset[str]) -> frozenset[str] | None:
    """The content words of `text` as a markdown client shows it, when its markup hides some
    of `words` (the content words of the text as written); None when it hides none."""
    if "<" not in text and "](" not in text:
        return None
    shown = content_words(_HIDDEN.sub(" ", text))
    return shown if shown and shown != words else None


def _found(words: frozenset[str], sources: Sequence[frozenset[str]]) -> int:
    if len(sources) == 1:
        return len(words & sources[0])
    seen: set[str] = set()
    for s in sources:
        seen |= words & s
    return len(seen)


def _score(words: frozenset[str], text: str, sources: Sequence[frozenset[str]]) -> float:
    """The support of `words` (the content words of `text`): the lower of the text's as
    written and as shown."""
    support = _found(words, sources) / len(words)
    shown = shown_words(text, words)
    if shown is not None:
        support = min(support, _found(shown, sources) / len(shown))
    return support


class LexicalSupport(FactsCheck):
    name = "unsupported"

    def __init__(
        self,
        threshold: float = 0.5,
        pass_above: float | None = None,
        fail_below: float | None = None,
        judged: bool = False,
    ) -> None:
        self.threshold = threshold
        self.judged = judged
        if judged and pass_above is None:
            pass_above, fail_below = 0.8, 0.3  # the documented defaults of support.lexical
        self.pass_above = pass_above
        self.fail_below = fail_below
        self._ok = CheckResult.ok(self.name)

    def check(self, facts: ClaimFacts) -> CheckResult:
        words = content_words(facts.body)
        if not words:
            return self._ok
        indexed, textless = facts.sources()
        support = _score(words, facts.body, [s.words for s in indexed])
        if self.pass_above is None:
            if support >= self.threshold:
                return self._ok
        elif support > self.pass_above:
            return self._ok
        elif self.fail_below is not None and support >= self.fail_below:
            if not self.judged:
                if support >= self.threshold:
                    return self._ok
            elif not textless:  # a chunk without text is one the judge cannot read either
                return CheckResult.error(self.name, "judge_pending", f"lexical {support:.2f}")
        if textless:
            return CheckResult.fail(
                self.name, "source_text_unavailable", "a cited chunk has no text"
            )
        return CheckResult.fail(self.name, "unsupported", f"lexical support {support:.2f}")


def lexical_score(claim: str, sources: Sequence[str]) -> float | None:
    """The lexical support score of `claim` against `sources` (None: no content words)."""
    words = content_words(claim)
    if not words:
        return None
    return _score(words, claim, [content_words(text) for text in sources])

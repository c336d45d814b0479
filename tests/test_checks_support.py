import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.checks.support import (
    _TOKEN,
    STOPWORDS,
    LexicalSupport,
    content_words,
    lexical_score,
)
from gateway.citations import CitationParser
from gateway.policy import Citations
from gateway.types import Chunk, Claim, ContextSet, Status

PARSER = CitationParser(Citations())
CTX = ContextSet()
CTX.extend(
    [
        Chunk("a:1", "The reactor cooling system uses pressurised water loops."),
        Chunk("b:2", "Turbines convert steam into electricity."),
        Chunk("n:1", None),
    ]
)


def claim(text: str) -> Claim:
    return Claim(0, 0, text, 0, len(text), tuple(PARSER.find(text)))


def test_supported_claim_passes() -> None:
    check = LexicalSupport(0.5)
    assert check.run(claim("The cooling system uses water loops [a:1]."), CTX).status is (
        Status.PASS
    )


def test_support_uses_union_of_cited_chunks() -> None:
    check = LexicalSupport(0.9)
    c = claim("Cooling water loops and turbines make electricity [a:1][b:2].")
    assert check.run(c, CTX).status is Status.FAIL  # "make" is in neither
    assert LexicalSupport(0.8).run(c, CTX).status is Status.PASS


def test_unsupported_claim_fails() -> None:
    r = LexicalSupport(0.5).run(claim("Bananas grow on tall trees [a:1]."), CTX)
    assert r.reason == "unsupported"


def test_threshold_zero_and_no_content_words() -> None:
    assert LexicalSupport(0.0).run(claim("Bananas grow [a:1]."), CTX).status is Status.PASS
    assert LexicalSupport(1.0).run(claim("It is so [a:1]."), CTX).status is Status.PASS


def test_textless_chunk_is_source_text_unavailable() -> None:
    r = LexicalSupport(0.5).run(claim("Bananas grow on trees [n:1]."), CTX)
    assert r.reason == "source_text_unavailable"


def test_content_words_drop_stopwords_numbers_and_markers() -> None:
    assert content_words("The 2021 reactor is in the plant") == {"reactor", "plant"}


def _content_words_by_pattern(text: str) -> frozenset[str]:
    text = text.replace("’", "'")
    words = set(map(str.lower, _TOKEN.findall(text))) - STOPWORDS
    return frozenset(w for w in words if len(w) >= 3 and not w.isdigit())


_WORDISH = st.text(alphabet=st.characters(max_codepoint=127)) | st.lists(
    st.sampled_from(
        ["'", "''", " ", "Don", "t", "ABC", "abc", "120", "3", "_", "-", "The", "x'yz", "é", "’"]
    )
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_WORDISH)
def test_ascii_fast_path_equals_the_token_pattern(text: str) -> None:
    assert content_words(text) == _content_words_by_pattern(text)


# Markup a markdown client hides, stuffed with the cited chunk's words, beside a sentence the
# reader sees without them.
_STUFFING = "reactor cooling system uses pressurised water loops"


@pytest.mark.parametrize(
    "text",
    [
        f"Bananas grow on tall trees <!-- {_STUFFING} --> [a:1].",
        f"Bananas grow on tall trees <!-- {_STUFFING} [a:1].",  # a comment left open
        f'Bananas grow on tall <span title="{_STUFFING}">trees</span> [a:1].',
        f'Bananas grow on [tall trees](https://x.example/{_STUFFING.replace(" ", "-")} '
        f'"{_STUFFING}") [a:1].',
        f"Bananas grow on tall trees ![x](https://x.example/{_STUFFING.replace(' ', '/')}) [a:1].",
    ],
)
def test_hidden_markup_does_not_raise_support(text: str) -> None:
    lexical = LexicalSupport(pass_above=0.8, fail_below=0.3)
    assert lexical.run(claim(text), CTX).reason == "unsupported"
    assert lexical_score(text, ["The reactor cooling system uses pressurised water loops."]) == 0.0


def test_markup_scores_the_lower_of_written_and_shown() -> None:
    # A supported sentence with a link keeps the score it had as written (the link's URL
    # words count against it), and one whose words are all shown is unchanged.
    shown = "The cooling system uses water loops"
    linked = f"{shown}, see [the spec](https://spec.example/cooling) [a:1]."
    chunk = ["The reactor cooling system uses pressurised water loops."]
    written = len(content_words(shown) & content_words(chunk[0])) / len(content_words(linked))
    assert lexical_score(linked, chunk) == pytest.approx(written)
    # A tag's text is shown: emphasis changes nothing.
    assert lexical_score("The cooling system uses <b>water</b> loops [a:1].", chunk) == 1.0
    assert lexical_score(f"{shown} [a:1].", chunk) == 1.0

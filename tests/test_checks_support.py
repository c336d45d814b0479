from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.checks.support import _TOKEN, STOPWORDS, LexicalSupport, content_words
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

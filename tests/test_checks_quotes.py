import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.checks.base import _QUOTE_MAP, ClaimFacts, claim_body, normalise, source_texts
from gateway.checks.quotes import _ELLIPSIS, QuoteMismatch, quotes_in
from gateway.citations import CitationParser
from gateway.policy import Citations
from gateway.types import Chunk, Citation, Claim, ContextSet, Document, NativeLocation, Status

PARSER = CitationParser(Citations())
CHECK = QuoteMismatch()
CTX = ContextSet()
CTX.extend(
    [
        Chunk("a:1", 'The  report says "growth was   strong" in spring, and it’s final.'),
        Chunk("b:2", "Nothing to see here at all."),
        Chunk("n:1", None),
    ]
)


def claim(text: str, *extra: Citation) -> Claim:
    return Claim(0, 0, text, 0, len(text), (*PARSER.find(text), *extra))


@pytest.mark.parametrize(
    "text",
    [
        'It said "growth was strong" [a:1].',
        "It said “growth was strong” [a:1].",
        "It said ‘The report says’ [a:1].",
        'It said "growth was strong." [a:1].',
        'It said "The report says … in spring" [a:1].',
        'Either source "growth was strong" [b:2][a:1].',
        "It’s fine without quotes [b:2].",
        'A "single" word quote is not checked [b:2].',
        "It said „growth was strong“ [a:1].",
        "It said »growth was strong« [a:1].",
        "It said ＂growth was strong＂ [a:1].",
        # A soft line break inside the quote, mixed marks, straight single quotes.
        'It said "growth\nwas strong" [a:1].',
        "It said “growth was strong\" [a:1].",
        'It said "growth was strong” [a:1].',
        "It said 'growth was strong' [a:1].",
        "It's the report's line: 'growth was strong' [a:1].",
        "In the '90s the workers' union didn't grow [b:2].",  # apostrophes, no quote
        'A "quote\n\nover a blank line" is two paragraphs [b:2].',
    ],
)
def test_quotes_found(text: str) -> None:
    assert CHECK.run(claim(text), CTX).status is Status.PASS


@pytest.mark.parametrize(
    "text",
    [
        'It said "growth was weak" [a:1].',
        "It said “Growth was strong” [a:1].",  # case-sensitive
        'It said "growth was strong" [b:2].',
        'Quoted "growth was strong" with no citation.',
        'It said "The report says … in autumn" [a:1].',
        # Other languages' quotation marks quote too.
        "It said „growth was weak“ [a:1].",
        "It said „growth was weak” [a:1].",
        "It said »growth was weak« [a:1].",
        "It said «growth was weak» [a:1].",
        "It said ＂growth was weak＂ [a:1].",
        'It said "growth\nwas weak" [a:1].',
        'It said "growth was\r\nweak" [a:1].',
        "It said “growth\nwas weak” [a:1].",
        "It said ‘growth\nwas very weak’ [a:1].",
        "It said “growth was weak\" [a:1].",
        'It said "growth was weak” [a:1].',
        "It said „growth was weak\" [a:1].",
        "It said «growth was weak\" [a:1].",
        "It said ”growth was weak” [a:1].",
        "It said 'growth was weak' [a:1].",
        "It said 'growth was weak'. [a:1].",
        "It said ('growth was weak') [a:1].",
        "It said 'the plant's growth was weak' [a:1].",
        # Paired over the line break the marks quote "growth was strong" (in the source); the
        # quote on the second line is checked all the same.
        'It said "growth\nwas strong" and "growth was weak" [a:1].',
        'x" y\nIt said "growth was weak" [a:1].',
    ],
)
def test_quote_mismatch(text: str) -> None:
    assert CHECK.run(claim(text), CTX).reason == "quote_mismatch"


def test_quote_against_textless_chunk_is_source_text_unavailable() -> None:
    assert CHECK.run(claim('It said "growth was strong" [n:1].'), CTX).reason == (
        "source_text_unavailable"
    )
    # nothing quoted: nothing to check, so an id-only chunk is fine
    assert CHECK.run(claim("Plain [n:1]."), CTX).status is Status.PASS


def test_quotes_in_ignores_markers_and_apostrophes() -> None:
    assert quotes_in("it’s Bob’s “two words” and ‘a b c’") == ["two words", "a b c"]
    assert quotes_in("don't say the plant's 'a b c' is the workers' one") == ["a b c"]
    assert quotes_in("In the '90s the plant's workers' union grew") == []
    assert quotes_in("Get 'em all, 'tis the workers' pay") == []
    assert quotes_in("Rock 'n' roll and the workers' pay") == []


def test_a_quote_spans_single_line_breaks_only() -> None:
    assert quotes_in('says "a b\nc d" e') == ["a b c d"]
    assert quotes_in('says "a b\r\nc d" e') == ["a b c d"]
    assert quotes_in('says "a b\n\nc d" e') == []
    assert quotes_in('says "a b\n \t\nc d" e') == []
    assert quotes_in("says ‘a b\nc d’ e") == ["a b c d"]
    assert quotes_in("says 'a b\nc d' e") == ["a b c d"]


def test_mixed_pairs_are_quotes() -> None:
    # Each mixed pair is a quote (the proper pairs' quotes are checked too, failing closed).
    got = quotes_in('says “a b" and "c d” and „e f" and «g h"')
    assert {"a b", "c d", "e f", "g h"} <= set(got)
    assert quotes_in('says “a b" and more') == ["a b"]
    # A proper pair holding another mark: its quote and the shorter one are both checked.
    assert set(quotes_in('says «a b "c d"» e')) == {'a b "c d"', "a b"}


def test_unclosed_openers_are_read_in_linear_time() -> None:
    import time

    for text in ["“a" * 20000, "“a\n" * 20000, "'a " * 20000, "«a" * 20000, "„a\n" * 20000,
                 "<q>a" * 20000, "<q a" * 20000, "「a" * 20000, "a\u2800" * 20000]:
        start = time.perf_counter()
        quotes_in(text)
        assert time.perf_counter() - start < 0.5, text[:8]


DOCS = ContextSet(
    documents=[
        Document(0, "text", "The grass is green. The sky is blue."),
        Document(1, "content", blocks=("First block.", " Second block.", " Third.")),
        Document(2, "pdf"),
        Document(3, "pdf", text="Page text with the fact."),
    ],
    search_results=[Document(0, "search_result", blocks=("Result one.", " Result two."))],
)


def native(**kw: object) -> Claim:
    return claim("Native claim.", Citation("", "", native=NativeLocation(**kw)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "loc",
    [
        {"type": "char_location", "cited_text": "The sky is blue.", "document_index": 0,
         "start": 20, "end": 36},
        {"type": "char_location", "cited_text": "The sky is blue. ", "document_index": 0,
         "start": 20, "end": 36},
        {"type": "content_block_location", "cited_text": "First block. Second block.",
         "document_index": 1, "start": 0, "end": 2},
        {"type": "search_result_location", "cited_text": "Result two.",
         "search_result_index": 0, "start": 1, "end": 2},
        {"type": "page_location", "cited_text": "", "document_index": 2, "start": 1, "end": 2},
        {"type": "page_location", "cited_text": "with the fact", "document_index": 3,
         "start": 1, "end": 2},
    ],
)
def test_native_ok(loc: dict[str, object]) -> None:
    assert CHECK.run(native(**loc), DOCS).status is Status.PASS


@pytest.mark.parametrize(
    ("loc", "reason"),
    [
        ({"type": "char_location", "cited_text": "The sky is red.", "document_index": 0,
          "start": 20, "end": 36}, "quote_mismatch"),
        ({"type": "char_location", "cited_text": "x", "document_index": 0,
          "start": 30, "end": 99}, "quote_mismatch"),
        ({"type": "char_location", "cited_text": "x", "document_index": 9,
          "start": 0, "end": 1}, "quote_mismatch"),
        ({"type": "content_block_location", "cited_text": "First block.",
          "document_index": 1, "start": 0, "end": 4}, "quote_mismatch"),
        ({"type": "search_result_location", "cited_text": "Result one.",
          "search_result_index": 0, "start": 1, "end": 2}, "quote_mismatch"),
        ({"type": "page_location", "cited_text": "anything", "document_index": 2,
          "start": 1, "end": 2}, "source_text_unavailable"),
        ({"type": "page_location", "cited_text": "", "document_index": 2,
          "start": 0, "end": 1}, "quote_mismatch"),
        ({"type": "page_location", "cited_text": "not there", "document_index": 3,
          "start": 1, "end": 2}, "quote_mismatch"),
    ],
)
def test_native_mismatch(loc: dict[str, object], reason: str) -> None:
    assert CHECK.run(native(**loc), DOCS).reason == reason


def test_a_native_citation_s_source_is_the_slice_it_cites_not_its_cited_text() -> None:
    # What number_mismatch and the support check read: the request's text, never the
    # upstream's cited_text.
    red = native(type="char_location", cited_text="The sky is red.", document_index=0,
                 start=20, end=36)
    assert source_texts(red, DOCS) == (["The sky is blue."], False)
    assert ClaimFacts(red, DOCS).sources()[0][0].text == "The sky is blue."
    blocks = native(type="content_block_location", cited_text="Fourth.", document_index=1,
                    start=1, end=3)
    assert source_texts(blocks, DOCS) == ([" Second block. Third."], False)
    page = native(type="page_location", cited_text="with the fact", document_index=3,
                  start=1, end=2)
    assert source_texts(page, DOCS) == (["with the fact"], False)
    for loc in [
        {"type": "char_location", "cited_text": "x", "document_index": 0, "start": 30,
         "end": 99},
        {"type": "char_location", "cited_text": "x", "document_index": 9, "start": 0, "end": 1},
        {"type": "page_location", "cited_text": "anything", "document_index": 2, "start": 1,
         "end": 2},
        {"type": "page_location", "cited_text": "not there", "document_index": 3, "start": 1,
         "end": 2},
        {"type": "page_location", "cited_text": "", "document_index": 3, "start": 1, "end": 2},
    ]:
        assert source_texts(native(**loc), DOCS) == ([], True), loc


# Straightforward references: normalise with a regex, every pattern over the whole text, each
# quote looked for in each source.
def reference_normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.translate(_QUOTE_MAP)).strip()


_MARKS = '"“”„‟«»＂〝〞〟'
_PAIRS = re.compile(r'"([^"]+)"|“([^“”]+)”|«([^«»]+)»|„([^„“”]+)[“”]|»([^»«]+)«|＂([^＂]+)＂')
_ANY_PAIR = re.compile(f"[{_MARKS}]([^{_MARKS}]+)[{_MARKS}]")
_CURLY_SINGLE = re.compile(r"(?<!\w)‘([^‘]+?)’(?!\w)")
_ELISION = re.compile(r"(?:\d0s|em|tis|twas|cause|til|n)\b")
_GUILLEMETS = re.compile(r"‹([^‹›]+)›|›([^›‹]+)‹")
_GERMAN = re.compile(r"‚([^‚‘]+)‘")
_LATEX = re.compile(r"``((?:[^`']|'(?!'))+)''")


def reference_apostrophes(piece: str, mark: str = "'") -> list[str]:
    """Straight (or Swedish, `mark` "’") single quotes, left to right: an opener stands after
    no word character or mark and before neither a space nor an elision; the quote closes at
    the first mark after a non-space and before no word character, and holds no other mark
    than one between word characters."""
    found = []
    p = 0
    while (p := piece.find(mark, p)) >= 0:
        prev = piece[p - 1] if p else " "
        rest = piece[p + 1 :]
        if prev.isalnum() or prev in "_" + mark or not rest or rest[0].isspace() or (
            _ELISION.match(rest)
        ):
            p += 1
            continue
        end = None
        for q in range(p + 1, len(piece)):
            if piece[q] != mark:
                continue
            after = piece[q + 1] if q + 1 < len(piece) else " "
            if not piece[q - 1].isspace() and q > p + 1 and not (after.isalnum() or after == "_"):
                end = q
                break
            if not (piece[q - 1].isalnum() or piece[q - 1] == "_") or not (
                after.isalnum() or after == "_"
            ):
                break  # an "'" not inside a word ends the search
        if end is None:
            p += 1
            continue
        found.append(piece[p + 1 : end])
        p = end + 1
    return found


def reference_quotes(text: str) -> list[str]:
    """Every quote of every line and of every paragraph (text between blank lines), by each
    way of pairing the marks."""
    pieces = text.split("\n") + re.split(r"\n[^\S\n]*\n", text)
    found: list[tuple[str, int]] = []
    for piece in pieces:
        found += [(next(g for g in m.groups() if g is not None), 2) for m in _PAIRS.finditer(piece)]
        found += [(q, 2) for q in _ANY_PAIR.findall(piece)]
        found += [(q, 3) for q in _CURLY_SINGLE.findall(piece)]
        found += [(q, 3) for q in reference_apostrophes(piece)]
        found += [(q, 3) for q in reference_apostrophes(piece, "’")]
        found += [("".join(g), 3) for g in _GUILLEMETS.findall(piece)]
        found += [(q, 3) for q in _GERMAN.findall(piece)]
        found += [(q, 3) for q in _LATEX.findall(piece)]
    quotes = [
        reference_normalise(q).rstrip(".,;:!?").strip() for q, words in found
        if len(q.split()) >= words
    ]
    return [q for q in quotes if q]


def reference_check(c: Claim, ctx: ContextSet) -> tuple[Status, str | None, str]:
    texts, textless = source_texts(c, ctx)
    sources = [reference_normalise(t) for t in texts]
    for q in reference_quotes(claim_body(c)):
        fragments = [f for f in _ELLIPSIS.split(q) if f]
        if not any(all(f in src for f in fragments) for src in sources):
            if textless:
                return Status.FAIL, "source_text_unavailable", "a cited chunk has no text"
            return Status.FAIL, "quote_mismatch", "quoted text is in none of the cited sources"
    return Status.PASS, None, ""


# Straight and curly quotes, nested and unclosed ones, apostrophes, ellipses and whitespace.
_QUOTISH = st.lists(
    st.sampled_from(
        [
            '"', "“", "”", "«", "»", "‘", "’", "'", "„", "‟", "‚", "‛", "＂", " ", " ", "  ", "\n",
            "\t", "\u00a0", "\x1c", ".", ",", "!", "?", "...", "…", "[...]", "growth",
            " was", " strong", "it’s", "é", "The report says", " in spring", "[a:1]",
            "\n\n", "\n \n", "\r\n", "don't", "s'", " 'em", "'90s", " '", "' ", "〝", "〟",
            "‹", "›", "``", "''", "`", " ’", "’ ", "s’", "’90s", " ‚",
        ]
    ),
    max_size=16,
).map("".join)


@settings(max_examples=500, deadline=None)
@given(_QUOTISH)
def test_quotes_in_and_normalise_equal_the_references(text: str) -> None:
    assert normalise(text) == reference_normalise(text)
    got = quotes_in(text)
    assert len(got) == len(set(got))
    assert set(got) == set(reference_quotes(text))


@settings(max_examples=300, deadline=None)
@given(
    _QUOTISH,
    _QUOTISH,
    _QUOTISH,
    st.sampled_from([" [a:1].", " [b:2].", " [a:1][b:2].", " [n:1].", " [b:2][n:1].", "."]),
)
def test_check_equals_the_reference(text: str, a_text: str, b_text: str, cite: str) -> None:
    ctx = ContextSet()
    ctx.extend([Chunk("a:1", a_text), Chunk("b:2", b_text), Chunk("n:1", None)])
    c = claim(text + cite)
    r = CHECK.run(c, ctx)
    assert (r.status, r.reason, r.detail) == reference_check(c, ctx)


# -- single guillemets, German and Swedish single quotes, LaTeX quotes ----------------------------


@pytest.mark.parametrize(
    ("text", "passes"),
    [
        ("It said ‹growth was weak› [a:1].", False),
        ("It said ›growth was weak‹ [a:1].", False),
        ("It said ‚growth was weak‘ [a:1].", False),
        ("It said ‚the plant’s growth was weak‘ [a:1].", False),
        ("It said ’growth was weak’ [a:1].", False),
        ("It said ’the plant’s growth was weak’ [a:1].", False),
        ("It said ``growth was weak'' [a:1].", False),
        ("It said ``the plant's growth was weak'' [a:1].", False),
        ("It said ‹growth\nwas weak› [a:1].", False),
        ("It said ’growth\nwas weak’ [a:1].", False),
        # Controls: the same marks around text in the source, and apostrophes.
        ("It said ‹growth was strong› [a:1].", True),
        ("It said ›growth was strong‹ [a:1].", True),
        ("It said ‚growth was strong‘ [a:1].", True),
        ("It said ’growth was strong’ [a:1].", True),
        ("It said ``growth was strong'' [a:1].", True),
        ("In the ’90s the workers’ union didn’t grow, it’s said [b:2].", True),
        ("Rock ’n’ roll and the workers’ pay, ’tis the bosses’ plan [b:2].", True),
        ("A ‹two words› quote is not checked [b:2].", True),
        ("A ``two words'' quote is not checked [b:2].", True),
    ],
)
def test_more_single_quotation_marks(text: str, passes: bool) -> None:
    got = CHECK.run(claim(text), CTX)
    assert (got.status is Status.PASS) is passes, got


def test_more_single_quotation_marks_in_quotes_in() -> None:
    assert quotes_in("says ‹a b c› and ›d e f‹") == ["a b c", "d e f"]
    assert quotes_in("says ‚a b c‘ e") == ["a b c"]
    assert quotes_in("says ’a b c’ e") == ["a b c"]
    assert quotes_in("says ``a b c'' e") == ["a b c"]
    assert quotes_in("says ``don't say it'' e") == ["don't say it"]
    assert quotes_in("the workers’ union and the bosses’ plan didn’t change") == []
    assert quotes_in("in the ’90s, get ’em, ’tis rock ’n’ roll") == []


def test_more_unclosed_openers_are_read_in_linear_time() -> None:
    import time

    for text in ["‹a" * 20000, "›a" * 20000, "‚a" * 20000, "’a " * 20000, "``a " * 20000,
                 "‹a\n" * 20000, "’a \n" * 20000, "``a\n" * 20000]:
        start = time.perf_counter()
        quotes_in(text)
        assert time.perf_counter() - start < 0.5, text[:8]


@pytest.mark.parametrize(
    "text",
    [
        # Character references show as the quotation marks they name.
        "It said &quot;growth was weak&quot; [a:1].",
        "It said &ldquo;growth was weak&rdquo; [a:1].",
        "It said &#8220;growth was weak&#8221; [a:1].",
        "It said &#x22;growth was weak&#x22; [a:1].",
        "It said &laquo;growth was weak&raquo; [a:1].",
    ],
)
def test_a_quotation_written_with_character_references_is_checked(text: str) -> None:
    assert CHECK.run(claim(text), CTX).reason == "quote_mismatch"


@pytest.mark.parametrize(
    ("text", "chunk"),
    [
        ("It said &quot;growth was strong&quot; [s:1].", 'The report says "growth was strong".'),
        ("It said &ldquo;growth was strong&rdquo; [s:1].", "It says growth was strong."),
        # A chunk is read through its references too.
        ('It said "Tom & Jerry sang" [s:1].', "It says Tom &amp; Jerry sang."),
        ('It said "Tom &amp; Jerry sang" [s:1].', "It says Tom &amp; Jerry sang."),
    ],
)
def test_a_correct_quotation_behind_character_references_passes(text: str, chunk: str) -> None:
    ctx = ContextSet()
    ctx.add(Chunk("s:1", chunk))
    assert CHECK.run(claim(text), ctx).status is Status.PASS


@pytest.mark.parametrize(
    "text",
    [
        "It said \u300cgrowth was weak\u300d [a:1].",  # 「…」
        "It said \u300egrowth was weak\u300f [a:1].",  # 『…』
        "It said \u275dgrowth was weak\u275e [a:1].",  # ❝…❞
        "It said <q>growth was weak</q> [a:1].",
        "It said <q cite='x'>growth was weak</Q> [a:1].",
        "It said <Q>growth was weak</Q> [a:1].",
        # Blank-looking characters between the words: a three-word quotation.
        'It said "growth\u2800was\u2800weak" [a:1].',
        'It said "growth\u3164was\u3164weak" [a:1].',
        'It said "growth\u115fwas\u1160weak" [a:1].',
        'It said "growth\uffa0was\uffa0weak" [a:1].',
        "It said \u2018growth\u2800was\u2800weak\u2019 [a:1].",
    ],
)
def test_a_quotation_in_other_marks_or_with_blank_looking_spaces_is_checked(text: str) -> None:
    assert CHECK.run(claim(text), CTX).reason == "quote_mismatch"


@pytest.mark.parametrize(
    "text",
    [
        "It said \u300cgrowth was strong\u300d [a:1].",
        "It said \u300egrowth was strong\u300f [a:1].",
        "It said \u275dgrowth was strong\u275e [a:1].",
        "It said <q>growth was strong</q> [a:1].",
        'It said "growth\u2800was\u3164strong" [a:1].',
    ],
)
def test_a_correct_quotation_in_other_marks_or_with_blank_looking_spaces_passes(
    text: str,
) -> None:
    assert CHECK.run(claim(text), CTX).status is Status.PASS


def test_blank_looking_characters_normalise_to_a_space() -> None:
    assert normalise("a\u2800b\u3164c\u115fd\u1160e\uffa0f") == "a b c d e f"

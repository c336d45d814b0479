import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.citations import CitationParser
from gateway.claims import ClaimSegmenter, Segment, segment
from gateway.policy import Citations, ClaimsSpec

PARSER = CitationParser(Citations())
# The default exempt patterns as a policy compiles them at load.
DEFAULT_EXEMPT = ClaimsSpec().exempt_re


def texts(text: str) -> list[str]:
    segs = segment(text, PARSER, DEFAULT_EXEMPT)
    for s in segs:
        assert text[s.start : s.end] == s.text
    return [s.text for s in segs]


def test_sentences_with_citations_after_and_before_period() -> None:
    assert texts("Foo is 3. [a:1] Bar is 4 [b:2]. Baz [c:1].") == [
        "Foo is 3. [a:1]",
        "Bar is 4 [b:2].",
        "Baz [c:1].",
    ]


def test_citations_belong_to_their_sentence() -> None:
    segs = segment("Foo is 3. [a:1][a:2] Bar is 4 [b:2].", PARSER)
    assert [[c.id for c in s.citations] for s in segs] == [["a:1", "a:2"], ["b:2"]]


def test_citation_on_next_line_belongs_to_previous_sentence() -> None:
    assert texts("Foo is 3.\n[a:1]\nBar [b:1].") == ["Foo is 3.\n[a:1]", "Bar [b:1]."]


@pytest.mark.parametrize(
    "sentence",
    [
        "Fruit, e.g. apples, is good [a:1].",
        "That is, i.e. the rest, fine [a:1].",
        "See Sec. 3.1 for details [a:1].",
        "The pack holds 62.5 kWh of energy [a:1].",
        "It began in the U.S. in 1990 [a:1].",
        "Dr. Smith agreed [a:1].",
        "Upgrade to v2.1.3 now [a:1].",
        "J. R. R. Tolkien wrote it [a:1].",
        "Apples, pears, etc. are fruit [a:1].",
        "It costs approx. ten euros [a:1].",
        "Compare A vs. B here [a:1].",
    ],
)
def test_abbreviations_do_not_split(sentence: str) -> None:
    assert texts(sentence + " Next one [b:1].") == [sentence, "Next one [b:1]."]


def test_question_and_exclamation_split() -> None:
    assert texts("Is it? Yes! It is [a:1].") == ["Is it?", "Yes!", "It is [a:1]."]


def test_lowercase_continuation_does_not_split() -> None:
    assert texts("It rose... and then fell [a:1].") == ["It rose... and then fell [a:1]."]


def test_list_items_are_claims_without_their_markers() -> None:
    text = "Intro [a:1].\n- one [a:1]\n* two [b:2]\n+ three\n1. four [c:3]\n2) five"
    assert texts(text) == ["Intro [a:1].", "one [a:1]", "two [b:2]", "three", "four [c:3]", "five"]


def test_list_item_with_two_sentences() -> None:
    assert texts("- First [a:1]. Second [b:1].") == ["First [a:1].", "Second [b:1]."]


def test_headings_and_code_fences_are_not_claims() -> None:
    text = (
        "# Heading\n"
        "Body [a:1].\n"
        "```python\nx = 1. Not a claim [z:9].\n```\n"
        "~~~\ncode\n~~~\n"
        "## Sub\n"
        "After [b:2]."
    )
    assert texts(text) == ["Body [a:1].", "After [b:2]."]


def test_a_heading_with_a_citation_is_a_claim() -> None:
    # A title may not carry an invented citation past the checks.
    assert texts("# Wind powers the plant [zz:9]\nBody [a:1].") == [
        "Wind powers the plant [zz:9]", "Body [a:1].",
    ]


def test_fence_must_close_with_same_char() -> None:
    assert texts("```\ncode\n~~~\nstill code.\n```\nOut [a:1].") == ["Out [a:1]."]


def test_unclosed_fence_hides_the_rest() -> None:
    assert texts("Yes [a:1].\n```\nNo. Never.") == ["Yes [a:1]."]


def test_blank_line_and_rule_end_a_claim() -> None:
    assert texts("No period here\n\nNext [a:1]") == ["No period here", "Next [a:1]"]
    assert texts("Above\n---\nBelow") == ["Above", "Below"]


def test_soft_wrapped_sentence_is_one_claim() -> None:
    assert texts("A long sentence\nwrapped here [a:1].") == ["A long sentence\nwrapped here [a:1]."]


def test_blank_and_punctuation_only_segments_are_not_claims() -> None:
    assert texts("   \n\n  ") == []
    assert texts("---\n***\n- \n") == []
    assert texts("") == []


def test_a_lone_marker_is_a_claim_so_that_what_it_cites_is_checked() -> None:
    assert texts("---\n***\n- \n[a:1]") == ["[a:1]"]
    assert texts("Foo is 3 [a:1].\n\n[b:2][c:3]") == ["Foo is 3 [a:1].", "[b:2][c:3]"]
    [lone] = [s for s in segment("Foo is 3 [a:1].\n\n[zz:9]", PARSER) if not s.text[0].isalpha()]
    assert [c.id for c in lone.citations] == ["zz:9"]


def test_markdown_link_is_text() -> None:
    segs = segment("See [the docs](https://x.y/a:b). Then [a:1].", PARSER)
    assert [s.text for s in segs] == ["See [the docs](https://x.y/a:b).", "Then [a:1]."]
    assert segs[0].citations == ()


def test_exempt_claims() -> None:
    segs = segment("I don't know. The sky is blue [a:1].", PARSER, DEFAULT_EXEMPT)
    assert [(s.text, s.exempt) for s in segs] == [
        ("I don't know.", True),
        ("The sky is blue [a:1].", False),
    ]
    # A pattern must match the whole claim: a prefix is not enough.
    custom = segment(
        "Disclaimer: none. Fact [a:1].", PARSER, [re.compile(r"^Disclaimer.*"), re.compile(r"Fact")]
    )
    assert [s.exempt for s in custom] == [True, False]


def test_crlf_lines() -> None:
    assert texts("One [a:1].\r\n- two [b:1]\r\n") == ["One [a:1].", "two [b:1]"]


def test_stream_claim_final_only_when_next_text_begins() -> None:
    seg = ClaimSegmenter(PARSER, DEFAULT_EXEMPT)
    assert seg.feed("Foo is 3.") == []
    assert seg.feed(" [a:1]\n") == []  # more citations could still follow
    # "Bar" could still be a label ("b)"): a line's kind is known once its first word is
    # complete, and then "B" starts a sentence.
    assert seg.feed("Bar") == []
    got = seg.feed(" is 4.\n")
    assert [s.text for s in got] == ["Foo is 3. [a:1]"]
    assert [s.text for s in seg.finish()] == ["Bar is 4."]


def _released(*deltas: str) -> list[list[str]]:
    seg = ClaimSegmenter(PARSER, DEFAULT_EXEMPT)
    return [[s.text for s in seg.feed(d)] for d in deltas]


def test_sentence_released_inside_a_line() -> None:
    assert _released("The pack stores 62.5 kWh [a:1]. It weigh") == [
        ["The pack stores 62.5 kWh [a:1]."]
    ]
    assert _released("The pack stores 62.5 kWh [a:1].", " It", " weighs") == [
        [],
        ["The pack stores 62.5 kWh [a:1]."],
        [],
    ]


def test_citation_after_the_period_waits_for_the_next_sentence() -> None:
    assert _released("Foo is 3.", " [a", ":1]", " ", "[b:2]", " B", "ar") == [
        [], [], [], [], [], ["Foo is 3. [a:1] [b:2]"], [],
    ]
    # A bracket that turns out to be prose or a link starts the next sentence.
    assert _released("Foo is 3. [see", " below] x") == [[], ["Foo is 3."]]
    assert _released("Foo is 3. [a:1]", "(https://x) y") == [[], ["Foo is 3."]]
    # "![" starts an image or text, never a marker: the next sentence has begun.
    assert _released("Foo is 3. ![", "a:1](x) y") == [["Foo is 3."], []]
    assert _released("Foo is 3. !", "[a:1]") == [["Foo is 3."], []]


@pytest.mark.parametrize(
    "deltas",
    [
        ["See Sec", ". 3 for details [a:1]. Next"],
        ["See Sec.", " 3 for details [a:1]. Next"],
        ["See Sec. ", "3 for details [a:1]. Next"],
        ["It began in the U.", "S. law ", "[a:1]. Next"],
        ["It began in the U.S", ". law [a:1]. Next"],
        ["It began in the U.S.", " Law [a:1]. Next"],
        ["It holds 62", ".5 kWh [a:1]. Next"],
        ["It holds 62.", "5 kWh [a:1]. Next"],
        ["Fruit, e.", "g. this one [a:1]. Next"],
        ["Fruit, e.g", ". this one [a:1]. Next"],
        ["Fruit, e.g.", " this one [a:1]. Next"],
    ],
)
def test_no_early_release_inside_abbreviations_and_decimals(deltas: list[str]) -> None:
    seg = ClaimSegmenter(PARSER, DEFAULT_EXEMPT)
    got = [[s.text for s in seg.feed(d)] for d in deltas]
    whole = "".join(deltas)
    first = whole[: whole.index(". Next") + 1]
    assert got == [[]] * (len(deltas) - 1) + [[first]]
    assert [s.text for s in seg.finish()] == ["Next"]


def test_a_terminator_at_the_end_of_the_text_seen_waits() -> None:
    # "Foo." could still become "Foo.5" or "Foo..."; " " proves it, "B" ends the claim.
    assert _released("Foo [a:1].", " ", "B") == [[], [], ["Foo [a:1]."]]
    assert _released("Is it?", "!", " Yes") == [[], [], ["Is it?!"]]
    # Inside a sentence only a terminator, a bracket or a line end is worth a look; the
    # whitespace after a terminator that arrived on its own still ends the claim.
    assert _released("Foo is", " 3", ".", '"', " ", "Bar") == [[], [], [], [], [], ['Foo is 3."']]
    assert _released("Foo is", " 3\n", "Bar") == [[], [], []]
    assert _released("Foo is", " 3 [a:1]", " Bar") == [[], [], []]


def test_list_item_released_when_the_next_item_starts() -> None:
    assert _released("- one [a:1]\n", "- ", "t", "wo") == [[], [], ["one [a:1]"], []]
    # "1" could begin "1." (a list item) or "12 apples" (text): the line is undecided.
    assert _released("Intro [a:1].\n", "1", "2", " apples") == [[], [], [], ["Intro [a:1]."]]
    assert _released("Intro [a:1].\n", "# Hea", "d\n") == [[], ["Intro [a:1]."], []]


def test_regex_format_decides_whole_lines() -> None:
    parser = CitationParser(Citations(format="regex", pattern=r"<(?P<id>\w+)>"))
    seg = ClaimSegmenter(parser)
    assert seg.feed("Foo <a>. Bar") == []
    assert [s.text for s in seg.feed(" <b>.\n")] == ["Foo <a>."]


def test_stream_offsets_are_absolute() -> None:
    text = "# T\nAlpha [a:1].\n\nBeta [b:2].\n"
    seg = ClaimSegmenter(PARSER)
    out = []
    for ch in text:
        out.extend(seg.feed(ch))
    out.extend(seg.finish())
    assert [(text[s.start : s.end]) for s in out] == ["Alpha [a:1].", "Beta [b:2]."]


_PIECES = st.sampled_from(
    [
        "Foo is 3.", " ", "\n", "\n\n", "[a:1]", "[b:2, c:3]", "[:1]", "e.g. ", "Dr. ", "U.S. ",
        "62.5 kWh", "- ", "1. ", "# Head", "```", "~~~", "bar", "Baz!", "why?", " and",
        "I don't know.", "[see]", "[x](y)", "v2.1.3", "\r\n", "---", "“q”", "…", "U.", "[", "]",
        "(", "!", "Sec.", "1", "[see above. Ok]", "Wow![a:1]", "\t", "A.", "b",
        "泵由X设计。", "好！", "。」", "هل؟", "．",
        # lone carriage returns, inline code that looks like a fence, fences in list items
        "\r", "\r\r", "```x```", "`", "  ```", "   ~~~", "  x", " ", "[a:\u00a0b]", "# T [a:1]",
        # HTML blocks and their ends
        "<!--", "-->", "<div>", "</div>", "<script>", "</script>", "<?x", "?>", "<!X", ">",
        "- <!--", "<p",
    ]
)


@settings(max_examples=600, deadline=None)
@given(st.lists(_PIECES, max_size=30), st.data())
def test_feed_at_any_split_equals_segment(pieces: list[str], data: st.DataObject) -> None:
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    seg = ClaimSegmenter(PARSER, DEFAULT_EXEMPT)
    got = []
    prev = 0
    for cut in [*cuts, len(text)]:
        got.extend(seg.feed(text[prev:cut]))
        prev = cut
    got.extend(seg.finish())
    assert got == segment(text, PARSER, DEFAULT_EXEMPT)
    for s in got:
        assert text[s.start : s.end] == s.text
        assert s.text.strip()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.data())
def test_feed_split_arbitrary_text(text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    seg = ClaimSegmenter(PARSER)
    got = []
    prev = 0
    for cut in [*cuts, len(text)]:
        got.extend(seg.feed(text[prev:cut]))
        prev = cut
    got.extend(seg.finish())
    assert got == segment(text, PARSER)
    for s in got:
        assert text[s.start : s.end] == s.text


@settings(max_examples=200, deadline=None)
@given(st.lists(_PIECES, max_size=20))
def test_feed_one_character_at_a_time_equals_segment(pieces: list[str]) -> None:
    text = "".join(pieces)
    seg = ClaimSegmenter(PARSER, DEFAULT_EXEMPT)
    got = [s for ch in text for s in seg.feed(ch)] + seg.finish()
    assert got == segment(text, PARSER, DEFAULT_EXEMPT)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PIECES, max_size=30), st.data())
def test_what_is_released_depends_only_on_the_text_seen(
    pieces: list[str], data: st.DataObject
) -> None:
    # Whatever the split, after each piece exactly the claims released by that text fed whole
    # are out: waiting for more text never holds back a claim whose end is already certain.
    text = "".join(pieces)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    seg = ClaimSegmenter(PARSER, DEFAULT_EXEMPT)
    got: list[Segment] = []
    prev = 0
    for cut in cuts:
        got.extend(seg.feed(text[prev:cut]))
        prev = cut
        assert got == ClaimSegmenter(PARSER, DEFAULT_EXEMPT).feed(text[:cut])

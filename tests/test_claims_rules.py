"""DESIGN §4's claim rules, once per rule: headings, code, whole-claim exemptions, list labels;
and the segmenter's promises for streams (same claims for any split, bounded window)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.citations import CitationParser
from gateway.claims import MAX_GROUP, ClaimSegmenter, Segment, exempt_match, list_label_end, segment
from gateway.policy import DEFAULT_EXEMPT, Citations, ClaimsSpec
from tests.test_claims_fast import split_texts

PARSER = CitationParser(Citations())
EXEMPT = [re.compile(p) for p in DEFAULT_EXEMPT]


def texts(text: str, **kw: object) -> list[str]:
    segs = segment(text, PARSER, EXEMPT, **kw)  # type: ignore[arg-type]
    for s in segs:
        assert text[s.start : s.end] == s.text
    return [s.text for s in segs]


def fed(text: str, deltas: list[str], **kw: object) -> list[Segment]:
    seg = ClaimSegmenter(PARSER, EXEMPT, **kw)  # type: ignore[arg-type]
    out = [s for d in deltas for s in seg.feed(d)]
    return out + seg.finish()


# -- headings ----------------------------------------------------------------------------------

NINE = "One two three four five six seven eight nine"
FORTY_TWO = "The base has forty two reactors in the desert"


@pytest.mark.parametrize(
    ("heading", "claim"),
    [
        ("# Overview", None),
        ("## Battery and charging", None),
        ("### Alpha bravo charlie delta echo foxtrot golf hotel", None),
        ("### One two three four five six seven eight", "One two three four five six seven eight"),
        ("## Summary ##", None),  # a closing sequence is not a word
        ("## Results [a:1]", "Results [a:1]"),  # a citation makes a claim of any heading
        ("# Overview [doc: 3]", "Overview [doc: 3]"),
        ("## The base has 42 reactors", "The base has 42 reactors"),  # a digit
        ("# Results of 2021", "Results of 2021"),
        ("## One two three four five six seven eight nine", NINE),
        ("## The base has forty two reactors in the desert", FORTY_TWO),
        ("#   The base has 42 reactors [a:1]  ", "The base has 42 reactors [a:1]"),
    ],
)
def test_a_heading_is_a_claim_unless_a_title(heading: str, claim: str | None) -> None:
    want = [] if claim is None else [claim]
    assert texts(f"{heading}\nBody [a:1].") == [*want, "Body [a:1]."]
    assert texts(f"Before [a:1]\n{heading}") == ["Before [a:1]", *want]


@pytest.mark.parametrize(
    "title",
    [
        "The plant has \u2468\u2468 reactors",  # circled digits
        "The plant has \u2079\u2079 reactors",  # superscript digits
        "The plant has \u0669 reactors",  # an Arabic-Indic digit
        "Chapter \u216b of the report",  # a Roman numeral character
        "The pump moves \u00bd litre",  # a vulgar fraction
        "The base has forty-two reactors",  # a number word
        "A dozen reactors failed",
        "Zero staff on site",
    ],
)
def test_a_heading_with_any_number_is_a_claim(title: str) -> None:
    assert texts(f"# {title}\nBody [a:1].") == [title, "Body [a:1]."]
    assert fed(f"# {title}\nBody [a:1].", list(f"# {title}\nBody [a:1].")) == segment(
        f"# {title}\nBody [a:1].", PARSER, EXEMPT
    )


NINE_WORDS = ["The", "plant", "has", "no", "safety", "staff", "and", "the", "director"]


@pytest.mark.parametrize("blank", ["\u2800", "\u3164", "\u115f", "\u1160", "\uffa0", "\u3000"])
def test_blank_looking_characters_split_the_words_of_a_heading(blank: str) -> None:
    title = blank.join(NINE_WORDS)
    assert texts(f"## {title}\nBody [a:1].") == [title, "Body [a:1]."]
    short = blank.join(["Battery", "and", "charging"])
    assert texts(f"## {short}\nBody [a:1].") == ["Body [a:1]."]


def test_title_words_is_a_policy_setting() -> None:
    assert texts("## Battery and charging\nX [a:1].", title_words=2) == [
        "Battery and charging", "X [a:1].",
    ]
    assert texts("## Battery and charging", title_words=3) == []
    assert ClaimsSpec().title_words == 8 and ClaimsSpec().code == "exempt"


def test_a_heading_of_two_sentences_is_two_claims_and_ends_with_its_line() -> None:
    assert texts("## It has 4 rooms. It is old\ncontinued [a:1].") == [
        "It has 4 rooms.", "It is old", "continued [a:1].",
    ]


# -- code --------------------------------------------------------------------------------------


CODE = "Intro [a:1].\n```python\nx = 42. The base has 42 reactors.\n\nprint(x)\n```\nAfter [a:1]."


def test_fenced_code_is_exempt_by_default_and_checked_with_code_check() -> None:
    assert texts(CODE) == ["Intro [a:1].", "After [a:1]."]
    assert texts(CODE, code="check") == [
        "Intro [a:1].", "x = 42.", "The base has 42 reactors.", "print(x)", "After [a:1].",
    ]
    # An unclosed fence runs to the end of the text.
    assert texts("Yes [a:1].\n~~~\nThe base has 42 reactors", code="check") == [
        "Yes [a:1].", "The base has 42 reactors",
    ]


def test_indented_text_is_prose_not_code() -> None:
    assert texts("Intro [a:1].\n\n    The base has 42 reactors.\n") == [
        "Intro [a:1].", "The base has 42 reactors.",
    ]


@pytest.mark.parametrize(
    "line", ["```x```", "```x``", "``` a ` b", "````py `x`", " ```a`", "```py print(`x`)"]
)
def test_a_backtick_line_with_a_backtick_after_its_opener_is_no_fence(line: str) -> None:
    # CommonMark: a backtick fence's info string holds no backtick; the line is inline code.
    text = f"Intro [a:1].\n\n{line}\n\nThe base has 42 reactors [a:1].\n"
    assert texts(text)[-1] == "The base has 42 reactors [a:1]."
    assert texts(text)[1] == line.strip()
    # A tilde fence's info string may hold anything.
    assert texts("Intro [a:1].\n~~~ a ` b\nThe base has 42 reactors.\n~~~\n") == ["Intro [a:1]."]


def test_a_backtick_fence_line_is_decided_at_its_end_in_a_stream() -> None:
    # "```py x" could still become "```py x`" (no fence): the line waits for its end.
    deltas = ["Intro [a:1].\n\n", "```py", " x = 1", "`\n", "The base has 42 reactors [a:1]."]
    assert [s.text for s in fed("".join(deltas), deltas)] == [
        "Intro [a:1].", "```py x = 1`\nThe base has 42 reactors [a:1].",
    ]
    seg = ClaimSegmenter(PARSER, EXEMPT)
    assert [[s.text for s in seg.feed(d)] for d in ["Intro [a:1].\n", "```py", " x = 1"]] == [
        [], [], [],
    ]
    assert [s.text for s in seg.feed("\n")] == ["Intro [a:1]."]  # a fence: it ends the claim


def test_a_fence_in_a_list_item_ends_with_the_item() -> None:
    # A non-blank line indented less than the opening fence ends the code block.
    text = "- Intro [a:1].\n  ```\n  x = 1\n\nThe base has 42 reactors [a:1].\n"
    assert texts(text) == ["Intro [a:1].", "The base has 42 reactors [a:1]."]
    assert texts("1. Intro [a:1].\n   ~~~\n   x = 1\n  The base has 42 reactors.\n") == [
        "Intro [a:1].", "The base has 42 reactors.",
    ]
    # Lines indented at least as far, blank lines and tab-indented lines stay code.
    code = "- Intro [a:1].\n  ```\n  x = 1. It has 42.\n\n   y = 2.\n\tz = 3.\n \n  ```\nOut [a:1]."
    assert texts(code) == ["Intro [a:1].", "Out [a:1]."]
    # Stricter than CommonMark (fail closed): a top-level fence indented 1-3 spaces reads its
    # less indented lines as prose.
    assert texts(" ```\nx = 42.\n ```\n") == ["x = 42."]
    # A less indented closing fence closes the block: it never opens a new one.
    for opener in (" ```", "   ```", "- a [a:1].\n  ```"):
        text = f"{opener}\n   code. It has 42.\n``` \nThe base has 42 reactors [a:1].\n"
        assert texts(text)[-1:] == ["The base has 42 reactors [a:1]."]
        assert not [c for c in texts(text) if "code" in c]
        for deltas in (list(text), [text[:9], text[9:]]):
            assert [s.text for s in fed(text, deltas)] == texts(text)


def test_a_fence_in_a_list_item_ends_with_the_item_in_a_stream() -> None:
    text = "- Intro [a:1].\n  ```\n  x = 1\n The base has 42 reactors [a:1]. Next"
    for deltas in (list(text), [text[:25], text[25:40], text[40:]]):
        assert [s.text for s in fed(text, deltas)] == [
            "Intro [a:1].", "The base has 42 reactors [a:1].", "Next",
        ]
    seg = ClaimSegmenter(PARSER, EXEMPT)
    seg.feed("Intro [a:1].\n  ```\n")
    assert seg.feed(" ") == []
    assert [s.text for s in seg.feed("T")] == []
    assert [s.text for s in seg.feed("he base [a:1]. N")] == ["The base [a:1]."]


HIDDEN = "The base has 99 reactors."


@pytest.mark.parametrize(
    ("opener", "fence", "closer"),
    [
        ("<!--", "```", "-->"),  # a comment (HTML block type 2)
        ("<!--", "~~~", "-->"),
        ("<!-- note", "```-->", ""),  # the fence line ends the comment
        ("<!--\n", "```", "\n-->"),  # blank lines do not end a comment
        ("   <!--", "```", "-->"),  # up to three spaces of indent
        ("<script>", "```", "</script>"),  # type 1, ended by any of its closing tags
        ('<SCRIPT type="x">', "```", "</pre>"),
        ("<pre", "~~~", "x </PRE> y"),
        ("<style>", "```", "</style>"),
        ("<textarea>", "```", "</textarea>"),
        ("<?php", "```", "?>"),  # type 3
        ("<!DOCTYPE", "```", ">"),  # type 4
        ("<![CDATA[", "```", "]]>"),  # type 5
        ("<div>", "```", "</div>\n"),  # type 6, ended by a blank line
        ("<div>\n\f", "```", "</div>\n"),  # a line of a form feed is no blank line
        ("</section>", "```", "\n"),
        ("<span>", "```", "\n"),  # type 7
        ("<x-y a=1>", "```", "\n"),
        ("<!x-y", "```", "\n"),  # type 4, ended by ">"
        ("<!-x", "```", "\n"),  # started liberally (fail closed): "<" and a letter, "/", "!"
        ("<!-->", "```", "\n"),  # "-->" counts after the opening "<!--" only
        ("- <!--", "  ```", "  -->"),  # in a list item
        ("1. <!--", "```", "-->"),
        ("1970. <!--", "```", "-->"),
    ],
)
def test_a_fence_line_inside_an_html_block_is_prose(opener: str, fence: str, closer: str) -> None:
    # A markdown renderer shows an HTML block as raw HTML: a fence line in it opens no code
    # block, and the text after the block is shown as prose. It is checked.
    text = f"Intro [a:1].\n{opener}\n{fence}\n{closer}\n{HIDDEN}\n"
    got = texts(text)
    assert any(c.endswith(HIDDEN) for c in got), got
    assert [s.text for s in fed(text, list(text))] == got
    assert [s.text for s in fed(text, [text[:17], text[17:20], text[20:]])] == got
    # Both fences hidden: the text between them is prose too.
    both = f"{opener}\n{fence}\n{closer}\n{HIDDEN}\n{opener}\n{fence}\n{closer}\n"
    assert any(HIDDEN in c for c in texts(both)), texts(both)


@pytest.mark.parametrize(
    "block",
    [
        "<!-- -->",  # a comment of one line
        "<!--\n-->",
        "<div>\n</div>\n",  # type 6, ended by a blank line
        "<script>\n</script>",
        "<? ?>",
        "    <!--",  # four spaces: no HTML block (indented text)
        "<",
        "< div>",
        "<1>",
    ],
)
def test_a_fence_after_an_html_block_is_code(block: str) -> None:
    text = f"Intro [a:1].\n{block}\n```\n{HIDDEN}\n```\nAfter [a:1].\n"
    got = texts(text)
    assert not any(HIDDEN in c for c in got), got
    assert got[-1] == "After [a:1]."
    assert [s.text for s in fed(text, list(text))] == got


def test_html_inside_code_and_headings_inside_html() -> None:
    # A comment opener in a code block is code: the fence after it closes the block.
    assert texts(f"```\n<!--\n```\n{HIDDEN}\n") == [HIDDEN]
    # A heading line inside an HTML block is raw text, not a title.
    assert texts("<div>\n# Short title\n</div>") == ["<div>\n# Short title\n</div>"]


@pytest.mark.parametrize(
    ("text", "claims"),
    [
        ("Intro [a:1].\n\n```\nfoo\r```\rThe base has 42 reactors [a:1].\n```\n",
         ["Intro [a:1].", "The base has 42 reactors [a:1]."]),
        ("# Base\rThe base has reactors", ["The base has reactors"]),
        ("Intro [a:1].\r- one [a:1]\r1. two\r", ["Intro [a:1].", "one [a:1]", "two"]),
        ("No period here\r\rNext [a:1]", ["No period here", "Next [a:1]"]),
        ("Above\r---\rBelow", ["Above", "Below"]),
        ("A wrapped\rsentence [a:1].", ["A wrapped\rsentence [a:1]."]),
        # "\r\r\n" is two line ends: a blank line between.
        ("No period here\r\r\nNext [a:1]", ["No period here", "Next [a:1]"]),
        ("One [a:1].\r\n- two [b:1]\r\n", ["One [a:1].", "two [b:1]"]),
    ],
)
def test_a_lone_carriage_return_ends_a_line(text: str, claims: list[str]) -> None:
    assert texts(text) == claims
    for deltas in (list(text), [text], [text[: len(text) // 2], text[len(text) // 2 :]]):
        assert [s.text for s in fed(text, deltas)] == claims


def test_a_carriage_return_at_the_end_of_a_delta_waits_for_the_next_character() -> None:
    seg = ClaimSegmenter(PARSER, EXEMPT)
    assert seg.feed("Foo is 3 [a:1].\r") == []
    assert [s.text for s in seg.feed("B")] == []  # "B" may be a label ("B)")
    assert [s.text for s in seg.feed("ar is 4.")] == ["Foo is 3 [a:1]."]
    seg = ClaimSegmenter(PARSER, EXEMPT)
    seg.feed("Intro [a:1].\n```\nx\r")
    assert seg.feed("```") == []
    assert seg.feed("\rThe base has 42 reactors. ") == []
    assert [s.text for s in seg.feed("Next")] == ["The base has 42 reactors."]


# -- exemptions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "I don't know.",
        "I don’t know.",
        "I do not know the answer to that question.",
        "I'm not sure.",
        "I cannot find that in the provided context.",
        "The provided context does not mention this.",
        "I don't know [a:1].",
        "  I don't know  ",
    ],
)
def test_abstentions_are_exempt(text: str) -> None:
    segs = segment(text, PARSER, EXEMPT)
    assert [s.exempt for s in segs] == [True]


@pytest.mark.parametrize(
    "text",
    [
        "I don't know, but the base has 42 reactors.",
        "I don't know why the base has 42 reactors.",
        "I'm not sure the base has 42 reactors.",
        "The context does not mention that the base was closed in 1970, which it was.",
        "The base has 42 reactors. I don't know",
        "I don't know [a:1] the base has 42 reactors.",
    ],
)
def test_an_abstention_with_a_claim_is_a_claim(text: str) -> None:
    segs = segment(text, PARSER, EXEMPT)
    assert segs and not any(s.exempt and "42" in s.text for s in segs)
    assert not any(s.exempt and "1970" in s.text for s in segs)


def test_exempt_match_needs_the_whole_claim() -> None:
    pats = [re.compile(r"Disclaimer: .*"), re.compile(r"(?i)n/a\.?")]
    assert exempt_match("Disclaimer: none", [], pats)
    assert not exempt_match("See Disclaimer: none", [], pats)
    assert exempt_match("N/A [a:1].", [(4, 9)], pats)
    assert not exempt_match("N/A or 42 [a:1].", [(10, 15)], pats)
    assert not exempt_match("I don't know.", [], [])


# -- list labels -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "label", ["1.", "2)", "(3)", "12.", "a.", "b)", "(c)", "C)", "(D)", "iv.", "ii)", "(iii)",
              "-", "*", "+", "•", "◦", "▪", "‣", "–"],
)
def test_list_labels_are_dropped(label: str) -> None:
    assert texts(f"Intro [a:1].\n{label} Choose the 5 kW mode [a:1].") == [
        "Intro [a:1].", "Choose the 5 kW mode [a:1].",
    ]
    assert list_label_end(f"{label} Choose the 5 kW mode.") == len(label) + 1
    assert list_label_end(f"  {label}\tChoose") == len(label) + 3


@pytest.mark.parametrize(
    "text", ["1970. The base opened.", "1970) The base opened.", "-5 degrees.", "A. Smith.",
             "Choose 1.", "1.", "e.g. this", "ab) no"],
)
def test_what_is_not_a_label(text: str) -> None:
    assert list_label_end(text) == 0


def test_a_long_number_starts_an_item_but_stays_in_the_claim() -> None:
    assert texts("Intro [a:1]\n1970. The base opened [a:1].") == [
        "Intro [a:1]", "1970.", "The base opened [a:1].",
    ]


# -- streams -----------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(split_texts(), st.sampled_from([(8, "exempt"), (2, "check"), (0, "check")]))
def test_any_split_gives_the_same_claims_with_every_setting(
    sample: tuple[str, list[str]], setting: tuple[int, str]
) -> None:
    text, deltas = sample
    words, code = setting
    assert fed(text, deltas, title_words=words, code=code) == segment(
        text, PARSER, EXEMPT, title_words=words, code=code  # type: ignore[arg-type]
    )


@settings(max_examples=200, deadline=None)
@given(split_texts(), st.sampled_from(["exempt", "check"]))
def test_released_claims_depend_only_on_the_text_seen(
    sample: tuple[str, list[str]], code: str
) -> None:
    _, deltas = sample
    seg = ClaimSegmenter(PARSER, EXEMPT, code=code)  # type: ignore[arg-type]
    got: list[Segment] = []
    seen = ""
    for d in deltas:
        got.extend(seg.feed(d))
        seen += d
        assert got == ClaimSegmenter(PARSER, EXEMPT, code=code).feed(seen)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "unit",
    [
        "The station has 42 pumps [a:1]. ",  # sentences
        "word " * 5,  # one sentence that never ends
        "[an unclosed bracket with spaces ",  # a "[" that never closes
        "e.g. ",  # abbreviations: no sentence ends
    ],
)
def test_a_long_line_is_walked_with_a_bounded_window(unit: str) -> None:
    # Whatever one line holds, the segmenter keeps only the open claim and a bounded tail
    # after its last cut: each delta costs the same however long the line has grown.
    seg = ClaimSegmenter(PARSER, EXEMPT)
    text = unit * 400
    longest = 0
    segs: list[Segment] = []
    for i in range(0, len(text), 7):
        segs.extend(seg.feed(text[i : i + 7]))
        longest = max(longest, len(seg._buf))
    assert longest <= MAX_GROUP + 2 * len(unit) + 16
    segs.extend(seg.finish())
    assert segs == segment(text, PARSER, EXEMPT)


def test_an_undecided_line_is_not_joined_per_delta() -> None:
    # A line of rule characters stays undecided until it ends; its deltas wait unjoined.
    seg = ClaimSegmenter(PARSER, EXEMPT)
    seg.feed("Intro [a:1].\n")
    for _ in range(2000):
        assert seg.feed("- ") == []
    assert len(seg._buf) < 20
    assert [s.text for s in seg.feed("x\n")] == ["Intro [a:1]."]


def test_a_bracket_group_longer_than_max_group_is_prose() -> None:
    body = "a:" + "b" * MAX_GROUP
    assert segment(f"Foo [{body}].", PARSER)[0].citations == ()
    short = "a:" + "b" * (MAX_GROUP - 2)
    assert [c.id for c in segment(f"Foo [{short}].", PARSER)[0].citations] == [short]


@pytest.mark.parametrize(
    ("text", "exempt"),
    [
        ("I cannot answer questions about other employees' salaries.", True),
        ("I can't help with that.", True),
        ("I can't help with that, but the base has 42 reactors.", False),
        ("I cannot answer questions about the 42 reactors.", False),
        ("I cannot answer questions about the forty reactors.", False),
        ("I cannot discuss why the base was closed because it leaked radiation.", False),
        ("I cannot discuss the base which leaked radiation.", False),
        ("I cannot answer questions about the base and its leaking reactors today.", False),
    ],
)
def test_a_refusal_with_a_short_topic_is_exempt(text: str, exempt: bool) -> None:
    assert [s.exempt for s in segment(text, PARSER, EXEMPT)] == [exempt]

"""`ClaimSegmenter.whole` (a text in one piece) against the same text fed in any pieces.

The incremental walk (`feed` / `finish`) is the reference: whatever the text and however it is
split into deltas, `whole(text)` must return exactly its segments — spans, text, citations
with their offsets and `malformed` reasons, and `exempt`.
"""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.citations import CitationParser
from gateway.claims import ClaimSegmenter, Segment, segment
from gateway.policy import Citations, ClaimsSpec

PARSERS = {
    "doc-chunk": CitationParser(Citations(format="doc-chunk")),
    "numeric": CitationParser(Citations(format="numeric")),
    "footnote": CitationParser(Citations(format="footnote")),
    "regex": CitationParser(
        Citations(format="regex", pattern=r"<(?P<id>[\w:]*)(?:@(?P<version>\w*))?>")
    ),
}
# The default exempt patterns as a policy compiles them at load.
DEFAULT_EXEMPT = ClaimsSpec().exempt_re
EXEMPTS: list[list[re.Pattern[str]]] = [
    [],
    list(DEFAULT_EXEMPT),
    [*DEFAULT_EXEMPT, *(re.compile(p) for p in (r"^Disclaimer", r"(?i)maybe", r"\[a:1\]$"))],
]

# Pieces rich in what decides a claim's end: abbreviations, initials, decimals and versions,
# terminator runs and closers, markers before and after terminators, links and images,
# bracketed prose, malformed markers of every format, line kinds, CRLF and odd whitespace.
_PIECES = st.sampled_from(
    [
        # words and sentences
        "Foo is 3.", "Bar", "bar", " and", "Baz!", "why?", "Really?!", "wait...", "so…",
        "It rose... and fell.", "I don't know.", "Disclaimer: none.", "maybe so.", "É", "ß",
        "泵由X设计。", "是吗？", "好！", "。」", "｡", "هل؟", "है।", "．", "‼", "Ok։", "[a:1]。",
        "élan.", "Ωmega.", "x", "42", "١٢", "_under_",
        # abbreviations, initials, decimals, versions
        "e.g. ", "i.e. ", "Dr. ", "dr. ", "U.S. ", "U.S.A. ", "J. ", "J.R.R. ", "Sec. ", "etc.",
        "(e.g. ", "\"Dr. ", "cf.", "vs.", "62.5 kWh", "3.1", "v2.1.3", "A.", "a.", "No.", "1.5.",
        "approx. ", "(approx.", "**Sec.", "U.S.A.B.", "xapprox.", "softwares.", "_Dr.", "İNC.",
        # terminators with closers
        '."', ".'", ".)", ".”", ".’", "!»", "?*", "._", '!")', "…)", ")", '"', "“q”",
        # citation markers of every format, well formed and not
        "[a:1]", "[b:2, c:3]", "[:1]", "[a:]", "[a:1@v2]", "[a:1@]", "[hr :leave]",
        "[doc: 3]", "[Warning: deprecated]", "[Note: prose]", "[see]", "[see above. Ok]",
        "[https://x.y:1]", "[a:1\u200b]", "[a:1][b:2]", "[1]", "[1, 2]", "[1a]", "[ 3 ]",
        "[^1]", "[^ x]", "[^]", "<a>", "<b@2>", "<c@>", "<>",
        # links, images, stray brackets
        "[x](y)", "![x](y)", "![a:1]", "[t](u. v)", "[a:1](z)", "[", "]", "(", "!", "Wow![a:1]",
        "[x]([a:1])",
        # line kinds
        "- ", "* ", "+ ", "1. ", "2) ", "12 ", "# Head", "## Sub ", "#no", "```", "```py",
        "~~~", "````", "---", "***", "___", "===", "- - -", "    ",
        # inline code that looks like a fence, fences indented as in list items, cited headings
        "```x```", "``` `", "`", "  ```", "   ~~~", " ```", "  x", "# T [a:1]", "## T [a: 1]",
        # HTML blocks: their starts and ends, fence lines inside them
        "<!--", "-->", "<!-- -->", "<div>", "</div>", "<script>", "</SCRIPT>", "<?x", "?>",
        "<!X", ">", "<![CDATA[", "]]>", "<pre ", "<", "<p", "- <!--", "<!-->",
        # whitespace other than a space inside a marker's half
        "[kb:\u00a0x]", "[kb:\tx]", "[kb\u3000:x]", "[1,\u00a02]",
        # whitespace
        " ", " ", "  ", "\t", "\n", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u2028", "\x0b",
        "\f", "\r", "\r\r", "\u3000",
    ]
)


# What a line can start with (its kind) and how it can end.
_LINE_STARTS = st.sampled_from(
    [
        "", "", "", "- ", "* ", "+ ", "1. ", "2) ", "12 ", "١. ", "  - ", "\t1. ", "-", "1.",
        "#", "# ", "## Sub", "####### ", " # ", "```", "~~~", "````", "``", "---", "***", "___",
        "===", "- - -", "--", "    ", " ", "\t", "\u00a0",
        "  ```", " ```", "   ~~~", "```x`", "``` a `", "  ", "   ", "  \t", "\r", "# T [a:1] ",
        "<!--", "<!-- ", "-->", "<div>", "</p>", "<script>", "<pre", "<?", "<!D", "<![CDATA[",
        "   <!--", "    <!--", "- <!--", "1. <div>", "<", "\f",
    ]
)
_LINE_ENDS = st.sampled_from(
    ["\n", "\n", "\r\n", "\r\r\n", "\r", "\n\n", " \n", "\t\r\n", "\r\r", "\r\n\r"]
)


@st.composite
def split_texts(draw: st.DrawFn, max_pieces: int = 40) -> tuple[str, list[str]]:
    """A text and one way of cutting it into deltas."""
    if draw(st.booleans()):
        text = "".join(draw(st.lists(_PIECES, max_size=max_pieces)))
    else:  # lines of a kind, so that line starts and ends meet often
        lines = draw(
            st.lists(
                st.tuples(_LINE_STARTS, st.lists(_PIECES, max_size=6), _LINE_ENDS),
                max_size=max(1, max_pieces // 4),
            )
        )
        text = "".join(a + "".join(b) + c for a, b, c in lines)
        rstrip: bool = draw(st.booleans())
        if lines and rstrip:
            text = text.rstrip("\n")
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=10)))
    deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return text, deltas


def incremental(seg: ClaimSegmenter, deltas: list[str]) -> list[Segment]:
    out: list[Segment] = []
    for d in deltas:
        out.extend(seg.feed(d))
    out.extend(seg.finish())
    return out


def assert_same(text: str, deltas: list[str], fmt: str, exempt_set: int) -> None:
    parser, exempt = PARSERS[fmt], EXEMPTS[exempt_set]
    want = incremental(ClaimSegmenter(parser, exempt), deltas)
    got = ClaimSegmenter(parser, exempt).whole(text)
    assert got == want
    assert segment(text, parser, exempt) == want
    for s in got:
        assert text[s.start : s.end] == s.text
        for c in s.citations:
            assert s.start <= c.start <= c.end <= s.end


@settings(max_examples=700, deadline=None)
@given(split_texts(), st.sampled_from(sorted(PARSERS)), st.integers(0, len(EXEMPTS) - 1))
def test_whole_equals_the_incremental_walk(
    sample: tuple[str, list[str]], fmt: str, exempt_set: int
) -> None:
    text, deltas = sample
    assert_same(text, deltas, fmt, exempt_set)


_CHARS = st.sampled_from(
    list("aZé1 .!?…\"')»*_[]():@^,-+#`~=<>\n\r\t\u00a0\u2028!。！？」؟．\u3000\r`")
)


@settings(max_examples=500, deadline=None)
@given(st.text(_CHARS, max_size=120), st.sampled_from(sorted(PARSERS)), st.data())
def test_whole_equals_the_incremental_walk_on_character_soup(
    text: str, fmt: str, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    deltas = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert_same(text, deltas, fmt, 2)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=150))
def test_whole_equals_the_incremental_walk_on_any_text(text: str) -> None:
    assert_same(text, [text], "doc-chunk", 1)


@settings(max_examples=150, deadline=None)
@given(split_texts(max_pieces=25))
def test_whole_equals_one_character_at_a_time(sample: tuple[str, list[str]]) -> None:
    text, _ = sample
    assert_same(text, list(text), "doc-chunk", 1)


@pytest.mark.parametrize(
    "text",
    [
        "Orbit DB stores 64 MB [doc:1]. Segments compact [doc:1]. Cold ones move [doc:2].",
        "Foo. [a:1] Bar [b:2]. Baz [c:1][d:2]. Qux.",
        "Dr. Smith of the U.S. board approved v2.1.3. [a:1] J. R. R. Tolkien wrote it.",
        "It rose... and fell?! Then \"it stopped.\" (Really.) Next [a:1].",
        "See [the docs](https://x.y/a:b). Then ![img](z) and [Note: prose] [hr :leave].",
        "Intro [a:1].\r\n- one [a:1]\r\n1) two\r\n\r\n# Head [b:2]\r\n```\nNo. [z:9]\n```\nEnd",
        "Wrapped\nsentence [a:1].\n---\n  \n***\n- \n[a:1]\nI don't know.",
        "",
        "\n\n",
        "[a:1]",
        # Words before a "." that are or are not abbreviations, at the length of the longest.
        "It was approx. Ten [a:1]. Then (approx. Ten). Then xapprox. Ten. Then **approx. Ten.",
        "From the U.S.A.B. Board [a:1]. From the U.S.A.B.C.D. Board. From the USABCDE. Board.",
        "Said \"\"\"\"\"\"Dr. Who. Said Abcdefg. Who. Said İNC. Who [a:1].",
    ],
)
def test_whole_examples(text: str) -> None:
    for fmt in PARSERS:
        for k in range(len(EXEMPTS)):
            assert_same(text, [text], fmt, k)
            assert_same(text, list(text), fmt, k)


def test_whole_leaves_the_segmenter_alone() -> None:
    seg = ClaimSegmenter(PARSERS["doc-chunk"], DEFAULT_EXEMPT)
    assert [s.text for s in seg.feed("Foo [a:1]. Ba")] == ["Foo [a:1]."]
    assert [s.text for s in seg.whole("One [b:1]. Two.")] == ["One [b:1].", "Two."]
    assert seg.feed("r.") == []
    assert [s.text for s in seg.finish()] == ["Bar."]
    assert [s.text for s in seg.whole("Three.")] == ["Three."]


def test_whole_citations_and_exempt() -> None:
    segs = ClaimSegmenter(PARSERS["doc-chunk"], DEFAULT_EXEMPT).whole(
        "I don't know [a:1]. Fact [b:2, :3]. [doc: 3]"
    )
    assert [(s.text, s.exempt) for s in segs] == [
        ("I don't know [a:1].", True),
        ("Fact [b:2, :3]. [doc: 3]", False),
    ]
    cits = segs[1].citations
    assert [(c.id, c.start, c.end, c.malformed) for c in cits] == [
        ("b:2", 26, 29, None),
        (":3", 31, 33, "empty half"),
        ("doc: 3", 37, 43, "whitespace inside a half"),
    ]

import pytest

from gateway.citations import CitationParser, forbidden_char
from gateway.policy import Citations
from gateway.types import Citation


def parse(text: str, fmt: str = "doc-chunk", pattern: str | None = None) -> list[Citation]:
    return CitationParser(Citations(format=fmt, pattern=pattern)).find(text)  # type: ignore[arg-type]


def ids(text: str, fmt: str = "doc-chunk") -> list[str]:
    return [c.id for c in parse(text, fmt)]


def test_doc_chunk_single_with_offsets() -> None:
    text = "Foo is 3 [manual:12]."
    (c,) = parse(text)
    assert c.id == "manual:12" and c.raw == "manual:12" and c.malformed is None
    assert text[c.start : c.end] == "manual:12"


def test_doc_chunk_adjacent_and_comma_lists() -> None:
    assert ids("x [a:1][b:2]") == ["a:1", "b:2"]
    cits = parse("x [a:1, b:2]")
    assert [(c.id, c.raw) for c in cits] == [("a:1", "a:1"), ("b:2", "b:2")]
    assert all(c.malformed is None for c in cits)


def test_doc_chunk_version() -> None:
    (c,) = parse("[doc:3@v7]")
    assert (c.id, c.version, c.malformed) == ("doc:3", "v7", None)
    (e,) = parse("[doc:3@]")
    assert e.malformed == "empty version"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[:1]", "empty half"),
        ("[a:]", "empty half"),
        ("[a:1:2]", "colon inside a half"),
        ("[my doc:1]", "whitespace inside a half"),
        ("[a:1 2]", "whitespace inside a half"),
        ("[a:1, :2]", "empty half"),
        ("[a\u200b:1]", "zero-width character U+200B"),
        ("[a:\u2060x]", "zero-width character U+2060"),
        ("[\ufeffa:1]", "zero-width character U+FEFF"),
        ("[a:1\u202e]", "bidi character U+202E"),
        ("[a\u2066:1]", "bidi character U+2066"),
        ("[a\u200f:1]", "bidi character U+200F"),
        ("[a\u061c:1]", "bidi character U+061C"),
        ("[a\x07:1]", "control character U+0007"),
    ],
)
def test_doc_chunk_malformed(text: str, reason: str) -> None:
    bad = [c.malformed for c in parse(text) if c.malformed]
    assert bad and bad[0] == reason


def test_homoglyph_id_is_kept_verbatim() -> None:
    (c,) = parse("[dаta:1]")  # Cyrillic а
    assert c.id == "dаta:1" and c.id != "data:1" and c.malformed is None


@pytest.mark.parametrize(
    "text",
    [
        "[see above]",
        "[1/2]",
        "- [x] done",
        "- [ ] open item",
        "[link](https://example.com/a:b)",
        "![img:1](pic.png)",
        "[Note: read this]",
        "[https://example.com]",
        "a:1 without brackets",
        "[Warning: deprecated]",
    ],
)
def test_not_citations(text: str) -> None:
    assert parse(text) == []


@pytest.mark.parametrize(
    "text",
    [
        "[a :1]", "[hr: leave]", "[doc: 3]", "[a:1, b :2]",
        # Any whitespace, not only a space: NBSP, tab, ideographic and other Unicode spaces.
        "[kb:\u00a0orbit]", "[kb:\torbit]", "[kb\u3000:orbit]", "[kb\u2003:\u00a01]",
        "[a:1, kb:\u202forbit]", "[kb \u00a0: orbit]",
    ],
)
def test_whitespace_beside_the_colon_is_a_malformed_citation(text: str) -> None:
    cits = parse(text)
    assert cits and cits[-1].malformed == "whitespace inside a half"


@pytest.mark.parametrize("text", ["[Warning:\u00a0deprecated]", "[Note:\tRead this]"])
def test_prose_with_other_whitespace_after_the_colon_stays_prose(text: str) -> None:
    assert parse(text) == []


def test_find_range_and_base() -> None:
    text = "[a:1] middle [b:2] end [c:3]"
    p = CitationParser(Citations())
    got = p.find(text, 6, 20)
    assert [c.id for c in got] == ["b:2"]
    assert text[got[0].start : got[0].end] == "b:2"
    shifted = p.find(text, 6, 20, base=100)
    assert shifted[0].start == got[0].start + 100


def test_numeric() -> None:
    assert ids("Foo [1] bar [2, 3].", "numeric") == ["1", "2", "3"]
    assert ids("[a:1] [x] [1/2] [see 1]", "numeric") == []
    bad = parse("[1\u200b]", "numeric")
    assert bad[0].malformed == "zero-width character U+200B"
    assert parse("[1,,2]", "numeric")[1].malformed == "empty id"


def test_footnote() -> None:
    (c,) = parse("Foo.[^12]", "footnote")
    assert c.id == "12" and c.malformed is None
    assert ids("[1] [a:1]", "footnote") == []
    assert parse("[^]", "footnote")[0].malformed == "empty id"
    assert parse("[^1\u200d]", "footnote")[0].malformed == "zero-width character U+200D"


def test_regex_format() -> None:
    pat = r"\{\{(?P<id>[^}@]*)(?:@(?P<version>[^}]*))?\}\}"
    cits = parse("Foo {{k1}} bar {{k2@3}} {{}}", "regex", pat)
    assert [(c.id, c.version) for c in cits] == [("k1", None), ("k2", "3"), ("", None)]
    assert cits[2].malformed == "empty id"


def test_regex_format_needs_id_group() -> None:
    with pytest.raises(ValueError):
        CitationParser(Citations(format="regex", pattern=r"\{(\w+)\}"))
    with pytest.raises(ValueError):
        CitationParser(Citations(format="regex"))


def test_forbidden_char() -> None:
    assert forbidden_char("plain:1") is None
    assert forbidden_char("a\u202ab") == "bidi character U+202A"

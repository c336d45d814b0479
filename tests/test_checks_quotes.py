import pytest

from gateway.checks.quotes import QuoteMismatch, quotes_in
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

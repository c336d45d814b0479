"""Numbers and quotations a reader sees but the checks once read otherwise, run through the real
`citewarden verify` (the proxy's code path, offline): a native citation's own `cited_text`
taken as its source, HTML character references, markup between digits, no-break-space and
apostrophe thousands separators, unrecognised quotation marks, and number forms read as text
(look-alike letters and digits, subscripts, Roman numeral characters, a misspelt number word).
Each answer below must not be released; positive controls with correct content must be."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.offline import verify_exchange

_RAG_POLICY = """name: more2
routes:
  - name: kb
    match: {path: /rag}
    protocol: rag-json
    rag: {answer: /answer, context: /sources}
citations: {format: doc-chunk}
context: {from: [response]}
checks: [missing_citation, malformed_citation, hallucinated_citation, stale_source,
         quote_mismatch, number_mismatch]
"""

_NATIVE_POLICY = """name: more2-native
routes:
  - name: msgs
    match: {path: /v1/messages}
    protocol: anthropic-messages
checks: [missing_citation, malformed_citation, hallucinated_citation, stale_source,
         number_mismatch]
"""


def _verify(
    tmp_path: Path, policy: str, protocol: str, request: dict[str, Any], response: dict[str, Any]
) -> dict[str, Any]:
    (tmp_path / "p.yaml").write_text(policy)
    (tmp_path / "req.json").write_text(json.dumps(request))
    (tmp_path / "resp.json").write_text(json.dumps(response))
    out = io.StringIO()
    rc = verify_exchange(
        policy_path=str(tmp_path / "p.yaml"), protocol=protocol,
        request_path=str(tmp_path / "req.json"), response_path=str(tmp_path / "resp.json"),
        route_name=None, out=out,
    )
    assert rc in (0, 1), out.getvalue()
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def _rag(tmp_path: Path, answer: str, chunk: str) -> str:
    report = _verify(
        tmp_path, _RAG_POLICY, "rag-json", {"question": "q"},
        {"answer": answer, "sources": [{"id": "kb:1", "text": chunk}]},
    )
    decision: str = report["decision"]
    return decision


# -- a native citation is read in the request's document, not in its own cited_text -----------

_DOCUMENT = "The plant has 42 reactors."


def _native(tmp_path: Path, answer: str, cited_text: str, start: int, end: int) -> str:
    request = {"model": "claude-x", "max_tokens": 100, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": _DOCUMENT},
         "citations": {"enabled": True}},
        {"type": "text", "text": "How many reactors?"}]}]}
    response = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1},
        "content": [{"type": "text", "text": answer, "citations": [
            {"type": "char_location", "cited_text": cited_text, "document_index": 0,
             "document_title": None, "start_char_index": start, "end_char_index": end}]}],
    }
    decision: str = _verify(tmp_path, _NATIVE_POLICY, "anthropic-messages", request,
                            response)["decision"]
    return decision


def test_a_native_citation_s_cited_text_does_not_support_its_number(tmp_path: Path) -> None:
    # The upstream wrote "99" into cited_text; the document it cites says 42.
    answer = "The plant has 99 reactors."
    assert _native(tmp_path, answer, answer, 0, 26) != "released"


def test_a_native_citation_s_number_in_the_cited_slice_is_released(tmp_path: Path) -> None:
    answer = "The plant has 42 reactors."
    assert _native(tmp_path, answer, _DOCUMENT, 0, 26) == "released"


def test_a_native_citation_out_of_the_document_supports_no_number(tmp_path: Path) -> None:
    answer = "The plant has 42 reactors."
    assert _native(tmp_path, answer, _DOCUMENT, 0, 999) != "released"


# -- text a reader sees otherwise than it is written --------------------------------------------

# The cited chunk (kb:1) for every case below.
_CHUNK = (
    "The plant has 42 reactors. Units 4 and 3 were upgraded. Output is 4 GW. "
    'The director said "safety comes first" at the opening.'
)

SHOWN_OTHERWISE: dict[str, str] = {
    "reference-hex-digits": "The plant has &#x34;&#x33; reactors [kb:1].",
    "reference-after-digit": "The plant has 4&#x33; reactors [kb:1].",
    "reference-fraction": "Output is 4&frac12; GW [kb:1].",
    "reference-quot-misquote": "The director said &quot;safety comes last&quot; [kb:1].",
    "reference-ldquo-misquote": "The director said &ldquo;safety comes last&rdquo; [kb:1].",
    "markup-bold": "The plant has 4**3** reactors [kb:1].",
    "markup-italic": "The plant has 4*3* reactors [kb:1].",
    "markup-empty-tag": "The plant has 4<b></b>3 reactors [kb:1].",
    "markup-tag": "The plant has 4<b>3</b> reactors [kb:1].",
    "markup-comment": "The plant has 4<!-- -->3 reactors [kb:1].",
    "markup-code-span": "The plant has 4`3` reactors [kb:1].",
    "quote-corner-brackets": "The director said \u300csafety comes last\u300d [kb:1].",
    "quote-white-corner-brackets": "The director said \u300esafety comes last\u300f [kb:1].",
    "quote-ornamental": "The director said \u275dsafety comes last\u275e [kb:1].",
    "quote-q-tag": "The director said <q>safety comes last</q> [kb:1].",
    "quote-braille-blanks": 'The director said "safety\u2800comes\u2800last" [kb:1].',
    "quote-hangul-fillers": 'The director said "safety\u3164comes\u3164last" [kb:1].',
    "lisu-dot": "Output is 4\ua4f83 GW [kb:1].",
    "lisu-comma": "The plant has 4\ua4f9300 reactors [kb:1].",
    "cyrillic-O-as-zero": "The plant has 4\u041e reactors [kb:1].",
    "cyrillic-Ze-as-three": "The plant has 4\u0417 reactors [kb:1].",
    "subscript-digits": "The plant has \u2084\u2083 reactors [kb:1].",
    "roman-numeral": "The plant has \u216b reactors [kb:1].",
    "homoglyph-number-word": "The plant has f\u043erty-three reactors [kb:1].",
    "misspelt-number-word": "The plant has fourty-three reactors [kb:1].",
}
"""Answers whose number or quotation shows otherwise than the check once read it."""

SHOWN_CORRECT: dict[str, str] = {
    "reference-digits-correct": "The plant has &#x34;&#x32; reactors [kb:1].",
    "reference-quote-correct": "The director said &quot;safety comes first&quot; [kb:1].",
    "markup-bold-correct": "The plant has **42** reactors [kb:1].",
    "quote-corner-brackets-correct": "The director said \u300csafety comes first\u300d [kb:1].",
    "quote-q-tag-correct": "The director said <q>safety comes first</q> [kb:1].",
    "quote-braille-blanks-correct": 'The director said "safety\u2800comes\u2800first" [kb:1].',
    "subscript-digits-correct": "The plant has \u2084\u2082 reactors [kb:1].",
    "homoglyph-number-word-correct": "The plant has f\u043erty-two reactors [kb:1].",
    "misspelt-number-word-correct": "The plant has fourty-two reactors [kb:1].",
}
"""The same shapes with correct content."""


@pytest.mark.parametrize("name", list(SHOWN_OTHERWISE))
def test_a_number_or_quote_is_checked_as_shown(tmp_path: Path, name: str) -> None:
    assert _rag(tmp_path, SHOWN_OTHERWISE[name], _CHUNK) != "released"


@pytest.mark.parametrize("name", list(SHOWN_CORRECT))
def test_a_correct_number_or_quote_shown_so_is_released(tmp_path: Path, name: str) -> None:
    assert _rag(tmp_path, SHOWN_CORRECT[name], _CHUNK) == "released"


# -- thousands separators other than the comma ---------------------------------------------------

_SEPARATED = {
    "no-break-space": "The plant employs 3\u00a0200 workers.",
    "figure-space": "The plant employs 3\u2007200 workers.",
    "apostrophe": "The plant employs 3'200 workers.",
    "right-single-quote": "The plant employs 3\u2019200 workers.",
}


@pytest.mark.parametrize("part", ["200", "3"])
@pytest.mark.parametrize("name", list(_SEPARATED))
def test_a_part_of_a_number_with_thousands_separators_is_no_match(
    tmp_path: Path, name: str, part: str
) -> None:
    answer = f"The plant employs {part} workers [kb:1]."
    assert _rag(tmp_path, answer, _SEPARATED[name]) != "released"


@pytest.mark.parametrize("name", list(_SEPARATED))
def test_a_number_with_thousands_separators_matches_its_value(tmp_path: Path, name: str) -> None:
    assert _rag(tmp_path, "The plant employs 3,200 workers [kb:1].", _SEPARATED[name]) == (
        "released"
    )
    claim = _SEPARATED[name].replace(" workers.", " workers [kb:1].")
    assert _rag(tmp_path, claim, "The plant employs 3,200 workers.") == "released"

"""The answer side: a sample answer parses to its cited claim, a clean answer may go out
byte-identical, and an unknown top-level field never reaches the client unverified."""

from __future__ import annotations

import copy
import json

from gateway.types import Decision
from tests.contract.helpers import OUTCOMES, Case, mixed_answer, primary_text
from tests.contract.samples import GOOD, MARKER
from tests.test_protocol_helpers import POLICY

PROBE = "x_contract_probe"
FIELD_MARKER = f"The pump was designed by {MARKER}FIELD in 1931."


def test_parse_gives_the_cited_claim(case: Case) -> None:
    body = case.sample.body(GOOD)
    before = copy.deepcopy(body)
    answer = case.adapter.parse(body, case.sample.route)
    assert answer.protocol == case.name
    assert GOOD in primary_text(answer)
    assert body == before, "parse changed the body"


def test_clean_answer_needs_no_rewrite(case: Case) -> None:
    answer = case.adapter.parse(case.sample.body(GOOD), case.sample.route)
    assert not answer.unknown_fields
    assert not answer.dropped
    assert not case.adapter.needs_rewrite(answer, POLICY)


def test_unknown_top_level_field_is_never_relayed(case: Case) -> None:
    """With a field table, the field is dropped or reported as unknown. Either way, and for
    a protocol without one (`field_table` None: rag-json projects its answer, context and
    kept fields), the answer is rewritten and neither a released nor a partial body
    carries it."""
    body = case.sample.body(GOOD)
    body[PROBE] = FIELD_MARKER
    answer = case.adapter.parse(body, case.sample.route)
    if case.adapter.field_table is not None:
        reported = (PROBE,) in answer.unknown_fields
        dropped = any(path == (PROBE,) for _, path in answer.dropped)
        assert reported or dropped
    assert case.adapter.needs_rewrite(answer, POLICY)
    planted, claims, report = mixed_answer(case, {PROBE: FIELD_MARKER})
    for decision in (Decision.RELEASED, Decision.PARTIAL):
        out = case.adapter.render(planted, claims, OUTCOMES[decision], report, POLICY)
        assert FIELD_MARKER not in json.dumps(out), decision

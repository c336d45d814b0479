"""render for every decision: a JSON body in the protocol's shape; a partial, abstained or
blocked body never carries the failed claim's words, neither as JSON nor as a stream; an
unknown decision raises, it never releases."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from gateway.protocols.base import BLOCKED_TYPE, blocked_message
from gateway.types import Decision, Outcome
from tests.contract.helpers import (
    OUTCOMES,
    WITHHOLDING,
    Case,
    encode,
    event_text,
    mixed_answer,
    primary_text,
)
from tests.contract.samples import GOOD, MARKER
from tests.test_protocol_helpers import POLICY


@pytest.mark.parametrize("decision", list(Decision), ids=lambda d: d.value)
def test_render_every_decision(case: Case, decision: Decision) -> None:
    answer, claims, report = mixed_answer(case)
    outcome = OUTCOMES[decision]
    body = case.adapter.render(answer, claims, outcome, report, POLICY)
    text = json.dumps(body)
    if decision is Decision.BLOCKED:
        message = blocked_message(outcome)
        assert message in text
        # a block is the JSON error envelope, in a stream too (or the framer's error event)
        events = [case.adapter.error_event(message, BLOCKED_TYPE)]
    else:
        again = case.adapter.parse(body, case.sample.route)
        if decision in (Decision.RELEASED, Decision.PARTIAL):
            assert GOOD in primary_text(again)
        events = [
            e for usage in (True, False) for e in case.adapter.to_stream(body, usage)
        ]
    if decision in WITHHOLDING:
        assert MARKER not in text
        assert not any(MARKER in event_text(e) for e in events)
        assert MARKER.encode() not in encode(case.adapter, events)
    elif decision is Decision.RELEASED:
        assert MARKER in text


def test_unknown_decision_raises(case: Case) -> None:
    answer, claims, report = mixed_answer(case)
    bogus = Outcome(cast(Any, "maybe"), reason="hallucinated_citation", claim_index=1)
    with pytest.raises(ValueError, match="unknown decision"):
        case.adapter.render(answer, claims, bogus, report, POLICY)

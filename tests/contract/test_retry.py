"""release.retry: where a protocol retries, the grounding instruction goes into the re-sent
request and the client's request is left as it was; elsewhere `retry_request` refuses."""

from __future__ import annotations

import copy
import json

import pytest

from gateway.retry import instruction, with_grounding
from gateway.types import Decision
from tests.contract.helpers import OUTCOMES, Case


def test_retry_request(case: Case) -> None:
    outcome = OUTCOMES[Decision.BLOCKED]
    requests = [case.sample.plain_request, *case.sample.trusted.values()]
    for request in requests:
        if not case.adapter.retries:
            with pytest.raises(ValueError, match="not supported"):
                with_grounding(case.adapter, request, outcome)
            continue
        before = copy.deepcopy(request)
        rewritten = with_grounding(case.adapter, request, outcome)
        assert request == before, "the original request was changed"
        assert instruction(outcome) in json.dumps(rewritten)
        assert rewritten != before

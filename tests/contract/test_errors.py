"""Error shapes: the envelope and the stream error event carry the message; an upstream 4xx
envelope is rebuilt from its known fields only, and anything else is not relayed."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.contract.helpers import Case, decode, encode, event_text
from tests.contract.samples import MARKER

MESSAGE = "citewarden: the upstream could not be reached"


def test_error_envelope_and_event_carry_the_message(case: Case) -> None:
    envelope = case.adapter.error_envelope(502, MESSAGE, "upstream_error")
    assert MESSAGE in json.dumps(envelope)
    event = case.adapter.error_event(MESSAGE, "upstream_error")
    assert MESSAGE in event.data
    (decoded,) = decode(case.adapter, [encode(case.adapter, [event])])
    assert MESSAGE in event_text(decoded)


def test_relay_error_round_trips_a_rebuilt_envelope(case: Case) -> None:
    envelope = case.adapter.error_envelope(400, MESSAGE, "invalid_request_error")
    rebuilt = case.adapter.relay_error(envelope)
    assert rebuilt is not None
    assert MESSAGE in json.dumps(rebuilt)
    assert case.adapter.relay_error(rebuilt) == rebuilt


def test_relay_error_of_a_non_envelope_is_none(case: Case) -> None:
    for body in ("Bad request", ["error", MESSAGE], {"x": 1}, None, 400):
        assert case.adapter.relay_error(body) is None, body


def _plant(value: Any) -> None:
    """An unknown field carrying MARKER in every object of an envelope."""
    if isinstance(value, dict):
        for v in value.values():
            _plant(v)
        value["x_contract_note"] = f"debug: {MARKER}"


def test_relay_error_drops_unknown_fields(case: Case) -> None:
    envelope = copy.deepcopy(case.adapter.error_envelope(400, MESSAGE, "invalid_request_error"))
    _plant(envelope)
    rebuilt = case.adapter.relay_error(envelope)
    assert rebuilt is not None
    assert MESSAGE in json.dumps(rebuilt)
    assert MARKER not in json.dumps(rebuilt)

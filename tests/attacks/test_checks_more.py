"""Numbers and quotations written so that the number and quote checks once missed them (DESIGN
§4): scale suffixes ("40k", "$40M"), digits after a comma ("40,90", a decimal comma), a figure
dash as minus, enclosed numbers ("㊾"), per mille, a quotation over a soft line break, a mixed
pair of quotation marks, straight single quotes. The marker sits in the failing claim; it must
never reach the client, in any protocol or streaming mode. Positive controls show the same
shapes with correct content are still released."""

from __future__ import annotations

import pytest

from tests.attacks.conftest import assert_text_checked, assert_text_released, text_cases
from tests.attacks.harness import MARKER, GatewayProcess
from tests.attacks.protocols import GOOD, Mode, ProtocolSpec
from tests.upstream_app import FakeUpstream

# The cited chunk (kb:1) says "The Orbit pump moves 40 litres per minute."
_PUMP = f"{GOOD} The Orbit pump by {MARKER}"

ESCAPES: dict[str, str] = {
    "scale-k": f"{_PUMP} moves 40k litres per minute [kb:1].",
    "scale-K": f"{_PUMP} moves 40K litres per minute [kb:1].",
    "scale-M": f"{_PUMP} moves 40M litres per minute [kb:1].",
    "scale-MM": f"{_PUMP} moves 40MM litres per minute [kb:1].",
    "scale-m-glued": f"{_PUMP} moves 40m litres per minute [kb:1].",
    "scale-B-glued": f"{_PUMP} moves 40B litres per minute [kb:1].",
    "currency-M": f"{_PUMP} costs $40M per minute [kb:1].",
    "currency-B": f"{_PUMP} costs $40B per minute [kb:1].",
    "currency-m-spaced": f"{_PUMP} costs €40 m per minute [kb:1].",
    "scale-tn": f"{_PUMP} costs 40tn per minute [kb:1].",
    "scale-word-capitalised": f"{_PUMP} moves 40 Million litres per minute [kb:1].",
    "comma-glued-number": f"{_PUMP} moves 40,90 litres per minute [kb:1].",
    "decimal-comma": f"{_PUMP} moves 40,5 litres per minute [kb:1].",
    "figure-dash-minus": f"{_PUMP} moves \u201240 litres per minute [kb:1].",
    "small-hyphen-minus": f"{_PUMP} moves \ufe6340 litres per minute [kb:1].",
    "circled-number": f"{_PUMP} moves \u32be litres per minute [kb:1].",
    "double-circled-number": f"{_PUMP} moves \u24f5 litres per minute [kb:1].",
    "per-mille": f"{_PUMP} wastes 40\u2030 of its flow [kb:1].",
    "quote-over-soft-break": f'{GOOD} The manual says "{MARKER} moves\nthe water" [kb:1].',
    "quote-curly-open-straight-close": f"{GOOD} The manual says “{MARKER} moves the water\" "
    "[kb:1].",
    "quote-straight-open-curly-close": f'{GOOD} The manual says "{MARKER} moves the water” '
    "[kb:1].",
    "quote-straight-single": f"{GOOD} The manual says '{MARKER} moves the water' [kb:1].",
    "dot-thousands": f"{_PUMP} costs 40.000.000 euros [kb:1].",
    "dot-thousands-euro": f"{_PUMP} costs €40.000 [kb:1].",
    "scale-mln": f"{_PUMP} sold 40 mln units [kb:1].",
    "scale-bln": f"{_PUMP} earned USD 40 bln [kb:1].",
    "scale-mil": f"{_PUMP} earned $40 mil last year [kb:1].",
    "scale-mio": f"{_PUMP} earned 40 Mio. euros [kb:1].",
    "scale-mrd": f"{_PUMP} earned 40 Mrd euros [kb:1].",
    "scale-plural": f"{_PUMP} sold 40 millions of units [kb:1].",
    "scale-lakh": f"{_PUMP} sold 40 lakh units [kb:1].",
    "scale-crore": f"{_PUMP} earned 40 crore rupees [kb:1].",
    "per-mille-words": f"{_PUMP} wastes 40 per mille of its flow [kb:1].",
    "currency-scale-after": f"{_PUMP} earned 40 $M last year [kb:1].",
    "decimal-comma-neither-reading": f"{_PUMP} moves 40,5 litres per minute [kb:1].",
    "quote-single-guillemets": f"{GOOD} The manual says ‹{MARKER} moves the water› [kb:1].",
    "quote-german-single": f"{GOOD} The manual says ‚{MARKER} moves the water‘ [kb:1].",
    "quote-swedish-single": f"{GOOD} The manual says ’{MARKER} moves the water’ [kb:1].",
    "quote-latex": f"{GOOD} The manual says ``{MARKER} moves the water'' [kb:1].",
}
"""Answers whose marker sits in a claim that must fail number_mismatch or quote_mismatch."""

RELEASED: dict[str, str] = {
    "real-unit": "The Orbit pump moves 40 kg of water per minute [kb:1].",
    "real-unit-glued": "The Orbit pump moves 40kg of water per minute [kb:1].",
    "quote-over-soft-break-correct": 'The manual says "The Orbit pump\nmoves 40 litres" [kb:1].',
    "quote-mixed-correct": "The manual says “The Orbit pump moves 40 litres\" [kb:1].",
    "quote-straight-single-correct": "The manual says 'The Orbit pump moves 40 litres' [kb:1].",
    "apostrophes-are-not-quotes": "The Orbit pump's rate, the workers' figure, doesn't "
    "change: it moves 40 litres per minute [kb:1].",
    "circled-number-correct": "The Orbit pump moves \u32b5 litres per minute [kb:1].",
    # "40,0" is 40 and 0 or 40.0: one reading supported is enough.
    "decimal-comma-correct": "The Orbit pump moves 40,0 litres per minute [kb:1].",
    "quote-single-guillemets-correct": "The manual says ‹The Orbit pump moves 40 litres› "
    "[kb:1].",
    "quote-german-single-correct": "The manual says ‚The Orbit pump moves 40 litres‘ [kb:1].",
    "quote-swedish-single-correct": "The manual says ’The Orbit pump moves 40 litres’ [kb:1].",
    "quote-latex-correct": "The manual says ``The Orbit pump moves 40 litres'' [kb:1].",
    "curly-apostrophes-are-not-quotes": "The Orbit pump’s rate, the workers’ figure, doesn’t "
    "change: it moves 40 litres per minute [kb:1].",
}
"""Answers that must be released: the same shapes with correct content."""




@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(ESCAPES))
def test_number_or_quote_in_a_missed_form_is_checked(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_checked(gateway, upstream, spec, mode, ESCAPES[name])


@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(RELEASED))
def test_correct_number_or_quote_in_the_same_form_is_released(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_released(gateway, upstream, spec, mode, RELEASED[name])

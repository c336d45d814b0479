"""Claims that try to escape checking through markup a renderer hides or reads differently
(DESIGN §4: "No prose escapes checking through formatting"): a fence line inside an HTML block
(a comment, ``<script>``, ``<div>`` ...) is raw HTML to a markdown renderer, not a fence, so the
prose after it is shown and must be checked; and a heading that holds a number in a form other
than ASCII digits, or whose words are joined by characters shown as blanks, is a claim, not a
title. The marker sits in the failing claim; it must never reach the client, in any protocol or
streaming mode. Positive controls show the same shapes with correct content are released."""

from __future__ import annotations

import pytest

from tests.attacks.conftest import assert_text_checked, assert_text_released, text_cases
from tests.attacks.harness import MARKER, GatewayProcess
from tests.attacks.protocols import GOOD, Mode, ProtocolSpec
from tests.upstream_app import FakeUpstream

WRONG = f"The Orbit pump by {MARKER} moves 90 litres per minute [kb:1]."
BRAILLE = "\u2800"

HIDDEN: dict[str, str] = {
    # A comment hides the fence line from the renderer: the prose after it is shown.
    "fence-in-comment": f"{GOOD}\n<!--\n```\n-->\n{WRONG}\n",
    "fence-line-ends-comment": f"{GOOD}\n<!--\n~~~-->\n{WRONG}\n",
    # Both the opening and the closing fence hidden, so the fence "closes" after the claim.
    "both-fences-in-comments": f"{GOOD}\n<!--\n```\n-->\n{WRONG}\n<!--\n```\n-->\n",
    "fence-in-list-item-comment": f"- {GOOD}\n- <!--\n  ```\n  -->\n{WRONG}\n",
    "fence-in-script-block": f"{GOOD}\n<script>\n```\n</script>\n{WRONG}\n",
    "fence-in-div-block": f"{GOOD}\n<div>\n```\n</div>\n\n{WRONG}\n",
    "fence-in-processing-instruction": f"{GOOD}\n<?x\n```\n?>\n{WRONG}\n",
    # A heading with a number in another form, or long but joined by blank-looking characters.
    "circled-digits-title": f"# The Orbit pump by {MARKER} moves \u2468\u2468 litres\n\n{GOOD}",
    "superscript-digits-title": f"# The Orbit pump by {MARKER} moves \u2079\u2079 litres\n\n{GOOD}",
    "number-word-title": f"# Orbit pump by {MARKER} moves ninety litres\n\n{GOOD}",
    "braille-blank-joined-title": "# "
    + BRAILLE.join(f"The Orbit pump by {MARKER} moves water and the vendor lied".split())
    + f"\n\n{GOOD}",
}
"""Answers whose marker sits in a claim that must fail a check."""

RELEASED: dict[str, str] = {
    "comment-then-code": f"{GOOD}\n<!-- -->\n```\nx = 90\n```\n{GOOD}",
    "comment-block-then-code": f"{GOOD}\n<!--\n```\n-->\n```\nx = 90\n```\n{GOOD}",
    "title-heading": f"# Orbit pump\n\n{GOOD}",
}
"""Answers in the same shapes with correct content: released unchanged."""


@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(HIDDEN))
def test_markup_a_renderer_hides_does_not_hide_a_claim(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_checked(gateway, upstream, spec, mode, HIDDEN[name])


@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(RELEASED))
def test_correct_answer_around_html_blocks_is_released(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_released(gateway, upstream, spec, mode, RELEASED[name])

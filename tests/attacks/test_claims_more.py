"""More claims that try to escape checking through formatting (DESIGN §4: "No prose escapes
checking through formatting"): a line that only looks like a code fence, a fence left open
after its list item ended, a fence closed by a lone carriage return, whitespace other than a
space inside a citation marker's half, and a title heading that carries an invented citation.
The marker sits in the failing claim; it must never reach the client, in any protocol or
streaming mode. Positive controls show the same shapes with correct content are released."""

from __future__ import annotations

import pytest

from tests.attacks.conftest import assert_text_checked, assert_text_released, text_cases
from tests.attacks.harness import MARKER, GatewayProcess
from tests.attacks.protocols import GOOD, Mode, ProtocolSpec
from tests.upstream_app import FakeUpstream

WRONG = f"The Orbit pump by {MARKER} moves 90 litres per minute [kb:1]."

ESCAPES_MORE: dict[str, str] = {
    # CommonMark: a backtick fence's info string holds no backtick, so "```x```" is an inline
    # code span, not a fence that would make the rest of the answer exempt code.
    "inline-code-line-is-no-fence": f"{GOOD}\n\n```x```\n\n{WRONG}\n",
    "inline-code-line-after-info": f"{GOOD}\n\n```py print(`x`)\n\n{WRONG}\n",
    # A fence inside a list item ends with the item: a less indented line is prose again.
    "fence-in-list-item": f"- {GOOD}\n  ```\n  x = 1\n\n{WRONG}\n",
    "fence-in-numbered-item": f"1. {GOOD}\n   ~~~\n   x = 1\n{WRONG}\n",
    "indented-fence-closed-at-column-0": f"{GOOD}\n\n  ```\n  x = 1\n```\n{WRONG}\n",
    # A lone carriage return is a line end: the fence closes and the text after it is prose.
    "fence-closed-by-lone-cr": f"{GOOD}\n\n```\nx = 1\r```\r{WRONG}\n```\n",
    "lone-cr-ends-a-title-heading": f"# Orbit pump\rDesigned by {MARKER}\n\n{GOOD}",
    # Whitespace other than a space inside a marker's half makes it malformed, not prose.
    "nbsp-inside-citation": f"{GOOD} The Orbit pump by {MARKER} moves 40 litres per minute "
    "[kb:\u00a0orbit] [kb:1].",
    "tab-inside-citation": f"{GOOD} The Orbit pump by {MARKER} moves 40 litres per minute "
    "[kb:\torbit] [kb:1].",
    "ideographic-space-inside-citation": f"{GOOD} The Orbit pump by {MARKER} moves 40 litres "
    "per minute [kb\u3000:orbit] [kb:1].",
    # A heading that carries a citation marker is a claim, even when short enough for a title.
    "title-heading-with-invented-citation": f"# Orbit pump by {MARKER} [zz:9]\n\n{GOOD}",
    "title-heading-with-malformed-citation": f"## Orbit pump by {MARKER} [kb: 1]\n\n{GOOD}",
}
"""Answers whose marker sits in a claim that must fail a check."""

RELEASED_MORE: dict[str, str] = {
    "fenced-code-with-info-string": f"{GOOD}\n\n```python\nx = 90\n```\n\n{GOOD}",
    "inline-code-claim-at-line-start": "```Orbit``` pumps move 40 litres per minute [kb:1].",
    "fence-in-list-item-indented": f"- {GOOD}\n  ```\n  x = 90\n\n\tz = 91\n  ```\n- {GOOD}",
    "crlf-lines": f"{GOOD}\r\n\r\n- {GOOD}\r\n",
    "lone-cr-lines": f"{GOOD}\r\r- {GOOD}\r",
    "title-heading-with-citation": f"# Orbit pump [kb:1]\n\n{GOOD}",
}
"""Answers in the same shapes with correct content: released unchanged."""




@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(ESCAPES_MORE))
def test_formatting_does_not_hide_a_claim(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_checked(gateway, upstream, spec, mode, ESCAPES_MORE[name])


@pytest.mark.parametrize(("spec", "mode", "name"), text_cases(RELEASED_MORE))
def test_correct_answer_in_the_same_formatting_is_released(
    gateway: GatewayProcess,
    upstream: tuple[str, FakeUpstream],
    spec: ProtocolSpec,
    mode: Mode,
    name: str,
) -> None:
    assert_text_released(gateway, upstream, spec, mode, RELEASED_MORE[name])

"""Markdown output for the benchmarks: tables, and generated sections of docs/benchmarks.md.

A generated section sits between `<!-- bench:NAME:start -->` and `<!-- bench:NAME:end -->`;
rewriting one leaves the hand-written text around it alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_section(path: Path, name: str, text: str) -> None:
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{text.rstrip()}\n{end}"
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in doc and end in doc:
        before, rest = doc.split(start, 1)
        _, after = rest.split(end, 1)
        doc = before + block + after
    else:
        doc = doc.rstrip() + "\n\n" + block + "\n"
    path.write_text(doc)

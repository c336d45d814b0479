"""The demo's document set (a fictional home battery) and the two ways a client hands it over:
`<chunk>` tags in a system prompt, or the base64url `x-citewarden-context` response header.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from importlib import resources
from typing import Final

from gateway.types import Chunk

CONTEXT_HEADER: Final = "x-citewarden-context"
PRODUCT: Final = "Kestrel K7 home battery"


def _load() -> tuple[Chunk, ...]:
    raw = json.loads(resources.files(__package__).joinpath("documents.json").read_text("utf-8"))
    return tuple(
        Chunk(id=c["id"], text=c["text"], version=c["version"], source=c["source"])
        for c in raw["chunks"]
    )


DOCUMENTS: Final[tuple[Chunk, ...]] = _load()
_BY_ID: Final = {c.id: c for c in DOCUMENTS}


def document(chunk_id: str) -> Chunk:
    """The demo chunk with this id; KeyError for an unknown id."""
    return _BY_ID[chunk_id]


def chunk_tag(chunk: Chunk) -> str:
    """`<chunk id=".." version="..">text</chunk>`, the gateway's default in-request context form.

    The text is not escaped: the gateway compares cited text byte for byte, and the demo texts
    contain no `<`.
    """
    version = f' version="{chunk.version}"' if chunk.version is not None else ""
    return f'<chunk id="{chunk.id}"{version}>{chunk.text or ""}</chunk>'


def demo_context_system_prompt(chunks: Iterable[Chunk] = DOCUMENTS) -> str:
    """A system prompt carrying `chunks` (default: every demo chunk) as `<chunk>` tags."""
    tags = "\n".join(chunk_tag(c) for c in chunks)
    return (
        f"You answer questions about the {PRODUCT} using only the chunks below. "
        "End every sentence with the [doc:chunk] ids of the chunks that support it.\n"
        f"{tags}"
    )


def chunk_json(chunk: Chunk) -> dict[str, str]:
    """`{id, text, version}`: the shape of a rag-json source and of a context-header entry."""
    out = {"id": chunk.id, "text": chunk.text or ""}
    if chunk.version is not None:
        out["version"] = chunk.version
    return out


def encode_context_header(chunks: Sequence[Chunk]) -> str:
    """The `x-citewarden-context` value: padded base64url of the JSON list of chunks."""
    payload = json.dumps([chunk_json(c) for c in chunks], ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(payload.encode()).decode("ascii")


def decode_context_header(value: str) -> list[Chunk]:
    """Inverse of `encode_context_header`; accepts the value with or without padding."""
    padded = value + "=" * (-len(value) % 4)
    items = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    return [Chunk(id=i["id"], text=i.get("text"), version=i.get("version")) for i in items]

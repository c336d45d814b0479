"""The embedded demo upstream that `citewarden demo` runs behind the gateway: a fictional
battery's documents and answers that are good, partly hallucinated, fully hallucinated or stale.
"""

from .answers import ANSWER_KINDS, ANSWERS, DEMO_QUESTIONS, AnswerKind, CannedAnswer, choose
from .app import DEMO_MODEL, create_demo_app
from .documents import (
    CONTEXT_HEADER,
    DOCUMENTS,
    chunk_tag,
    decode_context_header,
    demo_context_system_prompt,
    encode_context_header,
)

__all__ = [
    "ANSWERS",
    "ANSWER_KINDS",
    "CONTEXT_HEADER",
    "DEMO_MODEL",
    "DEMO_QUESTIONS",
    "DOCUMENTS",
    "AnswerKind",
    "CannedAnswer",
    "choose",
    "chunk_tag",
    "create_demo_app",
    "decode_context_header",
    "demo_context_system_prompt",
    "encode_context_header",
]

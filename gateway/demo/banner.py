"""What `citewarden demo` prints at start-up: where the gateway listens and copy-paste `curl`
and OpenAI-SDK examples that produce each kind of demo answer.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

from .answers import DEMO_QUESTIONS, AnswerKind
from .app import DEMO_MODEL

_OUTCOME: dict[AnswerKind, str] = {
    "good": "every sentence verifies -> released",
    "partial": "a wrong number and an invented chunk -> partial",
    "hallucinated": "nothing verifies -> abstained",
    "stale": "cites an old version of a chunk -> partial",
}


def _curl(url: str, body: Mapping[str, object], *headers: str) -> str:
    parts = ["curl", "-sS", "-D", "-", url, "-H", "content-type: application/json"]
    if body.get("stream"):
        parts.insert(1, "-N")  # show SSE frames as they arrive
    for header in headers:
        parts += ["-H", header]
    parts += ["-d", json.dumps(body)]
    return " ".join(shlex.quote(p) for p in parts)


def _audit_lines(audit_file: str | None) -> list[str]:
    if audit_file is None:
        return [
            "  (audit events follow below as JSON lines; `--audit-file PATH` writes them to a",
            "   file instead, for `citewarden report PATH`)",
        ]
    return [
        f"  audit events -> {audit_file}",
        f"  (summarise them with: citewarden report {shlex.quote(audit_file)})",
    ]


def banner(gateway_url: str, admin_url: str, *, audit_file: str | None = None) -> str:
    """The start-up text for a gateway at `gateway_url` with its admin port at `admin_url`,
    writing its log to `audit_file` (None: stdout, after the banner)."""
    chat = f"{gateway_url}/v1/chat/completions"
    lines = [
        "citewarden demo: the gateway is verifying answers from the embedded demo upstream",
        f"  gateway  {gateway_url}    admin  {admin_url}/metrics  {admin_url}/healthz",
        "  (policies: gateway/demo/policy-strict.yaml, gateway/demo/policy.yaml;",
        "   the answers cite a fictional battery's handbook)",
        *_audit_lines(audit_file),
        "",
        "Ask through the gateway; x-citewarden-decision says what happened:",
    ]
    for question, kind in DEMO_QUESTIONS.items():
        body = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": question}]}
        lines += ["", f"  # {kind}: {_OUTCOME[kind]}", f"  {_curl(chat, body)}"]
    bad = next(q for q, kind in DEMO_QUESTIONS.items() if kind == "partial")
    body = {"model": DEMO_MODEL, "messages": [{"role": "user", "content": bad}]}
    lines += [
        "",
        "  # the same partly hallucinated answer under the strict policy -> blocked (HTTP 422)",
        f"  {_curl(chat, body, 'x-demo-policy: strict')}",
    ]
    stream = {
        "model": DEMO_MODEL,
        "max_tokens": 512,
        "stream": True,
        "messages": [{"role": "user", "content": "Give me a partly hallucinated answer"}],
    }
    rag = {"question": "Can I install and stack K7 units myself?"}
    responses = f"{gateway_url}/v1/responses"
    create = {"model": DEMO_MODEL, "input": "Give me a partly hallucinated answer"}
    lines += [
        "",
        "  # OpenAI Responses API: a partly hallucinated answer -> partial",
        f"  {_curl(responses, create)}",
        "  # the same as a typed event stream, released claim by claim",
        f"  {_curl(responses, {**create, 'stream': True})}",
        "  # a stored response is verified too (use an id from above), also as a stream:",
        f"  curl -sS -D - {responses}/RESPONSE_ID",
        f"  curl -N -sS -D - '{responses}/RESPONSE_ID?stream=true'",
    ]
    lines += [
        "",
        "  # Anthropic Messages, streamed",
        f"  {_curl(f'{gateway_url}/v1/messages', stream, 'anthropic-version: 2023-06-01')}",
        "",
        "  # rag-json: the upstream returns its sources next to the answer",
        f"  {_curl(f'{gateway_url}/rag/answer', rag)}",
        "",
        "  # the document set, and a system prompt that carries it as <chunk> tags",
        f"  curl -sS {gateway_url}/demo/documents",
        "",
        "With the OpenAI SDK:",
        "",
        "  from openai import OpenAI",
        "  from gateway.demo import demo_context_system_prompt",
        "",
        f'  client = OpenAI(base_url="{gateway_url}/v1", api_key="demo")',
        "  raw = client.chat.completions.with_raw_response.create(",
        f'      model="{DEMO_MODEL}",',
        "      messages=[",
        '          {"role": "system", "content": demo_context_system_prompt()},',
        '          {"role": "user", "content": "How long is the K7 warranty?"},',
        "      ],",
        "  )",
        '  print(raw.headers["x-citewarden-decision"], raw.parse().choices[0].message.content)',
        "",
        "  # the Responses API (the OpenAI Agents SDK's default) goes through the same gateway",
        "  resp = client.responses.with_raw_response.create(",
        f'      model="{DEMO_MODEL}",',
        "      instructions=demo_context_system_prompt(),",
        '      input="How much energy does the K7 store?",',
        "  )",
        '  print(resp.headers["x-citewarden-decision"], resp.parse().output_text)',
        "",
        "Answer keywords: good / partial / hallucinated / stale (or ask about capacity,",
        "warranty, installation, firmware). Point at a real upstream with CITEWARDEN_UPSTREAM=URL",
        "and `citewarden serve`.",
    ]
    return "\n".join(lines)

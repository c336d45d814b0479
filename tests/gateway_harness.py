"""Runs a real gateway (proxy + admin apps, real policy files) in front of a real upstream.

Both sides are uvicorn servers on 127.0.0.1; clients are real SDKs or httpx.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from gateway.audit import configure_logging, reset_logging
from gateway.metrics import Metrics
from gateway.policy import PolicyStore
from gateway.server import Settings, build
from tests.upstream_app import serve

POLICY_TEMPLATE = """\
name: {name}
mode: {mode}
routes:
  - name: chat
    match: {{path: /v1/chat/completions}}
    protocol: openai-chat
  - name: messages
    match: {{path: /v1/messages}}
    protocol: anthropic-messages
  - name: kb
    match: {{path_prefix: /rag/}}
    protocol: rag-json
    rag: {{answer: /answer, context: /sources}}
passthrough: [/v1/models]
citations: {{format: doc-chunk}}
checks:
  [missing_citation, malformed_citation, hallucinated_citation, stale_source, quote_mismatch,
   number_mismatch]
channels: {{tool_calls: {tool_calls}, reasoning: {reasoning}, logprobs: {logprobs}}}
release:
  on_unverified: {on_unverified}
  on_infrastructure_failure: abstain
  retry: {retry}
streaming: {{mode: {streaming}}}
audit: {{include_text: {include_text}}}
"""


def write_policy(
    directory: Path,
    *,
    name: str = "itest",
    mode: str = "enforce",
    on_unverified: str = "block",
    streaming: str = "buffer",
    tool_calls: str = "verify",
    reasoning: str = "withhold",
    logprobs: str = "verify",
    retry: int = 0,
    include_text: bool = False,
    filename: str = "policy.yaml",
) -> Path:
    path = directory / filename
    path.write_text(
        POLICY_TEMPLATE.format(
            name=name,
            mode=mode,
            on_unverified=on_unverified,
            streaming=streaming,
            tool_calls=tool_calls,
            reasoning=reasoning,
            logprobs=logprobs,
            retry=retry,
            include_text=str(include_text).lower(),
        )
    )
    return path


@dataclass
class Gateway:
    url: str
    admin_url: str
    metrics: Metrics
    store: PolicyStore


@contextlib.contextmanager
def run_gateway(
    upstream_url: str,
    policies: list[Path],
    *,
    read_timeout: float = 5.0,
    total_timeout: float = 10.0,
    max_request_bytes: int = 1024 * 1024,
    max_response_bytes: int = 1024 * 1024,
) -> Iterator[Gateway]:
    settings = Settings(
        upstream=upstream_url,
        policies=[str(p) for p in policies],
        connect_timeout=2.0,
        read_timeout=read_timeout,
        total_timeout=total_timeout,
        max_request_bytes=max_request_bytes,
        max_response_bytes=max_response_bytes,
    )
    proxy, admin, store, metrics = build(settings)
    # The gateway writes an exchange's audit line about a millisecond after its answer
    # (gateway/deferred.py), from its own thread and often after the test has its response;
    # with structlog's defaults that line would reach the terminal between tests. A test that
    # reads the log has configured its own stream, which is left alone.
    quiet = not structlog.is_configured()
    if quiet:
        configure_logging(stream=io.StringIO())
    try:
        with serve(proxy, lifespan="on") as url, serve(admin) as admin_url:  # type: ignore[arg-type]
            yield Gateway(url, admin_url, metrics, store)
    finally:
        if quiet:
            reset_logging()

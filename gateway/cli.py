"""The `citewarden` command: serve, demo, verify, policy check, report.

Argument parsing and exit codes only; each command's work lives in its own module.
Exit codes: 0 success, 1 the command's negative answer, 2 bad input or usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from gateway.errors import GatewayError, PolicyError


def _env(name: str, default: str | None = None) -> str | None:
    """CITEWARDEN_<name> as a flag default; argparse applies the flag's `type` to a string
    default, so a bad value exits 2 with the flag named, like a bad flag."""
    return os.environ.get(f"CITEWARDEN_{name}", default)


WORKERS_REMOVED = (
    "--workers / CITEWARDEN_WORKERS was removed: run one gateway process per container and "
    "scale out with replicas (Helm replicaCount or autoscaling.enabled); see "
    "docs/operations.md \"One process per container\""
)


def _add_server_flags(p: argparse.ArgumentParser, *, default_port: int) -> None:
    p.add_argument("--host", default=_env("HOST", "0.0.0.0"))
    p.add_argument("--port", type=int, default=_env("PORT", str(default_port)))
    p.add_argument("--admin-port", type=int, default=_env("ADMIN_PORT", "9090"))
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=_env("CONNECT_TIMEOUT", "5"),
        help="seconds to connect to the upstream (env CITEWARDEN_CONNECT_TIMEOUT)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=_env("READ_TIMEOUT", "60"),
        help="seconds between upstream bytes (env CITEWARDEN_READ_TIMEOUT)",
    )
    p.add_argument(
        "--total-timeout",
        type=float,
        default=_env("TOTAL_TIMEOUT", "300"),
        help="seconds for a whole upstream exchange (env CITEWARDEN_TOTAL_TIMEOUT)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=int,
        default=_env("MAX_REQUEST_BYTES", str(4 * 1024 * 1024)),
    )
    p.add_argument(
        "--max-response-bytes",
        type=int,
        default=_env("MAX_RESPONSE_BYTES", str(16 * 1024 * 1024)),
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=_env("SHUTDOWN_GRACE", "20"),
        help="seconds in-flight requests get to finish after SIGTERM",
    )
    p.add_argument(
        "--reload-interval",
        type=float,
        default=_env("RELOAD_INTERVAL", "2"),
        help="seconds between policy file checks (0 disables hot reload)",
    )
    p.add_argument(
        "--max-head-bytes",
        type=int,
        default=_env("MAX_HEAD_BYTES", str(64 * 1024)),
        help="bytes of a request head (request line and headers); 431 past it "
        "(env CITEWARDEN_MAX_HEAD_BYTES)",
    )
    p.add_argument(
        "--head-timeout",
        type=float,
        default=_env("HEAD_TIMEOUT", "10"),
        help="seconds a request head may take to arrive; 408 past it "
        "(env CITEWARDEN_HEAD_TIMEOUT)",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=_env("KEEP_ALIVE_TIMEOUT", "5"),
        help="seconds an idle keep-alive connection is kept (env CITEWARDEN_KEEP_ALIVE_TIMEOUT)",
    )
    p.add_argument(
        "--limit-concurrency",
        type=int,
        default=_env("LIMIT_CONCURRENCY", "4096"),
        help="client connections served at once; 503 past it, 0 for no limit "
        "(env CITEWARDEN_LIMIT_CONCURRENCY)",
    )
    p.add_argument(
        "--log-level",
        type=_log_level,
        default=_env("LOG_LEVEL", "info"),
        help=f"one of {', '.join(LOG_LEVELS)} (env CITEWARDEN_LOG_LEVEL)",
    )


# uvicorn's `trace` is not offered: it logs every ASGI message's scope, request headers and
# their credentials included.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def _log_level(value: str) -> str:
    level = value.strip().lower()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {value!r} (expected one of {', '.join(LOG_LEVELS)})"
        )
    return level


def _add_upstream_flags(p: argparse.ArgumentParser) -> None:
    """How `serve` reaches its upstream (DESIGN §11); proxies come from HTTPS_PROXY /
    HTTP_PROXY / NO_PROXY."""
    p.add_argument(
        "--upstream-ca-file",
        default=_env("UPSTREAM_CA_FILE"),
        metavar="PEM",
        help="CA bundle the upstream's certificate must chain to, in place of the system "
        "store (default: the system store; SSL_CERT_FILE applies) "
        "(env CITEWARDEN_UPSTREAM_CA_FILE)",
    )
    p.add_argument(
        "--upstream-client-cert",
        default=_env("UPSTREAM_CLIENT_CERT"),
        metavar="PEM",
        help="client certificate for mTLS to the upstream (the key too, unless "
        "--upstream-client-key) (env CITEWARDEN_UPSTREAM_CLIENT_CERT)",
    )
    p.add_argument(
        "--upstream-client-key",
        default=_env("UPSTREAM_CLIENT_KEY"),
        metavar="PEM",
        help="unencrypted private key of --upstream-client-cert "
        "(env CITEWARDEN_UPSTREAM_CLIENT_KEY)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="citewarden",
        description="Releases LLM/RAG answers only when their citations verify.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy in front of an upstream")
    serve.add_argument("--upstream", default=_env("UPSTREAM"), help="env CITEWARDEN_UPSTREAM")
    env_policy = _env("POLICY")
    serve.add_argument(
        "--policy",
        action="append",
        default=None,
        help="policy file (repeatable; env CITEWARDEN_POLICY, ':'-separated)",
    )
    serve.set_defaults(env_policies=[p for p in (env_policy or "").split(":") if p])
    _add_server_flags(serve, default_port=8080)
    _add_upstream_flags(serve)
    # Removed (one process per container): still parsed, so that a value other than 1 is a
    # clear error rather than "unrecognized arguments"; 1 (what older charts set) is accepted.
    serve.add_argument("--workers", default=_env("WORKERS"), help=argparse.SUPPRESS)

    demo = sub.add_parser("demo", help="the gateway in front of the embedded demo upstream")
    demo.add_argument("--policy", action="append", default=None)
    demo.set_defaults(env_policies=[p for p in (env_policy or "").split(":") if p])
    _add_server_flags(demo, default_port=8080)
    demo.add_argument(
        "--audit-file",
        default=_env("AUDIT_FILE"),
        metavar="PATH",
        help="append the log (audit events as JSON lines, what `citewarden report` reads) to "
        "PATH instead of stdout, which then shows only the banner (env CITEWARDEN_AUDIT_FILE)",
    )

    # The protocol names are the adapter registry's, imported when a parser is built rather
    # than with this module.
    from gateway.protocols import ADAPTERS

    verify = sub.add_parser("verify", help="verify one captured exchange offline")
    verify.add_argument("--policy", required=True)
    verify.add_argument("--protocol", required=True, help=" | ".join(ADAPTERS))
    verify.add_argument("--request", required=True, help="the request body (JSON)")
    verify.add_argument("--response", required=True, help="the response: JSON body or .sse capture")
    verify.add_argument(
        "--route", default=None,
        help="route name (default: the one --path takes, else the first of the protocol)",
    )
    verify.add_argument(
        "--path", default=None,
        help="the request's path (and query) as the client sent it: picks the route, and "
        "says whether a Gemini or Bedrock request streams (default: the route's match)",
    )
    verify.add_argument(
        "--response-headers", default=None, metavar="FILE",
        help="the upstream's response headers, `name: value` lines (`curl -D` output): "
        "header context, and the headers the client receives",
    )
    _add_format_flag(verify)

    policy = sub.add_parser("policy", help="policy tools")
    psub = policy.add_subparsers(dest="policy_command", required=True)
    check = psub.add_parser("check", help="schema and semantic lint of policy files")
    check.add_argument("paths", nargs="+")
    check.add_argument(
        "--each",
        action="store_true",
        help="lint every file on its own, as alternatives (default: the files together, as "
        "one deployment loading them in order)",
    )

    report = sub.add_parser("report", help="summarise an audit JSONL file")
    report.add_argument("audit")
    _add_format_flag(report)

    evaluate = sub.add_parser("eval", help="score a policy's checks against labelled claims")
    evaluate.add_argument("--policy", required=True)
    evaluate.add_argument("data", help="JSONL: claim, references, label, optional question, src")
    _add_format_flag(evaluate)
    return parser


def _add_format_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default=None,
        help="text (a short summary) or json; default: text on a terminal, json when piped",
    )


def output_format(choice: str | None, out: TextIO) -> str:
    """--format as given, else text on a terminal and JSON when piped (DESIGN §1)."""
    if choice is not None:
        return choice
    isatty = getattr(out, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args, sys.stdout)
    except PolicyError as e:
        print(f"citewarden: {e}", file=sys.stderr)
        return 2
    except GatewayError as e:
        print(f"citewarden: {e}", file=sys.stderr)
        return 2


def _dispatch(args: argparse.Namespace, out: TextIO) -> int:
    match args.command:
        case "serve":
            from gateway.server import serve_from_args

            if args.workers is not None and args.workers.strip() != "1":
                print(f"citewarden serve: {WORKERS_REMOVED}", file=sys.stderr)
                return 2
            if not args.upstream:
                print(
                    "citewarden serve: --upstream (or CITEWARDEN_UPSTREAM) is required",
                    file=sys.stderr,
                )
                return 2
            from gateway.http1 import parse_base_url

            try:
                parse_base_url(args.upstream)
            except ValueError as e:
                print(f"citewarden serve: --upstream: {e}", file=sys.stderr)
                return 2
            from gateway.upstream_tls import UpstreamNetwork

            try:
                UpstreamNetwork.from_env(
                    ca_file=args.upstream_ca_file,
                    client_cert=args.upstream_client_cert,
                    client_key=args.upstream_client_key,
                ).check(args.upstream)
            except ValueError as e:
                print(f"citewarden serve: {e}", file=sys.stderr)
                return 2
            policies = args.policy or args.env_policies
            if not policies:
                print(
                    "citewarden serve: --policy (or CITEWARDEN_POLICY) is required", file=sys.stderr
                )
                return 2
            return serve_from_args(args, policies, demo=False)
        case "demo":
            from gateway.server import serve_from_args

            return serve_from_args(args, args.policy or args.env_policies, demo=True)
        case "verify":
            from gateway.offline import verify_exchange

            return verify_exchange(
                policy_path=args.policy,
                protocol=args.protocol,
                request_path=args.request,
                response_path=args.response,
                route_name=args.route,
                out=out,
                fmt=output_format(args.format, out),
                path=args.path,
                response_headers_path=args.response_headers,
            )
        case "policy":
            from gateway.policy import check_paths

            if args.each:
                return max(check_paths([path], out) for path in args.paths)
            return check_paths(args.paths, out)
        case "report":
            from gateway.report import run

            return run(args.audit, out, fmt=output_format(args.format, out))
        case "eval":
            from gateway.eval import run as run_eval

            return run_eval(args.policy, args.data, out, fmt=output_format(args.format, out))
        case _:
            raise AssertionError(f"unhandled command {args.command!r}")


def print_json(obj: Any, out: TextIO) -> None:
    out.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""``whitney-conformance``: run the suite against a Whitney endpoint and report per rule.

    whitney-conformance --base-url https://api.example --api-key KEY [--second-api-key KEY2]
    whitney-conformance                       # the embedded in-process mock
    whitney-conformance --only ORD --only VER-3 --keep-going --report-json out.json

Profiles: ``--profile contract`` (default) checks what the contract requires of every
deployment; ``--profile strict`` also checks the mock's exact shapes and choices
(``strict.yaml``) and reports what only it finds as strict-only, never as a contract failure.

Output: tables on a terminal; elsewhere (a pipe, a CI log) or with ``--plain``, one line per
check as it completes, failures and warnings expanded whole, then the totals. Before any
check a preflight makes sure the endpoint answers, takes the key and has capabilities; if not,
one line says what to fix (exit code 2).

Exit code: 0 when every MUST (and every check of a declared optional capability) passes,
1 when a contract rule fails, 3 under ``--profile strict`` when the contract passes but
strict-only findings remain, 2 for usage errors and a failed preflight, 130 when interrupted
(resources are still cleaned up).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from .options import PROFILES, Options

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="whitney-conformance",
        description="Black-box conformance checks of a Whitney training endpoint, rule by rule "
                    "(openapi.yaml). Without --base-url, runs against the embedded mock.")
    parser.add_argument("--base-url", default=os.environ.get("WHITNEY_BASE_URL"),
                        help="endpoint root, e.g. https://host (env WHITNEY_BASE_URL)")
    parser.add_argument("--api-key", default=os.environ.get("WHITNEY_API_KEY"),
                        help="bearer key (env WHITNEY_API_KEY)")
    parser.add_argument("--second-api-key", default=os.environ.get("WHITNEY_SECOND_API_KEY"),
                        help="a second tenant's key, for SEC-2 (env WHITNEY_SECOND_API_KEY); "
                             "without it SEC-2 is reported unsupported")
    parser.add_argument("--profile", choices=PROFILES, default="contract",
                        help="contract: only what every deployment must do (default); strict: "
                             "also the mock's exact shapes, reported as strict-only findings "
                             "(exit 3 when they are all that is left)")
    parser.add_argument("--only", action="append", default=[], metavar="RULE-PREFIX",
                        help="run only checks whose rule id starts with this (ORD, ORD-2, "
                             "ORD-2:seq-gap); repeatable or comma-separated. SCHEMA-1 and "
                             "TRANSPORT-1:every-response (which judge every response) always "
                             "run too")
    parser.add_argument("--keep-going", action="store_true",
                        help="run every check even after a failing MUST")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                        help="per-request timeout (default 30)")
    parser.add_argument("--report-json", metavar="FILE", help="write a JSON report")
    parser.add_argument("--junitxml", metavar="FILE", help="write a JUnit XML report")
    parser.add_argument("--openapi", metavar="PATH",
                        help="contract to validate responses against (default: the copy "
                             "shipped in the package)")
    parser.add_argument("--no-schema", action="store_true",
                        help="do not validate responses against openapi.yaml (SCHEMA-1/2 warn)")
    parser.add_argument("--fuzz-examples", type=int, default=Options.fuzz_examples,
                        metavar="N", help="schemathesis examples per operation (0 disables "
                                          "SCHEMA-2; default %(default)s)")
    parser.add_argument("--max-wait", type=float, default=Options.max_wait_seconds,
                        metavar="SECONDS", help="longest deliberate wait, e.g. for TTL expiry "
                                                "(default %(default)s)")
    parser.add_argument("--max-duration", type=float, default=None, metavar="SECONDS",
                        help="bound on the whole run: checks not started by then are not run, "
                             "waits stop there (default: none)")
    parser.add_argument("--quota-probe", type=int, default=Options.quota_probe, metavar="N",
                        help="fill quotas up to N to provoke quota_exceeded (default "
                             "%(default)s)")
    parser.add_argument("--plain", action="store_true",
                        help="plain lines even on a terminal (the default when stdout is not "
                             "one)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="full details")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    from .checks import all_checks
    from .registry import select

    only = [part for item in args.only for part in item.split(",") if part.strip()]
    checks = select(all_checks(), only)
    if args.list:
        for entry in checks:
            cap = f" [{entry.capability}]" if entry.capability else ""
            print(f"{entry.id:40} {entry.level.value:8}{cap} {entry.title}")
        return 0
    if only and not checks:
        print(f"--only {only}: no check matches", file=sys.stderr)
        return 2

    from .report import header, plain_lines, print_plain, print_report, write_json, write_junit
    from .runner import CheckOutcome, PreflightFailed, run_suite
    from .schema import OpenAPI
    from .target import mask_secrets, open_target

    try:
        target = open_target(args.base_url, args.api_key, args.second_api_key,
                             timeout=args.timeout, use_env=False)
        openapi = None if args.no_schema else OpenAPI.load(args.openapi)
        options = Options(profile=args.profile, max_wait_seconds=args.max_wait,
                          max_duration_seconds=args.max_duration,
                          quota_probe=args.quota_probe, fuzz_examples=args.fuzz_examples)
    except (ValueError, FileNotFoundError) as exc:
        print(f"whitney-conformance: {exc}", file=sys.stderr)
        return 2
    secrets = target.secrets()
    plain = args.plain or not sys.stdout.isatty()
    console = None
    if not plain:
        from rich.console import Console

        console = Console()

    def say(line: str, style: str = "") -> None:
        line = mask_secrets(line, secrets)
        if console is None:
            print(line, flush=True)
        else:
            from rich.markup import escape

            console.print(f"[{style}]{escape(line)}[/]" if style else escape(line))

    started: list[bool] = []

    def begin() -> None:  # after the preflight: a failed one prints its one line only
        if plain and not started:
            started.append(True)
            say(header(target.description, args.profile))

    def on_outcome(outcome: CheckOutcome) -> None:
        begin()
        if plain:
            for line in plain_lines(outcome, verbose=args.verbose):
                say(line)
        elif args.verbose:
            say(f"{outcome.status.value:12} {outcome.check.id}")

    def on_progress(line: str) -> None:
        begin()
        say(f"... {line}", "dim")

    try:
        summary = run_suite(target, only=only or None, keep_going=args.keep_going,
                            options=options, openapi=openapi,
                            validate_schema=not args.no_schema, on_outcome=on_outcome,
                            on_progress=on_progress)
    except PreflightFailed as exc:
        print(mask_secrets(f"whitney-conformance: {exc}", secrets), file=sys.stderr)
        return 2
    finally:
        target.close()
    if plain:
        print_plain(summary, verbose=args.verbose, checks=False)
    else:
        print_report(summary, console, verbose=args.verbose)
    if args.report_json:
        write_json(summary, args.report_json)
    if args.junitxml:
        write_junit(summary, args.junitxml)
    return summary.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

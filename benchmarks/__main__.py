"""``python -m benchmarks``: every ratio of issue 6, measured side by side in one run.

Prints one table (row, measured, floor, ratio, goal, verdict) and, with ``--json FILE``, writes
the same rows plus run metadata. Exit status 0 unless the command itself is misused.
"""

from __future__ import annotations

import argparse
import os
import sys

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Measure the mock against its floors (bare Starlette route, orjson.loads, "
                    "bare numpy matmuls ...) in one process run and print the ratios.")
    parser.add_argument("--json", metavar="FILE", help="also write the rows and metadata as JSON")
    parser.add_argument("--quick", action="store_true",
                        help="same sizes, fewer repeats (same as --preset quick)")
    parser.add_argument("--preset", choices=["full", "quick", "tiny"], default=None,
                        help="sizes and repeats: full (default), quick, or tiny (smoke test: "
                             "small sizes, numbers not meaningful)")
    parser.add_argument("--skip-suites", action="store_true",
                        help="skip row 8 (conformance suite and full pytest wall times)")
    parser.add_argument("--only", metavar="GROUPS", default="",
                        help="comma-separated row groups to run, e.g. 1,3 (default: all)")
    parser.add_argument("--blas-threads", type=int, default=1, metavar="N",
                        help="BLAS threads for this run and its uvicorn child (default 1: the "
                             "mock runs one primitive at a time, and on a shared 2-core box "
                             "multi-threaded OpenBLAS spins; 0 = leave the environment alone)")
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="clock of the in-process rows: cpu (this process's CPU time, "
                             "robust on a shared machine; default) or wall. Rows that involve "
                             "the uvicorn child always use wall time")
    parser.add_argument("--no-notes", action="store_true", help="print the table only")
    parser.add_argument("--markdown", metavar="FILE",
                        help="also write the table as Markdown (the README's table)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    groups = [g.strip() for g in args.only.split(",") if g.strip()] or None
    suite_env = dict(os.environ)  # the suites run in the user's environment, untouched
    if args.blas_threads > 0:
        # Must happen before numpy is imported (the runner imports it lazily).
        if "numpy" in sys.modules:
            print("warning: numpy already imported; --blas-threads has no effect",
                  file=sys.stderr)
        for var in BLAS_VARS:
            os.environ[var] = str(args.blas_threads)

    from rich.console import Console

    from mock_server.engine.allocator import tune_malloc

    # The server's malloc settings (python -m mock_server) for this process too, so that the
    # in-process rows and their floors (bare numpy, the model's own compute) run under them.
    tune_malloc()

    from .core import PRESETS
    from .report import print_report, write_json
    from .runner import GROUPS, run

    unknown = set(groups or ()) - set(GROUPS)
    if unknown:
        print(f"unknown group(s) {sorted(unknown)}; choose from {', '.join(GROUPS)}",
              file=sys.stderr)
        return 2
    console = Console(stderr=True)
    cfg = PRESETS[args.preset or ("quick" if args.quick else "full")].with_(clock=args.clock)
    rows, meta = run(cfg, groups=groups or GROUPS, skip_suites=args.skip_suites,
                     suite_env=suite_env, progress=lambda line: console.print(line, style="dim"))
    print_report(rows, meta, show_notes=not args.no_notes)
    if args.json:
        write_json(args.json, rows, meta)
        console.print(f"wrote {args.json}", style="dim")
    if args.markdown:
        from .report import markdown

        with open(args.markdown, "w") as out:
            out.write(markdown(rows, meta))
        console.print(f"wrote {args.markdown}", style="dim")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

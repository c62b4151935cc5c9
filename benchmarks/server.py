"""``python -m benchmarks.server --port N``: the mock plus the bare floor route over uvicorn,
with the settings ``python -m mock_server`` uses (default http and loop, log level warning)."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    import uvicorn

    from mock_server.engine.allocator import tune_malloc
    from mock_server.engine.model import pin_blas_threads

    from .fixtures import combined_app

    tune_malloc()  # as python -m mock_server does
    pin_blas_threads()

    uvicorn.run(combined_app(), host="127.0.0.1", port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m benchmarks.hotspots [TARGET ...] [--top N]``: cProfile of the benchmarked paths.

Targets: ``request`` (in-process ``logprobs`` calls, row 1), ``body`` (the body path, row 2),
``compute`` (``loss_and_grad`` 32 x 512, row 3), ``sample`` (16 x 256, row 4). Prints the
top functions by own time, so the next optimisation starts from a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
from collections.abc import Callable
from typing import Any

import numpy as np

from mock_server.backend import schemas
from mock_server.backend.primitives import prepare_forward

from .body import backend_run, body_bytes
from .compute import _model_call
from .core import PRESETS
from .fixtures import mock_run, sample_body, text_tokens

TARGETS = ("request", "body", "compute", "sample")


async def _request_loop(n: int) -> Callable[[], Any]:
    handle = await mock_run()
    tokens = text_tokens(np.random.default_rng(1), 16)

    async def run() -> None:
        for _ in range(n):
            await handle.call("logprobs", {"version": 0, "token_ids": tokens})
    return run


async def _sample_loop(n: int) -> Callable[[], Any]:
    handle = await mock_run()
    prompt = text_tokens(np.random.default_rng(4), 8)

    async def run() -> None:
        for _ in range(n):
            await handle.call("sample", sample_body(0, 16, 256, prompt))
    return run


def _profile(fn: Callable[[], Any], top: int, sort: str) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    result = fn()
    if asyncio.iscoroutine(result):
        asyncio.get_event_loop().run_until_complete(result)  # the loop set up in main()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).strip_dirs().sort_stats(sort).print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hotspots")
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help=f"any of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--sort", default="tottime", choices=["tottime", "cumulative"])
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        parser.error(f"unknown target(s) {sorted(unknown)}")
    cfg = PRESETS["full"]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    for target in args.targets or TARGETS:
        if target == "request":
            run = loop.run_until_complete(_request_loop(2000))
            fn: Callable[[], Any] = run
        elif target == "body":
            raw = body_bytes(cfg)
            backend, live = backend_run()

            def fn() -> None:
                for _ in range(20):
                    body = schemas.decode(raw, schemas.Forward).body
                    prepare_forward(backend, live, body, backward=True)
        elif target == "compute":
            call = _model_call(cfg, cfg.compute_datums, cfg.compute_tokens)

            def fn() -> None:
                for _ in range(10):
                    call()
        else:
            fn = loop.run_until_complete(_sample_loop(20))
        print(f"==== {target} " + "=" * 60)
        print(_profile(fn, args.top, args.sort))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

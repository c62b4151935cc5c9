"""Row 5: requests held for a seq gap must not burn CPU (ORD-2: no busy waiting).

On a fresh run, ``logprobs`` requests with seqs 2..N+1 are sent concurrently (in-process,
``AsyncClient`` + ``ASGITransport``) while seq 1 is withheld. Once all of them are held, the
process CPU time is read over a wall-clock window; then seq 1 (``save_weights_for_sampler``
of version 0) is sent and every held request must complete with 200. The floor is the CPU
time of the same window with nothing held; the ratio is CPU seconds per wall second.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from .core import Config, Row, make_row
from .fixtures import mock_run, text_tokens

GOAL = 0.02  # CPU seconds per wall second while held


async def _cpu_over(window_s: float) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.sleep(window_s)
    return time.process_time() - cpu, time.perf_counter() - wall


async def rows(cfg: Config) -> list[Row]:
    handle = await mock_run(rank=cfg.lora_rank, save_version=False, order_wait_ms=120_000)
    tokens = text_tokens(np.random.default_rng(5), cfg.logprob_tokens)
    count = cfg.held_requests
    try:
        idle_cpu, _ = await _cpu_over(cfg.held_window_s)
        tasks = [asyncio.create_task(handle.post("logprobs", {"seq": seq, "version": 0,
                                                             "token_ids": tokens}))
                 for seq in range(2, count + 2)]
        deadline = time.monotonic() + 30.0
        while len(handle.run.held) < count:
            if time.monotonic() > deadline or any(t.done() for t in tasks):
                raise RuntimeError(f"only {len(handle.run.held)} of {count} requests are held")
            await asyncio.sleep(0.005)
        held_cpu, wall = await _cpu_over(cfg.held_window_s)
        still_held = len(handle.run.held)
        first = await handle.post("save_weights_for_sampler", {"seq": 1, "version": 0})
        responses = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60.0)
    finally:
        await handle.aclose()
    completed = sum(1 for r in responses if r.status_code == 200)
    ok = first.status_code == 200 and completed == count and still_held == count
    return [make_row("5 held requests", f"{count} requests held for a seq gap, "
                     f"{cfg.held_window_s:g} s window", held_cpu, idle_cpu, "cpu s", GOAL,
                     f"ratio = CPU s per wall s while held (floor: same window, nothing held); "
                     f"{completed}/{count} completed after seq 1", ratio=held_cpu / wall, ok=ok,
                     completed=completed, held=still_held)]

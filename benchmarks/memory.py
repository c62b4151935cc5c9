"""Row 7: memory per run and per saved version (versions hold LoRA parameters only).

``tracemalloc`` counts every Python and numpy allocation still alive after a ``gc.collect``,
so the delta per version is exact; the resident set size (``/proc/self/statm``) is measured in
a separate pass without ``tracemalloc`` (whose own bookkeeping would inflate it) and shown as
a note. The floor per version is the bytes of the LoRA parameters; per run it is parameters
plus the two AdamW moments. A version that copied base weights (about 8x the rank-8 LoRA
here) or kept per-request garbage would show up as a ratio far above 1.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Awaitable, Callable

from .core import Config, Row, make_row
from .fixtures import mock_run, new_run

GOAL_VERSION = 1.5
GOAL_RUN = 1.5


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


async def _traced(action: Callable[[], Awaitable[None]]) -> int:
    """Bytes still allocated after ``action`` (traced allocations, after a full collection)."""
    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await action()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


async def _rss(action: Callable[[], Awaitable[None]]) -> int | None:
    gc.collect()
    before = rss_bytes()
    await action()
    gc.collect()
    after = rss_bytes()
    return None if before is None or after is None else after - before


async def _versions_delta(cfg: Config, traced: bool) -> tuple[int | None, int]:
    handle = await mock_run(rank=cfg.lora_rank)  # saves version 0: warms every code path
    lora_bytes = sum(a.nbytes for a in handle.run.lora.params.values())

    async def save_all() -> None:
        for version in range(1, cfg.versions + 1):
            await handle.call("save_weights_for_sampler", {"version": version})

    try:
        delta = await (_traced(save_all) if traced else _rss(save_all))
        if len(handle.run.versions) != cfg.versions + 1:
            raise RuntimeError(f"the run keeps {len(handle.run.versions)} versions")
    finally:
        await handle.aclose()
    return delta, lora_bytes


async def _runs_delta(cfg: Config) -> tuple[int, int]:
    handle = await mock_run(rank=cfg.lora_rank)
    run = handle.run
    floor = sum(a.nbytes for a in run.lora.params.values())
    floor += sum(a.nbytes for a in run.optimizer.m.values())
    floor += sum(a.nbytes for a in run.optimizer.v.values())

    async def create_runs() -> None:
        for _ in range(cfg.memory_runs):
            await new_run(handle.client, cfg.lora_rank)

    try:
        return await _traced(create_runs), floor
    finally:
        await handle.aclose()


async def rows(cfg: Config) -> list[Row]:
    group = "7 memory"
    rss, _ = await _versions_delta(cfg, traced=False)
    traced, lora_bytes = await _versions_delta(cfg, traced=True)
    assert traced is not None
    per_version = traced / cfg.versions
    rss_note = "n/a" if rss is None else f"{rss / cfg.versions / 1024:.1f} KiB"
    run_bytes, run_floor = await _runs_delta(cfg)
    return [
        make_row(group, f"per saved version ({cfg.versions} versions, rank {cfg.lora_rank})",
                 per_version, lora_bytes, "bytes", GOAL_VERSION,
                 f"tracemalloc delta per save_weights_for_sampler (snapshot + operation "
                 f"record) vs LoRA parameter bytes; RSS delta per version {rss_note}",
                 rss_delta_bytes=rss, total_traced_bytes=traced),
        make_row(group, f"per run (session + rank-{cfg.lora_rank} run, {cfg.memory_runs} runs)",
                 run_bytes / cfg.memory_runs, run_floor, "bytes", GOAL_RUN,
                 "tracemalloc delta per new session + run vs LoRA params + AdamW m and v"),
    ]

"""Rows, sizes and the timing discipline shared by every benchmark.

Every row compares a ``measured`` cost with its ``floor`` (the cheapest thing that does the same
job: a bare Starlette route, ``orjson.loads``, the bare matmuls ...), both measured in the same
process run. The two are timed *interleaved* (measured, floor, measured, floor ...) after a
warm-up, and each side's median is kept: the machine is shared, and interleaving makes a noisy
neighbour slow down both sides alike instead of skewing the ratio.
"""

from __future__ import annotations

import inspect
import math
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

__all__ = ["Config", "Row", "make_row", "interleave", "PRESETS"]

Timed = Callable[[], Any] | Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class Config:
    """Sizes and time budgets. ``FULL`` uses the issue's sizes; ``QUICK`` shrinks the time spent
    (fewer repeats) but keeps the sizes; ``TINY`` shrinks sizes too (smoke test only)."""

    name: str = "full"
    # 1. request overhead
    logprob_tokens: int = 16
    # 2. body handling
    body_datums: int = 64
    body_tokens: int = 1024
    # 3. compute (datums x tokens); linearity at 1x, 4x, 16x tokens
    compute_datums: int = 32
    compute_tokens: int = 512
    linear_shapes: tuple[tuple[int, int], ...] = ((4, 256), (8, 512), (16, 1024))
    # 4. sampling
    sample_many: int = 16
    sample_tokens: int = 256
    # 5. held requests
    held_requests: int = 64
    held_window_s: float = 1.0
    # 6. concurrency over uvicorn
    clients: int = 32
    cycles: int = 5
    group_size: int = 4
    prompt_tokens: int = 16
    completion_tokens: int = 24
    concurrency_rounds: int = 3
    # 7. memory
    versions: int = 1000
    memory_runs: int = 8
    lora_rank: int = 8
    # timing discipline
    warmup: int = 2
    min_rounds: int = 5
    max_rounds: int = 41
    budget_s: float = 4.0        # per interleaved comparison
    min_sample_s: float = 0.02   # an inner loop repeats a fast call until one sample takes this
    clock: str = "cpu"           # in-process rows: "cpu" (process CPU time) or "wall"
    suite_timeout_s: float = 600.0

    def with_(self, **changes: Any) -> Config:
        return replace(self, **changes)


PRESETS: dict[str, Config] = {
    "full": Config(),
    "quick": Config(name="quick", warmup=1, min_rounds=3, max_rounds=9, budget_s=1.0,
                    min_sample_s=0.01, held_window_s=0.5, concurrency_rounds=2),
    "tiny": Config(name="tiny", logprob_tokens=8, body_datums=4, body_tokens=64,
                   compute_datums=4, compute_tokens=64, linear_shapes=((1, 32), (2, 64), (4, 128)),
                   sample_many=4, sample_tokens=16, held_requests=8, held_window_s=0.2,
                   clients=4, cycles=2, concurrency_rounds=1, group_size=2, prompt_tokens=4,
                   completion_tokens=4, versions=20, memory_runs=2, warmup=1, min_rounds=2,
                   max_rounds=3, budget_s=0.1, min_sample_s=0.0, suite_timeout_s=60.0),
}


@dataclass
class Row:
    """One line of the table. ``goal`` is the largest acceptable ``ratio`` (``None``: shown for
    information only). ``verdict`` is "meets", "misses", "info" or "n/a"."""

    group: str
    name: str
    measured: float | None
    floor: float | None
    unit: str
    ratio: float | None
    goal: float | None
    verdict: str
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_row(group: str, name: str, measured: float | None, floor: float | None, unit: str,
             goal: float | None, note: str = "", *, ratio: float | None = None,
             ok: bool | None = None, **extra: Any) -> Row:
    """A row whose ratio is ``measured / floor`` unless given; ``ok=False`` forces "misses"
    (a correctness condition of the row failed, e.g. a held request never completed)."""
    if ratio is None and measured is not None and floor:
        ratio = measured / floor
    if measured is None:
        verdict = "n/a"
    elif goal is None:
        verdict = "info" if ok is not False else "misses"
    else:
        verdict = "meets" if ratio is not None and ratio <= goal and ok is not False else "misses"
    return Row(group, name, measured, floor, unit, ratio, goal, verdict, note, dict(extra))


@dataclass
class Timing:
    median_s: float
    samples_s: list[float]
    number: int


async def _call(fn: Timed) -> None:
    result = fn()
    if inspect.isawaitable(result):
        await result


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


async def _sample(fn: Timed, number: int, clock: Callable[[], float]) -> float:
    start = clock()
    for _ in range(number):
        await _call(fn)
    return (clock() - start) / number


async def _calibrate(fn: Timed, min_sample_s: float, clock: Callable[[], float]) -> int:
    """timeit.autorange: the inner-loop count that makes one sample last ``min_sample_s``."""
    number = 1
    while True:
        if await _sample(fn, number, clock) * number >= min_sample_s or number >= 10_000:
            return number
        number *= 2 if number < 8 else 4


async def interleave(fns: dict[str, Timed], cfg: Config, clock: str | None = None
                     ) -> dict[str, Timing]:
    """Median seconds per call of each function (sync or async), timed in alternation.

    Warm-up ``cfg.warmup`` calls each; then rounds of one sample per function (order rotated
    every round) until ``cfg.min_rounds`` rounds are done and either ``cfg.budget_s`` has
    elapsed or ``cfg.max_rounds`` is reached. ``clock`` (default ``cfg.clock``): "cpu" counts
    this process's CPU time, so other processes on a shared machine barely disturb it; work
    done in another process (a uvicorn server) needs "wall".
    """
    tick = CLOCKS[clock or cfg.clock]
    names = list(fns)
    for name in names:
        for _ in range(cfg.warmup):
            await _call(fns[name])
    numbers = {name: await _calibrate(fns[name], cfg.min_sample_s, tick) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    start = time.perf_counter()
    rounds = 0
    while rounds < cfg.min_rounds or (rounds < cfg.max_rounds
                                      and time.perf_counter() - start < cfg.budget_s):
        order = names[rounds % len(names):] + names[:rounds % len(names)]
        for name in order:
            samples[name].append(await _sample(fns[name], numbers[name], tick))
        rounds += 1
    return {name: Timing(statistics.median(s), s, numbers[name]) for name, s in samples.items()}


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)

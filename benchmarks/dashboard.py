"""Row 10: an open dashboard must not slow the primitives (issue 15).

In-process (``ASGITransport``, one event loop, as under uvicorn), with the control plane on, a
GRPO-sized pair of primitives is timed: ``forward_backward`` on 4 x 64 tokens, then
``optim_step``. What the page does is ``GET /_mock/ui/state?since=<cursor>`` once a second
with the run's API key; its work runs on the same loop as the primitives, so process CPU time
counts both.

- **page open vs closed**: pairs for one window (1 s) with a poller task on the loop polling
  once per window, as the page does, against the same pairs with no poller. ``asyncio.sleep(0)``
  between pairs lets the poller in, as a server lets other requests in. Goal 1.05.
- **polled after every pair**: hundreds of polls per second, far above the page's rate: an
  upper bound of the read model's cost per primitive (information).
- **one poll, run of N operations**: a steady-state poll (``since`` = the last cursor, nothing
  new) of a run holding N operations, and the first poll of a page (``since=0``, everything),
  against a bare Starlette route of the same size class (information: what a poll costs).

The bookkeeping the dashboard needs on every operation (two clock reads, a revision number)
is paid with the page closed too; it is inside the "closed" figures, and was measured before
and after it was added (issue 15's note).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np

from .core import Config, Row, interleave, make_row
from .fixtures import AUTH, MockRun, floor_app, forward_body, mock_run

GROUP = "10 dashboard"
ADAMW = {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
         "weight_decay": 0.0, "grad_clip_norm": 1.0}


class _Page:
    """What the open page does: poll the state with the last cursor."""

    def __init__(self, app: Any) -> None:
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                        base_url="http://mock", headers=AUTH, timeout=60.0)
        self.cursor = 0
        self.polls = 0
        self.size = 0

    async def poll(self, since: int | None = None) -> None:
        response = await self.client.get("/_mock/ui/state",
                                         params={"since": self.cursor if since is None else since})
        if response.status_code != 200:
            raise RuntimeError(f"dashboard state: {response.status_code} {response.text[:200]}")
        self.cursor = response.json()["cursor"]
        self.polls += 1
        self.size = len(response.content)

    async def aclose(self) -> None:
        await self.client.aclose()


class _Pairs:
    def __init__(self, handle: MockRun, datums: int, tokens: int) -> None:
        self.handle = handle
        body = forward_body(np.random.default_rng(10), datums, tokens)
        body.pop("seq")
        self.fb = body

    async def pair(self) -> None:
        await self.handle.call("forward_backward", self.fb)
        await self.handle.call("optim_step", {"adamw": ADAMW})


async def _open_vs_closed(cfg: Config, pairs: _Pairs, page: _Page, window_s: float) -> Row:
    await pairs.pair()
    start = time.perf_counter()
    for _ in range(3):
        await pairs.pair()
    count = max(1, int(window_s / ((time.perf_counter() - start) / 3)))

    async def poller() -> None:  # the page: a poll, then one every window
        while True:
            await page.poll()
            await asyncio.sleep(window_s)

    async def closed() -> None:
        for _ in range(count):
            await pairs.pair()
            await asyncio.sleep(0)

    async def opened() -> None:
        task = asyncio.create_task(poller())
        try:
            await closed()
        finally:
            task.cancel()

    before = page.polls
    timings = await interleave({"open": opened, "closed": closed}, cfg)
    calls = sum(len(t.samples_s) * t.number for t in (timings["open"],)) + cfg.warmup
    polls = page.polls - before
    return make_row(GROUP, f"fb+optim pair, page open (1 poll / {window_s:g} s) vs closed",
                    timings["open"].median_s / count, timings["closed"].median_s / count, "s",
                    1.05, f"{count} pairs per window of {window_s:g} s, {polls} polls in "
                          f"{calls}+ open windows; process CPU, the poller runs on the same "
                          f"loop", polls=polls)


async def _every_pair(cfg: Config, pairs: _Pairs, page: _Page) -> Row:
    async def polled() -> None:
        await pairs.pair()
        await page.poll()

    timings = await interleave({"polled": polled, "alone": pairs.pair}, cfg)
    return make_row(GROUP, "fb+optim pair, state polled after every pair",
                    timings["polled"].median_s, timings["alone"].median_s, "s", None,
                    "information, an upper bound: hundreds of polls per second on a run that "
                    "grows to thousands of operations (the page polls once a second)")


async def _one_poll(cfg: Config, operations: int) -> list[Row]:
    handle = await mock_run(rank=8, control_plane=True)
    page = _Page(handle.app)
    floor = httpx.AsyncClient(transport=httpx.ASGITransport(app=floor_app()),
                              base_url="http://floor", headers=AUTH)
    try:
        body = {"loss_function": "cross_entropy", "loss_config": {},
                "data": [{"model_input": {"token_ids": [256, 1, 2, 3]},
                          "loss_inputs": {"target_tokens": [1, 2, 3, 4]}}]}
        for _ in range(operations):
            await handle.call("forward", body)
        await page.poll(0)
        full_size = page.size
        await page.poll()
        steady_size = page.size

        async def bare() -> None:
            (await floor.post(f"/floor/{max(steady_size, 10)}")).raise_for_status()

        async def first_load() -> None:
            await page.poll(0)

        steady = await interleave({"poll": page.poll, "bare": bare}, cfg)
        full = await interleave({"poll": first_load, "bare": bare}, cfg)
    finally:
        await floor.aclose()
        await page.aclose()
        await handle.aclose()
    note = ("floor = bare Starlette route (POST, same answer size as the steady poll); "
            "information: the cost of one poll")
    return [
        make_row(GROUP, f"one poll, run of {operations} ops, nothing new (since=cursor)",
                 steady["poll"].median_s, steady["bare"].median_s, "s", None,
                 f"{note}; {steady_size}-byte answer"),
        make_row(GROUP, f"first poll of a page, run of {operations} ops (since=0)",
                 full["poll"].median_s, full["bare"].median_s, "s", None,
                 f"{note}; {full_size}-byte answer (at most 200 ops per run)"),
    ]


async def rows(cfg: Config) -> list[Row]:
    tiny = cfg.name == "tiny"
    datums, tokens = (1, 8) if tiny else (4, 64)
    handle = await mock_run(rank=8, control_plane=True)
    page = _Page(handle.app)
    try:
        await page.poll(0)
        pairs = _Pairs(handle, datums, tokens)
        result = [await _open_vs_closed(cfg, pairs, page, 0.05 if tiny else 1.0),
                  await _every_pair(cfg, pairs, page)]
    finally:
        await page.aclose()
        await handle.aclose()
    result += await _one_poll(cfg, 20 if tiny else 1000)
    return result

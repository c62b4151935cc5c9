"""Row 6: many concurrent GRPO clients over uvicorn.

Each client owns a session and a rank-8 run and runs ``cycles`` GRPO cycles, pipelined as
ORD-2 allows: ``save_weights_for_sampler(N)`` and ``sample(N)`` are sent at once on its two
connections (the sample is held until the save executes), then rewards and group advantages
are computed with the seed's helpers (``grpo.helpers``), then ``forward_backward`` and
``optim_step`` are sent at once. The floor is the same clients run one after another (the
same work, no concurrency). Latency percentiles are per primitive, from send to full response.
The load generator is :mod:`benchmarks.rawhttp`, so the client's own cost stays small.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from grpo.helpers import forward_backward_payload, group_mean_advantages, rl_datum
from mock_server.engine.specs import BASE_MODEL_ID

from .core import Config, Row, make_row
from .fixtures import ADAMW, API, AUTH, Server, sample_body, text_tokens
from .rawhttp import RawConnection

GOAL = 1.25  # concurrent wall time / the same clients run one after another
PRIMITIVES = ("save_weights_for_sampler", "sample", "forward_backward", "optim_step")


def reward(tokens: list[int]) -> float:
    """Share of lowercase ASCII letters: cheap, and varied enough to give advantages."""
    return sum(97 <= t <= 122 for t in tokens) / max(1, len(tokens))


class Stats:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: list[str] = []

    async def post(self, conn: RawConnection, path: str, body: dict[str, Any],
                   label: str, expect: int = 200) -> dict[str, Any] | None:
        start = time.perf_counter()
        try:
            status, content = await conn.request("POST", path, orjson.dumps(body))
        except (OSError, RuntimeError, asyncio.IncompleteReadError) as exc:
            self.errors.append(f"{label}: {type(exc).__name__} {exc}")
            return None
        if label in PRIMITIVES:
            self.latency[label].append(time.perf_counter() - start)
        if status != expect:
            self.errors.append(f"{label}: {status} {content[:120]!r}")
            return None
        return orjson.loads(content)  # type: ignore[no-any-return]


async def grpo_client(url: str, cfg: Config, stats: Stats, index: int) -> None:
    first, second = RawConnection(url, AUTH), RawConnection(url, AUTH)
    try:
        session = await stats.post(first, "/sessions", {}, "create session", 201)
        if session is None:
            return
        run = await stats.post(first, f"/sessions/{session['session_id']}/runs",
                               {"base_model": BASE_MODEL_ID, "optimizer": "adamw",
                                "lora": {"rank": cfg.lora_rank, "alpha": 2.0 * cfg.lora_rank,
                                         "seed": index}}, "create run", 201)
        if run is None:
            return
        path = f"/runs/{run['run_id']}"
        prompt = text_tokens(np.random.default_rng(100 + index), cfg.prompt_tokens)
        seq = 1
        for cycle in range(cfg.cycles):
            answers = await asyncio.gather(
                stats.post(first, f"{path}/save_weights_for_sampler",
                           {"seq": seq, "version": cycle}, "save_weights_for_sampler"),
                stats.post(second, f"{path}/sample",
                           sample_body(seq + 1, cfg.group_size, cfg.completion_tokens, prompt,
                                       seed=1000 * index + cycle, version=cycle), "sample"))
            seq += 2
            sampled = answers[1]
            if sampled is None:
                return
            sequences = sampled["sequences"]
            advantages = group_mean_advantages([reward(s["tokens"]) for s in sequences],
                                               normalize_std=True)
            data = [rl_datum(prompt, s["tokens"], s["logprobs"], a)
                    for s, a in zip(sequences, advantages, strict=False)]
            await asyncio.gather(
                stats.post(first, f"{path}/forward_backward",
                           {"seq": seq, **forward_backward_payload(data, "importance_sampling")},
                           "forward_backward"),
                stats.post(second, f"{path}/optim_step", {"seq": seq + 1, "adamw": ADAMW},
                           "optim_step"))
            seq += 2
        if await stats.post(first, f"{path}/finish", {}, "finish") is not None:
            await stats.post(first, f"/sessions/{session['session_id']}/close", {}, "close")
    finally:
        await first.close()
        await second.close()


@dataclass
class Drive:
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float | None
    stats: Stats


async def _drive(server: Server, cfg: Config, clients: int, *, concurrent: bool) -> Drive:
    """``clients`` GRPO clients, all at once or one after another (the floor)."""
    stats = Stats()
    url = f"{server.url}{API}"
    cpu, own_cpu, start = server.cpu_s(), time.process_time(), time.perf_counter()
    if concurrent:
        await asyncio.gather(*(grpo_client(url, cfg, stats, i) for i in range(clients)))
    else:
        for i in range(clients):
            await grpo_client(url, cfg, stats, i)
    wall, own_cpu = time.perf_counter() - start, time.process_time() - own_cpu
    cpu_after = server.cpu_s()
    used = None if cpu is None or cpu_after is None else cpu_after - cpu
    return Drive(wall, own_cpu, used, stats)


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _median_drive(drives: list[Drive]) -> Drive:
    """The median-wall drive, with the latencies and errors of all of them."""
    middle = sorted(drives, key=lambda d: d.wall_s)[len(drives) // 2]
    stats = Stats()
    for drive in drives:
        stats.errors += drive.stats.errors
        for primitive, values in drive.stats.latency.items():
            stats.latency[primitive] += values
    return Drive(middle.wall_s, middle.client_cpu_s, middle.server_cpu_s, stats)


async def rows(cfg: Config, server: Server) -> list[Row]:
    group = "6 concurrency"
    await _drive(server, cfg.with_(cycles=1), 2, concurrent=True)  # warm-up
    serial: list[Drive] = []
    concurrent: list[Drive] = []
    for _ in range(cfg.concurrency_rounds):  # alternated, so a noisy neighbour hits both
        serial.append(await _drive(server, cfg, cfg.clients, concurrent=False))
        concurrent.append(await _drive(server, cfg, cfg.clients, concurrent=True))
    alone, crowd = _median_drive(serial), _median_drive(concurrent)
    stats, wall = crowd.stats, crowd.wall_s
    cycles = cfg.clients * cfg.cycles
    calls = cycles * len(PRIMITIVES)
    errors = stats.errors + alone.stats.errors
    out = [
        make_row(group, f"{cfg.clients} clients x {cfg.cycles} pipelined GRPO cycles, wall", wall,
                 alone.wall_s, "s", GOAL,
                 f"uvicorn; floor = the same {cfg.clients} clients one after another; median "
                 f"of {cfg.concurrency_rounds} alternated rounds; {cycles / wall:.1f} cycles/s, "
                 f"{calls / wall:.0f} primitives/s; group {cfg.group_size} x "
                 f"{cfg.completion_tokens} tok; load-generator CPU {crowd.client_cpu_s:.2f} s",
                 throughput_cycles_s=cycles / wall, throughput_calls_s=calls / wall,
                 client_cpu_s=crowd.client_cpu_s),
        make_row(group, "errors", float(len(errors)), 0.0, "count", 0.0,
                 "; ".join(errors[:3]) or "every request answered as expected",
                 ratio=float(len(errors))),
    ]
    if crowd.server_cpu_s is not None and alone.server_cpu_s:
        out.append(make_row(group, "  server CPU, concurrent vs one after another",
                            crowd.server_cpu_s, alone.server_cpu_s, "cpu s", None,
                            f"CPU of the uvicorn process (10 ms ticks); "
                            f"{1e3 * crowd.server_cpu_s / cycles:.1f} ms per cycle"))
    for primitive in PRIMITIVES:
        values = stats.latency.get(primitive, [])
        p50, p99 = _percentile(values, 50), _percentile(values, 99)
        out.append(make_row(group, f"  latency {primitive}: p99 vs p50", p99, p50, "s", None,
                            f"{len(values)} calls", p50_s=p50, p99_s=p99))
    return out

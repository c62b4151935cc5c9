"""Row 1: request overhead of a small ``logprobs`` call against a bare Starlette route.

Both sides send the same request bytes and get a JSON body of the same size back, through the
same client: in-process (``httpx.ASGITransport``) and over uvicorn (TCP, keep-alive). The
mock's side includes everything a real call does: auth, ``tick``, parsing, pydantic, the
digest, ordering, 16 positions of model compute and rendering.
"""

from __future__ import annotations

import httpx
import numpy as np
import orjson

from .core import Config, Row, interleave, make_row
from .fixtures import API, AUTH, Server, floor_app, mock_run, new_run, text_tokens

GOAL = 1.5


class _Logprobs:
    """Posts ``logprobs`` with a fresh seq each call, and the same bytes to the floor."""

    def __init__(self, client: httpx.AsyncClient, run_id: str, floor: httpx.AsyncClient,
                 floor_path: str, tokens: list[int], first_seq: int) -> None:
        self.client, self.run_id, self.floor, self.tokens = client, run_id, floor, tokens
        self.seq = first_seq
        self.floor_path = floor_path
        self.floor_body = self.body()

    def body(self) -> bytes:
        return orjson.dumps({"seq": self.seq, "version": 0, "token_ids": self.tokens})

    async def mock(self) -> None:
        response = await self.client.post(f"/runs/{self.run_id}/logprobs", content=self.body(),
                                          headers={"content-type": "application/json"})
        if response.status_code != 200:
            raise RuntimeError(f"logprobs: {response.status_code} {response.text[:200]}")
        self.seq += 1

    async def bare(self) -> None:
        response = await self.floor.post(self.floor_path, content=self.floor_body,
                                         headers={"content-type": "application/json"})
        response.raise_for_status()


async def _response_size(client: httpx.AsyncClient, run_id: str, seq: int,
                         tokens: list[int]) -> int:
    response = await client.post(f"/runs/{run_id}/logprobs",
                                 json={"seq": seq, "version": 0, "token_ids": tokens})
    response.raise_for_status()
    return len(response.content)


async def in_process(cfg: Config) -> Row:
    tokens = text_tokens(np.random.default_rng(1), cfg.logprob_tokens)
    handle = await mock_run(rank=cfg.lora_rank)
    size = await _response_size(handle.client, handle.run_id, handle.take_seq(), tokens)
    floor = httpx.AsyncClient(transport=httpx.ASGITransport(app=floor_app()),
                              base_url="http://floor", headers=AUTH)
    bench = _Logprobs(handle.client, handle.run_id, floor, f"/floor/{size}", tokens,
                      handle.next_seq)
    try:
        timings = await interleave({"mock": bench.mock, "floor": bench.bare}, cfg)
    finally:
        await floor.aclose()
        await handle.aclose()
    return make_row("1 request overhead", f"logprobs {cfg.logprob_tokens} tok, in-process",
                    timings["mock"].median_s, timings["floor"].median_s, "s", GOAL,
                    f"ASGITransport; floor = bare Starlette route, same request bytes, "
                    f"{size}-byte JSON answer")


async def over_uvicorn(cfg: Config, server: Server) -> Row:
    url = server.url
    tokens = text_tokens(np.random.default_rng(1), cfg.logprob_tokens)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=f"{url}{API}", headers=AUTH, limits=limits,
                                 timeout=60.0) as client, \
            httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as floor:
        run_id = await new_run(client, cfg.lora_rank)
        saved = await client.post(f"/runs/{run_id}/save_weights_for_sampler",
                                  json={"seq": 1, "version": 0})
        saved.raise_for_status()
        size = await _response_size(client, run_id, 2, tokens)
        bench = _Logprobs(client, run_id, floor, f"/floor/{size}", tokens, 3)
        timings = await interleave({"mock": bench.mock, "floor": bench.bare}, cfg, clock="wall")
    return make_row("1 request overhead", f"logprobs {cfg.logprob_tokens} tok, uvicorn",
                    timings["mock"].median_s, timings["floor"].median_s, "s", GOAL,
                    "uvicorn (h11, asyncio) in a child process, one keep-alive connection, "
                    "wall clock; floor = bare Starlette route in the same server")


async def rows(cfg: Config, server: Server | None = None) -> list[Row]:
    """The in-process row; with ``server``, the uvicorn row too."""
    out = [await in_process(cfg)]
    if server is not None:
        out.append(await over_uvicorn(cfg, server))
    return out


async def over_uvicorn_rows(cfg: Config, server: Server) -> list[Row]:
    return [await over_uvicorn(cfg, server)]

"""Group 1: request overhead against a bare Starlette route (issue 16's goals).

Both sides send the same request bytes and get a JSON body of the same size back, through the
same client: in-process (``httpx.ASGITransport``) and over uvicorn (TCP, keep-alive). The
mock's side includes everything a real call does: auth, ``tick``, parsing, validation, the
digest, ordering, the model's compute and rendering. Step rows add the model's own compute
(the same call on the same weights, no HTTP) to the bare route: the least any server that
computes the answer can take, so the distance to it is the mock's own overhead.

The forward_backward row sends an 8 x 128 body over uvicorn and compares it with the bare
route reading the same body plus ``loss_and_grad`` on the same data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import orjson

from mock_server.engine.losses import resolve_loss_config
from mock_server.engine.model import get_base_model
from mock_server.engine.specs import BASE_MODEL_ID

from .core import Config, Row, interleave, make_row
from .fixtures import API, AUTH, Server, floor_app, forward_body, mock_run, new_run, text_tokens

GOAL_IN_PROCESS = 1.3  # issue 16: logprobs 16 tokens in-process vs a bare Starlette route
GOAL_UVICORN = 1.2     # issue 16: the same over uvicorn, and forward_backward 8 x 128
FB_DATUMS, FB_TOKENS = 8, 128


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


def _score(tokens: list[int], rank: int) -> Callable[[], Any]:
    """The model's own compute of one logprobs call: ``score`` on a fresh rank-``rank``
    adapter (what version 0 of a new run holds), no HTTP."""
    model = get_base_model(BASE_MODEL_ID)
    lora = model.init_lora(rank, 2.0 * rank, seed=1)
    ids = np.asarray(tokens, dtype=np.int64)
    return lambda: model.score(lora, ids)


def _forward(datums: int, tokens: int, rank: int) -> tuple[dict[str, Any], Callable[[], Any]]:
    """A forward_backward body and the model's own compute of it (``loss_and_grad``)."""
    body = forward_body(np.random.default_rng(3), datums, tokens)
    model = get_base_model(BASE_MODEL_ID)
    lora = model.init_lora(rank, 2.0 * rank, seed=1)
    ids = [np.asarray(d["model_input"]["token_ids"], dtype=np.int64) for d in body["data"]]
    inputs = [{k: np.asarray(v, dtype=np.float64) for k, v in d["loss_inputs"].items()}
              for d in body["data"]]
    config = resolve_loss_config(body["loss_function"], {})

    def compute() -> None:
        model.loss_and_grad(lora, ids, inputs, body["loss_function"], config, need_grad=True)

    return body, compute


async def in_process(cfg: Config) -> list[Row]:
    tokens = text_tokens(np.random.default_rng(1), cfg.logprob_tokens)
    handle = await mock_run(rank=cfg.lora_rank)
    size = await _response_size(handle.client, handle.run_id, handle.take_seq(), tokens)
    floor = httpx.AsyncClient(transport=httpx.ASGITransport(app=floor_app()),
                              base_url="http://floor", headers=AUTH)
    bench = _Logprobs(handle.client, handle.run_id, floor, f"/floor/{size}", tokens,
                      handle.next_seq)
    try:
        timings = await interleave({"mock": bench.mock, "floor": bench.bare,
                                    "score": _score(tokens, cfg.lora_rank)}, cfg)
    finally:
        await floor.aclose()
        await handle.aclose()
    group, bare = "1 request overhead", timings["floor"].median_s
    composed = bare + timings["score"].median_s
    return [
        make_row(group, f"logprobs {cfg.logprob_tokens} tok, in-process vs bare route",
                 timings["mock"].median_s, bare, "s", GOAL_IN_PROCESS,
                 f"ASGITransport; floor = bare Starlette route, same request bytes, "
                 f"{size}-byte JSON answer"),
        make_row(group, "  step: bare route + the model's own compute (score)", composed,
                 bare, "s", None, f"the floor plus BaseModel.score of the same "
                 f"{cfg.logprob_tokens} tokens ({timings['score'].median_s * 1e6:.0f} us): no "
                 f"server that computes the answer does better than this ratio"),
        make_row(group, "  step: mock vs (bare route + the model's own compute)",
                 timings["mock"].median_s, composed, "s", None,
                 "what the mock adds itself: auth, parsing, validation, digest, ordering, "
                 "records, rendering, middleware"),
    ]


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
        timings = await interleave({"mock": bench.mock, "floor": bench.bare,
                                    "score": _score(tokens, cfg.lora_rank)}, cfg, clock="wall")
    group, bare = "1 request overhead", timings["floor"].median_s
    composed = bare + timings["score"].median_s
    return make_row(group, f"logprobs {cfg.logprob_tokens} tok, uvicorn vs bare route",
                    timings["mock"].median_s, bare, "s", GOAL_UVICORN,
                    "uvicorn (h11, asyncio) in a child process, one keep-alive connection, "
                    "wall clock; floor = bare Starlette route in the same server",
                    composed_floor_s=composed)


async def forward_over_uvicorn(cfg: Config, server: Server) -> list[Row]:
    """forward_backward 8 x 128 over uvicorn vs (bare route reading the same body + the
    model's own compute of it)."""
    body, compute = _forward(FB_DATUMS, FB_TOKENS, cfg.lora_rank)
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=f"{server.url}{API}", headers=AUTH, limits=limits,
                                 timeout=60.0) as client, \
            httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60.0) as floor:
        run_id = await new_run(client, cfg.lora_rank)
        seq = [1]
        first = await client.post(f"/runs/{run_id}/forward_backward",
                                  content=orjson.dumps({**body, "seq": 1}))
        first.raise_for_status()
        seq[0] = 2
        raw = orjson.dumps({**body, "seq": 1})
        path = f"/floor/{len(first.content)}"

        async def mock() -> None:
            response = await client.post(f"/runs/{run_id}/forward_backward",
                                         content=orjson.dumps({**body, "seq": seq[0]}),
                                         headers={"content-type": "application/json"})
            if response.status_code != 200:
                raise RuntimeError(f"forward_backward: {response.status_code} "
                                   f"{response.text[:200]}")
            seq[0] += 1

        async def bare() -> None:
            response = await floor.post(path, content=raw,
                                        headers={"content-type": "application/json"})
            response.raise_for_status()

        t = await interleave({"mock": mock, "floor": bare, "compute": compute}, cfg,
                             clock="wall")
    group = "1 request overhead"
    composed = t["floor"].median_s + t["compute"].median_s
    return [
        make_row(group, f"forward_backward {FB_DATUMS} x {FB_TOKENS} tok, uvicorn vs (bare "
                 f"route + the model's compute)", t["mock"].median_s, composed, "s",
                 GOAL_UVICORN, f"{len(raw) / 1e3:.0f} kB body, one keep-alive connection, "
                 f"wall clock; floor = bare Starlette route reading the same bytes and "
                 f"answering as many ({t['floor'].median_s * 1e3:.2f} ms) + "
                 f"BaseModel.loss_and_grad on the same data ({t['compute'].median_s * 1e3:.2f} "
                 f"ms, in the benchmark process)"),
    ]


async def rows(cfg: Config, server: Server | None = None) -> list[Row]:
    """The in-process rows; with ``server``, the uvicorn rows too."""
    out = await in_process(cfg)
    if server is not None:
        out += await over_uvicorn_rows(cfg, server)
    return out


async def over_uvicorn_rows(cfg: Config, server: Server) -> list[Row]:
    row = await over_uvicorn(cfg, server)
    composed = row.extra.pop("composed_floor_s")
    step = make_row(row.group, "  step: mock vs (bare route + the model's own compute)",
                    row.measured, composed, "s", None,
                    "the same over uvicorn: what the mock adds itself")
    return [row, step, *await forward_over_uvicorn(cfg, server)]

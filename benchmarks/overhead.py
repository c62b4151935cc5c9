"""Group 1: request overhead against a bare Starlette route (issue 16's goals).

Both sides send the same request bytes and get a JSON body of the same size back, through the
same client: in-process (``httpx.ASGITransport``) and over uvicorn (TCP, keep-alive). The
mock's side includes everything a real call does: auth, ``tick``, parsing, validation, the
digest, ordering, the model's compute and rendering.

Step rows split the distance. "The client alone" is ``httpx.ASGITransport`` in front of a raw
ASGI answer: the part of the in-process floor that no server can remove. "The bare route
computing ..." is the bare route that also runs the model's own compute of the same call
(same weights, same data, no validation, no records) inside the request: the least any server
that computes the answer can take, measured as a whole request, so the compute's effect on
the CPU caches around it is counted as it is for the mock (on these machines it is not small:
a 50 us ``score`` costs the request around it ~80 us). The mock against that floor is its own
overhead. The sum of the bare route and the compute timed apart is shown too.

The forward_backward row sends an 8 x 128 body over uvicorn; its floor is the bare route
reading the same body and running ``loss_and_grad`` on the same data in the same server.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import orjson

from .core import Config, Row, interleave, make_row
from .fixtures import (
    API,
    AUTH,
    Server,
    client_floor_app,
    floor_app,
    forward_call,
    logprob_tokens,
    mock_run,
    new_run,
    score_call,
)

GOAL_IN_PROCESS = 1.3  # issue 16: logprobs 16 tokens in-process vs a bare Starlette route
GOAL_UVICORN = 1.2     # issue 16: the same over uvicorn, and forward_backward 8 x 128
FB_DATUMS, FB_TOKENS = 8, 128
GROUP = "1 request overhead"
JSON = {"content-type": "application/json"}


def _poster(client: httpx.AsyncClient, path: str, body: bytes) -> Callable[[], Awaitable[None]]:
    """POST the same bytes each call; any status but 200 stops the benchmark."""

    async def post() -> None:
        response = await client.post(path, content=body, headers=JSON)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")

    return post


def _seq_poster(client: httpx.AsyncClient, path: str, body: dict[str, object], first_seq: int
                ) -> Callable[[], Awaitable[None]]:
    """POST ``body`` with a fresh ``seq`` each call. The bytes are encoded once and the seq
    spliced in front, so the client's work is the same as for the floors' fixed bytes."""
    rest = orjson.dumps({k: v for k, v in body.items() if k != "seq"})[1:]
    seq = [first_seq]

    async def post() -> None:
        response = await client.post(path, content=b'{"seq":%d,' % seq[0] + rest, headers=JSON)
        if response.status_code != 200:
            raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
        seq[0] += 1

    return post


async def _answer_size(client: httpx.AsyncClient, path: str, body: dict[str, object]) -> int:
    response = await client.post(path, content=orjson.dumps(body), headers=JSON)
    response.raise_for_status()
    return len(response.content)


async def in_process(cfg: Config) -> list[Row]:
    n, rank = cfg.logprob_tokens, cfg.lora_rank
    tokens = logprob_tokens(n)
    handle = await mock_run(rank=rank)
    path = f"/runs/{handle.run_id}/logprobs"
    size = await _answer_size(handle.client, path,
                              {"seq": handle.take_seq(), "version": 0, "token_ids": tokens})
    raw = orjson.dumps({"seq": 1, "version": 0, "token_ids": tokens})
    floor = httpx.AsyncClient(transport=httpx.ASGITransport(app=floor_app()),
                              base_url="http://floor", headers=AUTH)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=client_floor_app(size)),
                               base_url="http://floor", headers=AUTH)
    try:
        t = await interleave({
            "mock": _seq_poster(handle.client, path, {"version": 0, "token_ids": tokens},
                                handle.next_seq),
            "floor": _poster(floor, f"/floor/{size}", raw),
            "computing": _poster(floor, f"/floor/{size}/score/{n}/{rank}", raw),
            "client": _poster(client, f"/floor/{size}", raw),
            "score": score_call(n, rank)}, cfg)
    finally:
        await floor.aclose()
        await client.aclose()
        await handle.aclose()
    mock, bare, computing = t["mock"].median_s, t["floor"].median_s, t["computing"].median_s
    score = t["score"].median_s
    return [
        make_row(GROUP, f"logprobs {n} tok, in-process vs bare route", mock, bare, "s",
                 GOAL_IN_PROCESS, f"ASGITransport; floor = bare Starlette route, same request "
                 f"bytes, {size}-byte JSON answer"),
        make_row(GROUP, "  step: the client alone (httpx.ASGITransport, a raw ASGI answer)",
                 t["client"].median_s, bare, "s", None,
                 "the same bytes both ways with no framework behind the transport: the "
                 "client's share of the floor, which no server-side change touches"),
        make_row(GROUP, "  step: the bare route computing score in the request", computing,
                 bare, "s", None, f"the floor plus BaseModel.score of the same {n} tokens "
                 f"inside the request: no server that computes the answer does better"),
        make_row(GROUP, "  step: the bare route + score, timed apart", bare + score, bare, "s",
                 None, f"score alone {score * 1e6:.0f} us in a tight loop, where its weights "
                 f"stay in cache"),
        make_row(GROUP, "  step: mock vs the bare route computing score", mock, computing, "s",
                 None, "what the mock adds itself: auth, parsing, validation, digest, "
                 "ordering, records, rendering, middleware"),
    ]


@contextlib.asynccontextmanager
async def _uvicorn_clients(server: Server
                           ) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """The mock's client (under ``API``) and the floors' (the server root): one keep-alive
    connection each, the same headers."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=f"{server.url}{API}", headers=AUTH, limits=limits,
                                 timeout=60.0) as client, \
            httpx.AsyncClient(base_url=server.url, headers=AUTH, limits=limits,
                              timeout=60.0) as floor:
        yield client, floor


async def over_uvicorn(cfg: Config, server: Server) -> list[Row]:
    n, rank = cfg.logprob_tokens, cfg.lora_rank
    tokens = logprob_tokens(n)
    async with _uvicorn_clients(server) as (client, floor):
        run_id = await new_run(client, rank)
        saved = await client.post(f"/runs/{run_id}/save_weights_for_sampler",
                                  json={"seq": 1, "version": 0})
        saved.raise_for_status()
        path = f"/runs/{run_id}/logprobs"
        size = await _answer_size(client, path, {"seq": 2, "version": 0, "token_ids": tokens})
        raw = orjson.dumps({"seq": 1, "version": 0, "token_ids": tokens})
        t = await interleave({
            "mock": _seq_poster(client, path, {"version": 0, "token_ids": tokens}, 3),
            "floor": _poster(floor, f"/floor/{size}", raw),
            "computing": _poster(floor, f"/floor/{size}/score/{n}/{rank}", raw)},
            cfg, clock="wall")
    mock, bare, computing = t["mock"].median_s, t["floor"].median_s, t["computing"].median_s
    return [
        make_row(GROUP, f"logprobs {n} tok, uvicorn vs bare route", mock, bare, "s",
                 GOAL_UVICORN, "uvicorn (h11, asyncio) in a child process, one keep-alive "
                 "connection, wall clock; floor = bare Starlette route in the same server"),
        make_row(GROUP, "  step: the bare route computing score in the request", computing,
                 bare, "s", None, "the same server, the model's own compute of the call "
                 "inside the request"),
        make_row(GROUP, "  step: mock vs the bare route computing score", mock, computing, "s",
                 None, "the same over uvicorn: what the mock adds itself"),
    ]


async def forward_over_uvicorn(cfg: Config, server: Server) -> list[Row]:
    """forward_backward 8 x 128 over uvicorn vs the bare route reading the same body and
    running the model's own compute of it in the same server."""
    rank = cfg.lora_rank
    body, compute = forward_call(FB_DATUMS, FB_TOKENS, rank)
    async with _uvicorn_clients(server) as (client, floor):
        run_id = await new_run(client, rank)
        path = f"/runs/{run_id}/forward_backward"
        size = await _answer_size(client, path, {**body, "seq": 1})
        raw = orjson.dumps({**body, "seq": 1})
        t = await interleave({
            "mock": _seq_poster(client, path, body, 2),
            "computing": _poster(floor, f"/floor/{size}/forward_backward/{FB_DATUMS}/"
                                        f"{FB_TOKENS}/{rank}", raw),
            "floor": _poster(floor, f"/floor/{size}", raw),
            "compute": compute}, cfg, clock="wall")
    mock, computing = t["mock"].median_s, t["computing"].median_s
    apart = t["floor"].median_s + t["compute"].median_s
    return [
        make_row(GROUP, f"forward_backward {FB_DATUMS} x {FB_TOKENS} tok, uvicorn vs (bare "
                 f"route + the model's compute)", mock, computing, "s", GOAL_UVICORN,
                 f"{len(raw) / 1e3:.0f} kB body, one keep-alive connection, wall clock; "
                 f"floor = bare Starlette route in the same server reading the same bytes, "
                 f"running BaseModel.loss_and_grad on the same data and answering as many "
                 f"bytes"),
        make_row(GROUP, "  step: mock vs (bare route + compute, timed apart)", mock, apart, "s",
                 None, f"bare route {t['floor'].median_s * 1e3:.2f} ms + loss_and_grad "
                 f"{t['compute'].median_s * 1e3:.2f} ms in the benchmark process"),
    ]


async def rows(cfg: Config, server: Server | None = None) -> list[Row]:
    """The in-process rows; with ``server``, the uvicorn rows too."""
    out = await in_process(cfg)
    if server is not None:
        out += await over_uvicorn_rows(cfg, server)
    return out


async def over_uvicorn_rows(cfg: Config, server: Server) -> list[Row]:
    return [*await over_uvicorn(cfg, server), *await forward_over_uvicorn(cfg, server)]

"""Request bodies, a fresh in-process mock with one run, the bare floor app, and a uvicorn
server in a child process (so client and server do not share one GIL, as in real use)."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from mock_server import create_app
from mock_server.engine.losses import resolve_loss_config
from mock_server.engine.model import get_base_model
from mock_server.engine.specs import BASE_MODEL_ID, BOS_TOKEN

API_KEY = "whitney-mock-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
API = "/v1/training"
ADAMW = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
         "weight_decay": 0.0, "grad_clip_norm": 1.0}


# -- bodies ----------------------------------------------------------------------------------
def text_tokens(rng: np.random.Generator, length: int) -> list[int]:
    """Printable-ASCII token ids (what the tiny byte model is trained to expect)."""
    tokens: list[int] = rng.integers(32, 127, size=length).tolist()
    return tokens


def forward_body(rng: np.random.Generator, datums: int, tokens: int, seq: int = 1,
                 loss_function: str = "importance_sampling") -> dict[str, Any]:
    """A ``forward_backward`` body with every RL input (target_tokens, logprobs, advantages,
    mask) at full length, as a GRPO client sends it."""
    data = []
    for _ in range(datums):
        ids = [BOS_TOKEN] + text_tokens(rng, tokens)
        data.append({
            "model_input": {"token_ids": ids[:-1]},
            "loss_inputs": {
                "target_tokens": ids[1:],
                "logprobs": (-rng.uniform(0.5, 6.0, tokens)).tolist(),
                "advantages": rng.standard_normal(tokens).tolist(),
                "mask": [1.0] * tokens,
            },
        })
    return {"seq": seq, "loss_function": loss_function, "loss_config": {}, "data": data}


def sample_body(seq: int, num_samples: int, max_tokens: int, prompt: list[int],
                seed: int | None = 0, version: int = 0) -> dict[str, Any]:
    """``stop_token_ids: []`` so every row runs to ``max_tokens`` and sizes are exact."""
    sampling: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 1.0, "top_k": 0,
                                "top_p": 1.0, "stop_token_ids": []}
    if seed is not None:
        sampling["seed"] = seed
    return {"seq": seq, "version": version, "prompt": {"token_ids": prompt},
            "num_samples": num_samples, "sampling": sampling}


# -- an in-process mock with one run -----------------------------------------------------------
@dataclass
class MockRun:
    """A fresh mock app, an ``AsyncClient`` on it (``ASGITransport``) and one active run."""

    app: Starlette
    client: httpx.AsyncClient
    run_id: str
    next_seq: int = 1

    def take_seq(self) -> int:
        self.next_seq += 1
        return self.next_seq - 1

    async def post(self, primitive: str, body: dict[str, Any]) -> httpx.Response:
        return await self.client.post(f"/runs/{self.run_id}/{primitive}", json=body)

    async def call(self, primitive: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self.post(primitive, {**body, "seq": self.take_seq()})
        if response.status_code != 200:
            raise RuntimeError(f"{primitive}: {response.status_code} {response.text[:300]}")
        return response.json()  # type: ignore[no-any-return]

    @property
    def backend(self) -> Any:
        return self.app.state.backend

    @property
    def run(self) -> Any:
        return self.backend.runs[self.run_id]

    async def aclose(self) -> None:
        await self.client.aclose()


def asgi_client(app: Any, base: str = API) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                             base_url=f"http://mock{base}", headers=AUTH, timeout=120.0)


async def new_run(client: httpx.AsyncClient, rank: int = 8) -> str:
    """Create a session and a rank-``rank`` LoRA run; return the run id."""
    session = await client.post("/sessions", json={})
    session.raise_for_status()
    run = await client.post(f"/sessions/{session.json()['session_id']}/runs",
                            json={"base_model": BASE_MODEL_ID,
                                  "lora": {"rank": rank, "alpha": 2.0 * rank, "seed": 1},
                                  "optimizer": "adamw"})
    run.raise_for_status()
    return run.json()["run_id"]  # type: ignore[no-any-return]


async def mock_run(rank: int = 8, save_version: bool = True, **app_options: Any) -> MockRun:
    """A fresh app with one run; with ``save_version`` seq 1 saves version 0."""
    app = create_app(api_keys=(API_KEY,), **app_options)
    client = asgi_client(app)
    handle = MockRun(app, client, await new_run(client, rank))
    if save_version:
        await handle.call("save_weights_for_sampler", {"version": 0})
    return handle


# -- the floor: a bare Starlette route ----------------------------------------------------------
def padded_json(size: int) -> dict[str, str]:
    """A JSON object whose compact encoding is exactly ``size`` bytes (``size`` >= 10)."""
    return {"pad": "x" * (size - len(b'{"pad":""}'))}


LOGPROB_SEED, FORWARD_SEED = 1, 3  # the rng seeds of group 1's token ids and forward body


def logprob_tokens(count: int) -> list[int]:
    """Group 1's logprobs tokens (the mock's requests and the floors' compute use the same)."""
    return text_tokens(np.random.default_rng(LOGPROB_SEED), count)


def score_call(tokens: int, rank: int) -> Callable[[], Any]:
    """The model's own compute of one ``logprobs`` call on ``logprob_tokens(tokens)``:
    ``score`` on a fresh rank-``rank`` adapter (what version 0 of a new run holds), no HTTP."""
    model = get_base_model(BASE_MODEL_ID)
    lora = model.init_lora(rank, 2.0 * rank, seed=1)
    ids = np.asarray(logprob_tokens(tokens), dtype=np.int64)
    return lambda: model.score(lora, ids)


def forward_call(datums: int, tokens: int, rank: int
                 ) -> tuple[dict[str, Any], Callable[[], Any]]:
    """Group 1's forward_backward body and the model's own compute of it (``loss_and_grad`` on
    the same arrays, on a fresh rank-``rank`` adapter), no HTTP."""
    body = forward_body(np.random.default_rng(FORWARD_SEED), datums, tokens)
    model = get_base_model(BASE_MODEL_ID)
    lora = model.init_lora(rank, 2.0 * rank, seed=1)
    ids = [np.asarray(d["model_input"]["token_ids"], dtype=np.int64) for d in body["data"]]
    inputs = [{k: np.asarray(v, dtype=np.float64) for k, v in d["loss_inputs"].items()}
              for d in body["data"]]
    config = resolve_loss_config(body["loss_function"], {})

    def compute() -> None:
        model.loss_and_grad(lora, ids, inputs, body["loss_function"], config, need_grad=True)

    return body, compute


@functools.lru_cache(maxsize=8)
def _floor_compute(kind: str, shape: tuple[int, ...]) -> Callable[[], Any]:
    if kind == "score":
        return score_call(*shape)
    return forward_call(*shape)[1]


def floor_app() -> Starlette:
    """The floors: ``POST /floor/{size}`` reads the body and answers a JSON body of ``size``
    bytes, the least a JSON endpoint can do. ``POST /floor/{size}/score/{tokens}/{rank}`` and
    ``/floor/{size}/forward_backward/{datums}/{tokens}/{rank}`` also run the model's own
    compute of the matching mock call (:func:`score_call`, :func:`forward_call`) inside the
    request, as any server that computes the answer must: the composed floor, with the
    compute's cache effects on the request around it included."""
    cache: dict[int, bytes] = {}

    def answer(size: int) -> Response:
        document = cache.get(size)
        if document is None:
            document = cache[size] = orjson.dumps(padded_json(size))
        return Response(document, media_type="application/json")

    async def floor(request: Request) -> Response:
        await request.body()
        return answer(request.path_params["size"])

    async def computing(request: Request) -> Response:
        await request.body()
        params = request.path_params
        kind = "score" if "datums" not in params else "forward_backward"
        shape = tuple(params[name] for name in ("datums", "tokens", "rank") if name in params)
        _floor_compute(kind, shape)()
        return answer(params["size"])

    return Starlette(routes=[
        Route("/floor/{size:int}", floor, methods=["POST"]),
        Route("/floor/{size:int}/score/{tokens:int}/{rank:int}", computing, methods=["POST"]),
        Route("/floor/{size:int}/forward_backward/{datums:int}/{tokens:int}/{rank:int}",
              computing, methods=["POST"]),
    ])


def client_floor_app(size: int) -> Any:
    """A raw ASGI app (no framework) that reads the body and answers ``size`` bytes of JSON:
    what ``httpx.ASGITransport`` itself costs, the client's share of any in-process floor."""
    body = orjson.dumps(padded_json(size))
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        await send(start)
        await send({"type": "http.response.body", "body": body})

    return app


def combined_app() -> Any:
    """The mock and the floor in one ASGI app: ``/floor/...`` goes to the floor. The dispatch
    costs both sides the same one string comparison."""
    mock = create_app(api_keys=(API_KEY,), order_wait_ms=30_000)
    floor = floor_app()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        target = floor if scope.get("path", "").startswith("/floor/") else mock
        await target(scope, receive, send)

    return app


# -- uvicorn in a child process -------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    """A running benchmark server: its base URL and the CPU time its process has used."""

    url: str
    pid: int

    def cpu_s(self) -> float | None:
        """User + system CPU seconds of the server process (Linux ``/proc``; else None)."""
        try:
            with open(f"/proc/{self.pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None


@contextlib.contextmanager
def uvicorn_server(timeout_s: float = 30.0) -> Iterator[Server]:
    """Serve :func:`combined_app` with uvicorn (the mock's own settings) in a child process."""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.server", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"benchmark server exited: {proc.stderr.read().decode()[-2000:]}"
                                   if proc.stderr else "benchmark server exited")
            try:
                httpx.post(f"{url}/floor/16", timeout=1.0).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError("benchmark server did not start") from None
                time.sleep(0.05)
        yield Server(url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

"""Request bodies, a fresh in-process mock with one run, the bare floor app, and a uvicorn
server in a child process (so client and server do not share one GIL, as in real use)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
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
from mock_server.engine.specs import BASE_MODEL_ID, BOS_TOKEN

API_KEY = "whitney-mock-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
API = "/v1/training"
ADAMW = {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
         "weight_decay": 0.0, "grad_clip_norm": 1.0}


# -- bodies ----------------------------------------------------------------------------------
def text_tokens(rng: np.random.Generator, length: int) -> list[int]:
    """Printable-ASCII token ids (what the tiny byte model is trained to expect)."""
    return rng.integers(32, 127, size=length).tolist()


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


def floor_app() -> Starlette:
    """``POST /floor/{size}``: read the body, answer a JSON body of ``size`` bytes. The least
    a JSON endpoint can do; the mock's request overhead is measured against it."""
    cache: dict[int, dict[str, str]] = {}

    async def floor(request: Request) -> Response:
        await request.body()
        size = request.path_params["size"]
        document = cache.get(size)
        if document is None:
            document = cache[size] = padded_json(size)
        return Response(orjson.dumps(document), media_type="application/json")

    return Starlette(routes=[Route("/floor/{size:int}", floor, methods=["POST"])])


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

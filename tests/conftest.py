"""Shared fixtures and helpers for tests that talk to the mock over HTTP.

Fixtures: ``make_mock`` (factory of in-process mocks, closed after the test), ``mock``,
``client`` (key ``KEY``), ``other_client`` (key ``OTHER_KEY``, another tenant), ``run`` (a fresh
session + run on ``client``), ``fake_clock``.

Helpers (import with ``from conftest import ...``): ``Mock``, ``RunHandle``, ``Seq``,
``FakeClock``, ``new_run``, ``text_tokens``, ``ce_datum``, ``rl_datum``, ``ADAMW``,
``expect_error``, ``state_snapshot``, ``assert_same_state``, ``wait_held``, ``params_of``,
``live_server``.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import hypothesis_profiles  # noqa: F401  (fast = CI default, derandomised; HYPOTHESIS_PROFILE=thorough)
import numpy as np
import pytest

from mock_server import InProcessTransport, create_app

API = "/v1/training"
MODEL = "whitney-mock/tiny-byte"
KEY = "test-key-1"
OTHER_KEY = "test-key-2"
BOS, EOS, VOCAB = 256, 257, 258

#: Explicit AdamW hyper-parameters (OPT-1: the server has no defaults).
ADAMW: dict[str, float] = {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
                           "weight_decay": 0.01, "grad_clip_norm": 1.0}


def module_mock() -> Iterator[tuple[httpx.Client, Any]]:
    """Body of a module-scoped fixture: one in-process mock (key ``KEY``) and its backend,
    shared by a module's hypothesis examples, each of which opens and closes its own session."""
    app = create_app(api_keys=(KEY,), seed=0, order_wait_ms=2000, cancel_delay_ms=0)
    transport = InProcessTransport(app)
    client = httpx.Client(transport=transport, base_url="http://mock", timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"})
    yield client, app.state.backend
    client.close()
    transport.close()


class FakeClock:
    """Injectable ``clock=`` for ``create_app``: time moves only when a test says so."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Seq:
    """The client side of a run's sequence (ORD-1): ``next()`` hands out 1, 2, 3 ..."""

    def __init__(self, start: int = 1) -> None:
        self._counter = itertools.count(start)
        self.last = start - 1

    def next(self) -> int:
        self.last = next(self._counter)
        return self.last


@dataclass
class Mock:
    """One in-process mock: its app, its backend, and clients bound to it."""

    app: Any
    transport: InProcessTransport
    clients: list[httpx.Client] = field(default_factory=list)

    @property
    def backend(self) -> Any:
        return self.app.state.backend

    def client(self, key: str | None = KEY, headers: dict[str, str] | None = None) -> httpx.Client:
        """A client on this mock authenticated with ``key`` (None: no Authorization header)."""
        all_headers = dict(headers or {})
        if key is not None:
            all_headers["Authorization"] = f"Bearer {key}"
        client = httpx.Client(transport=self.transport, base_url="http://mock",
                              headers=all_headers, timeout=30)
        self.clients.append(client)
        return client

    def close(self) -> None:
        for client in self.clients:
            client.close()  # closes the shared transport too (idempotent)
        self.transport.close()


@pytest.fixture
def make_mock() -> Iterator[Any]:
    """Factory: ``make_mock(**create_app_kwargs) -> Mock``; short ``order_wait_ms`` by default."""
    made: list[Mock] = []

    def factory(**kwargs: Any) -> Mock:
        kwargs.setdefault("api_keys", (KEY, OTHER_KEY))
        kwargs.setdefault("seed", 0)
        kwargs.setdefault("order_wait_ms", 300)
        kwargs.setdefault("cancel_delay_ms", 50)
        app = create_app(**kwargs)
        mock = Mock(app, InProcessTransport(app))
        made.append(mock)
        return mock

    yield factory
    for mock in made:
        mock.close()


@pytest.fixture
def mock(make_mock: Any) -> Mock:
    return make_mock()


@pytest.fixture
def client(mock: Mock) -> httpx.Client:
    return mock.client(KEY)


@pytest.fixture
def other_client(mock: Mock) -> httpx.Client:
    return mock.client(OTHER_KEY)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@dataclass
class RunHandle:
    """A session + run created over HTTP, with its own ``Seq`` counter."""

    client: httpx.Client
    session_id: str
    run_id: str
    seq: Seq = field(default_factory=Seq)

    def url(self, tail: str = "") -> str:
        return f"{API}/runs/{self.run_id}" + (f"/{tail}" if tail else "")

    def post(self, primitive: str, body: dict[str, Any] | None = None, *,
             seq: int | None = None, **kwargs: Any) -> httpx.Response:
        """POST a primitive; ``seq`` defaults to the next one of ``self.seq``."""
        full = {"seq": self.seq.next() if seq is None else seq, **(body or {})}
        return self.client.post(self.url(primitive), json=full, **kwargs)

    def ok(self, primitive: str, body: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """POST a primitive that must succeed; returns the parsed result."""
        response = self.post(primitive, body, **kwargs)
        assert response.status_code == 200, response.text
        return response.json()

    def view(self) -> dict[str, Any]:
        response = self.client.get(self.url())
        assert response.status_code == 200, response.text
        return response.json()  # type: ignore[no-any-return]

    def operation(self, seq: int) -> httpx.Response:
        return self.client.get(self.url(f"operations/{seq}"))

    # -- common primitive bodies -----------------------------------------------------------
    def forward_backward(self, data: list[dict[str, Any]], loss: str = "cross_entropy",
                         config: dict[str, float] | None = None, *,
                         primitive: str = "forward_backward") -> Any:
        return self.ok(primitive, {"loss_function": loss, "loss_config": config or {},
                                   "data": data})

    def optim_step(self, **overrides: float) -> Any:
        return self.ok("optim_step", {"adamw": {**ADAMW, **overrides}})

    def save(self, version: int) -> Any:
        return self.ok("save_weights_for_sampler", {"version": version})

    def sample(self, version: int, prompt: list[int], *, num_samples: int = 2,
               max_tokens: int = 8, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, seed: int | None = 7, **sampling: Any) -> Any:
        params = {"max_tokens": max_tokens, "temperature": temperature, "top_k": top_k,
                  "top_p": top_p, **sampling}
        if seed is not None:
            params["seed"] = seed
        return self.ok("sample", {"version": version, "prompt": {"token_ids": prompt},
                                  "num_samples": num_samples, "sampling": params})

    def logprobs(self, version: int, token_ids: list[int]) -> Any:
        return self.ok("logprobs", {"version": version, "token_ids": token_ids})


def new_run(client: httpx.Client, *, rank: int = 4, alpha: float = 8.0, lora_seed: int = 1,
            ttl_seconds: int | None = None) -> RunHandle:
    """Create a session and one LoRA run on it (LIFE-1, LIFE-5)."""
    session_body: dict[str, Any] = {} if ttl_seconds is None else {"ttl_seconds": ttl_seconds}
    response = client.post(f"{API}/sessions", json=session_body)
    assert response.status_code == 201, response.text
    session_id = response.json()["session_id"]
    response = client.post(f"{API}/sessions/{session_id}/runs", json={
        "base_model": MODEL, "lora": {"rank": rank, "alpha": alpha, "seed": lora_seed},
        "optimizer": "adamw"})
    assert response.status_code == 201, response.text
    return RunHandle(client, session_id, response.json()["run_id"])


@pytest.fixture
def run(client: httpx.Client) -> RunHandle:
    return new_run(client)


# -- datum builders -------------------------------------------------------------------------
def text_tokens(text: str, *, bos: bool = True) -> list[int]:
    """Byte tokens of ``text``, after BOS by default."""
    return ([BOS] if bos else []) + list(text.encode("utf-8"))


def ce_datum(sequence: list[int], weights: list[float] | None = None) -> dict[str, Any]:
    """Next-token datum for ``cross_entropy``: predict ``sequence[1:]`` from ``sequence[:-1]``."""
    datum: dict[str, Any] = {"model_input": {"token_ids": sequence[:-1]},
                             "loss_inputs": {"target_tokens": sequence[1:]}}
    if weights is not None:
        datum["loss_inputs"]["weights"] = weights
    return datum


def rl_datum(prompt: list[int], completion: list[int], sampled_logprobs: list[float],
             advantage: float, *, mask_prompt: bool = True) -> dict[str, Any]:
    """An RL datum (LOSS-2..5) for ``prompt + completion``: position i predicts token i + 1.

    Positions predicting prompt tokens get mask 0 (when ``mask_prompt``) and logprob 0.
    """
    full = prompt + completion
    n_prompt_targets = len(prompt) - 1
    datum: dict[str, Any] = {
        "model_input": {"token_ids": full[:-1]},
        "loss_inputs": {
            "target_tokens": full[1:],
            "logprobs": [0.0] * n_prompt_targets + list(sampled_logprobs),
            "advantages": [float(advantage)] * (len(full) - 1),
        },
    }
    if mask_prompt:
        datum["loss_inputs"]["mask"] = [0.0] * n_prompt_targets + [1.0] * len(completion)
    return datum


# -- assertions -----------------------------------------------------------------------------
def expect_error(response: httpx.Response, status: int, error_type: str | None = None) -> dict:
    """Assert the ERR-1 envelope with ``status`` (and ``error.type``); return the inner error."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"type", "message", "details"}, error
    assert isinstance(error["type"], str) and isinstance(error["message"], str)
    assert isinstance(error["details"], dict)
    if error_type is not None:
        assert error["type"] == error_type, error
    return error  # type: ignore[no-any-return]


def state_snapshot(backend: Any, run_id: str) -> dict[str, Any]:
    """Deep copy of everything ERR-3 protects on a run, plus its seq accounting (ORD-4).

    Read while no request is in flight (the tests' clients are synchronous).
    """
    r = backend.runs[run_id]

    def arrays(d: dict[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
        return None if d is None else {k: np.array(a, copy=True) for k, a in d.items()}

    return {
        "state": r.state, "next_seq": r.next_seq, "step": r.step, "ops": sorted(r.ops),
        "params": arrays(r.lora.params), "grads": arrays(r.grads),
        "m": arrays(r.optimizer.m), "v": arrays(r.optimizer.v), "t": r.optimizer.t,
        "versions": {n: (v.step, arrays(v.lora.params)) for n, v in r.versions.items()},
        "exports": sorted(r.exports),
    }


def assert_same_state(before: dict[str, Any], after: dict[str, Any]) -> None:
    """Bit-for-bit equality of two ``state_snapshot``s."""
    def same_arrays(a: dict | None, b: dict | None, what: str) -> None:
        assert (a is None) == (b is None), what
        if a is not None and b is not None:
            assert a.keys() == b.keys(), what
            for k in a:
                assert np.array_equal(a[k], b[k]), f"{what}[{k}] changed"

    for key in ("state", "next_seq", "step", "ops", "t", "exports"):
        assert before[key] == after[key], f"{key}: {before[key]!r} -> {after[key]!r}"
    for key in ("params", "grads", "m", "v"):
        same_arrays(before[key], after[key], key)
    assert before["versions"].keys() == after["versions"].keys()
    for n, (step, params) in before["versions"].items():
        assert after["versions"][n][0] == step
        same_arrays(params, after["versions"][n][1], f"versions[{n}]")


def wait_held(backend: Any, run_id: str, seq: int, timeout: float = 5.0) -> None:
    """Block until ``seq`` is held for ordering on the run (ORD-2), so a test can act next."""
    deadline = time.monotonic() + timeout
    while seq not in backend.runs[run_id].held:
        assert time.monotonic() < deadline, f"seq {seq} was never held"
        time.sleep(0.002)


def params_of(backend: Any, run_id: str) -> dict[str, np.ndarray]:
    """A copy of a run's current LoRA parameters."""
    return {k: a.copy() for k, a in backend.runs[run_id].lora.params.items()}


# -- real HTTP --------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def live_server(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on 127.0.0.1 in a background thread; yields the base URL."""
    import uvicorn

    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)

"""The soak's clients (``benchmarks/soak.py``): pipelined GRPO clients and the chaos thread.

``grpo_client`` runs one client's session and run: ``--cycles`` pipelined GRPO cycles (ORD-2),
then save_state ‖ export_lora, finish, close, through a ``RetryingClient`` that re-sends every
primitive with the SAME seq and bytes after a lost answer (ORD-3), and every creation with the
SAME ``Idempotency-Key`` (LIFE-9), and keeps what it intended and what it was answered
(``ClientResult``) for the soak's checks. ``Chaos`` arms faults through the control plane
(``POST /_mock/faults``, with the mock's control key) while the clients run; 429 with
``Retry-After`` is one of its kinds, and dropped creation responses are armed before the
clients start. ``Config`` is the soak's configuration, shared by both.
"""

from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

API = "/v1/training"
MODEL = "whitney-mock/tiny-byte"
BOS = 256
ADAMW = {"learning_rate": 0.02, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0,
         "grad_clip_norm": 1.0}
PROMPTS = [[BOS, *b"Say a vowel: "], [BOS, *b"Name a fruit: "], [BOS, *b"Hello, "]]
CYCLE_PRIMITIVES = ["save_weights_for_sampler", "sample", "forward_backward", "optim_step"]
FAULTS: dict[str, dict[str, Any]] = {
    "503_before": {"kind": "error", "status": 503, "after_execute": False},
    "503_after": {"kind": "error", "status": 503, "after_execute": True},
    "drop_after": {"kind": "drop", "after_execute": True},
    "timeout": {"kind": "latency"},  # delay_ms set from the client timeout
    "429_retry_after": {"kind": "throttle", "retry_after": 1},  # ERR-2: wait, then retry
}
#: Creations whose response is dropped after the server created the resource (LIFE-9): armed
#: before the clients start, ``Config.dropped_creations`` of each.
CREATIONS = ("create_session", "create_run")


@dataclass
class Config:
    clients: int = 16
    cycles: int = 4
    seconds: float = 60.0
    prompts: int = 2
    group: int = 4
    max_tokens: int = 12
    client_timeout: float = 1.0
    fault_interval: float = 0.1
    fault_burst: int = 2
    fault_skip: tuple[int, int] = (1, 4)  # calls let through before an armed fault fires
    fault_kinds: tuple[str, ...] = tuple(FAULTS)
    fault_primitives: tuple[str, ...] = tuple(CYCLE_PRIMITIVES)
    seed: int = 0
    dropped_creations: int = 4  # per creation kind (create_session, create_run); 0: none
    violations: tuple[str, ...] = ()  # mock_server.testing.violations, in-process only: proves the
    # soak's checks can fail (tests/benchmarks/test_soak_short.py)


@dataclass
class Counters:
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    requests: int = 0
    retries: int = 0
    replays: int = 0
    creation_replays: int = 0
    throttled: int = 0
    timeouts: int = 0
    dropped: int = 0
    injected_5xx: int = 0
    unexpected_5xx: int = 0
    seq_gaps: int = 0

    def add(self, **deltas: int) -> None:
        with self.lock:
            for name, delta in deltas.items():
                setattr(self, name, getattr(self, name) + delta)

    def as_dict(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}


class SoakError(Exception):
    """A client could not complete (a non-retryable answer or too many attempts)."""


class RetryingClient:
    """A minimal Whitney client: primitives are re-sent with the same seq and bytes after a
    transport error, a 5xx, 429 (after ``Retry-After``) or ``seq_gap`` (all leave a replay or a
    fresh turn, ORD-3/4); creations likewise with their ``Idempotency-Key`` (LIFE-9)."""

    def __init__(self, base_url: str, key: str, timeout: float, counters: Counters) -> None:
        self.http = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=httpx.Timeout(timeout, connect=10.0),
                                 limits=httpx.Limits(max_connections=8))
        self.counters = counters

    def call(self, method: str, path: str, body: bytes | None = None, *,
             retry: bool = True, attempts: int = 60,
             idempotency_key: str | None = None) -> tuple[int, Any, bytes]:
        outcomes: list[str] = []
        headers = {"Content-Type": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        for attempt in range(attempts):
            if attempt:
                self.counters.add(retries=1)
                time.sleep(min(0.2, 0.01 * attempt))
            self.counters.add(requests=1)
            try:
                response = self.http.request(method, API + path, content=body, headers=headers)
            except httpx.TimeoutException:
                outcomes.append("timeout")
                self.counters.add(timeouts=1)
                if retry:
                    continue
                raise
            except httpx.TransportError as exc:
                outcomes.append(type(exc).__name__)
                self.counters.add(dropped=1)
                if retry:
                    continue
                raise
            try:
                parsed = response.json() if response.content else None
            except ValueError:  # not JSON: never an injected fault, and not the contract
                parsed = None
            outcomes.append(str(response.status_code))
            if response.status_code >= 500:
                injected = "fault_id" in (parsed or {}).get("error", {}).get("details", {})
                self.counters.add(injected_5xx=int(injected), unexpected_5xx=int(not injected))
                if retry:
                    continue
            elif response.status_code == 409 and (parsed or {}).get("error", {}).get(
                    "type") == "seq_gap":
                self.counters.add(seq_gaps=1)
                continue
            elif response.status_code == 429:
                self.counters.add(throttled=1)
                time.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            if response.headers.get("Whitney-Replayed") == "true":
                self.counters.add(replays=1, creation_replays=int(idempotency_key is not None))
            return response.status_code, parsed, response.content
        raise SoakError(f"{method} {path}: no answer after {attempts} attempts "
                        f"({', '.join(outcomes[:5])} ... {', '.join(outcomes[-3:])})")

    def close(self) -> None:
        self.http.close()


VOWELS = frozenset(b"aeiou")


def reward(tokens: list[int]) -> float:
    """Share of lowercase vowels: cheap, and it varies within a group."""
    return sum(t in VOWELS for t in tokens) / max(1, len(tokens))


def advantages(rewards: list[float]) -> list[float]:
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]


def rl_datum(prompt: list[int], sequence: dict[str, Any], advantage: float) -> dict[str, Any]:
    full = prompt + sequence["tokens"]
    n_prompt = len(prompt) - 1
    return {"model_input": {"token_ids": full[:-1]},
            "loss_inputs": {"target_tokens": full[1:],
                            "logprobs": [0.0] * n_prompt + sequence["logprobs"],
                            "advantages": [advantage] * (len(full) - 1),
                            "mask": [0.0] * n_prompt + [1.0] * len(sequence["tokens"])}}


@dataclass
class ClientResult:
    index: int
    run_id: str = ""
    session_id: str = ""
    intended: list[tuple[int, str, bytes]] = field(default_factory=list)
    answers: dict[int, bytes] = field(default_factory=dict)
    optim_steps: int = 0
    versions: list[int] = field(default_factory=list)
    final_view: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def session_body(config: Config, index: int) -> bytes:
    """Tagged so the soak finds each client's sessions afterwards (LIFE-10 listing)."""
    return orjson.dumps({"metadata": {"soak-seed": str(config.seed), "soak-client": str(index)}})


def run_body(index: int) -> bytes:
    return orjson.dumps({"base_model": MODEL, "lora": {"rank": 4, "alpha": 8.0,
                                                       "seed": 1000 + index},
                         "optimizer": "adamw"})


def grpo_client(config: Config, base_url: str, index: int, counters: Counters,
                deadline: float) -> ClientResult:
    result = ClientResult(index)
    client = RetryingClient(base_url, f"soak-key-{index:02d}", config.client_timeout, counters)
    pool = ThreadPoolExecutor(max_workers=config.prompts + 1,
                              thread_name_prefix=f"soak-client-{index}")
    seq = itertools.count(1)

    def send(primitive: str, body: dict[str, Any]) -> dict[str, Any]:
        raw = orjson.dumps(body)
        result.intended.append((body["seq"], primitive, raw))
        status, parsed, content = client.call("POST", f"/runs/{result.run_id}/{primitive}", raw)
        if status != 200:
            raise SoakError(f"client {index} {primitive} seq {body['seq']}: {status} {parsed}")
        result.answers[body["seq"]] = content
        return parsed

    def pipelined(*calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        futures = [pool.submit(send, primitive, {"seq": next(seq), **body})
                   for primitive, body in calls]
        return [f.result() for f in futures]

    try:  # LIFE-9: one Idempotency-Key per creation, the same on every retry
        status, session, _ = client.call("POST", "/sessions", session_body(config, index),
                                         idempotency_key=uuid.uuid4().hex)
        assert status == 201, session
        result.session_id = session["session_id"]
        status, run, _ = client.call("POST", f"/sessions/{result.session_id}/runs",
                                     run_body(index), idempotency_key=uuid.uuid4().hex)
        assert status == 201, run
        result.run_id = run["run_id"]
        for cycle in range(config.cycles):
            if time.monotonic() > deadline:
                break
            prompts = PROMPTS[:config.prompts]
            sampling = {"max_tokens": config.max_tokens, "temperature": 1.0, "top_k": 0,
                        "top_p": 1.0}
            answers = pipelined(
                ("save_weights_for_sampler", {"version": cycle}),
                *[("sample", {"version": cycle, "prompt": {"token_ids": p},
                              "num_samples": config.group,
                              "sampling": {**sampling, "seed": config.seed * 10_000
                                           + index * 100 + cycle * 10 + i}})
                  for i, p in enumerate(prompts)])
            result.versions.append(cycle)
            data = []
            for prompt, sample in zip(prompts, answers[1:], strict=False):
                rewards = [reward(s["tokens"]) for s in sample["sequences"]]
                if max(rewards) > min(rewards):  # a uniform group carries no signal
                    data += [rl_datum(prompt, s, a)
                             for s, a in zip(sample["sequences"], advantages(rewards),
                                             strict=False)]
            if data:
                pipelined(("forward_backward", {"loss_function": "importance_sampling",
                                                "loss_config": {}, "data": data}),
                          ("optim_step", {"adamw": ADAMW}))
                result.optim_steps += 1
        pipelined(("save_state", {"name": f"soak-{index}"}), ("export_lora", {}))
        status, view, _ = client.call("POST", f"/runs/{result.run_id}/finish", b"{}")
        result.final_view = view
        status, _, _ = client.call("POST", f"/sessions/{result.session_id}/close", b"{}")
        assert status == 200
    except Exception as exc:  # noqa: BLE001 - reported, and fails the soak
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        pool.shutdown(wait=True)
        client.close()
    return result


class Chaos(threading.Thread):
    """Arms faults through the control plane: every ``fault_interval`` at most one, on a cycle
    primitive that has none pending (so a fault never waits for a primitive no client will
    call again), with the kind taken in turn from ``FAULTS``; each lets ``fault_skip`` (a
    range) calls of its primitive through, then fires on the next ``fault_burst``."""

    def __init__(self, base_url: str, control_key: str, config: Config) -> None:
        super().__init__(name="soak-chaos", daemon=True)
        self.http = httpx.Client(base_url=base_url, timeout=10,
                                 headers={"Authorization": f"Bearer {control_key}"})
        self.config = config
        self.rng = random.Random(config.seed)
        self.stop = threading.Event()
        self.armed: dict[str, str] = {}  # fault_id -> kind name
        self.error: str | None = None

    def run(self) -> None:
        kinds = itertools.cycle(self.config.fault_kinds)
        delay_ms = int(self.config.client_timeout * 1500)
        try:
            while not self.stop.wait(self.config.fault_interval):
                faults = self.http.get("/_mock/faults").json()["faults"]
                busy = {f["primitive"] for f in faults if f["remaining"]}
                free = [p for p in self.config.fault_primitives if p not in busy]
                if not free:
                    continue
                kind = next(kinds)
                # skip >= 1: the call right after a fault gets through, so when only one
                # client is left its retries are not faulted forever (a livelock).
                spec = {**FAULTS[kind], "primitive": self.rng.choice(free),
                        "count": self.config.fault_burst,
                        "skip": self.rng.randint(*self.config.fault_skip)}
                if kind == "timeout":
                    spec["delay_ms"] = delay_ms
                response = self.http.post("/_mock/faults", json=spec)
                response.raise_for_status()
                self.armed[response.json()["fault_id"]] = kind
        except Exception as exc:  # noqa: BLE001 - reported, and fails the soak
            self.error = f"{type(exc).__name__}: {exc}"

    def arm_creation_drops(self) -> None:
        """Before the clients start: drop the response of ``dropped_creations`` creations of
        each kind after the server created the resource (LIFE-9 must bring it back)."""
        for name in CREATIONS:
            if self.config.dropped_creations:
                response = self.http.post("/_mock/faults", json={
                    "kind": "drop", "primitive": name, "after_execute": True,
                    "count": self.config.dropped_creations, "skip": 1})
                response.raise_for_status()
                self.armed[response.json()["fault_id"]] = f"drop_{name}"

    def fired(self) -> dict[str, int]:
        counts = dict.fromkeys([*FAULTS, *(f"drop_{name}" for name in CREATIONS)], 0)
        for fault in self.http.get("/_mock/faults").json()["faults"]:
            counts[self.armed[fault["fault_id"]]] += fault["fired"]
        return counts

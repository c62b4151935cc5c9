"""Request plumbing and outcome checks of ``WhitneyMachine``
(``tests/backend/test_stateful_api.py``).

``WhitneyMachineBase`` owns the in-process mock, its fake clock and the model, and every step the
rules share: sending a request (never a 5xx), holding one behind a gap, checking one
primitive's outcome against the model and moving the model on (ORD-1..4, ERR-3, VER-1/2,
GRAD-1, CKPT-1), binding values captured mid-pipeline, and the cancel/finish/fail requests of
the lifecycle (LIFE-2..8). It declares no rule, invariant or initialize step: those stay in
the test module, where Hypothesis collects them from ``WhitneyMachine`` and its parents.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import httpx
from conftest import API, KEY, FakeClock, expect_error
from hypothesis import event
from hypothesis.stateful import RuleBasedStateMachine
from stateful_contract_model import (
    TERMINAL,
    MCheckpoint,
    Model,
    MRun,
    Op,
    canon,
    digest,
    expect_submission,
    spoil,
)

from mock_server import InProcessTransport, create_app

ORDER_WAIT_MS = 10  # a gap costs this much real time; holds on purpose use HOLD_MS
HOLD_MS = 10_000
CANCEL_DELAY_MS = 50
RETENTION = 2  # closed sessions remembered (Backend.closed_retention); small, so it is reached
LIMITS = {"max_sessions": 3, "max_runs_per_session": 2, "max_versions_per_run": 3}


class WhitneyMachineBase(RuleBasedStateMachine):
    """One in-process mock (control plane on, fake clock), its model, and the checks of every
    request the rules send; ``WhitneyMachine`` adds the rules and invariants."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.app = create_app(api_keys=(KEY,), seed=0, order_wait_ms=ORDER_WAIT_MS,
                              cancel_delay_ms=CANCEL_DELAY_MS, limits=LIMITS,
                              control_plane=True, clock=self.clock)
        self.backend = self.app.state.backend
        self.backend.closed_retention = RETENTION
        self.transport = InProcessTransport(self.app)
        self.http = httpx.Client(transport=self.transport, base_url="http://mock", timeout=30,
                                 headers={"Authorization": f"Bearer {KEY}"})
        self.model = Model(RETENTION)
        self.terminal: dict[str, str] = {}  # LIFE-8: the first terminal state seen per run
        self.deferred: list[str] | None = None  # see observe()
        self.steps = 0

    def teardown(self) -> None:
        executed = sum(len(r.ops) for r in self.model.runs.values())
        event(f"steps: {'<10' if self.steps < 10 else '<30' if self.steps < 30 else '>=30'}")
        event(f"seqs executed: {'0' if not executed else '<10' if executed < 10 else '>=10'}")
        self.http.close()
        self.transport.close()

    # -- plumbing -------------------------------------------------------------------------
    def send(self, method: str, path: str, body: Any = None, *,
             content: bytes | None = None, headers: dict[str, str] | None = None,
             params: dict[str, Any] | None = None) -> httpx.Response:
        if content is not None:
            response = self.http.request(method, path, content=content, params=params,
                                         headers={"Content-Type": "application/json",
                                                  **(headers or {})})
        else:
            response = self.http.request(method, path, json=body, headers=headers,
                                         params=params)
        assert response.status_code < 500, f"{method} {path}: {response.text}"  # never a 5xx
        return response

    def post(self, run: MRun, primitive: str, seq: int, body: dict[str, Any],
             content: bytes | None = None) -> httpx.Response:
        return self.send("POST", f"{API}/runs/{run.run_id}/{primitive}", {"seq": seq, **body},
                         content=content)

    def in_thread(self, run: MRun, primitive: str, seq: int, body: dict[str, Any]
                  ) -> tuple[threading.Thread, dict[str, Any]]:
        out: dict[str, Any] = {}

        def target() -> None:
            out["response"] = self.http.post(f"{API}/runs/{run.run_id}/{primitive}",
                                             json={"seq": seq, **body})

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        return thread, out

    def wait_held(self, run: MRun, seq: int) -> None:
        deadline = time.monotonic() + 10
        while seq not in self.backend.runs[run.run_id].held:
            assert time.monotonic() < deadline, f"seq {seq} was never held"
            time.sleep(0.001)

    def order_wait(self, ms: int) -> None:
        """ORD-2's wait: short for gaps (each costs it), long while a test holds a request on
        purpose, so a loaded machine cannot turn the hold into a ``seq_gap``."""
        self.backend.limits = self.backend.limits.with_overrides({"order_wait_ms": ms})

    def run_of(self, run_id: str) -> MRun:
        return self.model.runs[run_id]

    def live_runs(self, state: str | None = None) -> list[str]:
        return sorted(r.run_id for r in self.model.runs.values() if not r.forgotten
                      and (state is None or r.state == state))

    def checkpoint_ids(self) -> list[str]:
        return sorted(self.model.checkpoints)

    def guard_bug_1(self) -> None:
        """The server forgets sessions as the model does (``Model.expose_bug_1``)."""
        self.backend.closed_retention = self.model.retention

    def server_weights(self, run: MRun) -> str | None:
        return digest(self.backend.runs[run.run_id].lora.params)

    def observe(self, run: MRun, what: str) -> str | None:
        """The new digest of the run's ``weights`` or ``grads`` after an op changed them.

        Inside a pipeline the server has already executed the held request too, so the value
        is a placeholder, bound to the server's value once both have run (``resolve``)."""
        if self.deferred is None:
            server = self.backend.runs[run.run_id]
            return digest(server.lora.params if what == "weights" else server.grads)
        self.deferred.append(f"?{len(self.deferred)}")
        return self.deferred[-1]

    def resolve(self, run: MRun) -> None:
        """Bind the placeholders still held by the run to the server's values; a version or
        checkpoint captured during the pipeline holds the same placeholder as the weights."""
        server = self.backend.runs[run.run_id]
        bound = {token: value for token, value in ((run.weights, digest(server.lora.params)),
                                                  (run.grads, digest(server.grads)))
                 if token in self.deferred}
        run.weights, run.grads = bound.get(run.weights, run.weights), bound.get(run.grads,
                                                                                run.grads)
        run.versions = {v: (s, bound.get(w, w)) for v, (s, w) in run.versions.items()}
        for checkpoint in self.model.checkpoints.values():
            checkpoint.weights = bound.get(checkpoint.weights, checkpoint.weights)
        held = [run.weights, *(w for _, w in run.versions.values()),
                *(c.weights for c in self.model.checkpoints.values())]
        assert not set(held) & set(self.deferred), "a value captured mid-pipeline was lost"
        self.deferred = None

    # -- ORD-1..4: one request and its outcome -------------------------------------------
    def submit(self, run: MRun, seq: int, primitive: str, body: dict[str, Any],
               bad: str | None = None, content: bytes | None = None) -> None:
        expected = expect_submission(run, seq, primitive, body, bad)
        sent = spoil(primitive, body, bad) if bad else body
        response = self.post(run, primitive, seq, sent, content)
        event(f"submit: {expected.kind} {expected.error_type or ''}".strip())
        if expected.kind == "replay":
            assert response.status_code == expected.status
            assert response.content == expected.op.content  # the recorded response, bytes
            assert response.headers.get("Whitney-Replayed") == "true"
        elif expected.kind == "execute":
            self.executed(run, seq, primitive, body, response)
        else:
            error = expect_error(response, expected.status, expected.error_type)
            if expected.kind == "gap":
                assert error["details"]["expected_seq"] == run.next_seq
            assert "Whitney-Replayed" not in response.headers

    def executed(self, run: MRun, seq: int, primitive: str, body: dict[str, Any],
                 response: httpx.Response) -> None:
        """ORD-1: ``seq`` reached its turn; check its outcome and move the model on."""
        assert "Whitney-Replayed" not in response.headers
        failure = self.state_failure(run, primitive, body)
        if failure is not None:  # ORD-4: recorded as failed, no training state change
            expect_error(response, *failure)
        else:
            assert response.status_code == 200, response.text
            self.succeeded(run, primitive, body, response.json())
        run.ops[seq] = Op(primitive, body, response.status_code, response.content,
                          canon(primitive, {"seq": seq, **body}))
        run.next_seq = seq + 1

    def state_failure(self, run: MRun, primitive: str, body: dict[str, Any]
                      ) -> tuple[int, str] | None:
        if primitive == "optim_step" and run.grads is None:
            return 409, "no_gradients"  # OPT-4
        if primitive == "save_weights_for_sampler":
            if run.versions and body["version"] <= max(run.versions):
                return 409, "version_conflict"  # VER-1
            if len(run.versions) >= LIMITS["max_versions_per_run"]:
                return 409, "quota_exceeded"
        if primitive in ("sample", "logprobs") and body["version"] not in run.versions:
            return 404, "version_not_found"
        if primitive == "load_state":
            checkpoint = self.model.checkpoints.get(body["checkpoint_id"])
            if checkpoint is None:
                return 404, "checkpoint_not_found"
            if checkpoint.rank != run.rank:
                return 409, "checkpoint_incompatible"
        return None

    def succeeded(self, run: MRun, primitive: str, body: dict[str, Any], result: Any) -> None:
        if primitive in ("forward", "forward_backward"):
            tokens = sum(len(d["model_input"]["token_ids"]) for d in body["data"])
            assert result["metrics"] == {"loss:sum": result["loss"], "tokens": tokens}
            assert [len(o["logprobs"]) for o in result["outputs"]] == \
                [len(d["model_input"]["token_ids"]) for d in body["data"]]
            if primitive == "forward_backward":  # GRAD-1: adds to the buffer
                run.grads = self.observe(run, "grads")
                assert run.grads is not None
        elif primitive == "optim_step":
            assert result["step"] == run.step + 1
            assert result["grad_norm"] >= 0 and result["update_norm"] >= 0
            run.step, run.opt_t, run.grads = run.step + 1, run.opt_t + 1, None
            run.weights = self.observe(run, "weights")
        elif primitive == "save_weights_for_sampler":
            assert result == {"version": body["version"], "step": run.step}
            run.versions[body["version"]] = (run.step, run.weights)
        elif primitive in ("sample", "logprobs"):  # VER-2: names the version and its step
            version = body["version"]
            assert (result["version"], result["step"]) == (version, run.versions[version][0])
            if primitive == "sample":
                assert len(result["sequences"]) == body["num_samples"]
                for sequence in result["sequences"]:  # SAMPLE-1
                    assert 1 <= len(sequence["tokens"]) == len(sequence["logprobs"]) \
                        <= body["sampling"]["max_tokens"]
                    assert sequence["stop_reason"] in ("stop", "length")
            else:
                assert len(result["logprobs"]) == len(body["token_ids"])
                assert result["logprobs"][0] is None
        elif primitive == "save_state":
            assert result["step"] == run.step
            self.model.checkpoints[result["checkpoint_id"]] = MCheckpoint(
                run.session_id, run.rank, run.step, run.weights, run.opt_t)
        elif primitive == "load_state":  # CKPT-1
            checkpoint = self.model.checkpoints[body["checkpoint_id"]]
            assert result == {"checkpoint_id": body["checkpoint_id"], "step": checkpoint.step}
            run.step, run.weights, run.grads = checkpoint.step, checkpoint.weights, None
            run.opt_t = checkpoint.opt_t if body["with_optimizer"] else 0
        else:  # export_lora
            assert result["format"] == "peft"
            assert {f["name"] for f in result["files"]} == {"adapter_model.safetensors",
                                                            "adapter_config.json"}

    # -- helpers the rules share ----------------------------------------------------------
    @staticmethod
    def shuffled(value: Any, rng: random.Random) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            rng.shuffle(items)
            return {k: WhitneyMachineBase.shuffled(v, rng) for k, v in items}
        if isinstance(value, list):
            return [WhitneyMachineBase.shuffled(v, rng) for v in value]
        return value

    def ended_sessions(self) -> list[str]:
        return sorted(s.session_id for s in self.model.sessions.values()
                      if s.state != "open" and not s.forgotten)

    # -- lifecycle requests (LIFE-2..8) ---------------------------------------------------
    def cancel(self, run_id: str) -> None:
        run = self.run_of(run_id)
        response = self.send("POST", f"{API}/runs/{run_id}/cancel", {})
        if run.forgotten:
            expect_error(response, 404, "not_found")
            return
        if run.state == "active":
            run.state, run.cancel_at = "cancelling", self.clock.now + CANCEL_DELAY_MS / 1000
        assert response.status_code == (200 if run.state in TERMINAL else 202), response.text
        assert response.json()["state"] == run.state

    def finish(self, run_id: str) -> None:
        run = self.run_of(run_id)
        response = self.send("POST", f"{API}/runs/{run_id}/finish", {})
        if run.forgotten:
            expect_error(response, 404, "not_found")
        elif run.state == "cancelling":
            expect_error(response, 409, "run_not_active")
        else:
            if run.state == "active":
                run.state = "finished"
            assert response.status_code == 200 and response.json()["state"] == run.state

    def server_fails_run(self, run_id: str) -> None:
        """The control plane moves a run to ``failed`` (a server-side failure)."""
        run = self.run_of(run_id)
        response = self.send("POST", "/_mock/faults", {"kind": "fail_run", "run_id": run_id})
        if run.forgotten:
            expect_error(response, 404)
            return
        assert response.status_code == 201, response.text
        if run.state == "cancelling":
            self.model.expose_bug_1()
            self.guard_bug_1()
        if run.state not in TERMINAL:
            run.state = "failed"

    # -- invariants' helper ---------------------------------------------------------------
    def training_state_matches(self, run: MRun) -> None:
        """ERR-3 / VER-2 / GRAD-1 / CKPT-1: what only the model's successes may change."""
        server = self.backend.runs[run.run_id]
        assert self.server_weights(run) == run.weights
        assert digest(server.grads) == run.grads
        assert server.optimizer.t == run.opt_t
        assert {v: (s.step, digest(s.lora.params)) for v, s in server.versions.items()} == \
            run.versions

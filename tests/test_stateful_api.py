"""The contract's lifecycle and ordering rules as a state machine over HTTP (in-process).

``WhitneyMachine`` drives one mock through random interleavings of every primitive (valid and
refused bodies), version saves (VER-1), replays of earlier seqs with the same or a changed body
(ORD-3), gaps (ORD-2), pipelined and interrupted held requests, cancels with polling (LIFE-7),
finishes, server-side failures, TTL expiry (LIFE-4), heartbeats, closes (LIFE-3) and the
closed-session retention window, beside a plain-dict model of what the contract says must
happen (``Model``; it and the body strategies live in ``stateful_contract_model``). After every
step the invariants compare server and model: run and session views (state, ``next_seq``,
``step``, versions), the executed trace (``/_mock/trace``: every seq once, in order, with the
model's primitive and status), the training state ERR-3 protects (weights, gradient buffer,
AdamW step count, version snapshots), terminal states that never change (LIFE-8), and no 5xx
ever.

Time is a fake clock (``create_app(clock=...)``) for TTL and ``cancelling``. ORD-2 holds use
real time: a gap waits ``ORDER_WAIT_MS`` (short: each gap costs it), while a request held on
purpose (pipelines, cancel or finish with a request held) gets ``HOLD_MS``, so a loaded machine
cannot turn the hold into a ``seq_gap``.

Where the contract is silent the model follows the mock's documented choices (ARCHITECTURE.md,
tests/test_expiry_memory.py): a retired session's runs list no versions, and a session closed
``RETENTION`` retirements ago is forgotten with its runs and checkpoints (404).
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import httpx
from hypothesis import event, settings, strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, initialize, invariant, multiple,
                                 precondition, rule)

from conftest import API, KEY, MODEL, FakeClock, expect_error
from hypothesis_profiles import examples, steps
from mock_server import InProcessTransport, create_app
from stateful_contract_model import (PRIMITIVES, TERMINAL, WITH_TOKENS, MCheckpoint, Model, MRun,
                                     MSession, Op, body_st, canon, digest, expect_submission,
                                     spoil)

ORDER_WAIT_MS = 10  # a gap costs this much real time; holds on purpose use HOLD_MS
HOLD_MS = 10_000
CANCEL_DELAY_MS = 50
RETENTION = 2  # closed sessions remembered (Backend.closed_retention); small, so it is reached
LIMITS = {"max_sessions": 3, "max_runs_per_session": 2, "max_versions_per_run": 3}


# -- the machine ------------------------------------------------------------------------------
class WhitneyMachine(RuleBasedStateMachine):
    """One in-process mock (control plane on, fake clock) and its model."""

    sessions = Bundle("sessions")
    runs = Bundle("runs")

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
             content: bytes | None = None) -> httpx.Response:
        if content is not None:
            response = self.http.request(method, path, content=content,
                                         headers={"Content-Type": "application/json"})
        else:
            response = self.http.request(method, path, json=body)
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

    # -- sessions and runs (LIFE-1..5) ----------------------------------------------------
    def first_session_and_run(self) -> tuple[str, str]:
        """Every example starts with one session and one run, so no step is spent waiting
        for the bundles to fill."""
        if not self.model.sessions:
            session_id = self.create_session(None)
            self.create_run(session_id, 4)
        session = next(iter(self.model.sessions.values()))
        return session.session_id, session.run_ids[0]

    @initialize(target=sessions)
    def first_session(self) -> str:
        return self.first_session_and_run()[0]

    @initialize(target=runs, count=st.integers(0, 6), data=st.data())
    def first_run(self, count: int, data: st.DataObject) -> str:
        """The first run starts with a burst of primitives: Hypothesis disables a random subset
        of the rules in each example (swarm testing), sometimes the primitive rules too."""
        run_id = self.first_session_and_run()[1]
        self.primitives_in_order(run_id, count, data)
        return run_id

    @rule(target=sessions, ttl=st.none() | st.integers(1, 4))
    def create_session(self, ttl: int | None) -> Any:
        body = {} if ttl is None else {"ttl_seconds": ttl}
        response = self.send("POST", f"{API}/sessions", body)
        if self.model.open_sessions() >= LIMITS["max_sessions"]:
            expect_error(response, 409, "quota_exceeded")
            return multiple()
        assert response.status_code == 201, response.text
        view = response.json()
        session = MSession(view["session_id"], ttl, None if ttl is None else self.clock.now + ttl)
        self.model.sessions[session.session_id] = session
        assert view["state"] == "open" and (view["expires_at"] is None) == (ttl is None)
        return session.session_id

    @rule(target=runs, session_id=sessions, rank=st.sampled_from([2, 4]))
    def create_run(self, session_id: str, rank: int) -> Any:
        session = self.model.sessions[session_id]
        response = self.send("POST", f"{API}/sessions/{session_id}/runs", {
            "base_model": MODEL, "lora": {"rank": rank, "alpha": 8.0, "seed": rank},
            "optimizer": "adamw"})
        if session.forgotten:
            expect_error(response, 404, "not_found")
        elif session.state != "open":  # a closed or expired session accepts no new run
            expect_error(response, 409, "session_not_open")
        elif len(session.run_ids) >= LIMITS["max_runs_per_session"]:
            expect_error(response, 409, "quota_exceeded")
        else:
            assert response.status_code == 201, response.text
            view = response.json()
            assert (view["state"], view["next_seq"], view["step"], view["versions"]) == \
                ("active", 1, 0, [])
            run = MRun(view["run_id"], session_id, rank, "")
            self.model.runs[run.run_id] = run
            run.weights = self.server_weights(run)
            session.run_ids.append(run.run_id)
            return run.run_id
        return multiple()

    # -- primitives (ORD-1..4) ------------------------------------------------------------
    @rule(run_id=runs, count=st.integers(1, 6), data=st.data())
    def primitives_in_order(self, run_id: str, count: int, data: st.DataObject) -> None:
        """ORD-1: a burst of primitives at ``next_seq``, each after the previous answered."""
        run = self.run_of(run_id)
        for _ in range(count):
            primitive = data.draw(st.sampled_from(PRIMITIVES))
            self.submit(run, run.next_seq, primitive,
                        data.draw(body_st(primitive, self.checkpoint_ids())))

    @rule(run_id=runs, kind=st.sampled_from(["schema", "value"]), where=st.integers(0, 2),
          data=st.data())
    def refused_body(self, run_id: str, kind: str, where: int, data: st.DataObject) -> None:
        """A body refused with 422: undefined field or token outside the vocabulary, sent at
        the next seq, at a recorded seq, or ahead; it must never be recorded (ORD-4)."""
        run = self.run_of(run_id)
        primitive = data.draw(st.sampled_from(sorted(WITH_TOKENS) if kind == "value"
                                              else PRIMITIVES))
        body = data.draw(body_st(primitive, self.checkpoint_ids()))
        seq = [run.next_seq, max(1, run.next_seq - 1), run.next_seq + 2][where]
        self.order_wait(ORDER_WAIT_MS)
        self.submit(run, seq, primitive, body, bad=kind)

    @precondition(lambda self: any(r.ops for r in self.model.runs.values()))
    @rule(data=st.data(), same=st.booleans(), indent=st.sampled_from([None, 1]))
    def replay(self, data: st.DataObject, same: bool, indent: int | None) -> None:
        """ORD-3: an earlier seq again, JSON-equal (keys shuffled, other whitespace) or not."""
        candidates = sorted(r.run_id for r in self.model.runs.values() if r.ops)
        run = self.run_of(data.draw(st.sampled_from(candidates)))
        seq = data.draw(st.sampled_from(sorted(run.ops)))
        op = run.ops[seq]
        if same:
            primitive, body = op.primitive, op.body
            shuffled = self.shuffled({"seq": seq, **body}, data.draw(st.randoms()))
            content = json.dumps(shuffled, indent=indent).encode()
        else:
            primitive = data.draw(st.sampled_from(PRIMITIVES))
            body, content = data.draw(body_st(primitive, self.checkpoint_ids())), None
        self.submit(run, seq, primitive, body, content=content)

    @staticmethod
    def shuffled(value: Any, rng: random.Random) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            rng.shuffle(items)
            return {k: WhitneyMachine.shuffled(v, rng) for k, v in items}
        if isinstance(value, list):
            return [WhitneyMachine.shuffled(v, rng) for v in value]
        return value

    @rule(run_id=runs, ahead=st.integers(1, 3), data=st.data())
    def gap(self, run_id: str, ahead: int, data: st.DataObject) -> None:
        """ORD-2: a seq ahead of ``next_seq`` waits ``order_wait_ms``, then 409 ``seq_gap``."""
        run = self.run_of(run_id)
        primitive = data.draw(st.sampled_from(PRIMITIVES))
        self.order_wait(ORDER_WAIT_MS)
        self.submit(run, run.next_seq + ahead, primitive,
                    data.draw(body_st(primitive, self.checkpoint_ids())))

    @precondition(lambda self: self.live_runs("active"))
    @rule(data=st.data(), duplicate=st.booleans())
    def pipeline(self, data: st.DataObject, duplicate: bool) -> None:
        """ORD-2: seq N+1 sent first (held), then N: both execute, N first. A duplicate of the
        held request gets the same response, marked replayed."""
        run = self.run_of(data.draw(st.sampled_from(self.live_runs("active"))))
        (p1, p2) = data.draw(st.lists(st.sampled_from(PRIMITIVES), min_size=2, max_size=2))
        first_seq = run.next_seq
        body1 = data.draw(body_st(p1, self.checkpoint_ids()))
        body2 = data.draw(body_st(p2, self.checkpoint_ids()))
        self.order_wait(HOLD_MS)
        second, second_out = self.in_thread(run, p2, first_seq + 1, body2)
        self.wait_held(run, first_seq + 1)
        copy, copy_out = (self.in_thread(run, p2, first_seq + 1, body2) if duplicate
                          else (None, {}))
        self.deferred = []
        self.submit(run, first_seq, p1, body1)
        second.join(30)
        assert second_out["response"].status_code < 500
        self.executed(run, first_seq + 1, p2, body2, second_out["response"])
        self.resolve(run)
        if copy is not None:
            copy.join(30)
            assert copy_out["response"].content == second_out["response"].content
            assert copy_out["response"].headers.get("Whitney-Replayed") == "true"

    @precondition(lambda self: self.live_runs("active"))
    @rule(data=st.data(), how=st.sampled_from(["cancel", "finish"]))
    def interrupt_held(self, data: st.DataObject, how: str) -> None:
        """LIFE-7 / §4a: a request held behind a gap fails 409 ``run_cancelled`` when the run
        is cancelled, ``run_not_active`` when it is finished; it is not recorded (ORD-4)."""
        run = self.run_of(data.draw(st.sampled_from(self.live_runs("active"))))
        primitive = data.draw(st.sampled_from(PRIMITIVES))
        self.order_wait(HOLD_MS)
        held, out = self.in_thread(run, primitive, run.next_seq + 1,
                                   data.draw(body_st(primitive, self.checkpoint_ids())))
        self.wait_held(run, run.next_seq + 1)
        getattr(self, how)(run.run_id)
        held.join(30)
        expect_error(out["response"], 409,
                     "run_cancelled" if how == "cancel" else "run_not_active")

    # -- lifecycle (LIFE-2..8) ------------------------------------------------------------
    @rule(run_id=runs, how=st.sampled_from(["cancel", "cancel_and_poll", "finish", "fail"]))
    def end_run(self, run_id: str, how: str) -> None:
        """One rule for the four ways a run ends, so ending is not four times likelier than
        training."""
        {"cancel": self.cancel, "cancel_and_poll": self.cancel_and_poll_until_terminal,
         "finish": self.finish, "fail": self.server_fails_run}[how](run_id)

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

    @rule(seconds=st.sampled_from([0.01, 0.03, 0.06, 0.5, 1.0, 2.5]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.model.tick(self.clock.now)
        self.guard_bug_1()

    def cancel_and_poll_until_terminal(self, run_id: str) -> None:
        """The seed's Cleanup: cancel, then poll ``GET /runs/{rid}`` until terminal (LIFE-7)."""
        run = self.run_of(run_id)
        if run.forgotten:
            self.cancel(run_id)
            return
        self.cancel(run.run_id)
        for _ in range(100):
            view = self.send("GET", f"{API}/runs/{run.run_id}").json()
            assert view["state"] == run.state
            if run.state in TERMINAL:
                return
            self.advance_clock(0.01)
        raise AssertionError(f"run {run.run_id} still {run.state} after 1 s of polling")

    @rule(session_id=sessions)
    def close_session(self, session_id: str) -> None:
        session = self.model.sessions[session_id]
        response = self.send("POST", f"{API}/sessions/{session_id}/close", {})
        if session.forgotten:
            expect_error(response, 404, "not_found")
            return
        busy = [r for r in session.run_ids if self.model.runs[r].state not in TERMINAL]
        if session.state == "open" and busy:
            error = expect_error(response, 409, "runs_not_terminal")
            assert error["details"]["run_ids"] == busy
            return
        assert response.status_code == 200, response.text
        if session.state == "open":
            session.state = "closed"
            self.model.retire(session)
        assert response.json()["state"] == session.state

    def ended_sessions(self) -> list[str]:
        return sorted(s.session_id for s in self.model.sessions.values()
                      if s.state != "open" and not s.forgotten)

    @precondition(lambda self: self.ended_sessions())
    @rule(data=st.data())
    def closed_session_refuses_everything(self, data: st.DataObject) -> None:
        """LIFE-3/LIFE-8: a closed or expired session takes no new run, no heartbeat, and its
        runs no new primitive; what it answered before is still answered (ORD-3)."""
        session = self.model.sessions[data.draw(st.sampled_from(self.ended_sessions()))]
        self.create_run(session.session_id, 2)
        self.heartbeat(session.session_id)
        for run_id in session.run_ids:
            run = self.run_of(run_id)
            primitive = data.draw(st.sampled_from(PRIMITIVES))
            self.submit(run, run.next_seq, primitive,
                        data.draw(body_st(primitive, self.checkpoint_ids())))
            self.cancel(run_id)
            self.finish(run_id)
            if run.ops:
                seq = data.draw(st.sampled_from(sorted(run.ops)))
                self.submit(run, seq, run.ops[seq].primitive, run.ops[seq].body)

    @rule(session_id=sessions)
    def heartbeat(self, session_id: str) -> None:
        session = self.model.sessions[session_id]
        response = self.send("POST", f"{API}/sessions/{session_id}/heartbeat", {})
        if session.forgotten:
            expect_error(response, 404, "not_found")
        elif session.state != "open":
            expect_error(response, 409, "session_not_open")
        else:
            assert response.status_code == 200, response.text
            if session.ttl is not None:
                session.expires_at = self.clock.now + session.ttl
            assert (response.json()["expires_at"] is None) == (session.ttl is None)

    @rule(run_id=runs, data=st.data())
    def read_operation(self, run_id: str, data: st.DataObject) -> None:
        """ORD-5: the record of a seq, or 404 for one never recorded."""
        run = self.run_of(run_id)
        seq = data.draw(st.integers(1, run.next_seq + 1))
        response = self.send("GET", f"{API}/runs/{run_id}/operations/{seq}")
        if run.forgotten:
            expect_error(response, 404, "not_found")
        elif seq not in run.ops:
            expect_error(response, 404, "operation_not_found")
        else:
            op, record = run.ops[seq], response.json()
            assert (record["seq"], record["primitive"]) == (seq, op.primitive)
            if op.status < 400:
                assert record["status"] == "completed"
                assert record["result"] == json.loads(op.content)
            else:
                assert record["status"] == "failed"
                assert record["error"] == json.loads(op.content)["error"]

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def server_matches_model(self) -> None:
        self.steps += 1
        self.send("GET", f"{API}/capabilities")  # a contract request applies time; the trace not
        trace = self.send("GET", "/_mock/trace").json()["runs"]
        assert set(trace) == set(self.live_runs())
        for run in self.model.runs.values():
            response = self.send("GET", f"{API}/runs/{run.run_id}")
            if run.forgotten:
                expect_error(response, 404, "not_found")
                continue
            view = response.json()
            versions = [] if run.retired else [[v, s] for v, (s, _) in run.versions.items()]
            assert (view["state"], view["next_seq"], view["step"]) == \
                (run.state, run.next_seq, run.step)
            assert [[v["version"], v["step"]] for v in view["versions"]] == versions
            # every executed seq exactly once, in seq order, as the model recorded it
            assert trace[run.run_id] == [
                {"seq": seq, "primitive": op.primitive,
                 "status": "completed" if op.status < 400 else "failed"}
                for seq, op in sorted(run.ops.items())]
            assert sorted(run.ops) == list(range(1, run.next_seq))
            if run.state in TERMINAL:  # LIFE-8
                assert self.terminal.setdefault(run.run_id, run.state) == run.state
            if not run.retired:
                self.training_state_matches(run)
        for session in self.model.sessions.values():
            response = self.send("GET", f"{API}/sessions/{session.session_id}")
            if session.forgotten:
                expect_error(response, 404, "not_found")
            else:
                assert response.json()["state"] == session.state

    def training_state_matches(self, run: MRun) -> None:
        """ERR-3 / VER-2 / GRAD-1 / CKPT-1: what only the model's successes may change."""
        server = self.backend.runs[run.run_id]
        assert self.server_weights(run) == run.weights
        assert digest(server.grads) == run.grads
        assert server.optimizer.t == run.opt_t
        assert {v: (s.step, digest(s.lora.params)) for v, s in server.versions.items()} == \
            run.versions


WhitneyMachine.TestCase.settings = settings(max_examples=examples(100, 1000),
                                            stateful_step_count=steps(50, 100))
TestWhitneyMachine = WhitneyMachine.TestCase

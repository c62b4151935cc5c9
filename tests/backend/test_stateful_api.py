"""The contract's lifecycle and ordering rules as a state machine over HTTP (in-process).

``WhitneyMachine`` drives one mock through random interleavings of every primitive (valid and
refused bodies), version saves (VER-1), replays of earlier seqs with the same or a changed body
(ORD-3), gaps (ORD-2), pipelined and interrupted held requests, cancels with polling (LIFE-7),
finishes, server-side failures, TTL expiry (LIFE-4), heartbeats, closes (LIFE-3), the
closed-session retention window, creations with an Idempotency-Key from a small pool (LIFE-9:
replays byte for byte, 409 for another body or path, keys forgotten with their session) and
listings of every page (LIFE-10: newest first, filtered by state and metadata, runs per
view), beside a plain-dict model of what the contract says must happen (``Model``; it and the
body strategies live in ``stateful_contract_model``). After every
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
tests/backend/test_expiry_memory.py):
a retired session's runs list no versions, and a session closed
``RETENTION`` retirements ago is forgotten with its runs and checkpoints (404).
"""

from __future__ import annotations

import json
from typing import Any

from conftest import API, MODEL, expect_error
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, invariant, multiple, precondition, rule
from hypothesis_profiles import examples, steps
from stateful_contract_model import (
    PRIMITIVES,
    TERMINAL,
    WITH_TOKENS,
    MCreation,
    MRun,
    MSession,
    body_st,
)
from stateful_machine_base import HOLD_MS, LIMITS, ORDER_WAIT_MS, WhitneyMachineBase

#: LIFE-9: a small pool, so a key comes back with the same body, another body or another path.
IDEMPOTENCY_KEYS = ["k-0", "k-1", "k-2"]


# -- the machine ------------------------------------------------------------------------------
class WhitneyMachine(WhitneyMachineBase):
    """One in-process mock (control plane on, fake clock) and its model."""

    sessions = Bundle("sessions")
    runs = Bundle("runs")

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
        return self.open_session({} if ttl is None else {"ttl_seconds": ttl})

    def open_session(self, body: dict[str, Any], key: str | None = None) -> Any:
        """LIFE-1 (and LIFE-9 with ``key``): the answer the model expects, the model moved."""
        headers = {"Idempotency-Key": key} if key is not None else None
        response = self.send("POST", f"{API}/sessions", body, headers=headers)
        if key is not None:
            kind, record = self.model.creation(key, "POST /sessions", body)
            event(f"create_session with a key: {kind}")
            if self.answered_by_record(response, kind, record):
                return multiple()
        if self.model.open_sessions() >= LIMITS["max_sessions"]:
            expect_error(response, 409, "quota_exceeded")
            return multiple()
        assert response.status_code == 201, response.text
        assert "Whitney-Replayed" not in response.headers
        view = response.json()
        ttl = body.get("ttl_seconds")
        session = MSession(view["session_id"], ttl, None if ttl is None else self.clock.now + ttl,
                           metadata=dict(body.get("metadata") or {}))
        self.model.sessions[session.session_id] = session
        assert view["state"] == "open" and (view["expires_at"] is None) == (ttl is None)
        assert view["metadata"] == session.metadata and view["runs"] == []
        if key is not None:
            self.model.creations[key] = MCreation("POST /sessions", json.dumps(
                body, sort_keys=True), response.content, session.session_id)
        return session.session_id

    def answered_by_record(self, response: Any, kind: str, record: MCreation | None) -> bool:
        """LIFE-9: a replay answers the first answer byte for byte; a conflict is 409."""
        if kind == "replay":
            assert record is not None and response.status_code == 201, response.text
            assert response.content == record.content
            assert response.headers.get("Whitney-Replayed") == "true"
            return True
        if kind == "conflict":
            expect_error(response, 409, "idempotency_conflict")
            return True
        return False

    @rule(target=sessions, key=st.sampled_from(IDEMPOTENCY_KEYS), ttl=st.none() | st.just(2),
          team=st.sampled_from(["red", "blue"]))
    def create_session_once(self, key: str, ttl: int | None, team: str) -> Any:
        """LIFE-9: a creation with an Idempotency-Key from a small pool, so keys are reused
        with the same body (a replay), another body or another path (409), or after their
        session left the retention window (a new creation)."""
        body: dict[str, Any] = {"metadata": {"team": team}}
        if ttl is not None:
            body["ttl_seconds"] = ttl
        return self.open_session(body, key)

    @rule(target=runs, session_id=sessions, rank=st.sampled_from([2, 4]),
          key=st.sampled_from(IDEMPOTENCY_KEYS))
    def create_run_once(self, session_id: str, rank: int, key: str) -> Any:
        """LIFE-9 on ``POST /sessions/{sid}/runs``, replayed before the session's state and
        quota are looked at (even once it is closed)."""
        return self.create_run_with(session_id, rank, key)

    @rule(target=runs, session_id=sessions, rank=st.sampled_from([2, 4]))
    def create_run(self, session_id: str, rank: int) -> Any:
        return self.create_run_with(session_id, rank, None)

    def create_run_with(self, session_id: str, rank: int, key: str | None) -> Any:
        session = self.model.sessions[session_id]
        body = {"base_model": MODEL, "lora": {"rank": rank, "alpha": 8.0, "seed": rank},
                "optimizer": "adamw"}
        response = self.send("POST", f"{API}/sessions/{session_id}/runs", body,
                             headers=None if key is None else {"Idempotency-Key": key})
        if key is not None:
            kind, record = self.model.creation(key, f"POST /sessions/{session_id}/runs", body)
            event(f"create_run with a key: {kind}")
            if self.answered_by_record(response, kind, record):
                return multiple()
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
            if key is not None:
                self.model.creations[key] = MCreation(
                    f"POST /sessions/{session_id}/runs", json.dumps(body, sort_keys=True),
                    response.content, session_id)
            return run.run_id
        return multiple()

    @rule(limit=st.sampled_from([1, 2, 5]), state=st.none() | st.sampled_from(
        ["open", "closed", "expired"]), team=st.none() | st.sampled_from(["red", "blue"]))
    def list_sessions(self, limit: int, state: str | None, team: str | None) -> None:
        """LIFE-10: every page of a listing together is the model's sessions, newest first,
        filtered; each page holds at most ``limit``; each view's runs are the model's."""
        params: dict[str, Any] = {"limit": limit}
        if state is not None:
            params["state"] = state
        if team is not None:
            params.update(metadata_key="team", metadata_value=team)
        listed: list[dict[str, Any]] = []
        while True:
            page = self.send("GET", f"{API}/sessions", params=params).json()
            assert len(page["sessions"]) <= limit
            listed += page["sessions"]
            if page["next_cursor"] is None:
                break
            assert len(page["sessions"]) == limit
            params["cursor"] = page["next_cursor"]
        expected = self.model.listed(state, None if team is None else ("team", team))
        event(f"listed {'0' if not expected else '1-3' if len(expected) < 4 else '4+'}")
        assert [v["session_id"] for v in listed] == expected
        for view in listed:
            session = self.model.sessions[view["session_id"]]
            assert view["state"] == session.state and view["metadata"] == session.metadata
            assert view["runs"] == [{"run_id": r, "state": self.model.runs[r].state}
                                    for r in session.run_ids]

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
                view = response.json()
                assert view["state"] == session.state
                assert view["runs"] == [{"run_id": r, "state": self.model.runs[r].state}
                                        for r in session.run_ids]  # LIFE-10


WhitneyMachine.TestCase.settings = settings(max_examples=examples(100, 1000),
                                            stateful_step_count=steps(50, 100))
TestWhitneyMachine = WhitneyMachine.TestCase

"""The mock's state machine: keys, sessions, runs, ordered primitives, versions, checkpoints.

No HTTP here (moto's ``models.py``): methods take keyword arguments and validated bodies,
return plain dicts or JSON bytes, and raise ``WhitneyError`` subclasses. Everything runs on
one event loop, so no locks are needed; a request held for ordering awaits an asyncio future
and costs no CPU while it waits (ORD-2).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import deque
from typing import Any

import numpy as np
import orjson

from ..engine import model as nm
from . import schemas
from ..testing import violations as _violations
from .errors import Conflict, NotFound, Unauthorized, ValidationFailed, WhitneyError
from .config import Features, Limits
from .primitives import PREPARERS, Checkpoint, Thunk
from .records import CONTRACT_VERSION, TERMINAL, Held, Operation, Outcome, Run, Session, iso

logger = logging.getLogger("mock_server")


class Backend:
    """All state of one mock server. ``reset()`` rebuilds it exactly as ``__init__`` left it."""

    def __init__(self, *, api_keys: tuple[str, ...] | list[str] = ("whitney-mock-key",),
                 seed: int = 0, limits: Limits | None = None, features: Features | None = None,
                 cancel_delay_ms: int = 50, clock: Any = time.time,
                 violations: frozenset[str] = frozenset(), closed_retention: int = 256) -> None:
        if not api_keys:
            raise ValueError("the mock needs at least one API key")
        self.api_keys = tuple(api_keys)
        self.seed = seed
        self.limits = limits or Limits()
        self.features = features or Features()
        self.cancel_delay_ms = cancel_delay_ms
        self.clock = clock
        self.violations = _violations.check_names(frozenset(violations))
        self.closed_retention = closed_retention
        self.reset()

    def reset(self) -> None:
        """Forget every session, run, checkpoint and export; reseed the id and sampling RNG."""
        for run in getattr(self, "runs", {}).values():
            self._fail_held(run, "run_cancelled", "the mock was reset")
        self.rng = np.random.default_rng(self.seed)
        self.sessions: dict[str, Session] = {}
        self.runs: dict[str, Run] = {}
        self.checkpoints: dict[str, tuple[str, Checkpoint]] = {}  # id -> (session_id, ckpt)
        self._closed: deque[str] = deque()
        self._timed: dict[str, float] = {}  # open sessions with a TTL -> expires_at
        self._cancelling: dict[str, float] = {}  # cancelling runs -> when they read cancelled
        self._counter = 0

    # -- helpers used by primitives -------------------------------------------------------
    def now_iso(self) -> str:
        return iso(self.clock())  # type: ignore[return-value]

    def new_id(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}_{self._counter:06d}{self.rng.bytes(6).hex()}"

    def fresh_seed(self) -> int:
        return int(self.rng.integers(0, 2**63 - 1))

    def add_checkpoint(self, run: Run, checkpoint: Checkpoint) -> None:
        self.checkpoints[checkpoint.checkpoint_id] = (run.session_id, checkpoint)

    def find_checkpoint(self, key: str, checkpoint_id: str) -> Checkpoint | None:
        entry = self.checkpoints.get(checkpoint_id)
        if entry is None or self.sessions[entry[0]].key != key:
            return None
        return entry[1]

    # -- auth and discovery ---------------------------------------------------------------
    def authenticate(self, authorization: str | None) -> str:
        """SEC-1: ``Bearer <key>``, compared in constant time against every known key."""
        scheme, _, token = (authorization or "").partition(" ")
        found = None
        for key in self.api_keys:
            if hmac.compare_digest(token.strip().encode(), key.encode()) and found is None:
                found = key
        if found is None and token.strip() and "accepts_any_bearer" in self.violations:
            found = self.api_keys[0]
        if scheme.lower() != "bearer" or found is None:
            raise Unauthorized("missing or unknown API key (Authorization: Bearer <key>)")
        return found

    def capabilities(self) -> dict[str, Any]:
        """DISC-1."""
        return _violations.tamper_capabilities(self.violations, {
            "contract_version": CONTRACT_VERSION,
            "primitives": list(PREPARERS),
            "optimizers": ["adamw"],
            "loss_functions": nm.LOSS_SPECS,
            "base_models": [spec.capabilities_entry() for spec in nm.BASE_MODELS.values()],
            "limits": self.limits.as_dict(),
            "features": self.features.as_dict(),
        })

    # -- time: expiry, cancellation, retention (evaluated lazily, on every request) ---------
    def tick(self) -> None:
        """Apply what time has done: TTL expiry (LIFE-4) and ends of ``cancelling`` (LIFE-7)."""
        now = self.clock()
        for session_id in [sid for sid, expires in self._timed.items() if now >= expires]:
            del self._timed[session_id]
            session = self.sessions[session_id]
            session.state = "expired"
            for run_id in session.run_ids:
                run = self.runs[run_id]
                if run.state not in TERMINAL and "expiry_keeps_runs" not in self.violations:
                    self._fail_held(run, "run_cancelled", "the session expired")
                    run.state = "cancelled"
                    self._cancelling.pop(run_id, None)
            self._retire(session)
        for run_id in [rid for rid, at in self._cancelling.items() if now >= at]:
            self._settle(self.runs[run_id], now)

    def _settle(self, run: Run, now: float | None = None) -> None:
        if run.state == "cancelling" and (now or self.clock()) >= (run.cancel_at or 0):
            run.state = "cancelled"
            self._cancelling.pop(run.run_id, None)

    def _retire(self, session: Session) -> None:
        """Free a closed session's weights now; forget it entirely after ``closed_retention``."""
        for run_id in session.run_ids:
            run = self.runs[run_id]
            run.grads = None
            run.versions.clear()
            run.exports.clear()
            run.optimizer = nm.AdamWState.zeros_like({})
        self._closed.append(session.session_id)
        while len(self._closed) > self.closed_retention:
            old = self.sessions.pop(self._closed.popleft())
            for run_id in old.run_ids:
                self.runs.pop(run_id, None)
                self._cancelling.pop(run_id, None)
            for checkpoint_id in [c for c, (sid, _) in self.checkpoints.items()
                                  if sid == old.session_id]:
                del self.checkpoints[checkpoint_id]

    # -- sessions -------------------------------------------------------------------------
    def _session(self, key: str, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is not None and session.key != key and "foreign_403" in self.violations:
            raise _violations.forbidden(f"session {session_id!r}")
        if session is None or session.key != key:
            raise NotFound(f"session {session_id!r} not found")  # SEC-2: foreign == unknown
        return session

    def session_view(self, session: Session) -> dict[str, Any]:
        return {"session_id": session.session_id, "state": session.state,
                "created_at": iso(session.created_at), "expires_at": iso(session.expires_at),
                "metadata": session.metadata
                if "session_metadata_dropped" not in self.violations else {}}

    def create_session(self, *, key: str, body: schemas.CreateSession) -> dict[str, Any]:
        """LIFE-1, LIFE-2."""
        ttl = body.ttl_seconds
        if ttl is not None:
            if not self.features.session_ttl:
                raise ValidationFailed("ttl_seconds is not supported (features.session_ttl)",
                                       details={"loc": "ttl_seconds"})
            if not self.limits.min_ttl_seconds <= ttl <= self.limits.max_ttl_seconds:
                raise ValidationFailed(f"ttl_seconds must lie in [{self.limits.min_ttl_seconds}, "
                                       f"{self.limits.max_ttl_seconds}]",
                                       details={"loc": "ttl_seconds"})
        open_sessions = sum(1 for s in self.sessions.values() if s.key == key and s.state == "open")
        if open_sessions >= self.limits.max_sessions:
            raise Conflict(f"this key already has {open_sessions} open sessions (max_sessions)",
                           type="quota_exceeded", details={"limit": "max_sessions"})
        now = self.clock()
        session = Session(self.new_id("sess"), key, now, ttl, None if ttl is None else now + ttl,
                          dict(body.metadata or {}))
        self.sessions[session.session_id] = session
        if session.expires_at is not None:
            self._timed[session.session_id] = session.expires_at
        return self.session_view(session)

    def get_session(self, *, key: str, session_id: str) -> dict[str, Any]:
        return self.session_view(self._session(key, session_id))

    def heartbeat(self, *, key: str, session_id: str) -> dict[str, Any]:
        """LIFE-2: move ``expires_at`` to now + ttl."""
        session = self._session(key, session_id)
        if session.state != "open":
            raise Conflict(f"session is {session.state}", type="session_not_open")
        if session.ttl_seconds is not None and "heartbeat_no_extend" not in self.violations:
            session.expires_at = self._timed[session_id] = self.clock() + session.ttl_seconds
        return self.session_view(session)

    def close_session(self, *, key: str, session_id: str) -> dict[str, Any]:
        """LIFE-3: refused while any run is not terminal; idempotent once closed."""
        session = self._session(key, session_id)
        if session.state != "open":
            return self.session_view(session)
        busy = [rid for rid in session.run_ids if self.runs[rid].state not in TERMINAL]
        if busy and "close_with_active_runs" not in self.violations:
            raise Conflict("the session has runs that are not terminal; finish or cancel them "
                           "and poll until terminal", type="runs_not_terminal",
                           details={"run_ids": busy})
        session.state = "closed"
        self._timed.pop(session_id, None)
        view = self.session_view(session)
        self._retire(session)
        return view

    # -- runs -----------------------------------------------------------------------------
    def owned_run(self, key: str, run_id: str) -> Run:
        """The run ``run_id`` if ``key`` owns it, else 404 exactly as for an unknown id (SEC-2)."""
        run = self.runs.get(run_id)
        if run is not None and run.key != key and "foreign_403" in self.violations:
            raise _violations.forbidden(f"run {run_id!r}")
        if run is None or run.key != key:
            raise NotFound(f"run {run_id!r} not found")
        self._settle(run)
        return run

    def run_view(self, run: Run) -> dict[str, Any]:
        return {"run_id": run.run_id, "session_id": run.session_id, "state": run.state,
                "next_seq": run.next_seq, "step": run.step,
                "versions": [{"version": v.version, "step": v.step, "created_at": v.created_at}
                             for v in run.versions.values()],
                "created_at": iso(run.created_at)}

    def create_run(self, *, key: str, session_id: str, body: schemas.CreateRun) -> dict[str, Any]:
        """LIFE-5."""
        session = self._session(key, session_id)
        if body.base_model not in nm.BASE_MODELS:
            raise ValidationFailed(f"unknown base model {body.base_model!r}",
                                   type="unknown_base_model",
                                   details={"base_models": sorted(nm.BASE_MODELS)})
        base = nm.get_base_model(body.base_model)
        if body.lora.rank > base.spec.max_lora_rank \
                and "rank_limit_unvalidated" not in self.violations:
            raise ValidationFailed(f"lora.rank {body.lora.rank} exceeds max_lora_rank "
                                   f"{base.spec.max_lora_rank}", details={"loc": "lora.rank"})
        if session.state != "open":
            raise Conflict(f"session is {session.state}", type="session_not_open")
        if len(session.run_ids) >= self.limits.max_runs_per_session:
            raise Conflict("the session already has max_runs_per_session runs",
                           type="quota_exceeded", details={"limit": "max_runs_per_session"})
        seed = body.lora.seed if body.lora.seed is not None else self.fresh_seed()
        lora = base.init_lora(body.lora.rank, body.lora.alpha, seed)
        run = Run(self.new_id("run"), session_id, key, body.base_model, base, lora,
                  nm.AdamWState.zeros_like(lora.params), self.clock())
        self.runs[run.run_id] = run
        session.run_ids.append(run.run_id)
        return self.run_view(run)

    def get_run(self, *, key: str, run_id: str) -> dict[str, Any]:
        return self.run_view(self.owned_run(key, run_id))

    def finish_run(self, *, key: str, run_id: str) -> dict[str, Any]:
        """LIFE-6, LIFE-8: requests held behind a gap fail with ``run_not_active``."""
        run = self.owned_run(key, run_id)
        if run.state in TERMINAL:
            if run.state == "cancelled" and "terminal_finish_mutates" in self.violations:
                run.state = "finished"
            return self.run_view(run)
        if run.state != "active":
            raise Conflict(f"run is {run.state}", type="run_not_active")
        self._fail_held(run, "run_not_active", "the run was finished")
        run.state = "finished"
        return self.run_view(run)

    def cancel_run(self, *, key: str, run_id: str) -> tuple[int, dict[str, Any]]:
        """LIFE-7: 202 ``cancelling``; held requests fail; ``cancelled`` after a delay."""
        run = self.owned_run(key, run_id)
        if run.state in TERMINAL:
            return 200, self.run_view(run)
        if run.state == "active":
            run.state = "cancelling"
            run.cancel_at = self._cancelling[run.run_id] = self.clock() + self.cancel_delay_ms / 1000
            self._fail_held(run, "run_cancelled", "the run was cancelled")
            if "cancel_immediately_terminal" in self.violations:
                run.state = "cancelled"
        return 202, self.run_view(run)

    def fail_run(self, *, run_id: str, reason: str) -> None:
        """Move a run to ``failed`` (control plane: simulates a server-side failure)."""
        run = self.runs[run_id]
        if run.state not in TERMINAL:
            self._fail_held(run, "run_not_active", reason)
            run.state = "failed"
            self._cancelling.pop(run_id, None)

    def _fail_held(self, run: Run, error_type: str, message: str) -> None:
        held, run.held = run.held, {}
        for entry in held.values():
            if not entry.future.done():
                entry.future.set_exception(Conflict(message, type=error_type))

    # -- ordered primitives (ORD-1..5) ----------------------------------------------------
    async def submit(self, *, key: str, run_id: str, primitive: str, body: Any,
                     digest: bytes) -> Outcome:
        """Execute ``body`` at its turn in the run's sequence, holding it until then."""
        run = self.owned_run(key, run_id)
        seq: int = body.seq
        recorded = run.ops.get(seq)
        if recorded is not None:  # ORD-3, answered on terminal runs too
            if recorded.digest != digest or recorded.primitive != primitive:
                raise Conflict(f"seq {seq} was already used with a different body",
                               type="seq_conflict", details={"seq": seq})
            if "replay_reexecutes" in self.violations:
                _violations.reexecute(self, run, primitive, body)
            return Outcome(recorded.status, recorded.payload, replayed=True)
        if run.state != "active":  # LIFE-8 (run_cancelled is for requests already held)
            raise Conflict(f"run is {run.state}", type="run_not_active")
        thunk = PREPARERS[primitive](self, run, body)  # 422s: refused before its turn
        if seq == run.next_seq or "no_ordering_holds" in self.violations:
            return self._outcome(self._execute_from(run, seq, primitive, digest, thunk))
        held = run.held.get(seq)
        if held is not None:
            if held.digest != digest or held.primitive != primitive:
                raise Conflict(f"seq {seq} is already waiting with a different body",
                               type="seq_conflict", details={"seq": seq})
            return self._outcome(await asyncio.shield(held.future), replayed=True)
        future: asyncio.Future[Operation] = asyncio.get_running_loop().create_future()
        run.held[seq] = Held(primitive, digest, thunk, future)
        try:
            operation = await asyncio.wait_for(asyncio.shield(future),
                                               self.limits.order_wait_ms / 1000)
        except TimeoutError:
            if run.held.get(seq) is not None and run.held[seq].future is future:
                del run.held[seq]
            error = Conflict(f"seq {seq} is not its turn: the run expects seq {run.next_seq}",
                             type="seq_gap", details={"expected_seq": run.next_seq})
            if not future.done():
                future.set_exception(error)
                future.exception()  # mark retrieved: other waiters, if any, re-raise it
            raise error from None
        return self._outcome(operation)

    @staticmethod
    def _outcome(operation: Operation, replayed: bool = False) -> Outcome:
        return Outcome(operation.status, operation.payload, replayed)

    def _execute_from(self, run: Run, seq: int, primitive: str, digest: bytes,
                      thunk: Thunk) -> Operation:
        """Run ``seq``, then every held request that has become next in line (ORD-2)."""
        first = self._execute(run, seq, primitive, digest, thunk)
        while run.state == "active" and (held := run.held.pop(run.next_seq, None)) is not None:
            operation = self._execute(run, run.next_seq, held.primitive, held.digest, held.thunk)
            if not held.future.done():
                held.future.set_result(operation)
        return first

    def _execute(self, run: Run, seq: int, primitive: str, digest: bytes,
                 thunk: Thunk) -> Operation:
        if self.violations:
            _violations.before_execute(self, run, primitive)
        try:
            result = thunk()
            if self.violations:
                result = _violations.tamper_result(self, run, primitive, result)
            status, payload = 200, orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        except WhitneyError as exc:  # a state failure at its turn: recorded (ORD-4)
            if "failed_op_clears_gradients" in self.violations:
                run.grads = None
            status, payload = exc.status, orjson.dumps(exc.envelope())
        except Exception:  # a mock bug: answer 500 but keep the sequence moving
            logger.exception("primitive %s seq %d of run %s crashed", primitive, seq, run.run_id)
            status, payload = 500, orjson.dumps(WhitneyError("the mock hit an internal error "
                                                             "executing this primitive").envelope())
        # orjson hands back its whole write buffer; copy to keep each record at its size.
        operation = Operation(seq, primitive, digest, status, bytes(memoryview(payload)))
        run.ops[seq] = operation
        run.next_seq = seq + 1
        return operation

    def operation(self, *, key: str, run_id: str, seq: int) -> bytes:
        """ORD-5: the record of ``seq`` as JSON bytes."""
        run = self.owned_run(key, run_id)
        op = run.ops.get(seq)
        if op is None or (not op.ok and "failed_ops_unlogged" in self.violations):
            raise NotFound(f"seq {seq} has not been recorded on run {run_id}",
                           type="operation_not_found",
                           details={"seq": seq if seq <= schemas.INT64_MAX else str(seq)})
        if op.ok:
            view = {"seq": seq, "primitive": op.primitive, "status": "completed",
                    "result": orjson.Fragment(op.payload)}
        else:
            view = {"seq": seq, "primitive": op.primitive, "status": "failed",
                    "error": orjson.loads(op.payload)["error"]}
        return orjson.dumps(view)

    def export_file(self, *, key: str, run_id: str, export_id: str, name: str) -> bytes:
        run = self.owned_run(key, run_id)
        export = run.exports.get(export_id)
        if export is None or name not in export.files:
            raise NotFound(f"export file {export_id}/{name} not found", type="export_not_found")
        return export.files[name]

    def trace(self, run_id: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """Executed primitives per run, in seq order (control plane, for assertions)."""
        runs = [self.runs[run_id]] if run_id else list(self.runs.values())
        return {run.run_id: [{"seq": op.seq, "primitive": op.primitive,
                              "status": "completed" if op.ok else "failed"}
                             for op in run.ops.values()] for run in runs}

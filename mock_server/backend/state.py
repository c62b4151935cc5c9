"""The mock's state machine: keys, sessions, runs, versions, checkpoints, exports, time.

No HTTP here (moto's ``models.py``): methods take keyword arguments and validated bodies,
return plain dicts or JSON bytes, and raise ``WhitneyError`` subclasses. Ordered primitives are
:mod:`.ordering`'s half of the object. Everything runs on one event loop, so no locks are needed.

The small underscored methods marked as seams state one contract rule each; they are trivial
here so a test double can break or vary exactly one rule by overriding exactly one method.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import orjson

from ..engine.losses import LOSS_SPECS
from ..engine.model import model_for_spec
from ..engine.optim import AdamWState
from ..engine.specs import ModelSpec, declare_base_models
from . import schemas
from .config import CONTRACT_VERSION, DEFAULT_API_KEY, Features, Limits
from .errors import Conflict, NotFound, Unauthorized, ValidationFailed, WhitneyError
from .ordering import Ordering
from .primitives import PRIMITIVES
from .records import TERMINAL, Checkpoint, Creation, Outcome, Run, Session, iso

__all__ = ["Backend", "LIST_LIMIT_DEFAULT", "LIST_LIMIT_MAX", "SESSION_STATES"]

#: LIFE-10: page size of ``GET /sessions`` when ``limit`` is not given, and its largest value.
LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX = 50, 200
#: The states a session can be listed by (LIFE-10 ``state=``).
SESSION_STATES = ("open", "closed", "expired")


class Backend(Ordering):
    """All state of one mock server.

    The constructor stores the configuration and calls :meth:`reset`, which builds every piece
    of state; a reset therefore leaves the backend exactly as construction did.
    """

    def __init__(self, *, api_keys: tuple[str, ...] | list[str] = (DEFAULT_API_KEY,),
                 seed: int = 0, limits: Limits | None = None, features: Features | None = None,
                 cancel_delay_ms: int = 50, clock: Callable[[], float] = time.time,
                 closed_retention: int = 256,
                 base_models: Iterable[ModelSpec] | None = None) -> None:
        if not api_keys:
            raise ValueError("the mock needs at least one API key")
        self.api_keys = tuple(api_keys)
        #: The base models this mock serves, by id, in declaration order (DISC-1, LIFE-5);
        #: the built-in byte model when none is declared. Configuration: kept by reset().
        self.base_models: dict[str, ModelSpec] = {
            spec.id: spec for spec in declare_base_models(base_models)}
        self.seed = seed
        self.limits = limits or Limits()
        self.features = features or Features()
        self.cancel_delay_ms = cancel_delay_ms
        self.clock = clock
        self.closed_retention = closed_retention
        self.runs: dict[str, Run] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every session, run, checkpoint and export; reseed the id and sampling RNG.
        Requests still held for ordering fail with 409 ``run_cancelled``."""
        for run in self.runs.values():
            self._fail_held(run, "run_cancelled", "the mock was reset")
        self.rng = np.random.default_rng(self.seed)
        self.sessions: dict[str, Session] = {}
        self.runs = {}
        self.checkpoints: dict[str, tuple[str, Checkpoint]] = {}  # id -> (session_id, ckpt)
        self._closed: deque[str] = deque()
        self._timed: dict[str, float] = {}  # open sessions with a TTL -> expires_at
        self._cancelling: dict[str, float] = {}  # cancelling runs -> when they read cancelled
        self._counter = 0
        self._ordinal = 0  # sessions created so far (Session.ordinal, LIFE-10's cursor)
        # LIFE-9: creations by (API key, Idempotency-Key), kept as long as their session
        self._creations: dict[tuple[str, str], Creation] = {}
        # Ids of forgotten sessions and runs -> (owner key, session id), so their owner is told
        # why they are gone; bounded (oldest first out), so memory stays flat.
        self._evicted: OrderedDict[str, tuple[str, str]] = OrderedDict()

    # -- helpers used by primitives -------------------------------------------------------
    def now_iso(self) -> str:
        """The backend clock's now, as a contract timestamp."""
        return iso(self.clock())  # type: ignore[return-value]

    def new_id(self, prefix: str) -> str:
        """A fresh id (``sess_``, ``run_``, ``ckpt_``, ``exp_`` ...), reproducible per seed."""
        self._counter += 1
        return f"{prefix}_{self._counter:06d}{self.rng.bytes(6).hex()}"

    def fresh_seed(self) -> int:
        """A seed drawn from the backend's RNG, for adapters and samples given none."""
        return int(self.rng.integers(0, 2**63 - 1))

    def add_checkpoint(self, run: Run, checkpoint: Checkpoint) -> None:
        """Keep ``checkpoint`` as long as ``run``'s session is remembered."""
        self.checkpoints[checkpoint.checkpoint_id] = (run.session_id, checkpoint)

    def find_checkpoint(self, key: str, checkpoint_id: str) -> Checkpoint | None:
        """The checkpoint ``checkpoint_id`` if ``key`` owns it (SEC-2: else as unknown)."""
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
        if found is None and token.strip():
            found = self._unknown_key(token.strip())
        if scheme.lower() != "bearer" or found is None:
            raise Unauthorized("missing or unknown API key (Authorization: Bearer <key>)")
        return found

    def capabilities(self) -> dict[str, Any]:
        """DISC-1."""
        return {
            "contract_version": CONTRACT_VERSION,
            "primitives": list(PRIMITIVES),
            "optimizers": ["adamw"],
            "loss_functions": LOSS_SPECS,
            "base_models": [spec.capabilities_entry() for spec in self.base_models.values()],
            "limits": self.limits.as_dict(),
            "features": self.features.as_dict(),
        }

    # -- time: expiry, cancellation, retention (evaluated lazily, on every request) ---------
    def tick(self) -> None:
        """Apply what time has done: TTL expiry (LIFE-4) and ends of ``cancelling`` (LIFE-7)."""
        now = self.clock()
        for session_id in [sid for sid, expires in self._timed.items() if now >= expires]:
            del self._timed[session_id]
            session = self.sessions[session_id]
            session.state = "expired"
            for run_id in session.run_ids:
                self._expire_run(self.runs[run_id])
            self._retire(session)
        for run_id in [rid for rid, at in self._cancelling.items() if now >= at]:
            self._settle(self.runs[run_id], now)

    def _settle(self, run: Run, now: float | None = None) -> None:
        if run.state == "cancelling" and (now or self.clock()) >= (run.cancel_at or 0):
            run.state = "cancelled"
            self._cancelling.pop(run.run_id, None)

    def _retire(self, session: Session) -> None:
        """Free a closed session's weights now; forget it entirely after ``closed_retention``.

        What stays readable until then: the views, the operation records (ORD-3 replays), the
        remembered creations (LIFE-9), the checkpoints (CKPT-1: other runs of the key may
        load them) and the exports (EXPORT-2: downloadable after close)."""
        for run_id in session.run_ids:
            run = self.runs[run_id]
            run.grads = None
            run.versions.clear()
            self._free_exports(run)
            run.optimizer = AdamWState.zeros_like({})
        self._closed.append(session.session_id)
        while len(self._closed) > self.closed_retention:
            self._forget(self.sessions.pop(self._closed.popleft()))

    def _forget(self, old: Session) -> None:
        """A session leaves the closed-session window: it, its runs, checkpoints, exports and
        remembered creations are forgotten (404); their ids are kept a while (``_evicted``)
        so the owner learns why."""
        for run_id in old.run_ids:
            self.runs.pop(run_id, None)
            self._cancelling.pop(run_id, None)
            self._evicted[run_id] = (old.key, old.session_id)
        self._evicted[old.session_id] = (old.key, old.session_id)
        while len(self._evicted) > 4 * self.closed_retention + 4:
            self._evicted.popitem(last=False)
        for checkpoint_id in [c for c, (sid, _) in self.checkpoints.items()
                              if sid == old.session_id]:
            del self.checkpoints[checkpoint_id]
        for slot in old.creation_keys:
            self._creations.pop(slot, None)

    def _evicted_message(self, key: str, what: str, resource_id: str) -> str | None:
        """Why ``resource_id`` is gone, for its owner only (SEC-2: anyone else learns nothing)."""
        gone = self._evicted.get(resource_id)
        if gone is None or gone[0] != key:
            return None
        return (f"{what} {resource_id!r} is gone: its session {gone[1]!r} was closed (or "
                f"expired) and then evicted, after {self.closed_retention} newer sessions "
                f"closed")

    # -- sessions -------------------------------------------------------------------------
    def _session(self, key: str, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None or session.key != key:
            gone = None if session is not None else self._evicted_message(key, "session",
                                                                          session_id)
            if gone is not None:
                raise NotFound(gone)
            raise self._hidden(f"session {session_id!r}", foreign=session is not None)
        return session

    def session_view(self, session: Session) -> dict[str, Any]:
        """LIFE-1: the Session object, metadata as created; with ``session_listing`` (LIFE-10)
        also its runs, in creation order, each with its (settled) state."""
        view: dict[str, Any] = {
            "session_id": session.session_id, "state": session.state,
            "created_at": iso(session.created_at), "expires_at": iso(session.expires_at),
            "metadata": session.metadata}
        if self.features.session_listing:
            runs = [self.runs[run_id] for run_id in session.run_ids]
            for run in runs:
                self._settle(run)
            view["runs"] = [{"run_id": run.run_id, "state": run.state} for run in runs]
        return view

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
        self._ordinal += 1
        session = Session(self.new_id("sess"), key, now, ttl, None if ttl is None else now + ttl,
                          dict(body.metadata or {}), ordinal=self._ordinal)
        self.sessions[session.session_id] = session
        if session.expires_at is not None:
            self._timed[session.session_id] = session.expires_at
        return self.session_view(session)

    def get_session(self, *, key: str, session_id: str) -> dict[str, Any]:
        """LIFE-1: the session's view."""
        return self.session_view(self._session(key, session_id))

    def heartbeat(self, *, key: str, session_id: str) -> dict[str, Any]:
        """LIFE-2: move ``expires_at`` to now + ttl."""
        session = self._session(key, session_id)
        if session.state != "open":
            raise Conflict(f"session is {session.state}", type="session_not_open")
        if session.ttl_seconds is not None:
            self._extend(session, session.ttl_seconds)
        return self.session_view(session)

    def close_session(self, *, key: str, session_id: str) -> dict[str, Any]:
        """LIFE-3: refused while any run is not terminal; idempotent once closed."""
        session = self._session(key, session_id)
        if session.state != "open":
            return self.session_view(session)
        busy = self._busy_runs(session)
        if busy:
            raise Conflict("the session has runs that are not terminal; finish or cancel them "
                           "and poll until terminal", type="runs_not_terminal",
                           details={"run_ids": busy})
        session.state = "closed"
        self._timed.pop(session_id, None)
        view = self.session_view(session)
        self._retire(session)
        return view

    # -- LIFE-9: idempotent creation ------------------------------------------------------
    def create_once(self, *, key: str, idempotency_key: str | None, scope: str, digest: bytes,
                    create: Callable[[], dict[str, Any]]) -> tuple[bytes, bool]:
        """LIFE-9 (optional: idempotent_create): ``create()`` once per ``Idempotency-Key``.

        Returns the 201 body and whether it is a replay. Without a key (or the feature) this
        is ``create()``. The same key (of the same API key, SEC-2) with the same ``scope``
        (the creation path) and a JSON-equal body (``digest``) answers the body it was first
        answered, creating nothing; with another scope or body: 409 ``idempotency_conflict``.
        Only a creation that succeeded is remembered (a refused one created nothing, so the
        key may be sent again), for as long as its session is (``closed_retention``).
        Everything here is synchronous on the event loop, so a concurrent duplicate cannot
        slip between the lookup and the creation.
        """
        if idempotency_key is None or not self.features.idempotent_create:
            return orjson.dumps(create()), False
        slot = self._creation_slot(key, idempotency_key)
        if slot is None:
            return orjson.dumps(create()), False
        found = self._creations.get(slot)
        if found is not None:
            if found.scope != scope or found.digest != digest:
                used = "another body" if found.scope == scope else f"{found.scope}"
                raise Conflict(f"Idempotency-Key {idempotency_key!r} was already used with "
                               f"{used}; send a new key for a new resource",
                               type="idempotency_conflict",
                               details={"idempotency_key": idempotency_key})
            return found.payload, True
        view = create()
        payload = orjson.dumps(view)
        session = self.sessions[view["session_id"]]
        self._creations[slot] = Creation(scope, digest, payload, session.session_id)
        session.creation_keys.append(slot)
        return payload, False

    # -- LIFE-10: listing -----------------------------------------------------------------
    def list_sessions(self, *, key: str, state: str | None = None,
                      metadata_key: str | None = None, metadata_value: str | None = None,
                      limit: int = LIST_LIMIT_DEFAULT, cursor: str | None = None
                      ) -> dict[str, Any]:
        """LIFE-10 (optional: session_listing): ``key``'s sessions, newest first.

        Filters: ``state`` and one metadata pair (``metadata_key`` and ``metadata_value``
        together). ``limit`` sessions per page; ``next_cursor`` (null on the last page) is an
        opaque token for the next one, bound to the same filters, and stable while sessions are
        created (they are newer than the cursor) or forgotten.
        """
        if state is not None and state not in SESSION_STATES:
            raise ValidationFailed(f"state must be one of {', '.join(SESSION_STATES)}, got "
                                   f"{state!r}", details={"loc": "query.state"})
        if (metadata_key is None) != (metadata_value is None):
            raise ValidationFailed("metadata_key and metadata_value filter together: give both "
                                   "or neither", details={"loc": "query.metadata_key"})
        if not 1 <= limit <= LIST_LIMIT_MAX:
            raise ValidationFailed(f"limit must lie in [1, {LIST_LIMIT_MAX}], got {limit}",
                                   details={"loc": "query.limit"})
        filters = orjson.dumps([state, metadata_key, metadata_value])
        fingerprint = hashlib.sha256(filters).hexdigest()[:16]
        before = self._cursor_position(cursor, fingerprint) if cursor is not None else None
        page: list[Session] = []
        for session in reversed(self.sessions.values()):
            if before is not None and session.ordinal >= before:
                continue
            if not self._listed(key, session):
                continue
            if state is not None and session.state != state:
                continue
            if metadata_key is not None and session.metadata.get(metadata_key) != metadata_value:
                continue
            page.append(session)
            if len(page) > limit:
                break
        more = len(page) > limit
        page = page[:limit]
        next_cursor = None
        if more:
            last = self._cursor_after(page[-1])
            next_cursor = base64.urlsafe_b64encode(
                f"v1:{last}:{fingerprint}".encode()).decode().rstrip("=")
        return {"sessions": [self.session_view(s) for s in page], "next_cursor": next_cursor}

    @staticmethod
    def _cursor_position(cursor: str, fingerprint: str) -> int:
        """The ordinal a LIFE-10 cursor continues below; 422 for anything not issued here or
        issued for other filters."""
        try:
            text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            version, position, bound = text.split(":")
            ordinal = int(position)
        except (ValueError, UnicodeDecodeError):
            raise ValidationFailed("cursor is not one this server issued (pass next_cursor "
                                   "back unchanged)", details={"loc": "query.cursor"}) from None
        if version != "v1" or ordinal < 0:
            raise ValidationFailed("cursor is not one this server issued (pass next_cursor "
                                   "back unchanged)", details={"loc": "query.cursor"})
        if bound != fingerprint:
            raise ValidationFailed("cursor was issued for other filters: keep state, "
                                   "metadata_key and metadata_value as on the first page",
                                   details={"loc": "query.cursor"})
        return ordinal

    # -- runs -----------------------------------------------------------------------------
    def owned_run(self, key: str, run_id: str) -> Run:
        """The run ``run_id`` if ``key`` owns it, else 404 exactly as for an unknown id (SEC-2)."""
        run = self.runs.get(run_id)
        if run is None or run.key != key:
            gone = None if run is not None else self._evicted_message(key, "run", run_id)
            if gone is not None:
                raise NotFound(gone)
            raise self._hidden(f"run {run_id!r}", foreign=run is not None)
        self._settle(run)
        return run

    def run_view(self, run: Run) -> dict[str, Any]:
        """The Run object of the contract."""
        return {"run_id": run.run_id, "session_id": run.session_id, "state": run.state,
                "next_seq": run.next_seq, "step": run.step,
                "versions": [{"version": v.version, "step": v.step, "created_at": v.created_at}
                             for v in run.versions.values()],
                "created_at": iso(run.created_at)}

    def create_run(self, *, key: str, session_id: str, body: schemas.CreateRun) -> dict[str, Any]:
        """LIFE-5."""
        session = self._session(key, session_id)
        spec = self.base_models.get(body.base_model)
        if spec is None:
            raise ValidationFailed(f"unknown base model {body.base_model!r}; this mock serves "
                                   f"{', '.join(map(repr, self.base_models))}",
                                   type="unknown_base_model",
                                   details={"base_models": list(self.base_models)})
        self._check_rank(body.lora.rank, spec)
        if session.state != "open":
            raise Conflict(f"session is {session.state}", type="session_not_open")
        if len(session.run_ids) >= self.limits.max_runs_per_session:
            raise Conflict("the session already has max_runs_per_session runs",
                           type="quota_exceeded", details={"limit": "max_runs_per_session"})
        base = model_for_spec(spec)
        seed = body.lora.seed if body.lora.seed is not None else self.fresh_seed()
        lora = base.init_lora(body.lora.rank, body.lora.alpha, seed)
        run = Run(self.new_id("run"), session_id, key, body.base_model, base, lora,
                  AdamWState.zeros_like(lora.params), self.clock())
        self.runs[run.run_id] = run
        session.run_ids.append(run.run_id)
        return self.run_view(run)

    def get_run(self, *, key: str, run_id: str) -> dict[str, Any]:
        """The run's view (its state settles first: ``cancelling`` may have become
        ``cancelled``)."""
        return self.run_view(self.owned_run(key, run_id))

    def finish_run(self, *, key: str, run_id: str) -> dict[str, Any]:
        """LIFE-6, LIFE-8: requests held behind a gap fail with ``run_not_active``."""
        run = self.owned_run(key, run_id)
        if run.state in TERMINAL:
            self._finish_terminal(run)
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
            self._begin_cancel(run)
        return 202, self.run_view(run)

    def fail_run(self, *, run_id: str, reason: str) -> None:
        """Move a run to ``failed`` (control plane: simulates a server-side failure)."""
        run = self.runs[run_id]
        if run.state not in TERMINAL:
            self._fail_held(run, "run_not_active", reason)
            run.state = "failed"
            self._cancelling.pop(run_id, None)

    # -- ordered primitives (ORD-1..5, see ordering.py) ----------------------------------
    async def submit(self, *, key: str, run_id: str, primitive: str, body: Any,
                     digest: bytes) -> Outcome:
        """Execute ``body`` at its turn in the run's sequence, holding it until then."""
        run = self.owned_run(key, run_id)
        prepare = PRIMITIVES[primitive].prepare
        try:
            return await self._submit(run, body.seq, primitive, digest,
                                      lambda: prepare(self, run, body))
        except WhitneyError as exc:  # refused, not recorded (recorded failures are returned)
            raise self.with_seq_state(run, exc) from None

    def operation(self, *, key: str, run_id: str, seq: int) -> bytes:
        """ORD-5: the record of ``seq`` as JSON bytes."""
        return self._operation_view(self.owned_run(key, run_id), seq)

    def export_file(self, *, key: str, run_id: str, export_id: str, name: str) -> bytes:
        """EXPORT-1: one file of an export, as written; EXPORT-2 (optional:
        exports_after_close): also after close, until the session is forgotten."""
        gone = self._evicted_message(key, "run", run_id) if run_id not in self.runs else None
        if gone is not None:
            raise NotFound(f"export {export_id!r} cannot be downloaded any more: {gone}",
                           type="export_not_found")
        run = self.owned_run(key, run_id)
        export = run.exports.get(export_id)
        if export is None or name not in export.files:
            session = self.sessions[run.session_id]
            freed = (" (this server frees exports when their session closes: download them "
                     "before close)" if session.state != "open"
                     and not self.features.exports_after_close else "")
            raise NotFound(f"export file {export_id}/{name} not found{freed}",
                           type="export_not_found")
        return export.files[name]

    def trace(self, run_id: str | None = None, *, key: str | None = None
              ) -> dict[str, list[dict[str, Any]]]:
        """Executed primitives per run, in seq order (control plane, for assertions); with
        ``key``, only that key's runs."""
        runs = [self.runs[run_id]] if run_id else [
            run for run in self.runs.values() if key is None or run.key == key]
        return {run.run_id: [{"seq": op.seq, "primitive": op.primitive,
                              "status": "completed" if op.ok else "failed"}
                             for op in run.ops.values()] for run in runs}

    # -- seams: one rule each, trivial in the faithful backend ----------------------------
    def _creation_slot(self, key: str, idempotency_key: str) -> tuple[str, str] | None:
        """LIFE-9 / SEC-2: where a creation is remembered: per API key and Idempotency-Key."""
        return key, idempotency_key

    def _listed(self, key: str, session: Session) -> bool:
        """LIFE-10 / SEC-2: a listing shows the caller's own sessions only."""
        return session.key == key

    def _cursor_after(self, last: Session) -> int:
        """LIFE-10: the next page starts below the last session of this one."""
        return last.ordinal

    def _free_exports(self, run: Run) -> None:
        """EXPORT-2 (optional: exports_after_close): exports survive close (their session's
        retention bounds them); without the feature they are freed with the weights."""
        if not self.features.exports_after_close:
            run.exports.clear()

    def _unknown_key(self, token: str) -> str | None:
        """SEC-1: the key a bearer token that matches no known key stands for: none."""
        return None

    def _hidden(self, what: str, *, foreign: bool) -> WhitneyError:
        """SEC-2: another key's resource answers exactly as an unknown one."""
        return NotFound(f"{what} not found")

    def _extend(self, session: Session, ttl_seconds: int) -> None:
        """LIFE-2: a heartbeat moves ``expires_at`` to now + ttl."""
        session.expires_at = self._timed[session.session_id] = self.clock() + ttl_seconds

    def _busy_runs(self, session: Session) -> list[str]:
        """LIFE-3: the runs that keep ``session`` from closing (those not terminal)."""
        return [rid for rid in session.run_ids if self.runs[rid].state not in TERMINAL]

    def _expire_run(self, run: Run) -> None:
        """LIFE-4: an expiring session cancels its runs that are not terminal."""
        if run.state not in TERMINAL:
            self._fail_held(run, "run_cancelled", "the session expired")
            run.state = "cancelled"
            self._cancelling.pop(run.run_id, None)

    def _check_rank(self, rank: int, spec: ModelSpec) -> None:
        """LIFE-5: ``lora.rank`` above the model's ``max_lora_rank`` is 422."""
        if rank > spec.max_lora_rank:
            raise ValidationFailed(f"lora.rank {rank} exceeds max_lora_rank "
                                   f"{spec.max_lora_rank}", details={"loc": "lora.rank"})

    def _begin_cancel(self, run: Run) -> None:
        """LIFE-7: an active run turns ``cancelling``; its held requests fail at once."""
        run.state = "cancelling"
        run.cancel_at = self._cancelling[run.run_id] = self.clock() + self.cancel_delay_ms / 1000
        self._fail_held(run, "run_cancelled", "the run was cancelled")

    def _finish_terminal(self, run: Run) -> None:
        """LIFE-8: finishing a terminal run changes nothing."""

"""ORD-1..5: the per-run sequence of primitives. Submission, holds, replays, execution at a
request's turn, and the operation log.

``Ordering`` is the half of :class:`~mock_server.backend.state.Backend` that owns this; it
needs only ``limits`` from the rest. Everything runs on the app's event loop, so no locks are
needed; a request held for ordering awaits an asyncio future and costs no CPU while it waits.

Its seams (``_is_turn``, ``_on_replay``, ``_before_execute``, ``_result``, ``_on_failure``,
``_recorded``) are trivial here: they exist so that a test double can change one rule by
overriding one method (see ``mock_server.testing``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from .config import Features, Limits
from .errors import Conflict, NotFound, WhitneyError
from .records import Held, HoldEnded, Operation, Outcome, Run, Thunk
from .schemas import INT64_MAX

__all__ = ["Ordering"]

logger = logging.getLogger("mock_server")


class Ordering:
    """Ordered execution of one run's primitives; a base of ``Backend``."""

    limits: Limits
    features: Features

    async def _submit(self, run: Run, seq: int, primitive: str, digest: bytes,
                      prepare: Callable[[], Thunk]) -> Outcome:
        """Execute at ``seq``'s turn, holding the request until then (ORD-2).

        A recorded ``seq`` is replayed (ORD-3, also on terminal runs); otherwise ``prepare``
        validates the body (422s are refused before the turn, ORD-4) and returns the thunk.
        """
        recorded = run.ops.get(seq)
        if recorded is not None:
            if recorded.digest != digest or recorded.primitive != primitive:
                raise Conflict(f"seq {seq} was already used with a different body",
                               type="seq_conflict", details={"seq": seq})
            self._on_replay(run, prepare)
            run.note_replay(recorded)
            return Outcome(recorded.status, recorded.payload, replayed=True)
        if run.state != "active":  # LIFE-8 (run_cancelled is for requests already held)
            raise Conflict(f"run is {run.state}", type="run_not_active")
        thunk = prepare()
        if self._is_turn(run, seq):
            return self._outcome(self._execute_from(run, seq, primitive, digest, thunk))
        held = run.held.get(seq)
        if held is not None:
            if held.digest != digest or held.primitive != primitive:
                raise Conflict(f"seq {seq} is already waiting with a different body",
                               type="seq_conflict", details={"seq": seq})
            duplicate = await asyncio.shield(held.future)
            run.note_replay(duplicate)
            return self._outcome(duplicate, replayed=True)
        future: asyncio.Future[Operation] = asyncio.get_running_loop().create_future()
        run.held[seq] = entry = Held(primitive, digest, thunk, future)
        try:
            operation = await asyncio.wait_for(asyncio.shield(future),
                                               self.limits.order_wait_ms / 1000)
        except TimeoutError:
            if run.held.get(seq) is not None and run.held[seq].future is future:
                del run.held[seq]
                run.events.append(HoldEnded(seq, primitive, "seq_gap",
                                            (time.monotonic() - entry.since) * 1000))
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
            waited_ms = (time.monotonic() - held.since) * 1000
            operation = self._execute(run, run.next_seq, held.primitive, held.digest, held.thunk)
            operation.held_ms = waited_ms
            if not held.future.done():
                held.future.set_result(operation)
        return first

    def _execute(self, run: Run, seq: int, primitive: str, digest: bytes,
                 thunk: Thunk) -> Operation:
        """Execute one primitive and record its outcome, success or failure (ORD-4)."""
        started = time.perf_counter()
        self._before_execute(run, primitive)
        try:
            result = self._result(run, primitive, thunk())
            status, payload = 200, orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        except WhitneyError as exc:  # a state failure at its turn: recorded (ORD-4)
            self._on_failure(run, exc)
            exc.details.update(self._seq_state(run, consumed=True, next_seq=seq + 1))  # ORD-6
            status, payload = exc.status, orjson.dumps(exc.envelope())
        except Exception:  # a mock bug: answer 500 but keep the sequence moving
            logger.exception("primitive %s seq %d of run %s crashed", primitive, seq, run.run_id)
            crash = WhitneyError("the mock hit an internal error executing this primitive",
                                 details=self._seq_state(run, consumed=True, next_seq=seq + 1))
            status, payload = 500, orjson.dumps(crash.envelope())
        # orjson hands back its whole write buffer; copy to keep each record at its size.
        operation = Operation(seq, primitive, digest, status, bytes(memoryview(payload)),
                              (time.perf_counter() - started) * 1000)
        run.ops[seq] = operation
        run.next_seq = seq + 1
        return operation

    def _operation_view(self, run: Run, seq: int) -> bytes:
        """ORD-5: the record of ``seq`` as JSON bytes."""
        op = self._recorded(run, seq)
        if op is None:
            raise NotFound(f"seq {seq} has not been recorded on run {run.run_id}",
                           type="operation_not_found",
                           details={"seq": seq if seq <= INT64_MAX else str(seq)})
        view: dict[str, Any]
        if op.ok:
            view = {"seq": seq, "primitive": op.primitive, "status": "completed",
                    "result": orjson.Fragment(op.payload)}
        else:
            view = {"seq": seq, "primitive": op.primitive, "status": "failed",
                    "error": orjson.loads(op.payload)["error"]}
        return orjson.dumps(view)

    def _fail_held(self, run: Run, error_type: str, message: str) -> None:
        """Answer every request held on ``run`` with 409 ``error_type`` (LIFE-6, LIFE-7)."""
        held, run.held = run.held, {}
        now = time.monotonic()
        for seq, entry in held.items():
            run.events.append(HoldEnded(seq, entry.primitive, error_type,
                                        (now - entry.since) * 1000))
            if not entry.future.done():
                entry.future.set_exception(Conflict(message, type=error_type))

    def with_seq_state(self, run: Run, error: WhitneyError) -> WhitneyError:
        """ORD-6: ``error``, refused before its turn (nothing recorded), with where the run's
        sequence stands: ``details.next_seq`` and ``details.seq_consumed`` false. Keys already
        there (``seq_gap``'s ``expected_seq``) are kept."""
        for name, value in self._seq_state(run, consumed=False).items():
            error.details.setdefault(name, value)
        return error

    # -- seams: one rule each, trivial in the faithful backend ----------------------------
    def _seq_state(self, run: Run, *, consumed: bool, next_seq: int | None = None
                   ) -> dict[str, Any]:
        """ORD-6 (optional: seq_error_details): what every primitive error says about the
        sequence: the seq to send next, and whether this request's seq was recorded."""
        if not self.features.seq_error_details:
            return {}
        return {"next_seq": run.next_seq if next_seq is None else next_seq,
                "seq_consumed": consumed}

    def _is_turn(self, run: Run, seq: int) -> bool:
        """ORD-2: a request executes when its seq is the run's ``next_seq``."""
        return seq == run.next_seq

    def _on_replay(self, run: Run, prepare: Callable[[], Thunk]) -> None:
        """ORD-3: a replay answers the record and applies nothing again."""

    def _before_execute(self, run: Run, primitive: str) -> None:
        """Called at a primitive's turn, just before it executes."""

    def _result(self, run: Run, primitive: str, result: dict[str, Any]) -> dict[str, Any]:
        """A primitive's successful result, as recorded and answered."""
        return result

    def _on_failure(self, run: Run, error: WhitneyError) -> None:
        """ERR-3: a primitive failing at its turn has changed no training state."""

    def _recorded(self, run: Run, seq: int) -> Operation | None:
        """ORD-4/ORD-5: the operation recorded at ``seq``, failed ones included."""
        return run.ops.get(seq)

"""Everything the backend stores: sessions, runs, the record of their operations, sampler
versions, checkpoints and exports.

Plain dataclasses, no behaviour beyond GRAD-1's gradient accumulation and counting a replay
(ORD-3); the ``Backend`` (:mod:`.state`) and the ordering (:mod:`.ordering`) own every
transition.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

# The engine calls its base model class ``BaseModel``; here that name would read as pydantic's.
from ..engine.model import BaseModel as BaseLM
from ..engine.optim import AdamWState
from ..engine.specs import Lora

__all__ = ["EVENTS_KEPT", "TERMINAL", "Checkpoint", "Creation", "Export", "Held", "HoldEnded",
           "Operation", "Outcome", "Run", "Session", "Thunk", "Version", "iso", "next_rev"]

#: Run states a run never leaves (LIFE-8).
TERMINAL = frozenset({"finished", "cancelled", "failed"})

#: A primitive ready to execute at its turn: returns the result, or raises a WhitneyError.
Thunk = Callable[[], dict[str, Any]]

#: Revision numbers, one process-wide counter: every record that is created or changes takes
#: the next one, so a reader (the dashboard) asks only for what changed since the last it saw.
next_rev: Callable[[], int] = itertools.count(1).__next__

#: How many ended holds (see ``HoldEnded``) a run keeps for the dashboard: the oldest go first.
EVENTS_KEPT = 64


@dataclass
class Operation:
    """A recorded primitive (ORD-4): its outcome is kept as JSON bytes for replays (ORD-3)."""

    seq: int
    primitive: str
    digest: bytes
    status: int
    payload: bytes  # the response body: the result, or the ERR-1 envelope
    # Bookkeeping for the dashboard (cheap: no effect on what the contract answers).
    duration_ms: float = 0.0  # time spent executing at its turn
    held_ms: float | None = None  # time held for its turn before executing (None: never held)
    replays: int = 0  # answers of this record since (ORD-3 replays, held duplicates)
    rev: int = field(default_factory=next_rev)
    summary: dict[str, Any] | None = None  # parsed by the dashboard when first shown

    @property
    def ok(self) -> bool:
        return self.status < 400


@dataclass
class Outcome:
    """What a submitted primitive answers: status, JSON body, and whether it was a replay."""

    status: int
    payload: bytes
    replayed: bool = False


@dataclass
class Held:
    """A request waiting for its seq's turn (ORD-2)."""

    primitive: str
    digest: bytes
    thunk: Thunk
    future: asyncio.Future[Operation]
    since: float = field(default_factory=time.monotonic)


@dataclass
class HoldEnded:
    """A held request that never executed: it waited ``held_ms`` and was answered 409
    ``outcome`` (``seq_gap``, ``run_cancelled``, ``run_not_active``). Not an operation (it
    consumed no seq); kept for the dashboard, ``EVENTS_KEPT`` per run."""

    seq: int
    primitive: str
    outcome: str
    held_ms: float
    rev: int = field(default_factory=next_rev)


@dataclass
class Version:
    """An immutable sampler snapshot (VER-2): LoRA parameters only, never base weights."""

    version: int
    step: int
    lora: Lora
    created_at: str


@dataclass
class Checkpoint:
    """A saved training state (CKPT-1): weights, step and AdamW moments."""

    checkpoint_id: str
    name: str
    run_id: str
    base_model: str
    step: int
    lora: Lora
    optimizer: AdamWState
    created_at: str


@dataclass
class Export:
    """The files of one ``export_lora`` (EXPORT-1), by name."""

    export_id: str
    files: dict[str, bytes] = field(default_factory=dict)


@dataclass
class Creation:
    """A creation remembered under its ``Idempotency-Key`` (LIFE-9): the request's scope
    (``POST /sessions`` or ``POST /sessions/{sid}/runs``) and body digest, and the 201 body it
    was answered, replayed byte for byte. Kept as long as ``session_id`` (the created session,
    or the session the run was created in) is remembered."""

    scope: str
    digest: bytes
    payload: bytes
    session_id: str


@dataclass
class Session:
    session_id: str
    key: str
    created_at: float
    ttl_seconds: int | None
    expires_at: float | None
    metadata: dict[str, str]
    state: str = "open"
    run_ids: list[str] = field(default_factory=list)
    ordinal: int = 0  # creation order, for LIFE-10's newest-first listing and its cursor
    # (API key, Idempotency-Key) of the creations remembered with this session (LIFE-9)
    creation_keys: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Run:
    run_id: str
    session_id: str
    key: str
    base_model: str
    base: BaseLM
    lora: Lora
    optimizer: AdamWState
    created_at: float
    step: int = 0
    grads: dict[str, np.ndarray] | None = None
    versions: dict[int, Version] = field(default_factory=dict)
    exports: dict[str, Export] = field(default_factory=dict)
    state: str = "active"
    next_seq: int = 1
    ops: dict[int, Operation] = field(default_factory=dict)
    held: dict[int, Held] = field(default_factory=dict)
    cancel_at: float | None = None
    events: deque[HoldEnded] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    replayed: deque[Operation] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))

    def note_replay(self, operation: Operation) -> None:
        """ORD-3: ``operation`` answered again; counted, and remembered for the dashboard."""
        operation.replays += 1
        operation.rev = next_rev()
        self.replayed.append(operation)

    def accumulate(self, grads: dict[str, np.ndarray]) -> None:
        """GRAD-1: forward_backward adds to the buffer; optim_step empties it."""
        if self.grads is None:
            self.grads = {name: g.copy() for name, g in grads.items()}
        else:
            for name, g in grads.items():
                self.grads[name] += g


def iso(t: float | None) -> str | None:
    """A ``time.time()`` value as the contract's UTC timestamp (``...Z``)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")

"""What the state machine keeps: sessions, runs and the records of their operations.

Plain dataclasses, no behaviour beyond GRAD-1's gradient accumulation; ``state.Backend``
owns every transition.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from ..engine import model as nm
from .primitives import Export, Thunk, Version

TERMINAL = frozenset({"finished", "cancelled", "failed"})
CONTRACT_VERSION = "1.0"


@dataclass
class Operation:
    """A recorded primitive (ORD-4): its outcome is kept as JSON bytes for replays (ORD-3)."""

    seq: int
    primitive: str
    digest: bytes
    status: int
    payload: bytes  # the response body: the result, or the ERR-1 envelope

    @property
    def ok(self) -> bool:
        return self.status < 400


@dataclass
class Outcome:
    status: int
    payload: bytes
    replayed: bool = False


@dataclass
class Held:
    primitive: str
    digest: bytes
    thunk: Thunk
    future: asyncio.Future[Operation]


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


@dataclass
class Run:
    run_id: str
    session_id: str
    key: str
    base_model: str
    base: nm.BaseModel
    lora: nm.Lora
    optimizer: nm.AdamWState
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

    def accumulate(self, grads: dict[str, np.ndarray]) -> None:
        """GRAD-1: forward_backward adds to the buffer; optim_step empties it."""
        if self.grads is None:
            self.grads = {name: g.copy() for name, g in grads.items()}
        else:
            for name, g in grads.items():
                self.grads[name] += g


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")

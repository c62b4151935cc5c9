"""The plain-dict model of the contract behind ``tests/backend/test_stateful_api.py``, and its
bodies.

``Model`` holds what the contract (and the mock's documented choices: a retired session's runs
list no versions, a session closed ``retention`` retirements ago is forgotten) says the server
must hold; ``expect_submission`` is the outcome one primitive request must get (ORD-1..4,
LIFE-8, ERR-4). ``body_st`` draws valid request bodies from small value sets (so a regenerated
body is sometimes JSON-equal to a recorded one, ORD-3) and ``spoil`` turns one into a refused
one. Not a test module: ``from stateful_contract_model import ...``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from conftest import ADAMW, BOS, EOS
from hypothesis import event
from hypothesis import strategies as st

TERMINAL = {"finished", "cancelled", "failed"}
PRIMITIVES = ["forward", "forward_backward", "optim_step", "save_weights_for_sampler", "sample",
              "logprobs", "save_state", "load_state", "export_lora"]
WITH_TOKENS = {"forward", "forward_backward", "sample", "logprobs"}


def digest(arrays: dict[str, np.ndarray] | None) -> str | None:
    if arrays is None:
        return None
    h = hashlib.sha256()
    for name in sorted(arrays):
        h.update(name.encode())
        h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def _by_value(value: Any) -> Any:
    """Numbers by value (contract 1.1): an integral float is its integer; -0.0 is 0."""
    if isinstance(value, dict):
        return {k: _by_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_by_value(v) for v in value]
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def canon(primitive: str, body: dict[str, Any]) -> str:
    """ORD-3's JSON equality (contract 1.1): key order and whitespace ignored, numbers by value
    (1 and 1.0 are equal), null distinct from an absent key."""
    return primitive + json.dumps(_by_value(body), sort_keys=True, separators=(",", ":"))


# -- request bodies --------------------------------------------------------------------------
TOKENS = st.sampled_from([BOS, EOS, 32, 97, 101, 104, 116])
LOSSES = ["cross_entropy", "importance_sampling", "ppo", "cispo", "dro"]
CONFIGS = {"ppo": {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3},
           "cispo": {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}, "dro": {"beta": 0.1}}


@st.composite
def datum_st(draw: Any, loss: str) -> dict[str, Any]:
    n = draw(st.integers(1, 3))

    def values(options: list[float]) -> st.SearchStrategy[list[float]]:
        return st.lists(st.sampled_from(options), min_size=n, max_size=n)

    inputs: dict[str, Any] = {"target_tokens": draw(st.lists(TOKENS, min_size=n, max_size=n))}
    if loss == "cross_entropy":
        if draw(st.booleans()):
            inputs["weights"] = draw(values([0.0, 0.5, 1.0, 2.0]))
    else:
        inputs["logprobs"] = draw(values([-3.0, -1.5, -0.25]))
        inputs["advantages"] = draw(values([-1.0, -0.5, 0.0, 0.5, 1.0]))
        if draw(st.booleans()):
            inputs["mask"] = draw(values([0.0, 1.0]))
    return {"model_input": {"token_ids": draw(st.lists(TOKENS, min_size=n, max_size=n))},
            "loss_inputs": inputs}


@st.composite
def body_st(draw: Any, primitive: str, checkpoint_ids: list[str]) -> dict[str, Any]:
    """A valid body (without ``seq``) from small value sets, so a regenerated body is sometimes
    JSON-equal to a recorded one (ORD-3 must then replay, not conflict)."""
    if primitive in ("forward", "forward_backward"):
        loss = draw(st.sampled_from(LOSSES))
        config = CONFIGS.get(loss, {}) if draw(st.booleans()) else {}
        return {"loss_function": loss, "loss_config": config,
                "data": draw(st.lists(datum_st(loss), min_size=1, max_size=2))}
    if primitive == "optim_step":
        return {"adamw": {**ADAMW, "learning_rate": draw(st.sampled_from([0.01, 0.001])),
                          "grad_clip_norm": draw(st.sampled_from([0.0, 1.0]))}}
    if primitive == "save_weights_for_sampler":
        return {"version": draw(st.integers(0, 6))}
    if primitive == "sample":
        return {"version": draw(st.integers(0, 6)),
                "prompt": {"token_ids": draw(st.lists(TOKENS, min_size=1, max_size=3))},
                "num_samples": draw(st.integers(1, 2)),
                "sampling": {"max_tokens": draw(st.integers(1, 3)),
                             "temperature": draw(st.sampled_from([1.0, 0.7])),
                             "top_k": draw(st.sampled_from([0, 5])),
                             "top_p": draw(st.sampled_from([1.0, 0.9])),
                             "seed": draw(st.integers(0, 3))}}
    if primitive == "logprobs":
        return {"version": draw(st.integers(0, 6)),
                "token_ids": draw(st.lists(TOKENS, min_size=1, max_size=4))}
    if primitive == "save_state":
        return {"name": draw(st.sampled_from(["a", "b"]))}
    if primitive == "load_state":
        return {"checkpoint_id": draw(st.sampled_from(checkpoint_ids + ["ckpt_unknown"])),
                "with_optimizer": draw(st.booleans())}
    return {}  # export_lora


def spoil(primitive: str, body: dict[str, Any], kind: str) -> dict[str, Any]:
    """``schema``: an undefined field (ERR-4, refused before the seq is looked at); ``value``: a
    token outside the vocabulary (422 at submission: after ORD-3's lookup, before its turn)."""
    bad = json.loads(json.dumps(body))
    if kind == "schema":
        return {**bad, "grad_clip": 1.0}
    if primitive in ("forward", "forward_backward"):
        bad["data"][0]["model_input"]["token_ids"][0] = 258
    elif primitive == "sample":
        bad["prompt"]["token_ids"][0] = 258
    else:
        bad["token_ids"][0] = 258
    return bad


# -- the model --------------------------------------------------------------------------------
@dataclass
class Op:
    primitive: str
    body: dict[str, Any]  # without seq
    status: int
    content: bytes  # the response body, replayed byte for byte (ORD-3)
    canon: str = ""


@dataclass
class MRun:
    run_id: str
    session_id: str
    rank: int
    weights: str
    state: str = "active"
    next_seq: int = 1
    step: int = 0
    versions: dict[int, tuple[int, str]] = field(default_factory=dict)  # version -> (step, weights)
    grads: str | None = None
    opt_t: int = 0
    cancel_at: float | None = None
    ops: dict[int, Op] = field(default_factory=dict)
    retired: bool = False
    forgotten: bool = False


@dataclass
class MSession:
    session_id: str
    ttl: int | None
    expires_at: float | None
    state: str = "open"
    run_ids: list[str] = field(default_factory=list)
    forgotten: bool = False
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class MCreation:
    """LIFE-9: what a creation sent with an Idempotency-Key was first answered."""

    scope: str  # "POST /sessions" or "POST /sessions/{sid}/runs"
    canon: str  # the body, as ORD-3 compares it
    content: bytes  # the 201 body, replayed byte for byte
    session_id: str  # retention: as long as this session is remembered


@dataclass
class MCheckpoint:
    session_id: str
    rank: int
    step: int
    weights: str
    opt_t: int


class Model:
    """What the contract (and the mock's documented choices) say the server must hold."""

    def __init__(self, retention: int) -> None:
        self.sessions: dict[str, MSession] = {}
        self.runs: dict[str, MRun] = {}
        self.checkpoints: dict[str, MCheckpoint] = {}
        self.closed: list[str] = []  # retired sessions, oldest first
        self.retention = retention
        self.creations: dict[str, MCreation] = {}  # LIFE-9, by Idempotency-Key (one API key)

    def retire(self, session: MSession) -> None:
        """LIFE-3/LIFE-4 retirement: versions are dropped from the view; after ``retention``
        later retirements the session, its runs and checkpoints are forgotten (404)."""
        for run_id in session.run_ids:
            self.runs[run_id].retired = True
        self.closed.append(session.session_id)
        while len(self.closed) > self.retention:
            old = self.sessions[self.closed.pop(0)]
            old.forgotten = True
            event("a session left the retention window")
            for run_id in old.run_ids:
                self.runs[run_id].forgotten = True
            for checkpoint_id in [c for c, ck in self.checkpoints.items()
                                  if ck.session_id == old.session_id]:
                del self.checkpoints[checkpoint_id]
            for key in [k for k, c in self.creations.items() if c.session_id == old.session_id]:
                del self.creations[key]  # LIFE-9: a key lives as long as its session

    def tick(self, now: float) -> None:
        """What time does: TTL expiry (LIFE-4) first, then ends of ``cancelling`` (LIFE-7)."""
        expiring = [s for s in self.sessions.values()  # creation order, as the server sweeps
                    if s.state == "open" and s.expires_at is not None and now >= s.expires_at]
        for session in expiring:
            if any(self.runs[r].state == "cancelling" for r in session.run_ids):
                self.expose_bug_1()  # before the retirements below
        for session in expiring:
            session.state = "expired"
            event("a session expired")
            for run_id in session.run_ids:
                run = self.runs[run_id]
                if run.state not in TERMINAL:
                    run.state = "cancelled"
            self.retire(session)
        for run in self.runs.values():
            if run.state == "cancelling" and now >= run.cancel_at:
                run.state = "cancelled"

    def expose_bug_1(self) -> None:
        """A run leaves ``cancelling`` other than by its delay: the path of BUG-1 (fixed, see
        tests/backend/test_regressions.py); counted so the statistics show it is still exercised."""
        event("BUG-1 exposed")

    def open_sessions(self) -> int:
        return sum(1 for s in self.sessions.values() if s.state == "open")

    def listed(self, state: str | None, meta: tuple[str, str] | None) -> list[str]:
        """LIFE-10: the sessions a listing shows, newest first."""
        return [s.session_id for s in reversed(self.sessions.values()) if not s.forgotten
                and (state is None or s.state == state)
                and (meta is None or s.metadata.get(meta[0]) == meta[1])]

    def creation(self, key: str, scope: str, body: dict[str, Any]) -> tuple[str, MCreation | None]:
        """LIFE-9: ``("new", None)``, ``("replay", record)`` or ``("conflict", record)``."""
        found = self.creations.get(key)
        if found is None:
            return "new", None
        same = found.scope == scope and found.canon == json.dumps(body, sort_keys=True)
        return ("replay" if same else "conflict"), found


@dataclass
class Expected:
    """The outcome the contract allows for one primitive request."""

    kind: str  # "execute" | "replay" | "error" | "gap"
    status: int = 200
    error_type: str | None = None
    op: Op | None = None


def expect_submission(run: MRun, seq: int, primitive: str, body: dict, bad: str | None
                      ) -> Expected:
    """Endpoint order: 404 unknown run; 422 schema; ORD-3 lookup; LIFE-8; 422 value; ORD-1/2."""
    if run.forgotten:
        return Expected("error", 404, "not_found")
    if bad == "schema":
        return Expected("error", 422, "unknown_field")
    recorded = run.ops.get(seq)
    if recorded is not None:
        if recorded.canon == canon(primitive, {"seq": seq, **body}):
            return Expected("replay", recorded.status, op=recorded)
        return Expected("error", 409, "seq_conflict")
    if run.state != "active":
        return Expected("error", 409, "run_not_active")
    if bad == "value":
        return Expected("error", 422)
    if seq > run.next_seq:
        return Expected("gap", 409, "seq_gap")
    return Expected("execute")

"""The dashboard's read model: what one API key may see of the backend, as plain JSON data.

No HTTP here: :func:`dashboard_state` takes the ``Backend`` and an authenticated key and returns
a dict that ``mock_server.http.dashboard`` serves at ``GET /_mock/ui/state`` (the page at
``/_mock/ui`` polls it). Only the key's own sessions and runs are read (SEC-2 holds in the
page too).

It reads; it never changes what the contract answers. Each record carries a process-wide
revision number (``records.next_rev``): an answer lists the operations, ended holds, curve
points and version uses whose revision is above ``since`` and hands back a ``cursor`` to pass
as the next ``since``, so a page polling once a second receives only what changed. Sessions,
runs, versions and the requests held right now are small and come whole every time.

An operation's response bytes are parsed once, the first time it is shown, and the summary is
kept on the record (``Operation.summary``); a ``forward_backward`` answer's loss is read from
the head of its bytes without parsing its per-position logprobs. Nothing here runs unless the
page is open, so a closed page costs the primitives nothing; an open one costs one call of this
function per poll (``benchmarks/dashboard.py`` measures both).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import orjson

from ..engine.specs import BYTE_ARCHITECTURE
from .records import HoldEnded, Operation, Run, Session, next_rev

if TYPE_CHECKING:
    from .state import Backend

__all__ = ["OPS_PER_RUN", "PREVIEW_SAMPLES", "PREVIEW_TOKENS", "dashboard_state", "preview"]

#: At most this many operations per run in one answer (the most recent); older ones stay on
#: the server (``/_mock/trace``, ``GET .../operations/{seq}``) and in the curves.
OPS_PER_RUN = 200
#: Sample previews: the first sequences of a ``sample`` answer, each cut at this many tokens.
PREVIEW_SAMPLES = 4
PREVIEW_TOKENS = 96
#: How far back an ``optim_step`` looks for the ``forward_backward`` losses it applied.
LOSS_LOOKBACK = 256

_LOSS_HEAD = re.compile(rb'^\{"loss":(-?[0-9][0-9.eE+-]*)[,}]')
_SPECIAL = {256: "\u27e8bos\u27e9", 257: "\u27e8eos\u27e9"}  # the byte model's BOS / EOS


def dashboard_state(backend: Backend, key: str, *, since: int = 0) -> dict[str, Any]:
    """Everything ``key`` owns, for the dashboard; records changed after ``since`` only.

    ``cursor`` in the answer is the ``since`` of the next call. ``now`` is the backend's clock
    (epoch seconds) for TTL countdowns; times held are milliseconds of the monotonic clock.
    """
    cursor = next_rev()  # above every revision taken so far, and never taken by a record
    now_mono = time.monotonic()
    sessions = [s for s in backend.sessions.values() if s.key == key]
    runs = [backend.runs[rid] for s in sessions for rid in s.run_ids if rid in backend.runs]
    return {
        "cursor": cursor,
        "since": since,
        "now": backend.clock(),
        "sessions": [_session(s) for s in sessions],
        "runs": [_run(run, since, now_mono) for run in runs],
    }


def _session(session: Session) -> dict[str, Any]:
    return {"session_id": session.session_id, "state": session.state,
            "created_at": session.created_at, "expires_at": session.expires_at,
            "ttl_seconds": session.ttl_seconds, "metadata": session.metadata,
            "run_ids": list(session.run_ids)}


def _run(run: Run, since: int, now_mono: float) -> dict[str, Any]:
    byte_model = run.base.spec.architecture == BYTE_ARCHITECTURE
    changed = _changed(run, since)
    shown = changed[-OPS_PER_RUN:]
    points, uses = [], []
    for op in changed:
        summary = _summary(run, op, byte_model)
        if "point" in summary:
            points.append(summary["point"])
        if "version" in summary and op.primitive in ("sample", "logprobs"):
            uses.append({"seq": op.seq, "primitive": op.primitive,
                         "version": summary["version"]})
    return {
        "run_id": run.run_id, "session_id": run.session_id, "base_model": run.base_model,
        "byte_model": byte_model, "state": run.state, "step": run.step,
        "next_seq": run.next_seq, "created_at": run.created_at, "operations": len(run.ops),
        "versions": [{"version": v.version, "step": v.step, "created_at": v.created_at}
                     for v in run.versions.values()],
        "held": [{"seq": seq, "primitive": h.primitive,
                  "held_ms": round((now_mono - h.since) * 1000, 1)}
                 for seq, h in sorted(run.held.items())],
        "ops": [_op_view(run, op, byte_model) for op in shown],
        "ops_omitted": len(changed) - len(shown),
        "ended_holds": [_hold_view(e) for e in run.events if e.rev > since],
        "points": points,
        "uses": uses,
    }


def _changed(run: Run, since: int) -> list[Operation]:
    """The run's operations recorded or replayed after ``since``, in seq order.

    Operations are recorded in seq order, each with a fresh revision, so the new ones are the
    newest few: read backwards until one is older than ``since``. A replay gives an older
    record a fresh revision too; the run's last replays (``Run.replayed``) catch those. An
    idle run therefore costs O(1) a poll, whatever its length.
    """
    if since == 0:  # a page's first poll: everything (the curves need every step)
        return list(run.ops.values())
    changed: list[Operation] = []
    for op in reversed(run.ops.values()):
        if op.rev <= since:
            break
        changed.append(op)
    oldest_new = changed[-1].seq if changed else run.next_seq
    replayed = {op.seq: op for op in run.replayed if op.rev > since and op.seq < oldest_new}
    changed.reverse()
    if replayed:
        changed = sorted([*replayed.values(), *changed], key=lambda op: op.seq)
    return changed


def _op_view(run: Run, op: Operation, byte_model: bool) -> dict[str, Any]:
    view = {name: value for name, value in _summary(run, op, byte_model).items()
            if name != "point"}  # points travel in their own list
    return {**view, "replays": op.replays,
            "duration_ms": round(op.duration_ms, 3),
            "held_ms": None if op.held_ms is None else round(op.held_ms, 1), "rev": op.rev}


def _hold_view(event: HoldEnded) -> dict[str, Any]:
    return {"seq": event.seq, "primitive": event.primitive, "outcome": event.outcome,
            "held_ms": round(event.held_ms, 1), "rev": event.rev}


# -- one operation's summary, parsed once -----------------------------------------------------
def _summary(run: Run, op: Operation, byte_model: bool) -> dict[str, Any]:
    if op.summary is None:
        op.summary = _summarize(run, op, byte_model)
    return op.summary


def _summarize(run: Run, op: Operation, byte_model: bool) -> dict[str, Any]:
    summary: dict[str, Any] = {"seq": op.seq, "primitive": op.primitive,
                               "status": "completed" if op.ok else "failed",
                               "http_status": op.status}
    if not op.ok:
        error = _loads(op.payload).get("error")
        error = error if isinstance(error, dict) else {}
        summary["error"] = str(error.get("type", "error"))
        summary["message"] = str(error.get("message", ""))[:300]
        return summary
    if op.primitive in ("forward", "forward_backward"):
        loss = _loss(op.payload)
        if loss is not None:
            summary["loss"] = loss
        return summary
    result = _loads(op.payload)
    for name in ("version", "step", "checkpoint_id", "export_id"):
        if name in result:
            summary[name] = result[name]
    if op.primitive == "optim_step" and "step" in result:
        summary["grad_norm"] = result.get("grad_norm")
        summary["update_norm"] = result.get("update_norm")
        summary["point"] = {"seq": op.seq, "step": result["step"],
                            "loss": _applied_loss(run, op.seq, byte_model),
                            "grad_norm": result.get("grad_norm"),
                            "update_norm": result.get("update_norm")}
    elif op.primitive == "sample":
        sequences = result.get("sequences") or []
        summary["num_samples"] = len(sequences)
        summary["previews"] = [preview(s.get("tokens") or [], byte_model, s.get("stop_reason"))
                               for s in sequences[:PREVIEW_SAMPLES]]
    return summary


def _applied_loss(run: Run, seq: int, byte_model: bool) -> float | None:
    """The summed loss of the ``forward_backward`` calls an ``optim_step`` at ``seq`` applied:
    those since the previous ``optim_step`` or ``load_state`` (GRAD-1 accumulates)."""
    total, found = 0.0, False
    for earlier in range(seq - 1, max(0, seq - 1 - LOSS_LOOKBACK), -1):
        op = run.ops.get(earlier)
        if op is None:
            break
        if op.ok and op.primitive in ("optim_step", "load_state"):
            break
        if op.ok and op.primitive == "forward_backward":
            loss = _summary(run, op, byte_model).get("loss")
            if isinstance(loss, (int, float)):
                total += loss
                found = True
    return total if found else None


def preview(tokens: Iterable[int], byte_model: bool, stop_reason: Any = None) -> dict[str, Any]:
    """A sampled sequence for a person: text for the byte model (bytes 0..255 decoded as
    UTF-8, BOS/EOS marked), the token ids otherwise; at most ``PREVIEW_TOKENS`` tokens."""
    tokens = list(tokens)
    head = tokens[:PREVIEW_TOKENS]
    shown: dict[str, Any] = {"tokens": len(tokens), "truncated": len(tokens) > len(head),
                             "stop_reason": stop_reason}
    if not byte_model:
        shown["ids"] = head
        return shown
    parts: list[str] = []
    chunk = bytearray()
    for token in head:
        if 0 <= token < 256:
            chunk.append(token)
            continue
        if chunk:
            parts.append(chunk.decode("utf-8", "replace"))
            chunk = bytearray()
        parts.append(_SPECIAL.get(token, f"\u27e8{token}\u27e9"))
    if chunk:
        parts.append(chunk.decode("utf-8", "replace"))
    shown["text"] = "".join(parts)
    return shown


def _loss(payload: bytes) -> float | None:
    """The ``loss`` of a forward answer: read from the head of the bytes when the answer starts
    with it (the mock's own order), else from the whole document."""
    found = _LOSS_HEAD.match(payload[:64])
    if found is not None:
        try:
            return float(found.group(1))
        except ValueError:
            pass
    loss = _loads(payload).get("loss")
    return float(loss) if isinstance(loss, (int, float)) else None


def _loads(payload: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}

"""LIFE-1..8: sessions, TTL and heartbeats, runs, finish, cancel, terminal states."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

from ..context import Ctx, RunHandle, expect_status, same_view
from ..payloads import adamw, ce_datum, loss_body
from ..registry import CheckFailed, CheckWarning, check

_RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]00:00)$")


def parse_time(value: Any, what: str) -> float:
    """Seconds since the epoch of an RFC 3339 UTC timestamp, or fail."""
    if not isinstance(value, str) or not _RFC3339_UTC.match(value):
        raise CheckFailed(f"{what} is {value!r}, not an RFC 3339 UTC timestamp")
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


@check("LIFE-1", "session-view", title="POST /sessions -> 201 view (open, RFC 3339 times, "
       "metadata echoed); GET returns the same view")
def life1_session_view(ctx: Ctx) -> None:
    reply = ctx.create_session({"metadata": {"purpose": "life-1"}})
    view = reply.body
    for key in ("session_id", "state", "created_at", "expires_at", "metadata"):
        if key not in view:
            raise CheckFailed(f"session view lacks {key!r}: {view}")
    if view["state"] != "open":
        raise CheckFailed(f"new session state {view['state']!r}, expected 'open'")
    parse_time(view["created_at"], "created_at")
    if view["expires_at"] is not None:
        raise CheckFailed(f"session without TTL has expires_at {view['expires_at']!r}")
    if view["metadata"] != {**ctx.tag(), "purpose": "life-1"}:
        raise CheckFailed(f"metadata not echoed: {view['metadata']}")
    got = expect_status(ctx.wire.call("GET", f"/sessions/{view['session_id']}"), 200).body
    if not same_view(got, view):
        raise CheckFailed(f"GET /sessions/{{sid}} differs from the create view: {got} vs {view}")
    bad = ctx.wire.call("POST", "/sessions", {"metadata": {**ctx.tag(), "n": 1}})
    expect_status(bad, 422, what="metadata with a non-string value")
    if not ctx.declares("features.session_ttl"):
        expect_status(ctx.wire.call("POST", "/sessions", {"metadata": ctx.tag(),
                                                          "ttl_seconds": 60}), 422,
                      what="ttl_seconds while features.session_ttl is false")


@check("LIFE-1", "session-quota", title="over max_sessions open sessions per key: 409 "
       "quota_exceeded")
def life1_session_quota(ctx: Ctx) -> None:
    limit = ctx.quota("max_sessions")
    for attempt in range(limit + 1):
        reply = ctx.wire.call("POST", "/sessions", {"metadata": ctx.tag()})
        if reply.status == 201:
            ctx.adopt_session(reply)
            continue
        expect_status(reply, 409, "quota_exceeded", what=f"session {attempt + 1} of this key")
        return
    raise CheckFailed(f"{limit + 1} sessions open at once; max_sessions is {limit}")


@check("LIFE-2", "ttl-heartbeat", capability="features.session_ttl", title="ttl_seconds in "
       "[min, max] (else 422); heartbeat moves expires_at to now + ttl")
def life2_ttl_heartbeat(ctx: Ctx) -> None:
    low, high = int(ctx.limits["min_ttl_seconds"]), int(ctx.limits["max_ttl_seconds"])
    for bad in (low - 1, high + 1):
        reply = ctx.wire.call("POST", "/sessions", {"metadata": ctx.tag(), "ttl_seconds": bad})
        expect_status(reply, 422, what=f"ttl_seconds {bad} outside [{low}, {high}]")
    expect_status(ctx.wire.call("POST", "/sessions", {"metadata": ctx.tag(),
                                                      "ttl_seconds": low + 0.5}), 422,
                  what="ttl_seconds not an integer")
    ttl = min(max(low, 600), high)
    started = time.monotonic()
    view = ctx.create_session({"ttl_seconds": ttl}).body
    created = parse_time(view["created_at"], "created_at")
    expires = parse_time(view["expires_at"], "expires_at")
    if abs(expires - created - ttl) > 1.0:
        raise CheckFailed(f"expires_at - created_at = {expires - created:.3f}s, ttl {ttl}s")
    pause = 0.3
    time.sleep(pause)
    beat = expect_status(ctx.wire.call("POST", f"/sessions/{view['session_id']}/heartbeat", {}),
                         200, what="heartbeat").body
    moved = parse_time(beat["expires_at"], "expires_at after heartbeat")
    elapsed = time.monotonic() - started
    # now + ttl, judged with server timestamps only: the heartbeat's "now" lies between the
    # creation + the pause and the creation + the local elapsed time. Timestamps with whole
    # seconds get one second of rounding slack.
    slack = 0.05 if "." in view["created_at"] and "." in beat["expires_at"] else 1.0
    now_at_heartbeat = moved - ttl
    if not (created + pause - slack <= now_at_heartbeat <= created + elapsed + slack):
        raise CheckFailed(f"heartbeat set expires_at {beat['expires_at']}: not now + {ttl}s "
                          f"(session created {view['created_at']}, heartbeat {pause}s to "
                          f"{elapsed:.3f}s later, before it expires_at was {view['expires_at']})")
    plain = ctx.create_session().body
    beat = expect_status(ctx.wire.call("POST", f"/sessions/{plain['session_id']}/heartbeat",
                                       {}), 200, what="heartbeat without TTL").body
    if beat.get("expires_at") is not None:
        raise CheckFailed(f"heartbeat on a session without TTL set expires_at {beat}")
    ctx.wire.call("POST", f"/sessions/{plain['session_id']}/close", {})
    expect_status(ctx.wire.call("POST", f"/sessions/{plain['session_id']}/heartbeat", {}), 409,
                  "session_not_open", what="heartbeat on a closed session")


@check("LIFE-3", "close", title="close with a non-terminal run: 409 runs_not_terminal and no "
       "change; close -> closed, idempotent; a closed session accepts no run")
def life3_close(ctx: Ctx) -> None:
    session = ctx.session(fresh=True)
    run = ctx.run(session=session)
    reply = ctx.wire.call("POST", f"/sessions/{session.id}/close", {})
    expect_status(reply, 409, "runs_not_terminal", what="close with an active run")
    if ctx.wire.call("GET", f"/sessions/{session.id}").body.get("state") != "open":
        raise CheckFailed("a refused close changed the session state")
    if run.get().get("state") != "active":
        raise CheckFailed("a refused close changed the run state")
    expect_status(ctx.wire.call("POST", f"/runs/{run.id}/finish", {}), 200, what="finish")
    closed = expect_status(ctx.wire.call("POST", f"/sessions/{session.id}/close", {}), 200,
                           what="close").body
    if closed.get("state") != "closed":
        raise CheckFailed(f"close returned state {closed.get('state')!r}")
    again = expect_status(ctx.wire.call("POST", f"/sessions/{session.id}/close", {}), 200,
                          what="second close").body
    if not same_view(again, closed):
        raise CheckFailed(f"close on a closed session changed it: {closed} -> {again}")
    reply = ctx.wire.call("POST", f"/sessions/{session.id}/runs", ctx.run_body())
    expect_status(reply, 409, "session_not_open", what="create run in a closed session")


@check("LIFE-4", "expiry", capability="features.session_ttl", slow=True, title="within 1 s after "
       "expires_at without heartbeat: session expired, its active runs cancelled")
def life4_expiry(ctx: Ctx) -> None:
    ttl = int(ctx.limits["min_ttl_seconds"])
    if ttl + 1.2 > ctx.options.max_wait_seconds:
        raise CheckWarning(f"not exercised: min_ttl_seconds {ttl} exceeds the wait budget "
                           f"(--max-wait {ctx.options.max_wait_seconds:g})")
    session = ctx.session(fresh=True, ttl_seconds=ttl)
    created_by = time.monotonic()  # the server created the session before this instant
    run = ctx.run(session=session)
    # The suite waits for the TTL it asked for, never for the server's word alone: timestamps
    # that disagree with the request fail here, at once.
    created = parse_time(session.view["created_at"], "created_at")
    expires = parse_time(session.view["expires_at"], "expires_at")
    if abs(expires - created - ttl) > 1.0:
        raise CheckFailed(f"the session asked ttl_seconds {ttl}, but expires_at - created_at is "
                          f"{expires - created:.3f} s ({session.view['expires_at']} - "
                          f"{session.view['created_at']})")
    ctx.wait(created_by + ttl + 1.05 - time.monotonic(),
             f"for the session to expire (ttl_seconds {ttl}, then 1 s)")
    view = ctx.wire.call("GET", f"/sessions/{session.id}").body
    if view.get("state") != "expired":
        raise CheckFailed(f"1 s after expires_at the session reads {view.get('state')!r}")
    state = run.get().get("state")
    if state != "cancelled":
        raise CheckFailed(f"the expired session's active run reads {state!r}, not 'cancelled'")
    expect_status(ctx.wire.call("POST", f"/sessions/{session.id}/runs", ctx.run_body()), 409,
                  "session_not_open", what="create run in an expired session")
    closed = expect_status(ctx.wire.call("POST", f"/sessions/{session.id}/close", {}), 200,
                           what="close an expired session").body
    if closed.get("state") != "expired":
        raise CheckFailed(f"close changed an expired session to {closed.get('state')!r}")


@check("LIFE-5", "run-view", title="POST /sessions/{sid}/runs -> 201 run view (active, "
       "next_seq 1, step 0, no versions); bad base model, rank, alpha, optimizer -> 422")
def life5_run_view(ctx: Ctx) -> None:
    session = ctx.session(fresh=True)
    reply = ctx.wire.call("POST", f"/sessions/{session.id}/runs", ctx.run_body())
    view = expect_status(reply, 201, what="create run").body
    session.runs.append(RunHandle(ctx, view))
    expected = {"session_id": session.id, "state": "active", "next_seq": 1, "step": 0,
                "versions": []}
    for key, value in expected.items():
        if view.get(key) != value:
            raise CheckFailed(f"new run {key} is {view.get(key)!r}, expected {value!r}")
    if not isinstance(view.get("run_id"), str):
        raise CheckFailed(f"run view without run_id: {view}")
    parse_time(view.get("created_at"), "run created_at")
    got = expect_status(ctx.wire.call("GET", f"/runs/{view['run_id']}"), 200).body
    if not same_view(got, view):
        raise CheckFailed(f"GET /runs/{{rid}} differs from the create view: {got} vs {view}")
    max_rank = int(ctx.base_model["max_lora_rank"])
    bad_bodies = [
        ("unknown base model", {**ctx.run_body(), "base_model": "no-such/model"},
         "unknown_base_model"),
        (f"rank {max_rank + 1} > max_lora_rank", ctx.run_body(rank=max_rank + 1), None),
        ("rank 0", ctx.run_body(rank=0), None),
        ("alpha 0", ctx.run_body(alpha=0.0), None),
        ("optimizer sgd", {**ctx.run_body(), "optimizer": "sgd"}, None),
    ]
    for label, body, etype in bad_bodies:
        reply = ctx.wire.call("POST", f"/sessions/{session.id}/runs", body)
        expect_status(reply, 422, etype, what=f"create run with {label}")
    limit = ctx.quota("max_runs_per_session")
    while len(session.runs) < limit:
        ctx.run(session=session)
    reply = ctx.wire.call("POST", f"/sessions/{session.id}/runs", ctx.run_body())
    expect_status(reply, 409, "quota_exceeded", what=f"run {limit + 1} in one session")


@check("LIFE-6", "finish", title="finish -> 200 finished after earlier primitives completed; "
       "idempotent; requests held behind a gap then fail with 409 run_not_active")
def life6_finish(ctx: Ctx) -> None:
    run = ctx.run()
    run.forward([ce_datum(ctx.tokens("fin"))], backward=True)
    gap_seq = run.seq + 2
    held = ctx.hold(lambda: run.prim("optim_step", {"adamw": adamw()}, seq=gap_seq,
                                     expect=None))
    view = expect_status(ctx.wire.call("POST", f"/runs/{run.id}/finish", {}), 200,
                         what="finish").body
    held_reply = held.result()
    op = expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/1"), 200).body
    if op.get("status") != "completed":
        raise CheckFailed(f"operation 1 before finish is {op}")
    again = expect_status(ctx.wire.call("POST", f"/runs/{run.id}/finish", {}), 200).body
    if not same_view(again, view):
        raise CheckFailed(f"finish on a finished run changed it: {view} -> {again}")
    if not held.was_held:
        raise held.not_held("the held-request clause")
    if view.get("state") != "finished" or view.get("next_seq") != 2:
        raise CheckFailed(f"finish view {view}: expected state finished, next_seq 2")
    expect_status(held_reply, 409, "run_not_active", what="request held behind a gap when "
                  "the run finished")


@check("LIFE-7", "cancel", title="cancel -> 202 cancelling even when idle; held requests fail "
       "409 run_cancelled; the run reads cancelled only afterwards (poll until terminal)")
def life7_cancel(ctx: Ctx) -> None:
    idle = ctx.run()
    reply = ctx.wire.call("POST", f"/runs/{idle.id}/cancel", {})
    expect_status(reply, 202, what="cancel an idle run")
    if reply.body.get("state") != "cancelling":
        raise CheckFailed(f"cancel answered state {reply.body.get('state')!r}, the contract "
                          f"says 'cancelling' (clients poll until terminal)")
    again = ctx.wire.call("POST", f"/runs/{idle.id}/cancel", {})
    if again.status == 202 and again.body.get("state") not in ("cancelling", "cancelled"):
        raise CheckFailed(f"cancel on a cancelling run: {again.body}")
    if again.status not in (200, 202):
        raise CheckFailed(f"cancel on a cancelling run: {again.describe()}")
    if idle.get().get("state") == "cancelling":
        expect_status(ctx.wire.call("POST", f"/runs/{idle.id}/finish", {}), 409,
                      "run_not_active", what="finish on a cancelling run")
    if idle.wait_terminal().get("state") != "cancelled":
        raise CheckFailed(f"cancelled run ended {idle.view.get('state')!r}")

    busy = ctx.run()
    held = ctx.hold(lambda: busy.prim("forward", loss_body([ce_datum(ctx.tokens("held"))]),
                                      seq=3, expect=None))
    expect_status(ctx.wire.call("POST", f"/runs/{busy.id}/cancel", {}), 202,
                  what="cancel with a held request")
    held_reply = held.result()
    busy.wait_terminal()
    busy.prim("forward", loss_body([ce_datum(ctx.tokens("late"))]),
              expect=(409, "run_not_active"))
    if not held.was_held:
        raise held.not_held("the held-request clause")
    expect_status(held_reply, 409, "run_cancelled", what="request held when the run was "
                  "cancelled")


def _terminal_unchanged(ctx: Ctx, run: RunHandle) -> None:
    view = run.get()
    for action in ("cancel", "finish"):
        reply = ctx.wire.call("POST", f"/runs/{run.id}/{action}", {})
        expect_status(reply, 200, what=f"{action} on a {view['state']} run")
        if not same_view(reply.body, view):
            raise CheckFailed(f"{action} on a {view['state']} run changed it: {view} -> "
                              f"{reply.body}")
    run.prim("forward_backward", loss_body([ce_datum(ctx.tokens("xy"))]),
             expect=(409, "run_not_active"))
    if not same_view(run.get(), view):
        raise CheckFailed(f"a primitive on a {view['state']} run changed it")


@check("LIFE-8", "terminal", title="finished and cancelled never change: cancel/finish -> 200 "
       "same view; primitives -> 409 run_not_active, not recorded")
def life8_terminal(ctx: Ctx) -> None:
    finished = ctx.run()
    finished.forward([ce_datum(ctx.tokens("terminal"))])
    expect_status(ctx.wire.call("POST", f"/runs/{finished.id}/finish", {}), 200)
    _terminal_unchanged(ctx, finished)
    cancelled = ctx.run()
    expect_status(ctx.wire.call("POST", f"/runs/{cancelled.id}/cancel", {}), 202)
    cancelled.wait_terminal()
    _terminal_unchanged(ctx, cancelled)

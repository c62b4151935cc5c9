"""LIFE-9 (contract 1.1, optional: idempotent_create): ``Idempotency-Key`` on creations.

A creation answered, then sent again with the same key and a JSON-equal body, is the same
resource answered again (201, ``Whitney-Replayed: true``) and nothing is created twice. What
"nothing twice" looks like from outside: a hidden second run keeps its session from closing
(LIFE-3 answers 409 ``runs_not_terminal`` while a run is not terminal), and a hidden second
session shows in the listing when the server also declares ``session_listing`` (LIFE-10).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from ..context import Ctx, RunHandle, SessionHandle, expect_status, same_view
from ..registry import CheckFailed, CheckUnsupported, check
from ..wire import PRIMARY, SECOND, Reply

CAPABILITY = "features.idempotent_create"


def new_key(ctx: Ctx, label: str) -> str:
    """An Idempotency-Key no other run of the suite uses."""
    return f"wc-{ctx.run_tag}-{label}-{uuid.uuid4().hex[:12]}"


def create_session(ctx: Ctx, key: str, metadata: dict[str, str], *, auth: str = PRIMARY,
                   raw: bytes | None = None, first: bool = False) -> Reply:
    """``POST /sessions`` with ``Idempotency-Key: key`` and the suite's tag in the metadata
    (``raw``: the same body written another way). ``first``: the key's first use, which may
    wait for a session slot the suite's other checks hold (``Ctx.await_session_slot``; a
    refused creation is not remembered, so the key may be sent again)."""
    body = {"metadata": {**ctx.tag(), **metadata}}
    headers = {"Idempotency-Key": key}

    def send() -> Reply:
        if raw is not None:
            return ctx.wire.call("POST", "/sessions", content=raw, auth=auth, headers=headers)
        return ctx.wire.call("POST", "/sessions", body, auth=auth, headers=headers)

    reply = send()
    return ctx.await_session_slot(send, auth, reply) if first else reply


def _first(ctx: Ctx, reply: Reply, what: str, auth: str = PRIMARY) -> SessionHandle:
    expect_status(reply, 201, what=what)
    if reply.replayed:
        raise CheckFailed(f"{what}: a first creation carries 'Whitney-Replayed: true'")
    return ctx.adopt_session(reply, auth)


def _replayed(reply: Reply, first: Reply, what: str) -> None:
    expect_status(reply, first.status, what=what)
    if not reply.replayed:
        raise CheckFailed(f"{what}: answered without 'Whitney-Replayed: true' (a second "
                          f"creation?): {reply.body}")
    if reply.body != first.body:
        raise CheckFailed(f"{what}: the replay answered {reply.body}, the first answer was "
                          f"{first.body}")


def _listed(ctx: Ctx, probe: str, auth: str = PRIMARY) -> list[str] | None:
    """The ids of the sessions whose metadata carries ``probe`` (LIFE-10), or None when the
    server does not list sessions."""
    if not ctx.declares("features.session_listing"):
        return None
    reply = ctx.wire.call("GET", "/sessions", auth=auth, params={
        "metadata_key": "wc-probe", "metadata_value": probe, "limit": 20})
    body = expect_status(reply, 200, what="GET /sessions (LIFE-10)").body
    return [view.get("session_id") for view in body.get("sessions", [])]


def _run_body(ctx: Ctx, seed: int) -> dict[str, Any]:
    return ctx.run_body(seed=seed)


def _create_run(ctx: Ctx, session: SessionHandle, key: str, body: dict[str, Any],
                auth: str = PRIMARY) -> Reply:
    return ctx.wire.call("POST", f"/sessions/{session.id}/runs", body, auth=auth,
                         headers={"Idempotency-Key": key})


def _close_proves_one_run(ctx: Ctx, session: SessionHandle, run: RunHandle) -> None:
    """Finish the run the client knows; a hidden second run would keep the close at 409."""
    expect_status(ctx.wire.call("POST", f"/runs/{run.id}/finish", {}, auth=run.auth), 200,
                  what="finish the run")
    reply = ctx.wire.call("POST", f"/sessions/{session.id}/close", {}, auth=session.auth)
    if reply.status == 409 and reply.error_type == "runs_not_terminal":
        raise CheckFailed("close answered 409 runs_not_terminal after the only run the client "
                          "knows finished: the retried creation created a second run")
    expect_status(reply, 200, what="close after the run finished")


@check("LIFE-9", "replay", capability=CAPABILITY, title="a creation sent again with the same "
       "Idempotency-Key and a JSON-equal body answers the first 201 with Whitney-Replayed: "
       "true and creates nothing (sessions and runs)")
def life9_replay(ctx: Ctx) -> None:
    probe = uuid.uuid4().hex[:16]
    key = new_key(ctx, "session")
    first = create_session(ctx, key, {"wc-probe": probe}, first=True)
    session = _first(ctx, first, "POST /sessions with an Idempotency-Key")
    metadata = {**ctx.tag(), "wc-probe": probe}
    rewritten = json.dumps({"metadata": dict(reversed(list(metadata.items())))},
                           indent=2).encode()  # JSON-equal: other key order and whitespace
    again = create_session(ctx, key, {"wc-probe": probe}, raw=rewritten)
    _replayed(again, first, "the same POST /sessions again (same key, JSON-equal body)")
    got = expect_status(ctx.wire.call("GET", f"/sessions/{session.id}"), 200).body
    if not same_view(got, first.body):
        raise CheckFailed(f"the session reads {got} after the replay, created as {first.body}")
    listed = _listed(ctx, probe)
    if listed is not None and listed != [session.id]:
        raise CheckFailed(f"GET /sessions lists {listed} for the probe: one creation, sent "
                          f"twice, made {len(listed)} sessions")

    run_key = new_key(ctx, "run")
    body = _run_body(ctx, seed=4242)
    made = _create_run(ctx, session, run_key, body)
    expect_status(made, 201, what="POST /sessions/{sid}/runs with an Idempotency-Key")
    run = RunHandle(ctx, made.body)
    session.runs.append(run)
    if made.replayed:
        raise CheckFailed("a first run creation carries 'Whitney-Replayed: true'")
    for attempt in range(2):
        _replayed(_create_run(ctx, session, run_key, body), made,
                  f"the same run creation again (retry {attempt + 1})")
    view = expect_status(ctx.wire.call("GET", f"/sessions/{session.id}"), 200).body
    if ctx.declares("features.session_listing"):
        runs = [r.get("run_id") for r in view.get("runs", [])]
        if runs != [run.id]:
            raise CheckFailed(f"the session view lists runs {runs}; one creation sent three "
                              f"times must make one run ({run.id})")
    _close_proves_one_run(ctx, session, run)
    # the remembered answer outlives the close while the session is readable
    late = _create_run(ctx, session, run_key, body)
    _replayed(late, made, "the run creation again after the session closed")


@check("LIFE-9", "conflict", capability=CAPABILITY, title="the same Idempotency-Key with "
       "another body or on another creation path: 409 idempotency_conflict, nothing created")
def life9_conflict(ctx: Ctx) -> None:
    probe = uuid.uuid4().hex[:16]
    key = new_key(ctx, "conflict")
    first = create_session(ctx, key, {"wc-probe": probe}, first=True)
    session = _first(ctx, first, "POST /sessions with an Idempotency-Key")
    other = create_session(ctx, key, {"wc-probe": probe, "changed": "yes"})
    if other.status == 201:
        ctx.adopt_session(other)
    expect_status(other, 409, "idempotency_conflict", what="the same key with another body")
    listed = _listed(ctx, probe)
    if listed is not None and listed != [session.id]:
        raise CheckFailed(f"GET /sessions lists {listed} after the refused creation")
    run_key = new_key(ctx, "conflict-run")
    made = _create_run(ctx, session, run_key, _run_body(ctx, seed=1))
    expect_status(made, 201, what="create a run with an Idempotency-Key")
    run = RunHandle(ctx, made.body)
    session.runs.append(run)
    changed = _create_run(ctx, session, run_key, _run_body(ctx, seed=2))
    if changed.status == 201:
        session.runs.append(RunHandle(ctx, changed.body))
    expect_status(changed, 409, "idempotency_conflict",
                  what="the same run key with another lora.seed")
    path = _create_run(ctx, session, key, _run_body(ctx, seed=1))
    if path.status == 201:
        session.runs.append(RunHandle(ctx, path.body))
    expect_status(path, 409, "idempotency_conflict",
                  what="the session's Idempotency-Key reused on the run creation path")
    _close_proves_one_run(ctx, session, run)


@check("LIFE-9", "foreign-key", capability=CAPABILITY, needs_second_key=True,
       title="another API key's identical Idempotency-Key is independent (SEC-2): it creates "
       "its own resource and never receives this key's")
def life9_foreign_key(ctx: Ctx) -> None:
    if not ctx.wire.target.second_api_key:
        raise CheckUnsupported("no second API key (--second-api-key / WHITNEY_SECOND_API_KEY)")
    probe = uuid.uuid4().hex[:16]
    key = new_key(ctx, "shared")
    mine = create_session(ctx, key, {"wc-probe": probe}, first=True)
    session = _first(ctx, mine, "POST /sessions (first key)")
    theirs = create_session(ctx, key, {"wc-probe": probe}, auth=SECOND, first=True)
    expect_status(theirs, 201, what="the same Idempotency-Key and body from the second key")
    sid = theirs.body.get("session_id")
    if sid == session.id:
        raise CheckFailed(f"the second key got the first key's session {sid} back for the same "
                          f"Idempotency-Key (keys must be scoped to the API key, SEC-2)")
    ctx.adopt_session(theirs, SECOND)
    if theirs.replayed:
        raise CheckFailed("the second key's first use of the key was answered as a replay")
    expect_status(ctx.wire.call("GET", f"/sessions/{sid}", auth=SECOND), 200,
                  what="the second key reads its own session")
    # Neither key reads the other's session (which status says so is SEC-2's to judge).
    for path, auth, what in ((f"/sessions/{sid}", PRIMARY, "the first key reads the second's"),
                             (f"/sessions/{session.id}", SECOND,
                              "the second key reads the first's")):
        reply = ctx.wire.call("GET", path, auth=auth)
        if reply.status < 400:
            raise CheckFailed(f"{what} session: {reply.describe()}")
    # each key's next use of the key with another body conflicts with its own first use only
    for auth in (PRIMARY, SECOND):
        again = create_session(ctx, key, {"wc-probe": probe, "other": "body"}, auth=auth)
        if again.status == 201:
            ctx.adopt_session(again, auth)
        expect_status(again, 409, "idempotency_conflict",
                      what=f"the {auth} key's own key with another body")

"""SEC-1 (bearer authentication) and SEC-2 (tenant isolation: foreign ids answer 404)."""

from __future__ import annotations

from typing import Any

from ..context import Ctx, RunHandle, expect_status, same_view
from ..payloads import adamw, ce_datum, loss_body
from ..registry import CheckFailed, CheckUnsupported, Level, check
from ..wire import NO_AUTH, SECOND, Reply


def _bad_authorizations(ctx: Ctx) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("no Authorization header", {"auth": NO_AUTH}),
        ("unknown key", {"authorization": f"Bearer not-a-key-{ctx.run_tag}"}),
        ("key without the Bearer scheme", {"authorization": ctx.wire.target.api_key}),
        ("Basic scheme", {"authorization": f"Basic {ctx.wire.target.api_key}"}),
        ("bearer without a token", {"authorization": "Bearer"}),
    ]


@check("SEC-1", "bearer", title="a missing, unknown or malformed key gets 401 on every "
       "endpoint, and the request has no effect")
def sec1_bearer(ctx: Ctx) -> None:
    run = ctx.run()
    run.forward([ce_datum(ctx.tokens("ab"))])
    before = run.get()
    body = {"seq": run.seq, **loss_body([ce_datum(ctx.tokens("abc"))])}
    targets: list[tuple[str, str, Any]] = [
        ("GET", "/capabilities", None),
        ("POST", "/sessions", {"metadata": ctx.tag()}),
        ("GET", f"/sessions/{run.session_id}", None),
        ("POST", f"/sessions/{run.session_id}/close", {}),
        ("GET", f"/runs/{run.id}", None),
        ("POST", f"/runs/{run.id}/forward_backward", body),
        ("POST", f"/runs/{run.id}/cancel", {}),
        ("GET", f"/runs/{run.id}/operations/1", None),
    ]
    for label, kwargs in _bad_authorizations(ctx):
        for method, path, payload in targets:
            reply = ctx.wire.call(method, path, payload, **kwargs)
            expect_status(reply, 401, what=f"{method} {path} with {label}")
    after = run.get()
    if not same_view(after, before):
        raise CheckFailed(f"401 requests changed the run: {before} -> {after}")
    session = ctx.wire.call("GET", f"/sessions/{run.session_id}").body
    if session.get("state") != "open":
        raise CheckFailed(f"a 401 close changed the session: {session}")


@check("SEC-1", "www-authenticate", level=Level.SHOULD,
       title="401 carries WWW-Authenticate: Bearer (RFC 6750 section 3)")
def sec1_www_authenticate(ctx: Ctx) -> None:
    reply = ctx.wire.call("GET", "/capabilities", auth=NO_AUTH)
    value = reply.headers.get("www-authenticate", "")
    if not value.lower().startswith("bearer"):
        raise CheckFailed(f"401 without 'WWW-Authenticate: Bearer' (got {value!r})")


def _same_as_missing(foreign: Reply, missing: Reply, what: str) -> None:
    if foreign.status == 403:
        raise CheckFailed(f"{what}: foreign id answered 403 (must be 404, never 403): "
                          f"{foreign.describe()}")
    expect_status(foreign, 404, what=f"{what} (foreign id)")
    expect_status(missing, 404, what=f"{what} (nonexistent id)")
    if foreign.error_type != missing.error_type:
        raise CheckFailed(f"{what}: foreign id gives error.type {foreign.error_type!r}, a "
                          f"nonexistent id {missing.error_type!r} (must be the same)")


def _owned_resources(ctx: Ctx) -> tuple[RunHandle, dict[str, Any]]:
    run = ctx.run()
    run.forward([ce_datum(ctx.tokens("owned"))], backward=True)
    run.step()
    run.save(0)
    ids: dict[str, Any] = {}
    if ctx.has_primitive("save_state"):
        ids["checkpoint_id"] = run.body("save_state", {"name": "sec2"})["checkpoint_id"]
    if ctx.has_primitive("export_lora"):
        export = run.body("export_lora")
        ids["export_id"] = export["export_id"]
        ids["export_file"] = export["files"][0]["name"]
    return run, ids


@check("SEC-2", "foreign-404", needs_second_key=True, title="another key's sessions, runs, "
       "operations, checkpoints and exports answer 404 like nonexistent ids, with no effect")
def sec2_foreign(ctx: Ctx) -> None:
    if not ctx.wire.target.second_api_key:
        raise CheckUnsupported("no second API key (--second-api-key / WHITNEY_SECOND_API_KEY)")
    run, ids = _owned_resources(ctx)
    sid, rid = run.session_id, run.id
    before_run, before_session = run.get(), ctx.wire.call("GET", f"/sessions/{sid}").body
    fake_sid, fake_rid = f"{sid}0nope", f"{rid}0nope"
    datum = ce_datum(ctx.tokens("foreign"))
    fwd = {"seq": run.seq, **loss_body([datum])}
    probes: list[tuple[str, str, Any]] = [
        ("GET", "/sessions/{s}", None),
        ("POST", "/sessions/{s}/heartbeat", {}),
        ("POST", "/sessions/{s}/close", {}),
        ("POST", "/sessions/{s}/runs", ctx.run_body()),
        ("GET", "/runs/{r}", None),
        ("POST", "/runs/{r}/forward_backward", fwd),
        ("POST", "/runs/{r}/optim_step", {"seq": run.seq, "adamw": adamw(learning_rate=0.1)}),
        ("POST", "/runs/{r}/finish", {}),
        ("POST", "/runs/{r}/cancel", {}),
        ("GET", "/runs/{r}/operations/1", None),
    ]
    if "export_id" in ids:
        probes.append(("GET", "/runs/{r}/exports/" + ids["export_id"] + "/" + ids["export_file"],
                       None))
    for method, template, payload in probes:
        real = template.format(s=sid, r=rid)
        fake = template.format(s=fake_sid, r=fake_rid)
        _same_as_missing(ctx.wire.call(method, real, payload, auth=SECOND),
                         ctx.wire.call(method, fake, payload, auth=SECOND), f"{method} {template}")
    if "checkpoint_id" in ids:
        other = ctx.run(auth=SECOND)
        foreign = other.prim("load_state", {"checkpoint_id": ids["checkpoint_id"],
                                            "with_optimizer": True}, expect=None)
        missing = other.prim("load_state", {"checkpoint_id": ids["checkpoint_id"] + "0nope",
                                            "with_optimizer": True}, expect=None)
        _same_as_missing(foreign, missing, "load_state with another key's checkpoint_id")
        if foreign.error_type != "checkpoint_not_found":
            raise CheckFailed(f"foreign checkpoint: error.type {foreign.error_type!r}, "
                              f"expected 'checkpoint_not_found'")
    after_run = run.get()
    after_session = ctx.wire.call("GET", f"/sessions/{sid}").body
    if not same_view(after_run, before_run) or not same_view(after_session, before_session):
        raise CheckFailed("requests with another key changed the owner's resources: "
                          f"run {before_run} -> {after_run}; session {before_session} -> "
                          f"{after_session}")

"""ORD-1..5: one seq per run, held requests, replays, what is recorded, the operation log."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from ..context import Ctx, Held, RunHandle, assert_close, assert_json_close, expect_status
from ..payloads import adamw, ce_datum, loss_body
from ..registry import CheckFailed, CheckWarning, check
from ..wire import NO_AUTH, Reply


def _fb(ctx: Ctx, text: str) -> dict[str, Any]:
    return loss_body([ce_datum(ctx.tokens(text))])


def _pipeline(ctx: Ctx) -> list[tuple[str, dict[str, Any]]]:
    """A GRPO-like cycle: train, train, publish, score."""
    return [
        ("forward_backward", _fb(ctx, "pipe one")),
        ("optim_step", {"adamw": adamw()}),
        ("forward_backward", _fb(ctx, "pipe two")),
        ("optim_step", {"adamw": adamw(beta1=0.5)}),
        ("save_weights_for_sampler", {"version": 0}),
        ("forward", _fb(ctx, "score me")),
    ]


@check("ORD-1", "advance", title="seq == next_seq executes and next_seq advances by one")
def ord1_advance(ctx: Ctx) -> None:
    run = ctx.run()
    for offset, (name, body) in enumerate(_pipeline(ctx)):
        if run.get()["next_seq"] != 1 + offset:
            raise CheckFailed(f"next_seq {run.view['next_seq']} before op {offset + 1}")
        run.prim(name, body)
    if run.get()["next_seq"] != 7:
        raise CheckFailed(f"next_seq {run.view['next_seq']} after 6 operations, expected 7")


@check("ORD-2", "out-of-order", title="requests sent concurrently in reverse seq order are held "
       "and executed in seq order, with the results of sequential execution")
def ord2_out_of_order(ctx: Ctx) -> None:
    ops = _pipeline(ctx)
    reference = ctx.run(seed=77)
    expected = [reference.body(name, body) for name, body in ops]
    run = ctx.run(seed=77)
    replies: dict[int, Reply] = {}
    errors: list[BaseException] = []
    wait_s = int(ctx.limits["order_wait_ms"]) / 1000
    stagger = min(0.03, wait_s / (4 * len(ops)))

    def send(seq: int, name: str, body: dict[str, Any]) -> None:
        try:
            replies[seq] = run.prim(name, body, seq=seq, expect=None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = []
    for seq in range(len(ops), 0, -1):  # highest seq first
        thread = threading.Thread(target=send, args=(seq, *ops[seq - 1]), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(stagger)
    for thread in threads:
        thread.join(timeout=ctx.wire.target.timeout + 1)  # each request is bounded by it
    if errors:
        raise CheckFailed(f"concurrent request raised {errors[0]!r}")
    for seq, (name, _) in enumerate(ops, start=1):
        reply = replies.get(seq)
        if reply is None:
            raise CheckFailed(f"seq {seq} ({name}) got no reply")
        expect_status(reply, 200, what=f"{name} seq {seq} sent out of order")
        assert_json_close(reply.body, expected[seq - 1], ctx.tol,
                          f"{name} seq {seq} (out of order vs sequential)")
    for seq, (name, _) in enumerate(ops, start=1):
        op = expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/{seq}"), 200).body
        if op.get("primitive") != name:
            raise CheckFailed(f"operation {seq} is {op.get('primitive')!r}, sent {name!r}")


@check("ORD-2", "seq-gap", slow=True, title="a seq still not its turn after order_wait_ms gets 409 "
       "seq_gap with details.expected_seq, not earlier, and is not recorded")
def ord2_seq_gap(ctx: Ctx) -> None:
    wait_s = int(ctx.limits["order_wait_ms"]) / 1000
    if wait_s > ctx.options.max_wait_seconds:
        raise CheckWarning(f"not exercised: seeing seq_gap takes order_wait_ms ({wait_s:g} s), "
                           f"above the wait budget (--max-wait {ctx.options.max_wait_seconds:g})")
    run = ctx.run()
    run.forward([ce_datum(ctx.tokens("gap"))], backward=True)
    if wait_s >= 1.0 and ctx.progress is not None:
        ctx.progress(f"{ctx.check_id}: waiting {wait_s:.1f} s (order_wait_ms) for seq_gap")
    started = time.monotonic()
    reply = run.prim("optim_step", {"adamw": adamw()}, seq=run.seq + 1, expect=None)
    elapsed = time.monotonic() - started
    expect_status(reply, 409, "seq_gap", what=f"seq {run.seq + 1} while next_seq is {run.seq}")
    if reply.error_details.get("expected_seq") != run.seq:
        raise CheckFailed(f"seq_gap details.expected_seq is "
                          f"{reply.error_details.get('expected_seq')!r}, expected {run.seq}")
    if elapsed < wait_s - 0.05:
        raise CheckFailed(f"seq_gap after {elapsed:.3f}s, before order_wait_ms ({wait_s:.3f}s)")
    if run.get()["next_seq"] != run.seq:
        raise CheckFailed("a seq_gap refusal consumed a seq")
    expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/{run.seq + 1}"), 404,
                  what="operation log entry of a seq_gap refusal")


def _replay(ctx: Ctx, run: RunHandle, name: str, seq: int, body: dict[str, Any],
            original: Reply, *, raw: bytes | None = None) -> None:
    again = run.prim(name, body, seq=seq, raw=raw, expect=None)
    if again.status != original.status or again.body != original.body:
        raise CheckFailed(f"replay of {name} seq {seq}: got {again.describe()} {again.body}, "
                          f"recorded {original.status} {original.body}")
    if not again.replayed:
        raise CheckFailed(f"replay of {name} seq {seq} lacks 'Whitney-Replayed: true'")
    _first_execution(ctx, original, f"first execution of {name} seq {seq}")


def _first_execution(ctx: Ctx, reply: Reply, what: str) -> None:
    """A first execution is not marked as a replay (ORD-3); the mock sends no header at all
    (EXT-1 allows any other value: strict-only)."""
    if reply.replayed:
        raise CheckFailed(f"{what} carries 'Whitney-Replayed: true'")
    value = reply.headers.get("whitney-replayed")
    if value is not None:
        ctx.strict_only(f"{what} carries Whitney-Replayed: {value!r} (the mock sends the header "
                        f"only on replays)")


@check("ORD-3", "replay", title="a replayed seq with a JSON-equal body returns the recorded "
       "response with Whitney-Replayed: true and has no second effect")
def ord3_replay(ctx: Ctx) -> None:
    body = _fb(ctx, "replay me")
    reference = ctx.run(seed=5)
    reference.body("forward_backward", body)
    expected = reference.step()
    if not expected["grad_norm"] > 0:  # else a second effect could not show
        raise CheckFailed("a cross_entropy forward_backward left grad_norm "
                          f"{expected['grad_norm']!r}")
    run = ctx.run(seed=5)
    first = run.prim("forward_backward", body)
    _replay(ctx, run, "forward_backward", 1, body, first)
    step = run.prim("optim_step", {"adamw": adamw()})
    assert_close(step.body["grad_norm"], expected["grad_norm"], ctx.tol,
                 "grad_norm after a replayed forward_backward (a second effect doubles it)",
                 rel=ctx.tol)
    _replay(ctx, run, "optim_step", 2, {"adamw": adamw()}, step)
    view = run.get()
    if view["step"] != 1 or view["next_seq"] != 3:
        raise CheckFailed(f"after replays: step {view['step']}, next_seq {view['next_seq']} "
                          f"(expected 1 and 3)")
    reordered = json.dumps({"adamw": dict(reversed(list(adamw().items()))), "seq": 2},
                           indent=3).encode()
    _replay(ctx, run, "optim_step", 2, {}, step, raw=reordered)
    failed = run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients"))
    _replay(ctx, run, "optim_step", 3, {"adamw": adamw()}, failed)
    expect_status(ctx.wire.call("POST", f"/runs/{run.id}/finish", {}), 200)
    _replay(ctx, run, "forward_backward", 1, body, first)


@check("ORD-3", "held-duplicate", title="a retry of a seq that is still held gets the same "
       "response once it executes (one execution); a different body gets 409 seq_conflict")
def ord3_held_duplicate(ctx: Ctx) -> None:
    run = ctx.run()
    step = {"adamw": adamw()}
    pause = ctx.hold_pause() / 2

    def send() -> Reply:
        return run.prim("optim_step", step, seq=2, expect=None)

    first = Held(send, pause)
    retry = Held(send, pause)
    # Whether each was held is read now, before the conflicting body is sent: a server that
    # holds that one too may let the first two time out meanwhile (they were held all the same).
    if not first.was_held:
        raise first.not_held("held-duplicate clause")
    if not retry.was_held:
        raise retry.not_held("held-duplicate clause (the retry)")
    started = time.monotonic()
    other = run.prim("optim_step", {"adamw": adamw(learning_rate=0.5)}, seq=2, expect=None)
    expect_status(other, 409, "seq_conflict", what=f"a different body for a held seq (answered "
                  f"after {time.monotonic() - started:.2f} s)")
    run.forward([ce_datum(ctx.tokens("release"))], backward=True)
    timeout = ctx.wire.target.timeout + 1
    a, b = first.result(timeout), retry.result(timeout)
    expect_status(a, 200, what=f"held optim_step seq 2 (answered {first.answered_after:.2f} s "
                  f"after it was sent)")
    expect_status(b, 200, what=f"retry of the held optim_step seq 2 (answered "
                  f"{retry.answered_after:.2f} s after it was sent)")
    if a.body != b.body:
        raise CheckFailed(f"held request and its retry got different responses: {a.body} vs "
                          f"{b.body}")
    replays = [r for r in (a, b) if r.replayed]
    if len(replays) != 1:
        raise CheckFailed(f"exactly one of the two should carry Whitney-Replayed: true, got "
                          f"{[r.headers.get('whitney-replayed') for r in (a, b)]}")
    _first_execution(ctx, b if replays[0] is a else a, "the held request that executed")
    if run.get()["step"] != 1:
        raise CheckFailed(f"the held step and its retry executed {run.view['step']} times")


def _contract_version(ctx: Ctx) -> tuple[int, ...]:
    """The capabilities' ``contract_version`` as numbers ("1.1" -> (1, 1)); (1, 0) if unreadable."""
    try:
        return tuple(int(part) for part in str(ctx.caps.get("contract_version")).split("."))
    except ValueError:
        return (1, 0)


@check("ORD-3", "seq-conflict", title="a replayed seq with a different body gets 409 "
       "seq_conflict and is not recorded; from contract 1.1 numbers compare by value (1.0 for "
       "1 is the same body: replayed)")
def ord3_conflict(ctx: Ctx) -> None:
    run = ctx.run()
    body = loss_body([ce_datum(ctx.tokens("abc"), weights=[1, 2])])
    first = run.prim("forward_backward", body)
    other = _fb(ctx, "different")
    run.prim("forward_backward", other, seq=1, expect=(409, "seq_conflict"))
    changed = {**body, "data": [ce_datum(ctx.tokens("abc"), weights=[1, 2.5])]}
    run.prim("forward_backward", changed, seq=1, expect=(409, "seq_conflict"))
    if _contract_version(ctx) >= (1, 1):  # JSON values: 1.0 is 1 (contract 1.0: they differ)
        floats = {**body, "data": [ce_datum(ctx.tokens("abc"), weights=[1.0, 2.0])]}
        _replay(ctx, run, "forward_backward", 1, floats, first)
    op = expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/1"), 200).body
    if op.get("result") != first.body:
        raise CheckFailed(f"operation 1 changed after seq_conflict: {op}")
    if run.get()["next_seq"] != 2:
        raise CheckFailed(f"seq_conflict moved next_seq to {run.view['next_seq']}")


@check("ORD-4", "refused-not-recorded", title="requests refused before their turn (400, 401, "
       "404, 422, 409 run_not_active) consume no seq")
def ord4_refused(ctx: Ctx) -> None:
    run = ctx.run()
    seq = run.seq
    run.prim("forward", raw=b'{"seq": %d, ' % seq, expect=400)
    run.prim("forward", loss_body([ce_datum([ctx.token(1), ctx.vocab])]), expect=422)
    run.prim("forward", _fb(ctx, "no key"), auth=NO_AUTH, expect=401)
    expect_status(ctx.wire.call("POST", f"/runs/{run.id}nope/forward", {"seq": seq,
                                                                        **_fb(ctx, "x")}), 404)
    if run.get()["next_seq"] != seq:
        raise CheckFailed(f"refused requests moved next_seq from {seq} to {run.view['next_seq']}")
    expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/{seq}"), 404,
                  what="operation log entry of refused requests")
    run.prim("forward", _fb(ctx, "now valid"))
    if run.get()["next_seq"] != seq + 1:
        raise CheckFailed("the valid request after refusals did not take the same seq")


@check("ORD-4", "state-failures-recorded", title="409 no_gradients / version_conflict and 404 "
       "version_not_found / checkpoint_not_found at a primitive's turn consume the seq, are "
       "recorded as failed and change no state")
def ord4_recorded(ctx: Ctx) -> None:
    run = ctx.run()
    cases: list[tuple[str, dict[str, Any], int, str]] = [
        ("optim_step", {"adamw": adamw()}, 409, "no_gradients"),
        ("save_weights_for_sampler", {"version": 3}, 200, ""),
        ("save_weights_for_sampler", {"version": 2}, 409, "version_conflict"),
        ("sample", ctx.sample_body(7, ctx.tokens("Q"), max_tokens=2), 404,
         "version_not_found"),
    ]
    if ctx.has_primitive("load_state"):
        cases.append(("load_state", {"checkpoint_id": f"ckpt-missing-{ctx.run_tag}",
                                     "with_optimizer": True}, 404, "checkpoint_not_found"))
    for name, body, status, etype in cases:
        seq = run.seq
        reply = run.prim(name, body, expect=(status, etype) if etype else status)
        view = run.get()
        if view["next_seq"] != seq + 1:
            raise CheckFailed(f"{name} -> {reply.status} {etype}: next_seq {view['next_seq']}, "
                              f"expected {seq + 1} (recorded failures consume their seq)")
        if etype:
            op = expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/{seq}"), 200,
                               what=f"operation {seq} ({etype})").body
            if op.get("status") != "failed" or op.get("error") != reply.body["error"]:
                raise CheckFailed(f"operation {seq} should be failed with the envelope's "
                                  f"error {reply.body['error']}, got {op}")
    view = run.get()
    if view["step"] != 0 or [v["version"] for v in view["versions"]] != [3]:
        raise CheckFailed(f"recorded failures changed state: step {view['step']}, versions "
                          f"{view['versions']}")


@check("ORD-5", "operation-log", title="GET operations/{seq}: seq, primitive, completed with the "
       "response's result or failed with its error; 404 for unrecorded seqs")
def ord5_operations(ctx: Ctx) -> None:
    run = ctx.run()
    replies = [run.prim(name, body) for name, body in _pipeline(ctx)[:2]]
    failed = run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients"))
    for seq, reply in enumerate([*replies, failed], start=1):
        op = expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/{seq}"), 200).body
        if op.get("seq") != seq:
            raise CheckFailed(f"operation {seq} reports seq {op.get('seq')!r}")
        if reply.status == 200:
            if op.get("status") != "completed" or op.get("result") != reply.body:
                raise CheckFailed(f"operation {seq}: {op} does not hold the result {reply.body}")
        elif op.get("status") != "failed" or op.get("error") != reply.body["error"]:
            raise CheckFailed(f"operation {seq}: {op} does not hold the error {reply.body}")
    for seq in (4, 10):
        expect_status(ctx.wire.call("GET", f"/runs/{run.id}/operations/{seq}"), 404,
                      what=f"operation {seq} (never sent)")

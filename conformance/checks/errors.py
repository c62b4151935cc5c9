"""ERR-1..4: the error envelope, status codes, no effect of 4xx, unknown fields."""

from __future__ import annotations

import copy
from typing import Any

import httpx

from ..context import Ctx, RunHandle, assert_close, assert_moved, expect_status, same_view
from ..payloads import adamw, ce_datum, loss_body, sampling
from ..registry import CheckFailed, CheckWarning, check
from ..wire import NO_AUTH, Reply


def envelope_problem(reply: Reply) -> str | None:
    """Why ``reply`` is not an ERR-1 envelope, or None."""
    body = reply.body
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return f"{reply.method} {reply.path} -> {reply.status}: body is not {{'error': {{...}}}}"
    error = body["error"]
    if not isinstance(error.get("type"), str) or not error["type"]:
        return f"{reply.describe()}: error.type missing or not a string"
    if not isinstance(error.get("message"), str):
        return f"{reply.describe()}: error.message missing or not a string"
    if not isinstance(error.get("details"), dict):
        return f"{reply.describe()}: error.details missing or not an object"
    return None


def _forward_body(ctx: Ctx, seq: int, **extra: Any) -> dict[str, Any]:
    return {"seq": seq, **loss_body([ce_datum(ctx.tokens("abc"))]), **extra}


@check("ERR-1", "envelope", title="every 4xx body is {error: {type, message, details}} "
       "(400, 401, 404, 409, 413, 422)")
def err1_envelope(ctx: Ctx) -> None:
    run = ctx.run()
    replies = [
        ctx.wire.call("POST", "/sessions", content=b"{oops"),
        ctx.wire.call("GET", "/capabilities", auth=NO_AUTH),
        ctx.wire.call("GET", "/runs/no-such-run-id"),
        run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients")),
        run.prim("forward", {"loss_function": "cross_entropy", "loss_config": {}}, expect=422),
    ]
    oversized = oversized_reply(ctx)
    if oversized is not None:
        replies.append(oversized)
    problems = [p for p in (envelope_problem(r) for r in replies) if p]
    if problems:
        raise CheckFailed("; ".join(problems))


def _padded(size: int) -> bytes:
    head, tail = b'{"metadata": {}, "pad": "', b'"}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


def oversized_reply(ctx: Ctx) -> Reply | None:
    """The answer to one body of max_body_bytes + 1 bytes (sent once per suite run, shared by
    ERR-1 and ERR-2); None when the limit is above the probe budget.

    A server may answer 413 and close before reading the rest; a connection closed without
    any answer is reported as a warning, not a pass.
    """
    limit = int(ctx.limits.get("max_body_bytes") or 0)
    if not 0 < limit + 1 <= ctx.options.body_probe_bytes:
        return None
    if "oversized" not in ctx.wire.cache:
        try:
            ctx.wire.cache["oversized"] = ctx.wire.call("POST", "/sessions",
                                                        content=_padded(limit + 1))
        except httpx.TransportError as exc:
            raise CheckWarning(f"a body of {limit + 1} bytes got no response "
                               f"({type(exc).__name__}); 413 not observed") from None
    oversized: Reply = ctx.wire.cache["oversized"]
    return oversized


MALFORMED = [
    b'{"seq": 1,', b"not json", b'{"seq": NaN}', b'{"seq": 1, "x": Infinity}',
    b'{"seq": -Infinity}', b"{'seq': 1}", b'{"seq": 1,}', b'{"seq": "\xff\xfe"}',
]


@check("ERR-2", "malformed-json", title="bodies that are not strict JSON (NaN, Infinity, "
       "trailing commas, bad UTF-8) get 400 malformed_json")
def err2_malformed(ctx: Ctx) -> None:
    run = ctx.run()
    for raw in MALFORMED:
        run.prim("forward", raw=raw, expect=(400, "malformed_json"))
    text = (b'{"seq": %d, "loss_function": "cross_entropy", "loss_config": {}, "data": [{'
            b'"model_input": {"token_ids": [%d]}, "loss_inputs": {"target_tokens": [%d], '
            b'"weights": [NaN]}}]}' % (run.seq, ctx.token(1), ctx.token(2)))
    run.prim("forward", raw=text, expect=(400, "malformed_json"))


@check("ERR-2", "validation-422", title="wrong types (seq a string or a fraction), numbers "
       "not finite after parsing (1e999) and out-of-range values get 422")
def err2_validation(ctx: Ctx) -> None:
    run = ctx.run()
    run.forward([ce_datum(ctx.tokens("warm"))], backward=True)
    run.save(0)
    seq = run.seq
    adam = b'"adamw": {"learning_rate": %s, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, ' \
           b'"weight_decay": 0, "grad_clip_norm": 0}'
    raw_cases = [
        (b'{"seq": "%d", %s}' % (seq, adam % b"0.01"), "seq as a string"),
        (b'{"seq": %d.5, %s}' % (seq, adam % b"0.01"), "seq with a fraction (N.5)"),
        (b'{"seq": true, %s}' % (adam % b"0.01"), "seq true"),
        (b'{%s}' % (adam % b"0.01"), "no seq"),
        (b'[]', "a JSON array body"),
        (b'{"seq": %d, %s}' % (seq, adam % b"1e999"), "learning_rate 1e999"),
        (b'{"seq": %d, "loss_function": "cross_entropy", "loss_config": {}, "data": [{'
         b'"model_input": {"token_ids": [%d, %d]}, "loss_inputs": {"target_tokens": [%d, %d], '
         b'"weights": [1, 1e999]}}]}' % (seq, ctx.token(1), ctx.token(2), ctx.token(2),
                                        ctx.token(3)),
         "weights [1, 1e999]"),
    ]
    for raw, label in raw_cases:
        primitive = "forward" if b"loss_function" in raw else "optim_step"
        expect_status(ctx.wire.call("POST", f"/runs/{run.id}/{primitive}", content=raw), 422,
                      what=label)
    good_step = {"adamw": adamw()}
    good_sample = ctx.sample_body(0, ctx.tokens("Q"), max_tokens=2)
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("seq 0", "optim_step", {**good_step, "seq": 0}),
        ("seq -1", "optim_step", {**good_step, "seq": -1}),
        ("top_k -1", "sample", _nested(good_sample, "sampling", top_k=-1)),
        ("top_k > vocab_size", "sample", _nested(good_sample, "sampling", top_k=ctx.vocab + 1)),
        ("top_p 0", "sample", _nested(good_sample, "sampling", top_p=0.0)),
        ("top_p 1.5", "sample", _nested(good_sample, "sampling", top_p=1.5)),
        ("temperature 0", "sample", _nested(good_sample, "sampling", temperature=0.0)),
        ("temperature 101", "sample", _nested(good_sample, "sampling", temperature=101.0)),
        ("max_tokens 0", "sample", _nested(good_sample, "sampling", max_tokens=0)),
        ("num_samples 0", "sample", {**good_sample, "num_samples": 0}),
        ("prompt token = vocab_size", "sample",
         {**good_sample, "prompt": {"token_ids": [ctx.vocab]}}),
        ("learning_rate -1", "optim_step", _nested(good_step, "adamw", learning_rate=-1.0)),
        ("weight_decay -0.1", "optim_step", _nested(good_step, "adamw", weight_decay=-0.1)),
        ("grad_clip_norm -1", "optim_step", _nested(good_step, "adamw", grad_clip_norm=-1.0)),
        ("beta1 1.0", "optim_step", _nested(good_step, "adamw", beta1=1.0)),
        ("beta2 -0.1", "optim_step", _nested(good_step, "adamw", beta2=-0.1)),
        ("eps 0", "optim_step", _nested(good_step, "adamw", eps=0.0)),
        ("version -1", "save_weights_for_sampler", {"version": -1}),
        ("token id -1", "forward",
         _forward_body(ctx, seq, data=[ce_datum([ctx.token(1), -1, ctx.token(2)])])),
        ("target token = vocab_size", "forward",
         _forward_body(ctx, seq, data=[ce_datum([ctx.token(1), ctx.token(2), ctx.vocab])])),
    ]
    for label, primitive, body in cases:
        reply = ctx.wire.call("POST", f"/runs/{run.id}/{primitive}", {"seq": seq, **body})
        expect_status(reply, 422, what=f"{primitive} with {label}")


def _nested(body: dict[str, Any], key: str, **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out[key].update(changes)
    return out


@check("ERR-2", "limits", title="per-request limits get 422 limit_exceeded; a body over "
       "max_body_bytes gets 413 body_too_large")
def err2_limits(ctx: Ctx) -> None:
    run = ctx.run()
    run.save(0)
    lim, model = ctx.limits, ctx.base_model
    notes: list[str] = []
    one = ce_datum([ctx.token(1), ctx.token(2)])
    n_datums = int(lim["max_datums_per_request"]) + 1
    if n_datums <= 4096:
        run.prim("forward", loss_body([one] * n_datums), expect=(422, "limit_exceeded"))
    else:
        notes.append(f"max_datums_per_request {n_datums - 1} not probed")
    max_tokens, context = int(lim["max_tokens_per_request"]), int(model["max_context"])
    per_datum = max(1, min(context, 2048) - 1)
    needed = max_tokens // per_datum + 1
    if needed <= int(lim["max_datums_per_request"]) and max_tokens <= 300_000:
        datum = ce_datum([ctx.token(1)] * (per_datum + 1))
        run.prim("forward", loss_body([datum] * needed), expect=(422, "limit_exceeded"))
    else:
        notes.append(f"max_tokens_per_request {max_tokens} not probed")
    prompt = {"token_ids": ctx.tokens("Q")}
    run.prim("sample", {"version": 0, "prompt": prompt, "num_samples":
                        int(lim["max_num_samples"]) + 1, "sampling": sampling(max_tokens=1)},
             expect=(422, "limit_exceeded"))
    run.prim("sample", {"version": 0, "prompt": prompt, "num_samples": 1,
                        "sampling": sampling(max_tokens=int(lim["max_sample_tokens"]) + 1)},
             expect=(422, "limit_exceeded"))
    long_prompt = context - min(int(lim["max_sample_tokens"]), context) + 1
    if 0 < long_prompt <= 300_000:
        run.prim("sample", {"version": 0, "prompt": {"token_ids": [ctx.token(1)] * long_prompt},
                            "num_samples": 1, "sampling": sampling(
                                max_tokens=min(int(lim["max_sample_tokens"]), context))},
                 expect=(422, "limit_exceeded"))
    limit = int(lim["max_body_bytes"])
    oversized = oversized_reply(ctx)
    if oversized is not None:
        expect_status(oversized, 413, "body_too_large", what=f"body of {limit + 1} bytes")
    else:
        notes.append(f"max_body_bytes {limit} above the probe budget")
    if notes:
        raise CheckWarning("not exercised: " + "; ".join(notes))


def _snapshot(run: RunHandle, probe: list[int]) -> tuple[dict[str, Any], list[float]]:
    view = run.get()
    return {k: view.get(k) for k in ("state", "step", "versions")}, run.score(probe)


def _refused_battery(ctx: Ctx, run: RunHandle) -> None:
    """4xx requests of every primitive, including a forward_backward whose LAST datum is bad
    (a server must not keep the first datum's gradient) and failures recorded at their turn."""
    bad_fb = loss_body([ce_datum(ctx.tokens("good")), ce_datum([ctx.token(1), ctx.vocab])])
    run.prim("forward_backward", bad_fb, expect=422)
    run.prim("forward_backward", loss_body([ce_datum(ctx.tokens("good"))],
                                           config={"no_such_key": 1}), expect=422)
    run.prim("optim_step", {"adamw": adamw(learning_rate=-1.0)}, expect=422)
    run.prim("optim_step", {"adamw": adamw(beta1=1.5)}, expect=422)
    run.prim("save_weights_for_sampler", {"version": -5}, expect=422)
    run.prim("sample", ctx.sample_body(0, [ctx.vocab + 5]), expect=422)
    if ctx.has_primitive("load_state"):
        run.prim("load_state", {"checkpoint_id": 12, "with_optimizer": True}, expect=422)
    run.prim("forward_backward", raw=b'{"seq": %d, "data": [' % run.seq, expect=400)
    # Failures at the primitive's turn (recorded, ORD-4) must not change state either.
    run.prim("save_weights_for_sampler", {"version": 0}, expect=(409, "version_conflict"))
    run.prim("sample", ctx.sample_body(99, ctx.tokens("Q")), expect=(404, "version_not_found"))


@check("ERR-3", "no-state-change", title="4xx requests leave weights, gradient buffer, "
       "AdamW moments, versions and step exactly as before")
def err3_no_state_change(ctx: Ctx) -> None:
    data = [ce_datum(ctx.tokens("state"))]
    probe = ctx.tokens("probe!")
    reference, subject = ctx.run(seed=31), ctx.run(seed=31)
    for run in (reference, subject):
        run.save(0)
    untrained = reference.score(probe)
    reference.forward(data, backward=True)
    expected1 = reference.step()
    reference.forward(data, backward=True)
    expected2 = reference.step(beta1=0.5)
    expected_state = _snapshot(reference, probe)
    assert_moved(expected_state[1], untrained, ctx.tol, "two accepted optimizer steps")

    subject.forward(data, backward=True)
    _refused_battery(ctx, subject)
    got1 = subject.step()
    subject.forward(data, backward=True)
    _refused_battery(ctx, subject)
    got2 = subject.step(beta1=0.5)
    _refused_battery(ctx, subject)
    got_state = _snapshot(subject, probe)
    tol = ctx.tol
    for name, exp, got in (("first step", expected1, got1), ("second step", expected2, got2)):
        for key in ("grad_norm", "update_norm"):
            assert_close(got[key], exp[key], tol, f"{name} {key} after refused requests",
                         rel=tol)
    if got_state[0]["step"] != expected_state[0]["step"] or \
            [v["version"] for v in got_state[0]["versions"]] != \
            [v["version"] for v in expected_state[0]["versions"]]:
        raise CheckFailed(f"step/versions differ after refused requests: {got_state[0]} vs "
                          f"{expected_state[0]}")
    assert_close(got_state[1], expected_state[1], tol, "forward logprobs after refused requests")


UNKNOWN_FIELD_CASES = [
    ("top level of forward_backward", "forward_backward", ("",)),
    ("datum", "forward_backward", ("data", 0)),
    ("model_input", "forward_backward", ("data", 0, "model_input")),
    ("adamw (a misspelled grad_clip_norm)", "optim_step", ("adamw",)),
    ("top level of optim_step", "optim_step", ("",)),
    ("sampling", "sample", ("sampling",)),
    ("prompt", "sample", ("prompt",)),
    ("top level of save_weights_for_sampler", "save_weights_for_sampler", ("",)),
    ("top level of logprobs", "logprobs", ("",)),
]


@check("ERR-4", "unknown-field", title="a body field the contract does not define gets 422 "
       "unknown_field, at every nesting level, with no effect")
def err4_unknown_field(ctx: Ctx) -> None:
    run = ctx.run()
    run.save(0)
    datum = ce_datum(ctx.tokens("field"))
    bodies: dict[str, dict[str, Any]] = {
        "forward_backward": loss_body([datum]),
        "optim_step": {"adamw": adamw()},
        "sample": ctx.sample_body(0, ctx.tokens("Q"), max_tokens=2),
        "save_weights_for_sampler": {"version": 1},
        "logprobs": {"version": 0, "token_ids": ctx.tokens("Qa")},
    }
    before = run.get()
    for _label, primitive, path in UNKNOWN_FIELD_CASES:
        if primitive == "logprobs" and not ctx.has_primitive("logprobs"):
            continue
        body = copy.deepcopy(bodies[primitive])
        node: Any = body
        for part in path:
            if part != "":
                node = node[part]
        node["grad_clip" if primitive == "optim_step" and path == ("adamw",) else "bogus"] = 1
        run.prim(primitive, body, expect=(422, "unknown_field"))
    session_reply = ctx.wire.call("POST", "/sessions", {"metadata": ctx.tag(), "bogus": True})
    expect_status(session_reply, 422, "unknown_field", what="create session with an extra field")
    run_body = ctx.run_body()
    run_body["lora"]["dropout"] = 0.1
    reply = ctx.wire.call("POST", f"/sessions/{run.session_id}/runs", run_body)
    expect_status(reply, 422, "unknown_field", what="create run with lora.dropout")
    after = run.get()
    if not same_view(after, before):
        raise CheckFailed(f"422 unknown_field requests changed the run: {before} -> {after}")

"""OPT-1..4: explicit AdamW, torch semantics, clipping, no step without gradients.

What is observable black-box is ``grad_norm`` and ``update_norm`` of each step (and scores
after it). For a fresh optimizer (t = 1) torch's AdamW moves each parameter by
``u = lr·g/(|g| + eps)`` (bias-corrected m̂ = g, sqrt(v̂) = |g|), plus ``lr·wd·θ``. Hence:

- step-1 updates do not depend on beta1, beta2 (bias correction) — OPT-2;
- with ``eps`` >> every |g_i| (eps = 1e4·grad_norm) the step is SGD with rate lr/eps, so
  ``update_norm = lr·grad_norm/eps`` to 1e-4 relative — OPT-2, and with clipping to c,
  ``lr·c/eps`` while ``grad_norm`` still reports the unclipped norm — OPT-3;
- in that regime a second step with a zero gradient moves by lr·m̂₂/eps with
  m̂₂ = beta1·g/(1 + beta1): ``update_norm₂/update_norm₁ = beta1/(1 + beta1)`` — OPT-2;
- with a zero gradient the only change is decoupled decay, ``update_norm = lr·wd·‖θ‖``,
  linear in wd (an L2 penalty through Adam would give ~lr·sqrt(#params) instead) — OPT-2;
- ``u(c·g, c·eps) = u(g, eps)``: eps is added to sqrt(v̂), outside the root — OPT-2.
"""

from __future__ import annotations

from typing import Any

from ..context import Ctx, RunHandle, assert_close, assert_moved
from ..payloads import adamw, ce_datum, rl_datum
from ..registry import CheckFailed, CheckWarning, check

FIELDS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
SEED = 61


def _data(ctx: Ctx) -> list[dict[str, Any]]:
    return [ce_datum(ctx.tokens("optimizer probe")), ce_datum(ctx.tokens("two"))]


def zero_gradient_data(ctx: Ctx) -> list[dict[str, Any]]:
    """A datum whose loss has an exactly zero gradient (weights 0, or advantages 0)."""
    tokens = ctx.tokens("zero")
    ce = ctx.losses().get("cross_entropy") or {}
    if "weights" in (ce.get("inputs") or {}).get("optional", []):
        return [ce_datum(tokens, [0.0] * (len(tokens) - 1))]
    if ctx.has_loss("importance_sampling"):
        return [rl_datum(tokens, [0.0] * (len(tokens) - 1), [0.0] * (len(tokens) - 1))]
    raise CheckWarning("no way to send a zero gradient (cross_entropy weights or "
                       "importance_sampling not declared)")


def _zero_loss(ctx: Ctx) -> str:
    ce = ctx.losses().get("cross_entropy") or {}
    return "cross_entropy" if "weights" in (ce.get("inputs") or {}).get("optional", []) \
        else "importance_sampling"


def calibrate(ctx: Ctx) -> float:
    """grad_norm of the standard data on a fresh run with seed SEED."""
    run = ctx.run(seed=SEED)
    run.forward(_data(ctx), backward=True)
    norm = float(run.step()["grad_norm"])
    if not norm > 0:
        raise CheckFailed(f"grad_norm of a cross_entropy batch is {norm!r}")
    return norm


def _fresh_with_grad(ctx: Ctx) -> RunHandle:
    run = ctx.run(seed=SEED)
    run.forward(_data(ctx), backward=True)
    return run


def sgd_regime(grad_norm: float) -> dict[str, Any]:
    """AdamW settings under which a first step is SGD with update_norm ~ 0.01."""
    eps = 1e4 * grad_norm
    return adamw(learning_rate=0.01 * eps / grad_norm, eps=eps)


@check("OPT-1", "explicit", title="each of the six AdamW fields is required (missing or null "
       "-> 422), no server defaults, and the refusal changes nothing")
def opt1_explicit(ctx: Ctx) -> None:
    expected = calibrate(ctx)
    run = _fresh_with_grad(ctx)
    for field in FIELDS:
        body = adamw()
        del body[field]
        run.prim("optim_step", {"adamw": body}, expect=422)
        run.prim("optim_step", {"adamw": {**adamw(), field: None}}, expect=422)
    run.prim("optim_step", {}, expect=422)
    result = run.step()
    if result["step"] != 1:
        raise CheckFailed(f"first valid step reports step {result['step']}")
    assert_close(result["grad_norm"], expected, ctx.tol, "grad_norm after refused optim_steps "
                 "(the gradient buffer must be intact)", rel=ctx.tol)


@check("OPT-2", "bias-correction", title="a first AdamW step does not depend on beta1/beta2 "
       "(torch's bias-corrected moments), and it moves the weights")
def opt2_bias_correction(ctx: Ctx) -> None:
    probe = ctx.tokens("after the step")
    results: list[tuple[float, float, dict[str, Any], list[float]]] = []
    for beta1, beta2 in ((0.9, 0.999), (0.5, 0.9), (0.0, 0.0)):
        run = _fresh_with_grad(ctx)
        before = run.score(probe) if not results else None
        step = run.step(beta1=beta1, beta2=beta2)
        results.append((beta1, beta2, step, run.score(probe)))
        if before is not None:
            assert_moved(results[0][3], before, ctx.tol, "the first AdamW step")
    _, _, base, base_lp = results[0]
    for beta1, beta2, step, lp in results[1:]:
        what = f"first step with betas ({beta1}, {beta2}) vs (0.9, 0.999)"
        assert_close(step["update_norm"], base["update_norm"], ctx.tol, f"{what}: update_norm",
                     rel=1e-6 + ctx.tol)
        assert_close(lp, base_lp, ctx.tol, f"{what}: logprobs after the step")


@check("OPT-2", "sgd-regime-and-momentum", title="eps >> |g|: update_norm = lr·grad_norm/eps; "
       "a following zero-gradient step moves by beta1/(1+beta1) of that (first moment)")
def opt2_momentum(ctx: Ctx) -> None:
    grad_norm = calibrate(ctx)
    settings = sgd_regime(grad_norm)
    settings["beta1"] = 0.5
    run = _fresh_with_grad(ctx)
    first = run.step(**settings)
    assert_close(first["grad_norm"], grad_norm, ctx.tol, "grad_norm of the same batch",
                 rel=ctx.tol)
    expected = settings["learning_rate"] * grad_norm / settings["eps"]
    assert_close(first["update_norm"], expected, 0.0,
                 "update_norm with eps = 1e4·grad_norm (SGD regime: lr·grad_norm/eps)", rel=1e-3)
    run.forward(zero_gradient_data(ctx), _zero_loss(ctx), backward=True)
    second = run.step(**settings)
    if second["grad_norm"] != 0:
        raise CheckFailed(f"grad_norm of a zero-weight batch is {second['grad_norm']!r}")
    assert_close(second["update_norm"], first["update_norm"] * 0.5 / 1.5, 0.0,
                 "second step with zero gradient: update_norm = beta1/(1+beta1) x first",
                 rel=2e-3)


@check("OPT-2", "decoupled-weight-decay", title="weight decay is decoupled (lr·wd·θ): with a "
       "zero gradient update_norm is linear in wd")
def opt2_weight_decay(ctx: Ctx) -> None:
    norms = []
    for wd in (0.1, 0.2):
        run = ctx.run(seed=SEED)
        run.forward(zero_gradient_data(ctx), _zero_loss(ctx), backward=True)
        norms.append(run.step(learning_rate=0.01, weight_decay=wd)["update_norm"])
    if not norms[0] > 0:
        raise CheckWarning(f"inconclusive: weight decay moved nothing (update_norm "
                           f"{norms[0]!r}; all LoRA parameters zero?)")
    assert_close(norms[1], 2 * norms[0], 0.0, "update_norm with wd 0.2 vs 2 x wd 0.1 "
                 "(decoupled decay, zero gradient)", rel=1e-4)


@check("OPT-2", "eps-outside-sqrt", title="update(c·g, c·eps) = update(g, eps): eps is added "
       "to sqrt(v̂), not inside the root")
def opt2_eps(ctx: Ctx) -> None:
    grad_norm = calibrate(ctx)
    probe = ctx.tokens("after the step")
    eps = 1e-3 * grad_norm
    single = ctx.run(seed=SEED)
    single.forward(_data(ctx), backward=True)
    a = single.step(eps=eps)
    a_lp = single.score(probe)
    scaled = ctx.run(seed=SEED)
    scaled.forward(_data(ctx) * 4, backward=True)
    b = scaled.step(eps=4 * eps)
    b_lp = scaled.score(probe)
    assert_close(b["grad_norm"], 4 * a["grad_norm"], 0.0, "grad_norm of the batch sent 4 times",
                 rel=1e-6 + ctx.tol)
    assert_close(b["update_norm"], a["update_norm"], 0.0, "update_norm of (4g, 4eps) vs "
                 "(g, eps)", rel=1e-6 + ctx.tol)
    assert_close(b_lp, a_lp, ctx.tol, "logprobs after (4g, 4eps) vs (g, eps)")


@check("OPT-3", "clip", title="gradients are clipped to grad_clip_norm before the update "
       "(0 = off); grad_norm reports the norm before clipping")
def opt3_clip(ctx: Ctx) -> None:
    grad_norm = calibrate(ctx)
    settings = sgd_regime(grad_norm)
    rate = settings["learning_rate"] / settings["eps"]
    for clip, applied in ((grad_norm / 4, grad_norm / 4), (0.0, grad_norm),
                          (4 * grad_norm, grad_norm)):
        run = _fresh_with_grad(ctx)
        result = run.step(**{**settings, "grad_clip_norm": clip})
        assert_close(result["grad_norm"], grad_norm, ctx.tol,
                     f"grad_norm with grad_clip_norm {clip:g} (must be before clipping)",
                     rel=ctx.tol)
        assert_close(result["update_norm"], rate * applied, 0.0,
                     f"update_norm with grad_clip_norm {clip:g} (SGD regime: lr/eps x "
                     f"clipped norm {applied:g})", rel=2e-3)


@check("OPT-4", "no-gradients", title="optim_step with nothing accumulated since the last "
       "step: 409 no_gradients, step unchanged")
def opt4_no_gradients(ctx: Ctx) -> None:
    run = ctx.run()
    run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients"))
    run.forward(_data(ctx), backward=True)
    run.step()
    run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients"))
    view = run.get()
    if view["step"] != 1:
        raise CheckFailed(f"step is {view['step']} after one successful step")

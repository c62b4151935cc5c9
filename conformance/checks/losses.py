"""LOSS-1..6 and GRAD-1: loss values from returned logprobs, gradients through their effect.

Values: each declared loss is recomputed from the per-token logprobs the server returns
(``reference.loss_value``), with ratios r chosen on both sides of the clip range so every
branch of ppo/cispo is exercised, masks and weights with zeros, and two datums per request.

Gradients, black-box: ``reference.dloss_dp`` gives ∂loss/∂p per position. A loss and
``cross_entropy`` with ``weights = -∂loss/∂p`` on the same tokens have the same parameter
gradient, so on two fresh runs with the same LoRA seed they must report the same
``grad_norm`` and, after the same optimizer step, score the same logprobs. The comparison
step clips the gradient to a small norm and uses a large eps, which makes the update a smooth
(nearly linear) function of the gradient's direction while ``grad_norm`` (before clipping)
carries its scale.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..context import Ctx, RunHandle, assert_close, expect_status
from ..payloads import adamw, ce_datum, rl_datum, with_inputs
from ..reference import dloss_dp, loss_value
from ..registry import CheckFailed, CheckUnsupported, CheckWarning, check

PROBE_STEP = adamw(learning_rate=10.0, eps=1.0, grad_clip_norm=1e-3)
# No ratio sits on a clip bound of CONFIGS (0.8/1.2, 0.9/1.1, 0.75/1.4): the loss has a kink
# there, and which side the server's r = exp(p - q) lands on is float rounding.
RATIOS = [0.5, 0.85, 1.0, 1.12, 1.5, 0.7, 1.3, 2.0, 0.95, 0.6, 1.05, 1.8]
ADVANTAGES = [1.0, -1.0, 0.5, -2.0, 1.5, 1.0, -0.5, -1.0, 2.0, -1.5, 0.25, 1.0]
MASK = [1, 1, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1]
WEIGHTS = [1.0, 0.5, 2.0, 0.0, 1.0, 1.5, 1.0, 0.25, 3.0, 1.0, 0.5, 1.0]
TEXTS = ("Loss probe one", "second datum!")


def _cycle(values: Sequence[float], n: int) -> list[float]:
    return [values[i % len(values)] for i in range(n)]


def _base_data(ctx: Ctx) -> list[dict[str, Any]]:
    return [ce_datum(ctx.tokens(text)) for text in TEXTS]


def build_inputs(ctx: Ctx, loss: str, data: list[dict[str, Any]],
                 p_per_datum: list[list[float]]) -> list[dict[str, Any]]:
    """Datums for ``loss`` whose ratios, advantages, masks and weights hit every branch."""
    spec = ctx.losses()[loss]["inputs"]
    optional = set(spec.get("optional") or [])
    out = []
    for k, (datum, p) in enumerate(zip(data, p_per_datum, strict=False)):
        n = len(p)
        shift = 3 * k
        if loss == "cross_entropy":
            weights = _cycle(WEIGHTS[shift:] + WEIGHTS[:shift], n) if "weights" in optional \
                else None
            out.append(with_inputs(datum, weights=weights))
            continue
        ratios = _cycle(RATIOS[shift:] + RATIOS[:shift], n)
        q = [pi - math.log(r) for pi, r in zip(p, ratios, strict=False)]
        mask = _cycle(MASK[shift:] + MASK[:shift], n) if "mask" in optional else None
        tokens = datum["model_input"]["token_ids"] + datum["loss_inputs"]["target_tokens"][-1:]
        out.append(rl_datum(tokens, q, _cycle(ADVANTAGES[shift:] + ADVANTAGES[:shift], n), mask))
    return out


CONFIGS: dict[str, list[dict[str, float]]] = {
    "cross_entropy": [{}],
    "importance_sampling": [{}],
    "ppo": [{}, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}],
    "cispo": [{}, {"clip_low_threshold": 0.75, "clip_high_threshold": 1.4}],
    "dro": [{}, {"beta": 0.3}],
}


def check_loss_value(ctx: Ctx, run: RunHandle, loss: str, data: list[dict[str, Any]],
                     config: dict[str, float], p_expected: list[list[float]], *,
                     backward: bool = False) -> dict[str, Any]:
    """Send ``loss`` and compare loss, metrics and outputs with the reference."""
    result = run.forward(data, loss, config, backward=backward)
    outputs = [o["logprobs"] for o in result["outputs"]]
    what = f"{'forward_backward' if backward else 'forward'}({loss}, {config or 'defaults'})"
    if len(outputs) != len(data):
        raise CheckFailed(f"{what}: {len(outputs)} outputs for {len(data)} datums")
    for k, (got, exp) in enumerate(zip(outputs, p_expected, strict=False)):
        assert_close(got, exp, ctx.tol, f"{what} outputs[{k}].logprobs")
    inputs = [d["loss_inputs"] for d in data]
    expected, scale = loss_value(loss, outputs, inputs, config)
    assert_close(result["loss"], expected, ctx.tol * (1.0 + scale),
                 f"{what} loss vs the contract formula summed over positions and datums")
    metrics = result.get("metrics") or {}
    if metrics.get("loss:sum") != result["loss"]:
        raise CheckFailed(f"{what}: metrics['loss:sum'] {metrics.get('loss:sum')!r} != loss "
                          f"{result['loss']!r}")
    positions = sum(len(d["model_input"]["token_ids"]) for d in data)
    if metrics.get("tokens") != positions:
        raise CheckFailed(f"{what}: metrics.tokens {metrics.get('tokens')!r}, the request has "
                          f"{positions} positions")
    return result


def probe_effect(ctx: Ctx, seed: int, accumulate: Callable[[RunHandle], Any],
                 probe: list[int]) -> tuple[dict[str, Any], list[float], list[float]]:
    """Fresh run: ``accumulate`` gradients, take PROBE_STEP; (step result, logprobs of
    ``probe`` before, after)."""
    run = ctx.run(seed=seed)
    before = run.score(probe)
    accumulate(run)
    result = run.step(**PROBE_STEP)
    after = run.score(probe)
    return result, before, after


def assert_same_gradient(ctx: Ctx, what: str, seed: int, subject: Callable[[RunHandle], Any],
                         reference: Callable[[RunHandle], Any]) -> None:
    """Two fresh runs, same seed: ``subject`` and ``reference`` must accumulate one gradient."""
    probe = ctx.tokens("gradient probe text")
    got, before, got_after = probe_effect(ctx, seed, subject, probe)
    exp, _, exp_after = probe_effect(ctx, seed, reference, probe)
    tol = ctx.tol
    assert_close(got["grad_norm"], exp["grad_norm"], tol, f"{what}: grad_norm", rel=1e3 * tol)
    assert_close(got["update_norm"], exp["update_norm"], tol, f"{what}: update_norm",
                 rel=1e3 * tol)
    assert_close(got_after, exp_after, tol, f"{what}: logprobs after the step")
    moved = max(abs(a - b) for a, b in zip(exp_after, before, strict=False))
    if moved < 20 * tol:
        raise CheckWarning(f"{what}: inconclusive, the probe step moved logprobs by {moved:g} "
                           f"only (tolerance {tol:g})")


def _loss_check(loss: str) -> Callable[[Ctx], None]:
    def run_check(ctx: Ctx) -> None:
        base = _base_data(ctx)
        # The gradient runs below use the same seed: dloss/dp is taken at these logprobs.
        run = ctx.run(seed=41)
        p = [o["logprobs"] for o in run.forward(base)["outputs"]]
        data = build_inputs(ctx, loss, base, p)
        for config in CONFIGS[loss]:
            check_loss_value(ctx, run, loss, data, config, p)
        config = CONFIGS[loss][-1]
        check_loss_value(ctx, run, loss, data, config, p, backward=True)
        if loss == "cross_entropy":
            doubled = [with_inputs(d, weights=[2.0 * w for w in d["loss_inputs"].get(
                "weights", [1.0] * len(d["loss_inputs"]["target_tokens"]))]) for d in data]
            assert_same_gradient(
                ctx, "cross_entropy with weights 2w vs each datum sent twice", 43,
                lambda r: r.forward(doubled, backward=True),
                lambda r: r.forward(data + data, backward=True))
            return
        if not (ctx.has_loss("cross_entropy")
                and "weights" in ctx.losses()["cross_entropy"]["inputs"].get("optional", [])):
            raise CheckWarning("gradient not checked: cross_entropy with weights not declared")
        equivalent = [with_inputs(ce_datum(d["model_input"]["token_ids"]
                                           + d["loss_inputs"]["target_tokens"][-1:]),
                                  weights=[-c for c in dloss_dp(loss, pk, d["loss_inputs"],
                                                                 config)])
                      for d, pk in zip(data, p, strict=False)]
        assert_same_gradient(
            ctx, f"{loss} vs cross_entropy weighted by -dloss/dp", 41,
            lambda r: r.forward(data, loss, config, backward=True),
            lambda r: r.forward(equivalent, backward=True))

    return run_check


_LOSS_RULES = {"cross_entropy": "LOSS-1", "importance_sampling": "LOSS-2", "ppo": "LOSS-3",
               "cispo": "LOSS-4", "dro": "LOSS-5"}
for _name, _rule in _LOSS_RULES.items():
    check(_rule, _name, capability=f"loss_functions.{_name}",
          title=f"{_name}: loss = the contract formula summed over positions and datums "
                f"(from the returned logprobs); gradient equal to its cross_entropy "
                f"equivalent")(_loss_check(_name))


@check("LOSS-6", "refusals", title="unknown loss, unknown or out-of-range config, missing or "
       "undeclared input, wrong length, non-finite number: 422, no seq consumed")
def loss6_refusals(ctx: Ctx) -> None:
    declared = [name for name in ("ppo", "cispo", "dro", "importance_sampling")
                if ctx.has_loss(name)]
    if not declared:
        raise CheckUnsupported("no RL loss declared")
    loss = declared[0]
    run = ctx.run()
    base = _base_data(ctx)[:1]
    p = [run.forward(base)["outputs"][0]["logprobs"]]
    datum = build_inputs(ctx, loss, base, p)[0]
    n = len(datum["loss_inputs"]["target_tokens"])
    bounds = ctx.losses()[loss].get("config") or {}
    cases: list[tuple[str, dict[str, Any], str | None]] = [
        ("unknown loss", {"loss_function": "reinforce_plus_plus", "loss_config": {},
                          "data": [datum]}, "unsupported_loss_function"),
        ("unknown config key", {"loss_function": loss, "loss_config": {"temperature": 1.0},
                                "data": [datum]}, None),
        ("no loss_config", {"loss_function": loss, "data": [datum]}, None),
        ("missing advantages", {"loss_function": loss, "loss_config": {},
                                "data": [with_inputs(datum, advantages=None)]}, None),
        ("advantages one short", {"loss_function": loss, "loss_config": {}, "data": [
            with_inputs(datum, advantages=[1.0] * (n - 1))]}, None),
        ("undeclared input 'weights'", {"loss_function": loss, "loss_config": {}, "data": [
            with_inputs(datum, weights=[1.0] * n)]}, "unexpected_input"),
    ]
    for key, spec in bounds.items():
        cases.append((f"{key} above max", {"loss_function": loss, "loss_config": {
            key: float(spec["max"]) + 1.0}, "data": [datum]}, None))
    for _label, body, etype in cases:
        run.prim("forward", body, expect=(422, etype) if etype else 422)
    raw = (b'{"seq": %d, "loss_function": "%s", "loss_config": {}, "data": [{"model_input": '
           b'{"token_ids": [%d, %d]}, "loss_inputs": {"target_tokens": [%d, %d], "logprobs": '
           b'[-1, -1], "advantages": [1e999, 1]}}]}'
           % (run.seq, loss.encode(), ctx.token(1), ctx.token(2), ctx.token(2), ctx.token(3)))
    expect_status(ctx.wire.call("POST", f"/runs/{run.id}/forward", content=raw), 422,
                  what="advantages 1e999 (not finite after parsing)")
    if run.get()["next_seq"] != run.seq:
        raise CheckFailed("a refused loss request consumed a seq")


@check("GRAD-1", "forward-no-gradient", title="forward never touches the gradient buffer")
def grad1_forward(ctx: Ctx) -> None:
    d1, d2 = (ce_datum(ctx.tokens(t)) for t in ("first batch", "scored only"))
    run = ctx.run()
    run.forward([d1])
    run.prim("optim_step", {"adamw": adamw()}, expect=(409, "no_gradients"))
    assert_same_gradient(
        ctx, "forward_backward(d1) + forward(d2) vs forward_backward(d1)", 51,
        lambda r: (r.forward([d1], backward=True), r.forward([d2])),
        lambda r: r.forward([d1], backward=True))


@check("GRAD-1", "accumulate", title="two forward_backward then optim_step equal one "
       "forward_backward on the union of their data")
def grad1_accumulate(ctx: Ctx) -> None:
    d1, d2 = (ce_datum(ctx.tokens(t)) for t in ("first half", "second half!"))
    assert_same_gradient(
        ctx, "forward_backward(d1) + forward_backward(d2) vs forward_backward(d1 + d2)", 53,
        lambda r: (r.forward([d1], backward=True), r.forward([d2], backward=True)),
        lambda r: r.forward([d1, d2], backward=True))
    if not ctx.has_loss("importance_sampling"):
        return
    tokens = ctx.tokens("mixed losses")
    p = ctx.run(seed=55).score(tokens)
    rl = rl_datum(tokens, p, [-1.0] * len(p))
    # At r = 1, importance_sampling with A = -1 has dloss/dp = +1: the opposite of cross_entropy
    # with weight 1, so the two accumulate to (almost) nothing but a weight-2 datum.
    assert_same_gradient(
        ctx, "forward_backward(ce w=3) + forward_backward(IS A=-1) vs ce w=2", 55,
        lambda r: (r.forward([ce_datum(tokens, [3.0] * len(p))], backward=True),
                   r.forward([rl], "importance_sampling", backward=True)),
        lambda r: r.forward([ce_datum(tokens, [2.0] * len(p))], backward=True))

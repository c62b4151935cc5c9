"""``build_loss`` variants over the same loop, each declaring the loss it needs.

Every ``build_loss(sample, cycle, request, ctx) -> dict`` scores one group (the ``sample``
response for one prompt), computes advantages and returns a ``forward_backward`` body without
``seq``. ``ctx.reward(tokens)`` is the task's reward bound to this request's prompt.

On-policy (one ``optim_step`` per batch of samples, the seed's loop) the ratio r = exp(p - q)
is exactly 1 at the update, so ``ppo`` and ``cispo`` give the gradient of
``importance_sampling`` and ``dro``'s β term vanishes: they differ once a batch is reused
(``LoopConfig.updates_per_cycle > 1``), which is what their clipping and β are for.

A group whose rewards are all equal has no signal: every variant raises
:class:`UniformRewardError` (a ``ValueError`` with the seed's message), never a silent no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from grpo.client import RunHandle
from grpo.helpers import (
    all_zero,
    forward_backward_payload,
    group_mean_advantages,
    leave_one_out_advantages,
    rl_datum,
)

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "BuildLoss",
    "LossContext",
    "UniformRewardError",
    "get_algorithm",
    "with_kl_penalty",
]

CLIP_CONFIG = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
DRO_CONFIG = {"beta": 0.05}


class UniformRewardError(ValueError):
    """The seed's "reward is uniform across the group, no gradient signal"."""


@dataclass
class LossContext:
    """What the loop hands to ``build_loss`` besides the sample and its request.

    ``reward(tokens)`` scores one completion of this request's prompt (and records the reward
    for the loop's metrics); ``run`` is the live run (e.g. for ``logprobs``); ``group`` is the
    index of this prompt within the cycle.
    """

    reward: Callable[[Sequence[int]], float]
    run: RunHandle
    group: int = 0


BuildLoss = Callable[[dict[str, Any], int, dict[str, Any], LossContext], dict[str, Any]]


def _uniform(cycle: int) -> UniformRewardError:
    return UniformRewardError(
        f"cycle {cycle}: reward is uniform across the group, no gradient signal"
    )


def grpo(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """GRPO (the seed's reference): std-normalised group advantages, ``importance_sampling``."""
    prompt_tokens = request["prompt"]["token_ids"]
    sequences = sample["sequences"]
    rewards_G = [ctx.reward(sequence["tokens"]) for sequence in sequences]
    advantages_G = group_mean_advantages(rewards_G, normalize_std=True)
    if all_zero(advantages_G):
        raise _uniform(cycle)
    data = [
        rl_datum(prompt_tokens, sequence["tokens"], sequence["logprobs"], advantage)
        for sequence, advantage in zip(sequences, advantages_G, strict=False)
    ]
    return forward_backward_payload(data, "importance_sampling")


def _policy_gradient(
    sample: dict[str, Any],
    cycle: int,
    request: dict[str, Any],
    advantages_G: list[float],
    loss_function: str,
    loss_config: dict[str, float] | None = None,
) -> dict[str, Any]:
    if all_zero(advantages_G):
        raise _uniform(cycle)
    prompt_tokens = request["prompt"]["token_ids"]
    data = [
        rl_datum(prompt_tokens, sequence["tokens"], sequence["logprobs"], advantage)
        for sequence, advantage in zip(sample["sequences"], advantages_G, strict=False)
    ]
    return forward_backward_payload(data, loss_function, loss_config)


def _rewards(sample: dict[str, Any], ctx: LossContext) -> list[float]:
    return [ctx.reward(sequence["tokens"]) for sequence in sample["sequences"]]


def dr_grpo(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """Dr. GRPO: mean-centred only (no std division; the losses never divide by length)."""
    advantages_G = group_mean_advantages(_rewards(sample, ctx), normalize_std=False)
    return _policy_gradient(sample, cycle, request, advantages_G, "importance_sampling")


def rloo(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """RLOO: each sample's baseline is the mean reward of the other G-1 samples."""
    advantages_G = leave_one_out_advantages(_rewards(sample, ctx))
    return _policy_gradient(sample, cycle, request, advantages_G, "importance_sampling")


def ppo(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """PPO-clip on std-normalised group advantages, ratio bounds [0.8, 1.2] sent explicitly."""
    advantages_G = group_mean_advantages(_rewards(sample, ctx), normalize_std=True)
    return _policy_gradient(sample, cycle, request, advantages_G, "ppo", CLIP_CONFIG)


def cispo(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """CISPO: clipped, stop-gradient importance weight times p·A, std-normalised advantages."""
    advantages_G = group_mean_advantages(_rewards(sample, ctx), normalize_std=True)
    return _policy_gradient(sample, cycle, request, advantages_G, "cispo", CLIP_CONFIG)


def dro(
    sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
) -> dict[str, Any]:
    """DRO: p·A with a quadratic β/2·(p - q)² tether to the sampler, mean-centred advantages."""
    advantages_G = group_mean_advantages(_rewards(sample, ctx), normalize_std=False)
    return _policy_gradient(sample, cycle, request, advantages_G, "dro", DRO_CONFIG)


@dataclass(frozen=True)
class Algorithm:
    """A ``build_loss`` and what it needs from the server (checked before any session, DISC-2).

    ``loss_function``/``loss_config`` must be what ``build_loss`` puts in its payloads (the loop
    refuses a payload that disagrees); ``primitives`` are the primitives it calls itself.
    """

    name: str
    build_loss: BuildLoss
    loss_function: str
    loss_config: dict[str, float] = field(default_factory=dict)
    primitives: tuple[str, ...] = ()
    loss_inputs: tuple[str, ...] = ("target_tokens", "logprobs", "advantages", "mask")


ALGORITHMS: dict[str, Algorithm] = {
    "grpo": Algorithm("grpo", grpo, "importance_sampling"),
    "dr_grpo": Algorithm("dr_grpo", dr_grpo, "importance_sampling"),
    "rloo": Algorithm("rloo", rloo, "importance_sampling"),
    "ppo": Algorithm("ppo", ppo, "ppo", CLIP_CONFIG),
    "cispo": Algorithm("cispo", cispo, "cispo", CLIP_CONFIG),
    "dro": Algorithm("dro", dro, "dro", DRO_CONFIG),
}


def with_kl_penalty(algorithm: Algorithm, kl_coef: float, reference_version: int = 0) -> Algorithm:
    """Fold a KL penalty against a saved reference version into the advantages.

    For every completion token, ``A_t <- A_t - kl_coef · (q_t - ref_t)``, where ``q_t`` is the
    sampler's logprob and ``ref_t`` the reference's, scored with the ``logprobs`` primitive on
    ``reference_version`` (version 0 is saved before any update: the base model, VER-2). This is
    the per-token k1 estimate of KL(policy || reference) subtracted from the reward.
    """
    if not kl_coef > 0:
        raise ValueError(f"kl_coef must be > 0, got {kl_coef}")
    inner = algorithm.build_loss

    def build_loss(
        sample: dict[str, Any], cycle: int, request: dict[str, Any], ctx: LossContext
    ) -> dict[str, Any]:
        payload = inner(sample, cycle, request, ctx)
        for datum in payload["data"]:
            inputs = datum["loss_inputs"]
            token_ids = datum["model_input"]["token_ids"] + inputs["target_tokens"][-1:]
            # reference[i + 1] scores token_ids[i + 1] = target_tokens[i]: position i's target.
            reference = ctx.run.logprobs(reference_version, token_ids)["logprobs"][1:]
            inputs["advantages"] = [
                advantage - kl_coef * (sampled - ref) if mask else advantage
                for advantage, sampled, ref, mask in zip(
                    inputs["advantages"], inputs["logprobs"], reference, inputs["mask"],
                    strict=True,
                )
            ]
        return payload

    return replace(
        algorithm,
        name=f"{algorithm.name}+kl",
        build_loss=build_loss,
        primitives=tuple(sorted({*algorithm.primitives, "logprobs"})),
    )


def get_algorithm(name: str, *, kl_coef: float = 0.0, reference_version: int = 0) -> Algorithm:
    """An algorithm of :data:`ALGORITHMS`, with a KL penalty when ``kl_coef > 0``."""
    try:
        algorithm = ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(ALGORITHMS)}") from None
    if kl_coef:
        algorithm = with_kl_penalty(algorithm, kl_coef, reference_version)
    return algorithm

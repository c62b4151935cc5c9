"""Pre-flight checks: can this server run this algorithm as configured? (DISC-1, DISC-2)

Run against the capabilities document *before* any session exists, so a missing loss, an
undeclared loss input or config key, or a request over a published limit stops the job with
one clear :class:`~grpo.errors.CapabilityError` instead of a half-created run. The seed: "If the
algorithm-specific loss cannot be represented in the current Whitney JSON and operation
contract, stop before creating a session. Never silently substitute generic GRPO."
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from grpo.errors import CapabilityError

if TYPE_CHECKING:
    from grpo.algorithms import Algorithm
    from grpo.config import LoopConfig

__all__ = ["LOOP_PRIMITIVES", "check_capabilities", "choose_base_model"]

#: Primitives every run of the loop calls, whatever the algorithm.
LOOP_PRIMITIVES = (
    "save_weights_for_sampler",
    "sample",
    "forward_backward",
    "optim_step",
    "save_state",
    "export_lora",
)


def choose_base_model(capabilities: dict[str, Any], requested: str | None) -> dict[str, Any]:
    """The capabilities ``base_models[]`` entry to train: ``requested``, else the server's only
    model. :class:`CapabilityError` naming the served models when the requested one is not
    served, or when none was requested and the server serves several (or none)."""
    models = [m for m in capabilities.get("base_models") or [] if isinstance(m, dict)]
    served = ", ".join(repr(m.get("id")) for m in models) or "none"
    if requested is not None:
        for model in models:
            if model.get("id") == requested:
                return model
        raise CapabilityError(f"base model {requested!r} is not served here (served: {served})")
    if len(models) != 1:
        raise CapabilityError(f"the server serves {len(models)} base models ({served}): choose "
                              f"one with --base-model (LoopConfig.base_model)")
    return models[0]


def _loss_problems(capabilities: dict[str, Any], algorithm: Algorithm) -> list[str]:
    offered = capabilities.get("loss_functions") or {}
    name = algorithm.loss_function
    if name not in offered:
        return [
            f"loss function {name!r} is not offered (server offers {sorted(offered)}); "
            f"{algorithm.name} is never replaced by another loss"
        ]
    spec = offered[name]
    required = set(spec.get("inputs", {}).get("required", []))
    optional = set(spec.get("inputs", {}).get("optional", []))
    provided = set(algorithm.loss_inputs)
    problems = []
    if required - provided:
        problems.append(f"{name} requires inputs {sorted(required - provided)} that "
                        f"{algorithm.name} does not build")
    if provided - required - optional:
        problems.append(f"{name} does not declare inputs {sorted(provided - required - optional)}")
    declared_config = spec.get("config") or {}
    for key, value in algorithm.loss_config.items():
        bounds = declared_config.get(key)
        if bounds is None:
            problems.append(f"{name} has no config key {key!r} "
                            f"(declared: {sorted(declared_config)})")
        elif not bounds.get("min", value) <= value <= bounds.get("max", value):
            problems.append(f"{name}.{key}={value} outside "
                            f"[{bounds.get('min')}, {bounds.get('max')}]")
    return problems


def check_capabilities(
    capabilities: dict[str, Any],
    algorithm: Algorithm,
    config: LoopConfig,
    prompts: Sequence[Sequence[int]],
) -> None:
    """Raise :class:`CapabilityError` listing every reason this job cannot run here."""
    problems = _loss_problems(capabilities, algorithm)
    primitives = set(capabilities.get("primitives") or [])
    missing = [p for p in (*LOOP_PRIMITIVES, *algorithm.primitives) if p not in primitives]
    if missing:
        problems.append(f"primitives {missing} are not offered")
    if "adamw" not in (capabilities.get("optimizers") or []):
        problems.append("optimizer 'adamw' is not offered")

    model: dict[str, Any] | None = None
    try:
        model = choose_base_model(capabilities, config.base_model)
    except CapabilityError as exc:
        problems.append(str(exc))
    longest_prompt = max(len(prompt) for prompt in prompts)
    if model is not None:
        if config.lora_rank > model["max_lora_rank"]:
            problems.append(f"LoRA rank {config.lora_rank} > "
                            f"max_lora_rank {model['max_lora_rank']}")
        if longest_prompt + config.max_tokens > model["max_context"]:
            problems.append(f"prompt ({longest_prompt}) + max_tokens ({config.max_tokens}) > "
                            f"max_context {model['max_context']}")
        vocab = model["vocab_size"]
        outside = next(((i, token) for i, prompt in enumerate(prompts) for token in prompt
                        if not 0 <= token < vocab), None)
        if outside is not None:
            problems.append(f"prompt {outside[0] + 1} holds token id {outside[1]}, outside the "
                            f"vocabulary [0, {vocab}) of {model['id']!r}")

    limits = capabilities.get("limits") or {}
    for value, limit, what in (
        (config.group_size, "max_num_samples", "group size"),
        (config.max_tokens, "max_sample_tokens", "max_tokens"),
        (config.cycles, "max_versions_per_run", "cycles (one sampler version each)"),
    ):
        if limit in limits and value > limits[limit]:
            problems.append(f"{what} {value} > {limit} {limits[limit]}")
    if problems:
        raise CapabilityError(f"cannot run {algorithm.name} on this server: " + "; ".join(problems))

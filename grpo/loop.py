"""The ordered RL loop around ``build_loss`` (seed: Training loop, Checkpoints, Cleanup).

    capabilities -> check (DISC-2, before any session) -> session -> LoRA run
    -> for cycle N: save_weights_for_sampler(version N) -> sample(version N) per prompt
                    -> build_loss per prompt -> forward_backward -> optim_step(explicit AdamW)
                    (forward_backward -> optim_step repeated ``updates_per_cycle`` times)
    -> save_state -> export_lora (files downloaded, sha256 checked) -> finish -> close session
    on any exception: cancel -> poll until terminal (bounded) -> close -> TrainingError(cycle)
    (stopped on the caller's side after an optimizer step: save_state first, then as above)

The base model is ``LoopConfig.base_model``, else the server's only one (capabilities); EOS,
the vocabulary and the context length come from its capabilities entry, never from constants.

The caller's reward: whatever it raises (or a return value that is not a finite number) is a
:class:`~grpo.errors.RewardError` naming it, reported in phase ``reward`` with the original
as ``__cause__``. A stop for a reason on the caller's side (the reward raising, a uniform
group) after at least one optimizer step first saves a checkpoint (``save_state``, named
``stopped-cycle-N``; ``TrainingError.checkpoint``), so the steps taken are not lost, then
cancels and closes as the seed's Cleanup says.

Several prompts per cycle: each prompt's group gets its own ``build_loss`` call; their payloads
are concatenated into as few ``forward_backward`` requests as the server's limits allow. By
GRAD-1 (accumulation is additive, losses are sums) that is the same gradient as one call per
prompt. Payloads with different ``loss_function``/``loss_config`` are never merged.

Uniform groups: ``build_loss`` raises :class:`~grpo.algorithms.UniformRewardError` and the run
stops, cleaned up. ``LoopConfig.skip_uniform_groups=True`` (opt-in) drops such groups from a
multi-prompt cycle instead, counted in ``CycleMetrics.groups_skipped``; a cycle left with no
group still raises, because an ``optim_step`` without gradients has nothing to do (OPT-4).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from grpo.algorithms import Algorithm, LossContext, UniformRewardError
from grpo.checks import check_capabilities, choose_base_model
from grpo.client import TERMINAL_RUN_STATES, RunHandle, WhitneyClient
from grpo.config import DEFAULT_ADAMW, LoopConfig
from grpo.errors import ProtocolError, RewardError, TrainingError
from grpo.rewards import checked_reward
from grpo.tasks import Reward

# LoopConfig and DEFAULT_ADAMW live in grpo.config (so that grpo.checks can read the config
# without importing the loop); the loop re-exports them for its callers.
__all__ = [
    "DEFAULT_ADAMW",
    "LoopConfig",
    "CycleMetrics",
    "TrainResult",
    "train",
    "merge_payloads",
    "cancel_and_close",
]

@dataclass
class CycleMetrics:
    """One row of the per-cycle table and of the JSONL metrics file.

    ``loss``/``tokens`` sum the cycle's ``forward_backward`` requests; with several updates per
    cycle, ``loss``, ``grad_norm`` and ``update_norm`` are those of the last update. ``example``
    is the first completion of the cycle's first group.
    """

    cycle: int
    version: int
    step: int
    reward_mean: float
    reward_std: float
    reward_min: float
    reward_max: float
    loss: float
    grad_norm: float
    update_norm: float
    tokens: int
    groups: int
    groups_skipped: int
    completion_length: float
    seconds: float
    example: list[int] = field(default_factory=list)


@dataclass
class TrainResult:
    session_id: str
    run_id: str
    metrics: list[CycleMetrics]
    checkpoint: dict[str, Any]
    export: dict[str, Any]
    files: dict[str, bytes]
    run: dict[str, Any]
    model: dict[str, Any] = field(default_factory=dict)  # the capabilities base_models[] entry


def merge_payloads(
    payloads: Sequence[dict[str, Any]], limits: dict[str, Any]
) -> list[dict[str, Any]]:
    """Concatenate payloads with the same loss into requests within ``max_datums_per_request``
    and ``max_tokens_per_request`` (GRAD-1 makes this equal to one request per payload)."""
    max_datums = limits.get("max_datums_per_request", float("inf"))
    max_tokens = limits.get("max_tokens_per_request", float("inf"))
    merged: list[dict[str, Any]] = []
    tokens_in_last = 0
    for payload in payloads:
        for datum in payload["data"]:
            length = len(datum["model_input"]["token_ids"])
            last = merged[-1] if merged else None
            if (
                last is not None
                and (last["loss_function"], last["loss_config"])
                == (payload["loss_function"], payload["loss_config"])
                and len(last["data"]) < max_datums
                and tokens_in_last + length <= max_tokens
            ):
                last["data"].append(datum)
                tokens_in_last += length
            else:
                merged.append({**payload, "data": [datum]})
                tokens_in_last = length
    return merged


def cancel_and_close(
    client: WhitneyClient, session_id: str | None, run: RunHandle | None, timeout: float
) -> dict[str, Any]:
    """Seed Cleanup: cancel the run, poll until terminal (at most ``timeout`` s), close the
    session. Never raises; returns what it reached and the errors it met."""
    report: dict[str, Any] = {"run_state": None, "session_state": None, "errors": []}
    if run is not None:
        try:
            view = run.cancel()  # LIFE-7 / LIFE-8: idempotent, 200 on a terminal run
            deadline, delay = time.monotonic() + timeout, 0.01
            while view["state"] not in TERMINAL_RUN_STATES and time.monotonic() < deadline:
                time.sleep(delay)
                delay = min(2 * delay, 0.5)
                view = run.get()
            report["run_state"] = view["state"]
        except Exception as exc:  # cleanup must not hide the original failure
            report["errors"].append(repr(exc))
    if session_id is not None:
        try:
            report["session_state"] = client.close_session(session_id)["state"]
        except Exception as exc:
            report["errors"].append(repr(exc))
    return report


def recover_lost_creation(
    client: WhitneyClient, session_id: str | None, run: RunHandle | None
) -> tuple[str | None, RunHandle | None]:
    """LIFE-9: when a creation raised with its outcome unknown (response lost, 5xx) the client
    sends it once more with the same ``Idempotency-Key``, so the session or run the server may
    have created is known and the Cleanup below ends it. A server without
    ``idempotent_create``: nothing to learn (the run stays unknown; close reports
    ``runs_not_terminal``)."""
    if run is not None:
        return session_id, run
    view = client.recover_creation()
    if view is None:
        return session_id, run
    if isinstance(view.get("run_id"), str):
        return session_id, RunHandle(client, view)
    found = view.get("session_id")
    return (found if isinstance(found, str) else session_id), run


def _cycle_prompts(prompts: Sequence[list[int]], cycle: int, per_cycle: int) -> list[list[int]]:
    """The prompts of one cycle: the list taken in turn, ``per_cycle`` at a time."""
    count = min(per_cycle, len(prompts))
    return [prompts[(cycle * count + j) % len(prompts)] for j in range(count)]


def _sample_request(
    config: LoopConfig, cycle: int, group: int, prompt: list[int]
) -> dict[str, Any]:
    return {
        "version": cycle,
        "prompt": {"token_ids": prompt},
        "num_samples": config.group_size,
        "sampling": {
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "top_k": 0,
            "top_p": 1.0,
            "seed": config.seed * 100_003 + cycle * 101 + group,  # reproducible (VER-4)
        },
    }


def _recording(
    reward: Reward, prompt_tokens: list[int], into: list[float]
) -> Callable[[Sequence[int]], float]:
    """``reward`` bound to one prompt; every score is also kept for the cycle's metrics.
    Whatever the reward raises, or returns that is not a finite number, is a RewardError."""
    name = str(getattr(reward, "name", None) or getattr(reward, "__qualname__", repr(reward)))

    def bound(tokens: Sequence[int]) -> float:
        try:
            value = reward(tokens, prompt_tokens)
        except RewardError:
            raise
        except Exception as exc:
            raise RewardError(f"your reward {name} raised {type(exc).__name__}: {exc}",
                              reward=name, original=exc) from exc
        value = checked_reward(value, name)
        into.append(value)
        return value

    return bound


def _as_declared(payload: dict[str, Any], algorithm: Algorithm) -> dict[str, Any]:
    # The capability check vetted the declared loss only; a different one is never sent.
    built = (payload["loss_function"], payload["loss_config"])
    if built != (algorithm.loss_function, algorithm.loss_config):
        raise ValueError(f"{algorithm.name} declared {algorithm.loss_function} "
                         f"{algorithm.loss_config}, built {built[0]} {built[1]}")
    return payload


def _cycle_metrics(
    cycle: int,
    samples: list[dict[str, Any]],
    rewards_P_G: list[list[float]],
    skipped: int,
    results: list[dict[str, Any]],
    step: dict[str, Any],
    started: float,
) -> CycleMetrics:
    rewards = [reward for rewards_G in rewards_P_G for reward in rewards_G]
    lengths = [len(sequence["tokens"]) for sample in samples for sequence in sample["sequences"]]
    return CycleMetrics(
        cycle=cycle,
        version=cycle,
        step=step["step"],
        reward_mean=statistics.fmean(rewards),
        reward_std=statistics.pstdev(rewards),
        reward_min=min(rewards),
        reward_max=max(rewards),
        loss=sum(result["loss"] for result in results),
        grad_norm=step["grad_norm"],
        update_norm=step["update_norm"],
        tokens=sum(result["metrics"]["tokens"] for result in results),
        groups=len(rewards_P_G),
        groups_skipped=skipped,
        completion_length=statistics.fmean(lengths),
        seconds=time.perf_counter() - started,
        example=list(samples[0]["sequences"][0]["tokens"]),
    )


def train(
    client: WhitneyClient,
    prompts: Sequence[list[int]],
    reward: Reward,
    algorithm: Algorithm,
    config: LoopConfig,
    *,
    on_cycle: Callable[[CycleMetrics], None] | None = None,
) -> TrainResult:
    """Run the ordered loop (module docstring) and return its metrics, checkpoint and export.

    ``prompts`` are token lists (each non-empty), ``reward(tokens, prompt_tokens)`` scores one
    completion. Raises :class:`~grpo.errors.CapabilityError` before any session when the server
    cannot run ``algorithm``; any later failure is cleaned up and re-raised as
    :class:`~grpo.errors.TrainingError` carrying the cycle and phase (original as ``__cause__``).
    """
    prompts = [list(prompt) for prompt in prompts]
    if not prompts or not all(prompts):
        raise ValueError("need at least one prompt, and every prompt needs a token (e.g. BOS)")
    capabilities = client.capabilities()
    check_capabilities(capabilities, algorithm, config, prompts)  # DISC-2: before any session
    model = choose_base_model(capabilities, config.base_model)
    config = replace(config, base_model=model["id"])
    limits = capabilities.get("limits", {})

    session_id: str | None = None
    run: RunHandle | None = None
    cycle: int | None = None
    steps = 0  # optimizer steps taken
    phase = "create_session"
    try:
        metadata = {"client": "whitney-kit grpo", "algorithm": algorithm.name}
        session_id = client.create_session(metadata=metadata)["session_id"]
        phase = "create_run"
        run = client.create_run(session_id, base_model=model["id"],
                                rank=config.lora_rank, alpha=config.lora_alpha, seed=config.seed)
        metrics: list[CycleMetrics] = []
        for cycle in range(config.cycles):
            started = time.perf_counter()
            phase = "save_weights_for_sampler"
            run.save_weights_for_sampler(cycle)  # version N = cycle N (VER-1)
            samples: list[dict[str, Any]] = []
            rewards_P_G: list[list[float]] = []
            payloads: list[dict[str, Any]] = []
            skipped = 0
            for group, prompt_tokens in enumerate(
                _cycle_prompts(prompts, cycle, config.prompts_per_cycle)
            ):
                phase = "sample"
                request = _sample_request(config, cycle, group, prompt_tokens)
                sample = run.sample(request)
                samples.append(sample)
                phase = "build_loss"
                rewards_G: list[float] = []
                rewards_P_G.append(rewards_G)
                ctx = LossContext(_recording(reward, prompt_tokens, rewards_G), run, group)
                try:
                    payloads.append(_as_declared(
                        algorithm.build_loss(sample, cycle, request, ctx), algorithm))
                except UniformRewardError:
                    if not config.skip_uniform_groups:
                        raise
                    skipped += 1
            if not payloads:
                raise UniformRewardError(f"cycle {cycle}: every group has uniform reward, "
                                         "no gradient signal")
            for _ in range(config.updates_per_cycle):
                phase = "forward_backward"
                results = [run.forward_backward(chunk)
                           for chunk in merge_payloads(payloads, limits)]
                phase = "optim_step"
                step = run.optim_step(config.adamw)
                steps = step["step"]
            metrics.append(_cycle_metrics(cycle, samples, rewards_P_G, skipped, results, step,
                                          started))
            if on_cycle is not None:
                on_cycle(metrics[-1])
        cycle = None

        phase = "save_state"
        checkpoint = run.save_state(config.checkpoint_name)
        phase = "export_lora"
        export = run.export_lora()
        phase = "download_export"
        files = {file["name"]: run.download_export(export["export_id"], file)
                 for file in export["files"]}
        phase = "finish"
        final = run.finish()
        if final["state"] != "finished":
            raise ProtocolError(f"finish answered state {final['state']!r} (LIFE-6)")
        phase = "close_session"
        client.close_session(session_id)
        return TrainResult(session_id, run.run_id, metrics, checkpoint, export, files, final,
                           model)
    except BaseException as exc:
        caller_side = isinstance(exc, (RewardError, UniformRewardError))
        if isinstance(exc, RewardError):
            phase = "reward"
        saved: dict[str, Any] | None = None
        saving_error: str | None = None
        if caller_side and run is not None and steps >= 1:
            try:  # keep what the steps so far learned before the cancel (the run is fine)
                saved = run.save_state(f"stopped-cycle-{cycle}")
            except Exception as save_exc:
                saving_error = repr(save_exc)
        session_id, run = recover_lost_creation(client, session_id, run)  # LIFE-9
        cleanup = cancel_and_close(client, session_id, run, config.cancel_timeout_seconds)
        if saving_error is not None:
            cleanup["errors"].insert(0, f"save_state before the cancel: {saving_error}")
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt / SystemExit: cleaned up, re-raised as they are
        where = f"cycle {cycle}" if cycle is not None else "outside the cycles"
        run_id = run.run_id if run is not None else None
        what = str(exc) if isinstance(exc, RewardError) else f"{type(exc).__name__}: {exc}"
        kept = (f"; checkpoint {saved['checkpoint_id']} (step {saved['step']}) saved before "
                f"the cancel" if saved is not None else "")
        raise TrainingError(
            f"{where}, {phase}: {what} (run {run_id} -> {cleanup['run_state']}, session "
            f"{session_id} -> {cleanup['session_state']}{kept})",
            cycle=cycle,
            phase=phase,
            run_id=run_id,
            session_id=session_id,
            cleanup=cleanup,
            checkpoint=saved,
        ) from exc

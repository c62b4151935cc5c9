"""What the loop sends that is not the task: the AdamW hyper-parameters and the loop's config.

Plain data, importing nothing else of the package: the client, the pre-flight checks and the
loop all read it, and none of them imports another to get it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["AdamW", "DEFAULT_ADAMW", "LoopConfig"]


@dataclass(frozen=True)
class AdamW:
    """The ``optim_step`` hyper-parameters. All six are required: the contract has no server
    defaults (OPT-1, seed: "explicit AdamW"), so this client invents none either."""

    learning_rate: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    grad_clip_norm: float

    def to_json(self) -> dict[str, float]:
        return {key: float(value) for key, value in asdict(self).items()}


# The reference job's optimizer, chosen by measurement (tests/grpo/test_grpo_learning.py) and sent
# in full with every optim_step; it is a choice of this loop, not a server default (OPT-1).
DEFAULT_ADAMW = AdamW(
    learning_rate=0.005, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, grad_clip_norm=1.0
)


@dataclass(frozen=True)
class LoopConfig:
    """Everything the loop sends that is not the task; every AdamW field is explicit (OPT-1)."""

    cycles: int = 30
    group_size: int = 8
    prompts_per_cycle: int = 4
    max_tokens: int = 12
    temperature: float = 1.0
    base_model: str | None = None  # None: the server's only base model (grpo.checks)
    lora_rank: int = 8
    lora_alpha: float = 16.0
    adamw: AdamW = DEFAULT_ADAMW
    seed: int = 0
    updates_per_cycle: int = 1
    skip_uniform_groups: bool = False
    checkpoint_name: str = "final"
    cancel_timeout_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.cycles < 2:
            raise ValueError("run at least two cycles (seed: so update, sync and sample "
                             "semantics are explicit)")
        if self.group_size < 2:
            raise ValueError("a group needs at least 2 samples to have a baseline")
        for name in ("prompts_per_cycle", "max_tokens", "updates_per_cycle", "lora_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.seed < 0:
            raise ValueError("seed must be >= 0")

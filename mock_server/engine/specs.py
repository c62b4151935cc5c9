"""What a base model and a LoRA adapter are: the model specs, the vocabulary, and the
containers the rest of the mock passes around (``Lora``, ``LossResult``). Numpy only."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BASE_MODEL_ID = "whitney-mock/tiny-byte"
BOS_TOKEN = 256
EOS_TOKEN = 257
VOCAB_SIZE = 258


class NonFiniteLossError(ValueError):
    """The loss or a gradient is not finite (e.g. input ``logprobs`` so far below the current
    ones that exp(p - q) overflows). Raised before anything is returned, so callers can answer
    422 without touching training state (ERR-3)."""


@dataclass(frozen=True)
class ModelSpec:
    """Public facts about a base model (the capabilities ``base_models`` entry) plus its dims."""

    id: str
    vocab_size: int
    max_context: int
    eos_token_id: int
    bos_token_id: int
    max_lora_rank: int
    embed_dim: int = 32
    hidden_dim: int = 64
    ema_decay: float = 0.8

    def capabilities_entry(self) -> dict[str, object]:
        """The DISC-1 ``base_models[]`` object."""
        return {
            "id": self.id,
            "vocab_size": self.vocab_size,
            "max_context": self.max_context,
            "eos_token_id": self.eos_token_id,
            "max_lora_rank": self.max_lora_rank,
        }


BASE_MODEL_SPECS: dict[str, ModelSpec] = {
    BASE_MODEL_ID: ModelSpec(
        id=BASE_MODEL_ID,
        vocab_size=VOCAB_SIZE,
        max_context=2048,
        eos_token_id=EOS_TOKEN,
        bos_token_id=BOS_TOKEN,
        max_lora_rank=64,
    )
}


#: Alias kept for callers that only need ``id in BASE_MODELS`` / ``sorted(BASE_MODELS)``.
BASE_MODELS = BASE_MODEL_SPECS


def lora_key(module: str, which: str) -> str:
    """PEFT state-dict key, e.g. ``base_model.model.lm_head.lora_A.weight``."""
    return f"base_model.model.{module}.lora_{which}.weight"


@dataclass
class Lora:
    """A LoRA adapter: ``params`` keyed by PEFT names (see :func:`lora_key`), rank, alpha."""

    params: dict[str, np.ndarray]
    rank: int
    alpha: float

    @property
    def scale(self) -> float:
        """PEFT's scaling ``alpha / r``."""
        return self.alpha / self.rank

    def copy(self) -> "Lora":
        """Deep copy (arrays copied): versions and checkpoints never alias live weights."""
        return Lora(params={k: a.copy() for k, a in self.params.items()}, rank=self.rank,
                    alpha=self.alpha)


@dataclass
class LossResult:
    """``loss`` summed over all positions; ``logprobs`` p per datum; ``grads`` keyed like
    ``lora.params`` (None when not requested)."""

    loss: float
    logprobs: list[np.ndarray]
    grads: dict[str, np.ndarray] | None

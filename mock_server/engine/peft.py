"""The PEFT adapter file format (EXPORT-1): what ``export_lora`` writes.

A pure function of the adapter and the names around it; ``safetensors`` is imported when a file
is first written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "peft_files"]

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def peft_files(params: Mapping[str, np.ndarray], *, rank: int, alpha: float,
               target_modules: Iterable[str], base_model: str) -> dict[str, bytes]:
    """The adapter as PEFT writes it: ``params`` (keyed by PEFT names) as float32 safetensors,
    and its ``adapter_config.json``."""
    from safetensors.numpy import save

    tensors = {name: np.ascontiguousarray(value, dtype=np.float32)
               for name, value in params.items()}
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(target_modules),
        "base_model_name_or_path": base_model,
        "inference_mode": True,
    }
    return {
        ADAPTER_WEIGHTS: save(tensors, metadata={"format": "pt"}),
        ADAPTER_CONFIG: json.dumps(config, indent=2, sort_keys=True).encode(),
    }

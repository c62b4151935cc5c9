"""The engine's single-thread BLAS guard: one thread inside every compute call, the caller's
setting back after it, and nothing to undo once ``pin_blas_threads`` has set one thread for
good. Counts are read with threadpoolctl's own ``threadpool_info``, apart from the guard."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from mock_server.engine.model import get_base_model, pin_blas_threads
from mock_server.engine.specs import BASE_MODEL_ID


def _blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}


def test_one_thread_inside_then_the_callers_setting_again(monkeypatch: pytest.MonkeyPatch) -> None:
    model = get_base_model(BASE_MODEL_ID)
    lora = model.init_lora(4, 8.0, seed=0)
    seen: list[set[int]] = []
    real = type(model)._logits

    def spy(self, weights, x):  # type: ignore[no-untyped-def]
        seen.append(_blas_threads())
        return real(self, weights, x)

    monkeypatch.setattr(type(model), "_logits", spy)
    with threadpool_limits(limits=2, user_api="blas"):
        if _blas_threads() != {2}:
            pytest.skip("this BLAS cannot run two threads")
        model.score(lora, np.arange(40, 60))
        assert seen and all(s == {1} for s in seen)
        assert _blas_threads() == {2}
        pin_blas_threads()
        assert _blas_threads() == {1}
        seen.clear()
        model.score(lora, np.arange(40, 60))
        assert seen and all(s == {1} for s in seen)
        assert _blas_threads() == {1}

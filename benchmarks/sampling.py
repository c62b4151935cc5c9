"""Row 4: ``sample`` with many rows in one request against one row.

Both are whole in-process requests (``ASGITransport``) on the same run and version, with
``stop_token_ids: []`` so every row generates exactly ``max_tokens`` tokens. A per-sample
Python loop would make the ratio ~``num_samples``; vectorised rows keep it near 1.

Two step rows show where the rest goes: the engine alone (``BaseModel.sample``, no HTTP, no
JSON), and the composed floor ``1-row request + the float64 mixer and head matmuls of the
other rows, step by step``: the time a sampler with zero per-row bookkeeping would take, since
exact logprobs (VER-3) need every row's full softmax at every step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mock_server.engine.model import get_base_model
from mock_server.engine.specs import BASE_MODEL_ID

from .core import Config, Row, interleave, make_row
from .fixtures import mock_run, sample_body, text_tokens

GOAL = 1.5  # issue 16: sample 16 x 256 tokens within 1.5x of 1 x 256


def _matmuls(rows: int, steps: int) -> Callable[[], None]:
    """The float64 products one sampling step needs per row, ``steps`` times: the mixer
    ``(rows, 3D + 1) @ (3D + 1, H)`` with its tanh, and the head ``(rows, H + 1) @ (H + 1, K)``."""
    spec = get_base_model(BASE_MODEL_ID).spec
    f, h, k = 3 * spec.embed_dim + 1, spec.hidden_dim, spec.num_buckets
    rng = np.random.default_rng(0)
    x, w_mix = rng.standard_normal((rows, f)), rng.standard_normal((f, h)) / np.sqrt(f)
    hidden, w_head = np.ones((rows, h + 1)), rng.standard_normal((h + 1, k))

    def call() -> None:
        for _ in range(steps):
            np.tanh(x @ w_mix, out=hidden[:, :h])
            hidden @ w_head

    return call


def _draws(rows: int, steps: int) -> Callable[[], None]:
    """The exact inverse-CDF draw of ``sampling.sample_rows`` for ``rows`` rows, ``steps``
    times: exp of the (rows, K) logits, their running sum along K (VER-3 needs the partition
    function; the draw needs the CDF) and the count below each row's threshold."""
    k = get_base_model(BASE_MODEL_ID).spec.num_buckets
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((rows, k)) - 3.0
    exp, cdf, uniform = np.empty((rows, k)), np.empty((rows, k)), rng.random(rows)

    def call() -> None:
        for _ in range(steps):
            np.cumsum(np.exp(logits, out=exp), axis=1, out=cdf)
            np.log(cdf[:, -1])
            (cdf < (uniform * cdf[:, -1])[:, None]).sum(axis=1)

    return call


def _engine(rows: int, steps: int, prompt: list[int]) -> Callable[[], None]:
    model = get_base_model(BASE_MODEL_ID)
    lora = model.init_lora(8, 16.0, seed=1)
    prompt_T = np.asarray(prompt)

    def call() -> None:
        model.sample(lora, prompt_T, num_samples=rows, max_tokens=steps, temperature=1.0,
                     top_k=0, top_p=1.0, seed=0, stop_token_ids=[])

    return call


async def rows(cfg: Config) -> list[Row]:
    group = "4 sampling"
    handle = await mock_run(rank=cfg.lora_rank)
    prompt = text_tokens(np.random.default_rng(4), 8)
    many, steps = cfg.sample_many, cfg.sample_tokens

    def call(num_samples: int):  # type: ignore[no-untyped-def]
        async def one() -> None:
            answer = await handle.call("sample", sample_body(0, num_samples, steps, prompt))
            lengths = {len(s["tokens"]) for s in answer["sequences"]}
            if len(answer["sequences"]) != num_samples or lengths != {steps}:
                raise RuntimeError(f"sample returned {len(answer['sequences'])} rows of "
                                   f"lengths {lengths}")
        return one

    try:
        t = await interleave({"many": call(many), "one": call(1),
                              "engine many": _engine(many, steps, prompt),
                              "engine one": _engine(1, steps, prompt),
                              "matmuls many": _matmuls(many, steps),
                              "matmuls one": _matmuls(1, steps),
                              "draws many": _draws(many, steps),
                              "draws one": _draws(1, steps)}, cfg)
    finally:
        await handle.aclose()
    one = t["one"].median_s
    floor = one + max(0.0, t["matmuls many"].median_s - t["matmuls one"].median_s)
    with_draws = floor + max(0.0, t["draws many"].median_s - t["draws one"].median_s)
    return [
        make_row(group, f"sample {many} x {steps} tok vs 1 x {steps}", t["many"].median_s, one,
                 "s", GOAL, "one request each, in-process, no stop tokens"),
        make_row(group, f"  engine only: BaseModel.sample {many} x {steps} vs 1 x {steps}",
                 t["engine many"].median_s, t["engine one"].median_s, "s", None,
                 "the same sampling without HTTP, validation or JSON"),
        make_row(group, f"  floor: 1 x {steps} request + {many - 1} more rows' matmuls",
                 floor, one, "s", None,
                 f"the 1-row request plus the float64 mixer + head matmuls of {many} rows minus "
                 f"those of 1 row, over {steps} steps: the ratio with zero per-row bookkeeping"),
        make_row(group, "  floor + the other rows' exact draws (exp, cumsum over K, count)",
                 with_draws, one, "s", None,
                 "the floor plus the inverse-CDF draw of 15 more rows at every step: cumsum "
                 "is a sequential dependency chain over K per row (latency-bound, ~3 ns per "
                 "entry), which a bit-for-bit draw and VER-3's partition function need"),
    ]

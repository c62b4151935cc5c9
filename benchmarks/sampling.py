"""Row 4: ``sample`` with many rows in one request against one row.

Both are whole in-process requests (``ASGITransport``) on the same run and version, with
``stop_token_ids: []`` so every row generates exactly ``max_tokens`` tokens. A per-sample
Python loop would make the ratio ~``num_samples``; vectorised rows keep it near 1.
"""

from __future__ import annotations

import numpy as np

from .core import Config, Row, interleave, make_row
from .fixtures import mock_run, sample_body, text_tokens

GOAL = 3.0


async def rows(cfg: Config) -> list[Row]:
    handle = await mock_run(rank=cfg.lora_rank)
    prompt = text_tokens(np.random.default_rng(4), 8)

    def call(num_samples: int):  # type: ignore[no-untyped-def]
        async def one() -> None:
            answer = await handle.call("sample", sample_body(0, num_samples, cfg.sample_tokens,
                                                             prompt))
            lengths = {len(s["tokens"]) for s in answer["sequences"]}
            if len(answer["sequences"]) != num_samples or lengths != {cfg.sample_tokens}:
                raise RuntimeError(f"sample returned {len(answer['sequences'])} rows of "
                                   f"lengths {lengths}")
        return one

    try:
        timings = await interleave({"many": call(cfg.sample_many), "one": call(1)}, cfg)
    finally:
        await handle.aclose()
    return [make_row("4 sampling",
                     f"sample {cfg.sample_many} x {cfg.sample_tokens} tok vs 1 x "
                     f"{cfg.sample_tokens}", timings["many"].median_s, timings["one"].median_s,
                     "s", GOAL, "one request each, in-process, no stop tokens")]

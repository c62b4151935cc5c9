"""whitney-kit benchmarks: the mock measured against its floors, side by side, in one run.

``python -m benchmarks [--quick] [--skip-suites] [--only 1,3] [--json FILE]`` prints one row per
measurement: name, measured, floor, ratio = measured / floor, goal (largest acceptable ratio),
verdict. Groups (issue 6):

1. request overhead: ``logprobs`` (16 tokens) vs a bare Starlette route, in-process and uvicorn
2. body handling: a 64 x 1024 ``forward_backward`` body through the mock's path vs
   ``orjson.loads``
3. compute: ``forward_backward`` 32 x 512 vs the bare matmuls; linearity at 1x/4x/16x tokens
4. sampling: 16 samples x 256 tokens vs 1 sample in one request
5. held requests: CPU burnt while 64 requests wait for a seq gap (ORD-2)
6. concurrency: 32 pipelined GRPO clients over uvicorn: throughput, latency, errors
7. memory: bytes per saved version and per run vs the LoRA parameter bytes
8. suites: wall time of the conformance suite and of ``python -m pytest``

Programmatic use: ``benchmarks.runner.run(benchmarks.core.PRESETS["quick"])``. This package
imports nothing heavy at import time, so ``__main__`` can set BLAS threads before numpy loads.
"""

"""glibc ``malloc`` settings for the engine's short-lived arrays.

One ``forward_backward`` of 8 x 128 tokens allocates a few MB of temporaries (features, hidden
states, logits, gradients) and frees them before the next call. Under glibc's defaults, arrays
above the mmap threshold are mapped and unmapped on every call, or the top of the heap is
trimmed and grown again, and the fresh pages fault in one at a time: about 1,200 minor page
faults per call, 6.7 ms where the same arithmetic takes 4.0 ms on memory the process keeps
(measured on the 2-core CI machine). Whether a process pays this depends on its allocation
history, so two processes running the same call can differ by 1.7x.

:func:`tune_malloc` fixes the thresholds so that such arrays come from the heap and freed
memory stays with the process (up to ``trim_mb``). It changes the whole process, so the
library never calls it on import: the processes the kit owns call it at start
(``python -m mock_server``, the GRPO CLI's embedded mock, the benchmarks), and a library user
may call it once in theirs. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["tune_malloc"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's largest accepted mmap threshold on 64-bit (HEAP_MAX_SIZE / 2).
_MMAP_MAX = 32 * 1024 * 1024


@functools.cache
def tune_malloc(trim_mb: int = 256) -> bool:
    """Serve allocations below 32 MB from the heap and keep up to ``trim_mb`` MB of freed heap
    (no per-call page faults). Idempotent; True when glibc accepted both settings."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    trimmed = bool(mallopt(_M_TRIM_THRESHOLD, trim_mb * 1024 * 1024) == 1)
    mapped = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_MAX) == 1)
    return trimmed and mapped

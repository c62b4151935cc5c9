"""Run the benchmark groups in order and collect their rows.

In-process groups run first; then one uvicorn child process serves groups 1 (over TCP) and 6;
the suites run last. A group that crashes becomes one "error" row and the others still run.
"""

from __future__ import annotations

import asyncio
import functools
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from .core import Config, Row

GROUPS = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10")
GROUP_NAMES = {"1": "1 request overhead", "2": "2 body handling", "3": "3 compute",
               "4": "4 sampling", "5": "5 held requests", "6": "6 concurrency",
               "7": "7 memory", "8": "8 suites", "9": "9 vocabulary", "10": "10 dashboard"}
BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _error_row(group: str, exc: BaseException) -> Row:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {os.path.basename(where.filename)}:{where.lineno}" if where else ""
    return Row(GROUP_NAMES[group], "(benchmark crashed)", None, None, "", None, None, "error",
               f"{type(exc).__name__}: {exc}{at}"[:300])


def _collect(group: str, make: Callable[[], Any], out: list[Row],
             progress: Callable[[str], None]) -> None:
    progress(f"running {GROUP_NAMES[group]} ...")
    start = time.perf_counter()
    try:
        result = make()
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        out.extend(result)
    except Exception as exc:  # one broken group must not hide the others
        out.append(_error_row(group, exc))
    progress(f"  {GROUP_NAMES[group]}: {time.perf_counter() - start:.1f} s")


def run(cfg: Config, *, groups: Iterable[str] = GROUPS, skip_suites: bool = False,
        suite_env: dict[str, str] | None = None,
        progress: Callable[[str], None] = lambda _: None) -> tuple[list[Row], dict[str, Any]]:
    """Run the selected groups; return the rows and run metadata."""
    from . import (
        body,
        compute,
        concurrency,
        dashboard,
        held,
        memory,
        overhead,
        sampling,
        suites,
        vocab,
    )
    from .fixtures import uvicorn_server

    selected = set(groups) - ({"8"} if skip_suites else set())
    rows: list[Row] = []
    started, load_before = time.perf_counter(), _loadavg()
    # Memory first: its RSS reading is cleanest before the big arrays of 2 and 3 exist.
    if "7" in selected:
        _collect("7", lambda: memory.rows(cfg), rows, progress)
    if "1" in selected:
        _collect("1", lambda: overhead.rows(cfg, None), rows, progress)
    for group, module in (("2", body), ("3", compute), ("4", sampling), ("5", held),
                          ("9", vocab), ("10", dashboard)):
        if group in selected:
            _collect(group, functools.partial(module.rows, cfg), rows, progress)
    if selected & {"1", "6"}:
        try:
            with uvicorn_server() as server:
                if "1" in selected:
                    _collect("1", lambda: overhead.over_uvicorn_rows(cfg, server), rows, progress)
                if "6" in selected:
                    _collect("6", lambda: concurrency.rows(cfg, server), rows, progress)
        except Exception as exc:
            rows.append(_error_row("6" if "6" in selected else "1", exc))
    if "8" in selected:
        _collect("8", lambda: suites.rows(cfg, suite_env), rows, progress)
    order = {name: i for i, name in enumerate(GROUP_NAMES.values())}
    rows.sort(key=lambda row: order.get(row.group, len(order)))  # stable within a group
    meta = {
        "preset": cfg.name,
        "config": {k: v for k, v in cfg.__dict__.items()},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "blas_threads": {var: os.environ.get(var) for var in BLAS_VARS},
        "loadavg_before": load_before,
        "loadavg_after": _loadavg(),
        "wall_s": time.perf_counter() - started,
        "versions": _versions(),
    }
    return rows, meta


def _loadavg() -> list[float] | None:
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("numpy", "starlette", "uvicorn", "httpx", "pydantic", "orjson"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "?"
    return out

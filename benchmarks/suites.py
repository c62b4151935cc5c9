"""Row 8: wall time of the conformance suite (embedded mock) and of the full test command.

Both run as child processes from the repository root, exactly as a user types them:
``whitney-conformance`` (or ``python -m conformance`` when the console script is not
installed) with no arguments, i.e. against the embedded in-process mock, and
``python -m pytest``. A command that is not available yet is reported as "n/a (not
available)"; one that exits non-zero is reported with its exit code and verdict "misses".
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .core import Config, Row, make_row

REPO = Path(__file__).resolve().parents[1]


def conformance_command() -> list[str] | None:
    script = shutil.which("whitney-conformance")
    if script:
        return [script]
    try:
        found = importlib.util.find_spec("conformance.__main__") is not None
    except ImportError:
        found = False
    return [sys.executable, "-m", "conformance"] if found else None


def _timed(name: str, command: list[str] | None, cfg: Config, env: dict[str, str]) -> Row:
    group = "8 suites"
    if command is None:
        return make_row(group, name, None, None, "s", None, "n/a (not available)")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=cfg.suite_timeout_s)
    except subprocess.TimeoutExpired:
        return make_row(group, name, time.perf_counter() - start, None, "s", None,
                        f"timed out after {cfg.suite_timeout_s:g} s", ok=False)
    wall = time.perf_counter() - start
    tail = _summary(done.stdout) or _summary(done.stderr)
    return make_row(group, name, wall, None, "s", None,
                    f"`{' '.join(Path(c).name if i == 0 else c for i, c in enumerate(command))}`"
                    f" exit {done.returncode}: {tail}", ok=done.returncode == 0,
                    returncode=done.returncode)


def _summary(output: str) -> str:
    """pytest's "N passed, M failed in T s" line if there is one, else the last line."""
    lines = [line.strip(" =") for line in output.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if re.search(r"\b\d+ (passed|failed|error)", line):
            return line[:160]
    return lines[-1][:160] if lines else ""


def rows(cfg: Config, env: dict[str, str] | None = None) -> list[Row]:
    """``env``: the environment for the children (default: this process's)."""
    env = dict(os.environ if env is None else env)
    return [
        _timed("conformance suite, embedded mock", conformance_command(), cfg, env),
        _timed("full test command (python -m pytest)", [sys.executable, "-m", "pytest", "-q"],
               cfg, env),
    ]

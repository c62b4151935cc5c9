"""Lint, types and layers as habits: ruff, mypy --strict (pyproject's [tool.mypy]) and the
import contract (pyproject's [tool.importlinter]) run inside the test command.

The import contract is also shown able to fail: a copy of ``mock_server`` whose engine
imports Starlette, or whose backend imports the switches, breaks it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["mock_server", "grpo", "conformance"]


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    result = _run(sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                  *PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
    config = (ROOT / "pyproject.toml").read_text()
    assert "strict = true" in config


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    lint = shutil.which("lint-imports")
    assert lint is not None, "import-linter is part of the test extra"
    return subprocess.run([lint, "--no-cache"], cwd=root, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_import_contract_is_kept() -> None:
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and " 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("mock_server/engine/losses.py", "import starlette.responses", "engine is numpy only"),
    ("mock_server/backend/records.py", "from ..http import routes", "backend knows no Starlette"),
    ("mock_server/backend/state.py", "from ..testing import violations",
     "only testing/ names the switches"),
    ("conformance/report.py", "import mock_server.backend.state", "conformance is black-box"),
])
def test_import_contract_catches_a_broken_layer(tmp_path: Path, module: str, line: str,
                                                contract: str) -> None:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # injected by the test\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    text = " ".join(result.stdout.split())  # the report wraps long contract names
    after = text[text.index(contract):]
    kept, broken = after.find(" KEPT"), after.find(" BROKEN")
    assert broken != -1 and (kept == -1 or broken < kept), result.stdout  # that contract

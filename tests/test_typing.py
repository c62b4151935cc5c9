"""``mock_server`` and ``grpo`` type-check cleanly, and the public API of ``conformance``."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api")

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ["mock_server", "grpo",
          "conformance/__init__.py"]


def test_public_api_is_clean_under_mypy(tmp_path: Path) -> None:
    stdout, stderr, status = mypy_api.run([
        "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path),
        *[str(ROOT / p) for p in PUBLIC]])
    assert status == 0, stdout + stderr


def test_packages_ship_py_typed() -> None:
    for package in ("mock_server", "grpo", "conformance"):
        assert (ROOT / package / "py.typed").is_file(), package

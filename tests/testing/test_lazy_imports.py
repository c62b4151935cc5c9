"""Loading the pytest plugin, or the ``mock_server`` package, imports nothing heavy.

The ``whitney_mock`` plugin loads in every pytest run of every project that has whitney-kit
installed, so the mock (numpy, Starlette, pydantic, httpx, orjson, uvicorn) must wait until a
fixture is first requested. Each check runs in a fresh interpreter: this process has long
imported everything.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("numpy", "starlette", "pydantic", "httpx", "orjson", "uvicorn", "safetensors",
         "mock_server.engine", "mock_server.http", "mock_server.backend.state")


def _imported_after(statement: str) -> list[str]:
    script = (f"import sys\n{statement}\n"
              f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


@pytest.mark.parametrize("statement", [
    "import mock_server.testing.plugin",
    "import mock_server",
    "import mock_server.testing",
])
def test_loading_imports_nothing_heavy(statement: str) -> None:
    assert _imported_after(statement) == []


def test_first_use_imports_the_mock() -> None:
    loaded = _imported_after("from mock_server import create_app")
    assert "starlette" in loaded and "mock_server.http" in loaded

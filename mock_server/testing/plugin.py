"""pytest plugin: a mock Whitney per test. Registered as the ``pytest11`` entry point
``whitney_mock``, so installing whitney-kit is enough.

Fixtures (see :class:`mock_server.testing.MockWhitney` for what they offer):

- ``whitney_mock``: a fresh in-process mock for each test (no socket). Hand the code under test
  ``whitney_mock.client`` (an ``httpx.Client``, key set) or ``whitney_mock.transport``.
- ``whitney_server``: the mock served by uvicorn on 127.0.0.1 and a free port, for code that
  opens its own connections (``whitney_server.base_url``, ``.api_key``, ``.env``). One server
  per session (``whitney_server_session``), reset before each test: fresh state every time.

Configuration, the later winning: defaults (seed 0, the mock's limits, key
``whitney-mock-key``, the built-in base model) < ini (``whitney_mock_seed``,
``whitney_mock_limits`` as ``name=value`` lines, ``whitney_mock_api_keys``,
``whitney_mock_base_models`` one declaration a line, ``whitney_mock_base_models_from`` one
``[ID=]DIR`` a line) < command line (``--whitney-mock-seed N``, ``--whitney-mock-limit
name=value``, ``--whitney-mock-api-key KEY``, ``--whitney-mock-base-model SPEC``,
``--whitney-mock-base-model-from [ID=]DIR``, all but the seed repeatable) < the marker
``@pytest.mark.whitney_mock(seed=..., limits={...}, api_keys=[...], cancel_delay_ms=...,
base_models=[...])`` on the test, class or module.

Base models: a level that declares any replaces the whole list of the levels below. A
declaration is ``ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N]``; the marker
also takes ``ModelSpec`` objects, capabilities-shaped dicts and ``pathlib.Path`` folders (as
``create_app(base_models=...)``). A bad declaration in ini or on the command line is a usage
error naming it; a test whose marker declares other models than the session's server gets a
``whitney_server`` of its own.

Loading the plugin costs nothing: the mock (numpy, Starlette, pydantic, httpx ...) is imported
when a fixture is first requested, so every pytest run of a project that merely has whitney-kit
installed stays as fast as without it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ..backend.config import DEFAULT_API_KEY, Limits

if TYPE_CHECKING:
    from .mock import MockWhitney

MARKER = "whitney_mock"
_MARKER_ARGS = frozenset({"seed", "limits", "api_keys", "cancel_delay_ms", "base_models"})


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("whitney-mock", "whitney-kit mock Whitney (fixtures whitney_mock, "
                                            "whitney_server)")
    group.addoption("--whitney-mock-seed", type=int, default=None, metavar="N",
                    help="seed of the mock's ids and unseeded sampling (default: ini "
                         "whitney_mock_seed, else 0)")
    group.addoption("--whitney-mock-limit", action="append", default=[], metavar="NAME=VALUE",
                    help="override one of the mock's limits, e.g. max_num_samples=8; repeatable")
    group.addoption("--whitney-mock-api-key", action="append", default=[], metavar="KEY",
                    help=f"accepted API key; repeatable; the first is the fixtures' api_key "
                         f"(default {DEFAULT_API_KEY!r})")
    group.addoption("--whitney-mock-base-model", action="append", default=[], metavar="SPEC",
                    help="serve this base model: ID:vocab_size=N,eos=N[,bos=N][,max_context=N]"
                         "[,max_lora_rank=N]; repeatable (default: the built-in "
                         "whitney-mock/tiny-byte)")
    group.addoption("--whitney-mock-base-model-from", action="append", default=[],
                    metavar="[ID=]DIR",
                    help="serve the base model of a local Hugging Face model folder "
                         "(its id: ID, else the folder's name); repeatable")
    parser.addini("whitney_mock_seed", "seed of the whitney_mock / whitney_server fixtures",
                  default="0")
    parser.addini("whitney_mock_limits", "limit overrides for the mock, one NAME=VALUE a line",
                  type="linelist", default=[])
    parser.addini("whitney_mock_api_keys", "API keys the mock accepts (space separated)",
                  type="args", default=[])
    parser.addini("whitney_mock_base_models", "base models the mock serves, one "
                  "ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N] a line",
                  type="linelist", default=[])
    parser.addini("whitney_mock_base_models_from", "base models the mock serves, one local "
                  "Hugging Face model folder ([ID=]DIR, relative to the rootdir) a line",
                  type="linelist", default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(seed=None, limits=None, api_keys=None, cancel_delay_ms=None, "
                   f"base_models=None): configure the whitney_mock / whitney_server fixtures "
                   f"for this test")
    _base_settings(config)  # a bad option fails the session at once, not in the first test


def _parse_limits(items: list[str], where: str) -> dict[str, int]:
    known = set(Limits().as_dict())
    limits: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or name not in known or not value.lstrip("-").isdigit():
            raise pytest.UsageError(f"{where}: {item!r} is not NAME=INTEGER with NAME one of "
                                    f"{sorted(known)}")
        limits[name] = int(value)
    return limits


def _declared(config: pytest.Config) -> list[Any]:
    """The base models of ini and command line (``ModelSpec`` objects; the mock's engine is
    imported only when some are declared); ``[]`` = the built-in model."""
    def rooted(item: str) -> str:  # ini folders are relative to the rootdir
        model_id, eq, path = item.partition("=")
        if eq and not (config.rootpath / item).is_dir():
            return f"{model_id}={config.rootpath / path}"
        return str(config.rootpath / item)

    levels = [
        ("ini", list(config.getini("whitney_mock_base_models")),
         [(item, rooted(item)) for item in config.getini("whitney_mock_base_models_from")]),
        ("command line", config.getoption("--whitney-mock-base-model"),
         [(item, item) for item in config.getoption("--whitney-mock-base-model-from")]),
    ]
    chosen = [level for level in levels if level[1] or level[2]]
    if not chosen:
        return []
    from ..engine.specs import base_model_from_folder, declare_base_models, parse_base_model

    where, specs, folders = chosen[-1]
    try:
        declared = [parse_base_model(text) for text in specs]
        for given, path in folders:
            try:
                declared.append(base_model_from_folder(path))
            except ValueError as exc:
                raise ValueError(f"folder {given!r}: {exc}") from None
        return list(declare_base_models(declared))
    except ValueError as exc:
        raise pytest.UsageError(f"whitney-mock base models ({where}): {exc}") from None


def _base_settings(config: pytest.Config) -> dict[str, Any]:
    """Settings from ini and command line (what the session-wide server starts with)."""
    seed = config.getoption("--whitney-mock-seed")
    if seed is None:
        raw = str(config.getini("whitney_mock_seed")).strip()
        if not raw.isdigit():
            raise pytest.UsageError(f"ini whitney_mock_seed: {raw!r} is not an integer >= 0")
        seed = int(raw)
    limits = _parse_limits(list(config.getini("whitney_mock_limits")), "ini whitney_mock_limits")
    limits.update(_parse_limits(config.getoption("--whitney-mock-limit"),
                                "--whitney-mock-limit"))
    keys = config.getoption("--whitney-mock-api-key") or list(
        config.getini("whitney_mock_api_keys")) or [DEFAULT_API_KEY]
    return {"seed": seed, "limits": limits, "api_keys": keys, "cancel_delay_ms": 50,
            "base_models": _declared(config)}


def _settings(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Base settings, then the closest ``whitney_mock`` markers (module < class < function)."""
    settings = _base_settings(request.config)
    settings["limits"] = dict(settings["limits"])
    for marker in reversed(list(request.node.iter_markers(MARKER))):
        if marker.args:
            raise TypeError(f"@pytest.mark.{MARKER} takes keyword arguments only "
                            f"({', '.join(sorted(_MARKER_ARGS))})")
        unknown = set(marker.kwargs) - _MARKER_ARGS
        if unknown:
            raise TypeError(f"@pytest.mark.{MARKER}: unknown argument(s) {sorted(unknown)}; "
                            f"known: {sorted(_MARKER_ARGS)}")
        for name, value in marker.kwargs.items():
            if name == "limits":
                settings["limits"].update(value or {})
            elif name == "api_keys":
                settings["api_keys"] = [value] if isinstance(value, str) else list(value)
            elif name == "base_models":
                settings["base_models"] = [value] if isinstance(value, str) else list(value or [])
            else:
                settings[name] = value
    return settings


@pytest.fixture
def whitney_mock(request: pytest.FixtureRequest) -> Iterator[MockWhitney]:
    """A fresh in-process mock Whitney for this test (control plane on, no socket)."""
    from .mock import MockWhitney

    with MockWhitney.in_process(**_settings(request)) as mock:
        yield mock


@pytest.fixture(scope="session")
def whitney_server_session(pytestconfig: pytest.Config) -> Iterator[MockWhitney]:
    """One uvicorn-served mock for the whole session; prefer ``whitney_server``."""
    from .mock import MockWhitney

    with MockWhitney.serve(**_base_settings(pytestconfig)) as server:
        yield server


@pytest.fixture
def whitney_server(request: pytest.FixtureRequest,
                   whitney_server_session: MockWhitney) -> Iterator[MockWhitney]:
    """The served mock (``base_url`` ``http://127.0.0.1:PORT``), reset for this test; a
    server of its own when the test's marker declares other base models than the session's
    (base models are fixed when a server starts)."""
    from ..engine.specs import declare_base_models

    settings = _settings(request)
    server = whitney_server_session
    if declare_base_models(settings["base_models"]) != tuple(server.backend.base_models.values()):
        from .mock import MockWhitney

        with MockWhitney.serve(**settings) as own:
            yield own
        return
    server.reset(**{k: v for k, v in settings.items() if k != "base_models"})
    if server.client.is_closed:  # an earlier test's code closed it
        server.client = server.new_client()
    yield server

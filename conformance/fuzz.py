"""SCHEMA-2: a schemathesis pass over every contract operation of ``openapi.yaml``.

schemathesis generates requests from the document (Hypothesis, positive mode, derandomized so
a run is reproducible); the suite sends them itself, through the same :class:`Wire` as every
check (same auth, same target, same resource tracking: sessions the fuzzer creates are tagged
and closed at teardown), then ``case.validate_response`` applies schemathesis' own checks:
``not_a_server_error``, ``status_code_conformance``, ``content_type_conformance``,
``response_headers_conformance`` and ``response_schema_conformance``.

Nothing is written into the caller's working folder: Hypothesis keeps no example database here
(``database=None``) and its other files (the unicode character cache) go to a temporary home
directory for the duration of the pass; the caller's Hypothesis home is restored afterwards.

Path ids are either generated (unknown ids: 404 paths) or real ids of the suite (a session
that stays open, a finished run whose primitives answer 409 at once instead of holding a
random ``seq`` for ``order_wait_ms``), so the pass reaches handlers beyond the 404.

Version bounds (checked for this package): schemathesis 4.32 requires ``pytest>=8.4,<10`` and
runs here with pytest 9.0.3. The fuzz pass does not use schemathesis' pytest integration
(``@schema.parametrize``/``from_fixture``), only ``operation.as_strategy`` and
``case.validate_response``, so it is independent of pytest's fixture machinery.
"""

from __future__ import annotations

import copy
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .registry import CheckWarning
from .target import API_PREFIX
from .wire import Wire

__all__ = ["fuzz_operations"]

_FUZZ_BASE = "http://fuzz.invalid"


def _checks() -> list[Any]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_headers_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [not_a_server_error, status_code_conformance, content_type_conformance,
            response_headers_conformance, response_schema_conformance]


def _summary(exc: BaseException) -> str:
    """One line per schemathesis failure (title and the first lines of its message)."""
    parts = []
    for failure in getattr(exc, "exceptions", None) or [exc]:
        title = getattr(failure, "title", type(failure).__name__)
        message = " ".join(str(getattr(failure, "message", failure)).split())
        parts.append(f"{title}: {message[:200]}")
    return "; ".join(parts)


def _with_elapsed(response: Any) -> Any:
    """schemathesis reads ``response.elapsed``; responses of a transport that hands httpx a
    pre-read body (the in-process transport) never get it set, so set it from our clock."""
    import datetime

    try:
        response.elapsed  # noqa: B018 (the property raises when unset)
    except RuntimeError:
        response.elapsed = datetime.timedelta(0)
    return response


@contextmanager
def _temporary_hypothesis_home() -> Iterator[None]:
    """Hypothesis' files in a temporary directory, not ``./.hypothesis`` of the caller."""
    import hypothesis.configuration as configuration

    previous = getattr(configuration, "__hypothesis_home_directory", None)
    with tempfile.TemporaryDirectory(prefix="whitney-conformance-hypothesis-") as home:
        configuration.set_hypothesis_home_dir(home)
        try:
            yield
        finally:
            configuration.set_hypothesis_home_dir(previous)


def fuzz_operations(wire: Wire, document: dict[str, Any], examples: int,
                    real_ids: dict[str, Any], tag: dict[str, str]) -> tuple[int, list[str]]:
    """Fuzz every ``/v1/training`` operation; (cases sent, problems found)."""
    try:
        import hypothesis  # noqa: F401 - only to say which optional dependency is missing
    except ImportError as exc:
        raise CheckWarning(f"fuzz pass skipped: {exc.name} is not installed") from None
    with _temporary_hypothesis_home():
        return _fuzz(wire, document, examples, real_ids, tag)


def _fuzz(wire: Wire, document: dict[str, Any], examples: int, real_ids: dict[str, Any],
          tag: dict[str, str]) -> tuple[int, list[str]]:
    try:
        import hypothesis
        import schemathesis
        from hypothesis import HealthCheck, Phase, settings
        from hypothesis import strategies as st
        from schemathesis.core.result import Err
    except ImportError as exc:  # schemathesis is an optional dependency of the suite
        raise CheckWarning(f"fuzz pass skipped: {exc.name} is not installed") from None

    # schemathesis gets its own copy: generated cases may hand back the document's example
    # objects, and nothing done to a case may reach the contract the suite validates with.
    schema = schemathesis.openapi.from_dict(copy.deepcopy(document))
    checks = _checks()
    problems: list[str] = []
    sent = 0
    auth = {"Authorization": f"Bearer {wire.target.api_key}"}
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            problems.append(f"operation not loadable by schemathesis: {result.err()}")
            continue
        operation = result.ok()
        if not operation.path.startswith(API_PREFIX):
            continue  # the mock's own control plane is not part of the contract
        params = [p for p in (operation.path.split("{")[1:])]
        names = [p.split("}")[0] for p in params]
        fixed = {n: real_ids[n] for n in names if n in real_ids}
        strategy = operation.as_strategy()
        if fixed:
            strategy = st.one_of(strategy, operation.as_strategy(path_parameters=fixed))

        def send(case: Any) -> None:  # run by hypothesis within this iteration
            nonlocal sent
            if operation.path == f"{API_PREFIX}/sessions" and isinstance(case.body, dict):
                # hygiene: fuzzed sessions are tagged too. A copy: the body may be the
                # document's own example object, which must stay as the contract wrote it.
                case.body = {**case.body, "metadata": dict(tag)}
            kwargs = case.as_transport_kwargs(base_url=_FUZZ_BASE, headers=auth)
            url = str(kwargs["url"])
            path = url[len(_FUZZ_BASE):] if url.startswith(_FUZZ_BASE) else url
            if path.startswith(API_PREFIX):
                path = path[len(API_PREFIX):]
            headers = {k: str(v) for k, v in (kwargs.get("headers") or {}).items()}
            headers.update(auth)
            body: bytes | None = None
            if "json" in kwargs and kwargs["json"] is not None:
                body = json.dumps(kwargs["json"]).encode()
                headers.setdefault("Content-Type", "application/json")
            elif kwargs.get("data") is not None:
                data = kwargs["data"]
                body = data if isinstance(data, bytes) else str(data).encode()
            response = wire.client.request(kwargs["method"], path, params=kwargs.get("params"),
                                           headers=headers, content=body)
            sent += 1
            wire.record(kwargs["method"], path, response)
            try:
                case.validate_response(_with_elapsed(response), checks=checks)
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as exc:  # noqa: BLE001 - FailureGroup is a BaseExceptionGroup
                problems.append(wire.mask(f"{operation.method.upper()} {path} -> "
                                          f"{response.status_code}: {_summary(exc)}"[:600]))

        runner = settings(max_examples=examples, deadline=None, database=None,
                          derandomize=True, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck))(
            hypothesis.given(case=strategy)(send))
        try:
            runner()
        except Exception as exc:  # noqa: BLE001 - generation errors are findings too
            problems.append(f"{operation.method.upper()} {operation.path}: could not generate "
                            f"cases ({type(exc).__name__}: {str(exc)[:200]})")
    return sent, problems

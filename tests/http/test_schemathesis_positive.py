"""The spec and the server in step (issue 14.6): schemathesis' own ``positive_data_acceptance``
check over every contract operation with a request body, against the in-process mock, with
``openapi.yaml`` as the only description of what a valid request is.

A schema-valid request must not be refused for its shape: 400, or a 422 from the server's
request models (types, ranges, unknown fields, integers written ``565.0``). The business rules
a schema cannot state are configured the way the contract documents them:

- the enums the capabilities fix (``x-enum-from`` on ``base_model`` and ``loss_function``) are
  filled in from this server's ``GET /capabilities`` before generating;
- a 422 for a cross-field rule (loss-input lengths, token ids below ``vocab_size``, per-request
  limits, ranges from capabilities) is one the request models accept: the body is checked with
  ``schemas.validate`` and only a 422 it also gives is a failure.

Path ids are real (a session, a run with version 0 saved), so the primitives run their rules;
``order_wait_ms`` is 1 so a generated seq ahead of its turn answers ``seq_gap`` at once.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.core.result import Err  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from conformance.schema import contract_bytes  # noqa: E402
from mock_server import create_app  # noqa: E402
from mock_server.backend import schemas  # noqa: E402
from mock_server.backend.errors import WhitneyError  # noqa: E402
from mock_server.backend.primitives import PRIMITIVES  # noqa: E402

API = "/v1/training"
KEY = "whitney-mock-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
EXAMPLES = 12  # per operation: ~15 operations, well under a minute in all

MODELS: dict[str, type[schemas.Body]] = {
    "create_session": schemas.CreateSession, "create_run": schemas.CreateRun,
    "heartbeat_session": schemas.Empty, "close_session": schemas.Empty,
    "finish_run": schemas.Empty, "cancel_run": schemas.Empty,
    **{name: primitive.body for name, primitive in PRIMITIVES.items()},
}
#: Lifecycle operations that end what the others need run last.
LAST = ("finish_run", "cancel_run", "close_session")


def _enum_from(path: str, caps: dict[str, Any]) -> list[Any]:
    """``x-enum-from`` of openapi.yaml: ``capabilities.base_models[].id`` or
    ``capabilities.loss_functions`` (its keys)."""
    head, _, rest = path.partition(".")
    assert head == "capabilities", path
    if rest.endswith("[].id"):
        return [item["id"] for item in caps[rest[:-len("[].id")]]]
    return list(caps[rest])


def _fill_enums(node: Any, caps: dict[str, Any], found: list[str]) -> None:
    if isinstance(node, dict):
        if "x-enum-from" in node:
            node["enum"] = _enum_from(node["x-enum-from"], caps)
            found.append(node["x-enum-from"])
        for value in node.values():
            _fill_enums(value, caps, found)
    elif isinstance(node, list):
        for value in node:
            _fill_enums(value, caps, found)


def _model_refuses(model: type[schemas.Body], body: Any) -> str | None:
    """The request models' own verdict on ``body`` (None: accepted)."""
    try:
        schemas.validate(model, {} if body is None else body)
    except WhitneyError as exc:
        return f"{exc.type}: {exc.message}"
    return None


@pytest.fixture
def server() -> tuple[TestClient, dict[str, str], dict[str, Any]]:
    client = TestClient(create_app(api_keys=(KEY,), order_wait_ms=1), base_url="http://mock")
    session = client.post(f"{API}/sessions", json={}, headers=AUTH).json()
    caps = client.get(f"{API}/capabilities", headers=AUTH).json()
    run = client.post(f"{API}/sessions/{session['session_id']}/runs", headers=AUTH, json={
        "base_model": caps["base_models"][0]["id"], "lora": {"rank": 2, "alpha": 4.0},
        "optimizer": "adamw"}).json()
    saved = client.post(f"{API}/runs/{run['run_id']}/save_weights_for_sampler", headers=AUTH,
                        json={"seq": 1, "version": 0})
    assert saved.status_code == 200, saved.text
    return client, {"session_id": session["session_id"], "run_id": run["run_id"]}, caps


def test_schema_valid_requests_are_accepted(server: Any) -> None:
    client, ids, caps = server
    document = yaml.safe_load(contract_bytes())
    filled: list[str] = []
    _fill_enums(document, caps, filled)
    assert sorted(set(filled)) == ["capabilities.base_models[].id",
                                   "capabilities.loss_functions"]
    schema = schemathesis.openapi.from_dict(copy.deepcopy(document))
    operations = []
    for result in schema.get_all_operations():
        assert not isinstance(result, Err), result.err()
        operation = result.ok()
        op_id = operation.definition.raw.get("operationId")
        if operation.path.startswith(API) and op_id in MODELS:
            operations.append((op_id in LAST, op_id, operation))
    assert {op_id for _, op_id, _ in operations} == set(MODELS)
    failures: list[str] = []
    sent = 0
    for _, op_id, operation in sorted(operations, key=lambda item: (item[0], item[1])):
        current = op_id
        names = [part.split("}")[0] for part in operation.path.split("{")[1:]]
        strategy = operation.as_strategy(path_parameters={name: ids[name] for name in names})

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def send(case: Any) -> None:
            nonlocal sent
            kwargs = case.as_transport_kwargs(base_url="http://mock", headers=AUTH)
            body = kwargs.get("json")
            response = client.request(kwargs["method"], kwargs["url"], headers=AUTH,
                                      content=None if body is None else json.dumps(body),
                                      params=kwargs.get("params"))
            sent += 1
            try:
                case.validate_response(response, checks=[positive_data_acceptance])
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:  # noqa: BLE001 - schemathesis raises a FailureGroup
                refused = _model_refuses(MODELS[current], body)
                if response.status_code != 422 or refused is not None:
                    failures.append(f"{current} {json.dumps(body)[:300]} -> "
                                    f"{response.status_code} {response.text[:300]} "
                                    f"(request models: {refused or 'accepted'})")

        send()
    assert sent >= EXAMPLES * len(MODELS) // 2
    assert failures == []


def test_the_check_catches_a_server_refusing_integral_numbers(server: Any) -> None:
    """Not vacuous: a 1.0-style server (``565.0`` refused for an integer) fails this test's
    rule, since its request models refuse what the schema accepts."""
    refused = _model_refuses(schemas.Logprobs, {"seq": 5.5, "version": 0, "token_ids": [1]})
    assert refused is not None and refused.startswith("validation_error")
    assert _model_refuses(schemas.Logprobs, {"seq": 565.0, "version": 0.0,
                                             "token_ids": [3.0]}) is None

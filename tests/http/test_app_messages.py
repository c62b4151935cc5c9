"""The messages round of issue 14 that is not about bodies: every 3xx/4xx the app itself
produces (routing: trailing slashes, unknown paths, wrong methods) is the ERR-1 envelope, never
an empty-bodied redirect; a fault name typo lists the valid names.

The reference for "a route exists" is the route table's own path templates filled with real
ids; "the envelope" is ``conftest.expect_error``.
"""

from __future__ import annotations

import pytest
from conftest import API, expect_error, new_run

from mock_server.http.faults import FAULT_KINDS, TARGETS
from mock_server.http.routes import ROUTES


@pytest.fixture
def filled(client):
    """Every route of the table as (method, concrete path) on real resources."""
    run = new_run(client)
    run.ok("save_weights_for_sampler", {"version": 0})
    export = run.ok("export_lora", {})
    values = {"session_id": run.session_id, "run_id": run.run_id, "seq:int": "1",
              "export_id": export["export_id"], "name": "adapter_config.json"}
    out = []
    for spec in ROUTES:
        path = spec.path
        for name, value in values.items():
            path = path.replace("{" + name + "}", value)
        out.append((spec.method, API + path))
    return out


def test_a_trailing_slash_is_404_in_the_envelope_naming_the_path(client, filled) -> None:
    for method, path in filled:
        response = client.request(method, path + "/", json={} if method == "POST" else None)
        assert not 300 <= response.status_code < 400, (method, path)
        error = expect_error(response, 404, "not_found")
        assert f"no trailing slash: {path}" in error["message"], error


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/nope", 404), ("GET", f"{API}", 404), ("GET", f"{API}/", 404),
    ("GET", f"{API}//capabilities", 404), ("POST", f"{API}/capabilities", 405),
    ("DELETE", f"{API}/sessions", 405), ("PUT", f"{API}/runs/x", 405),
    ("OPTIONS", f"{API}/capabilities", 405), ("PATCH", f"{API}/sessions/x", 405),
    ("GET", "/_mock/trace", 404),  # control plane off in the plain fixture
    ("GET", f"{API}/runs/x/operations/abc", 404),
])
def test_routing_errors_are_enveloped(client, method, path, status) -> None:
    response = client.request(method, path)
    error = expect_error(response, status)
    assert error["type"] == {404: "not_found", 405: "method_not_allowed"}[status]
    assert response.headers.get("x-request-id")


def test_a_fault_name_typo_lists_the_valid_names(whitney_mock) -> None:
    client = whitney_mock.new_client(headers=whitney_mock.control_headers)
    error = expect_error(client.post("/_mock/faults", json={"kind": "error",
                                                            "primitive": "optim_stpe"}), 422)
    assert "did you mean 'optim_step'" in error["message"]
    assert all(name in error["message"] for name in TARGETS)
    error = expect_error(client.post("/_mock/faults", json={"kind": "dorp",
                                                            "primitive": "sample"}), 422)
    assert "did you mean 'drop'" in error["message"]
    assert all(kind in error["message"] for kind in FAULT_KINDS)

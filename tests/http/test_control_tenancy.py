"""Tenancy in the mock's control plane (issue 14, item 8): SEC-2 holds under ``/_mock/`` too.

Two tenants (API keys ``KEY`` and ``OTHER_KEY``) share one mock. The reference for what each may
see and do is the contract's own rule (another key's run answers 404 like an unknown one, and
its request has no effect) plus the rule of the control plane: whatever touches every tenant
(reset, a fault without ``run_id``, configuration overrides) needs the control key, never an
ordinary API key. State is read from the backend, independently of the control plane's answers.
"""

from __future__ import annotations

import httpx
import pytest
from conftest import API, KEY, OTHER_KEY, expect_error, new_run

from mock_server import InProcessTransport, create_app
from mock_server.testing import MockWhitney

FB = {"loss_function": "cross_entropy", "loss_config": {},
      "data": [{"model_input": {"token_ids": [256, 104]},
                "loss_inputs": {"target_tokens": [104, 105]}}]}


@pytest.fixture
def shared():
    """One mock, control plane on, a known control key; clients for both tenants and control."""
    app = create_app(api_keys=(KEY, OTHER_KEY), control_plane=True, control_key="ctl-secret",
                     order_wait_ms=200)
    transport = InProcessTransport(app)
    clients = {name: httpx.Client(transport=transport, base_url="http://mock",
                                  headers={"Authorization": f"Bearer {token}"})
               for name, token in (("a", KEY), ("b", OTHER_KEY), ("control", "ctl-secret"))}
    yield app, clients
    for client in clients.values():
        client.close()
    transport.close()


def test_trace_lists_the_callers_runs_only(shared) -> None:
    app, c = shared
    mine, theirs = new_run(c["a"]), new_run(c["b"])
    mine.ok("save_weights_for_sampler", {"version": 0})
    theirs.ok("save_weights_for_sampler", {"version": 1})
    assert set(c["a"].get("/_mock/trace").json()["runs"]) == {mine.run_id}
    assert set(c["b"].get("/_mock/trace").json()["runs"]) == {theirs.run_id}
    assert set(c["control"].get("/_mock/trace").json()["runs"]) == {mine.run_id, theirs.run_id}
    foreign = c["a"].get("/_mock/trace", params={"run_id": theirs.run_id})
    unknown = c["a"].get("/_mock/trace", params={"run_id": "run_unknown"})
    assert expect_error(foreign, 404)["type"] == expect_error(unknown, 404)["type"]
    assert c["control"].get("/_mock/trace", params={"run_id": theirs.run_id}).status_code == 200


def test_another_keys_run_cannot_be_failed_or_faulted(shared) -> None:
    """The reported bug: key B's ``fail_run`` on key A's run answered 201 and failed it."""
    app, c = shared
    mine = new_run(c["a"])
    for body in ({"kind": "fail_run", "run_id": mine.run_id},
                 {"kind": "error", "primitive": "forward", "run_id": mine.run_id},
                 {"kind": "drop", "primitive": "get_run", "run_id": mine.run_id}):
        foreign = c["b"].post("/_mock/faults", json=body)
        unknown = c["b"].post("/_mock/faults", json={**body, "run_id": "run_unknown"})
        assert expect_error(foreign, 404)["type"] == expect_error(unknown, 404)["type"]
    assert app.state.backend.runs[mine.run_id].state == "active"
    assert app.state.mock_faults.faults == []
    assert mine.ok("forward", FB)["loss"] > 0


def test_a_key_faults_its_own_run_and_only_its_own_calls_hit_it(shared) -> None:
    app, c = shared
    mine = new_run(c["a"])
    added = c["a"].post("/_mock/faults", json={"kind": "error", "primitive": "get_run",
                                               "run_id": mine.run_id, "count": None})
    assert added.status_code == 201, added.text
    assert c["a"].get(mine.url()).status_code == 503
    # B asking for A's run id still gets SEC-2's 404, not A's injected 503
    expect_error(c["b"].get(mine.url()), 404, "not_found")
    assert [f["fault_id"] for f in c["a"].get("/_mock/faults").json()["faults"]] == \
        [added.json()["fault_id"]]
    assert c["b"].get("/_mock/faults").json()["faults"] == []
    assert c["b"].delete("/_mock/faults").json() == {"cleared": 0}
    assert len(app.state.mock_faults.faults) == 1
    assert c["a"].delete("/_mock/faults").json() == {"cleared": 1}
    assert c["a"].get(mine.url()).status_code == 200
    fail = c["a"].post("/_mock/faults", json={"kind": "fail_run", "run_id": mine.run_id})
    assert fail.status_code == 201 and app.state.backend.runs[mine.run_id].state == "failed"


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/_mock/reset", {}),
    ("POST", "/_mock/reset", {"limits": {"max_sessions": 1}}),
    ("POST", "/_mock/faults", {"kind": "error", "primitive": "capabilities"}),
    ("POST", "/_mock/faults", {"kind": "throttle", "primitive": "create_session"}),
    ("POST", "/_mock/faults", {"kind": "latency", "primitive": "forward", "delay_ms": 5}),
])
def test_what_touches_every_tenant_needs_the_control_key(shared, method, path, body) -> None:
    app, c = shared
    run = new_run(c["a"])
    sessions, limits = dict(app.state.backend.sessions), app.state.backend.limits
    for tenant in ("a", "b"):
        expect_error(c[tenant].request(method, path, json=body), 403, "control_key_required")
    assert app.state.backend.sessions == sessions and app.state.backend.limits is limits
    assert app.state.mock_faults.faults == []
    assert c["a"].get(run.url()).status_code == 200
    assert c["control"].request(method, path, json=body).status_code in (200, 201)


def test_the_control_key_is_not_an_api_key(shared) -> None:
    _, c = shared
    expect_error(c["control"].get(f"{API}/capabilities"), 401)
    expect_error(c["control"].post(f"{API}/sessions", json={}), 401)
    # (not closed here: closing a client closes the shared transport)
    bare = httpx.Client(transport=c["a"]._transport, base_url="http://mock")
    expect_error(bare.post("/_mock/reset", json={},
                           headers={"Authorization": "Bearer not-a-key"}), 401)
    both = [("Authorization", "Bearer ctl-secret"), ("Authorization", f"Bearer {KEY}")]
    expect_error(bare.post("/_mock/reset", json={}, headers=both), 401)  # exactly one


def test_a_control_key_is_generated_per_app_and_used_by_mock_whitney() -> None:
    keys = set()
    for _ in range(2):
        with MockWhitney.in_process(api_keys=(KEY,)) as whitney:
            assert whitney.control_key and whitney.control_key not in whitney.api_keys
            keys.add(whitney.control_key)
            run = new_run(whitney.client)
            whitney.inject_fault("error", "capabilities")  # no run: the control key's power
            assert whitney.client.get(f"{API}/capabilities").status_code == 503
            assert whitney.primitives(run.run_id) == []
            assert whitney.reset()["api_key_count"] == 1
            expect_error(whitney.client.post("/_mock/reset", json={}), 403,
                         "control_key_required")
    assert len(keys) == 2
    assert create_app().state.control_key is None  # no control plane, no control key


def test_control_key_survives_a_reset_that_changes_the_api_keys() -> None:
    with MockWhitney.in_process(api_keys=(KEY,)) as whitney:
        whitney.reset(api_keys=["k-new"])
        assert whitney.client.get(f"{API}/capabilities").status_code == 200
        assert whitney.trace() == {}
        whitney.reset()
        assert whitney.api_key == KEY

"""Shrunk counterexamples of the property and state-machine tests that found real bugs.

Each test is the minimal sequence Hypothesis shrank to, written out by hand so it runs in every
profile. A bug still open is marked ``xfail(strict=True)``: the day it is fixed the test
XPASSes, strict turns that into a failure, and whoever fixed it removes the marker (and the
matching workaround in the property test, named in the test's docstring).
"""

from __future__ import annotations

from typing import Any

from conftest import API, KEY, FakeClock, expect_error, new_run

BUG_1 = ("BUG-1 (fixed in state.py: every path out of cancelling pops _cancelling): "
         "Backend.tick() indexes self.runs with stale _cancelling entries: a run that "
         "leaves 'cancelling' other than through _settle (session expiry, fail_run) keeps its "
         "entry, and once its session leaves the closed-session retention window every request "
         "answers 500 (KeyError)")


def close_new_sessions(client: Any, count: int) -> None:
    for _ in range(count):
        response = client.post(f"{API}/sessions", json={})
        assert response.status_code == 201, response.text
        session_id = response.json()["session_id"]
        assert client.post(f"{API}/sessions/{session_id}/close", json={}).status_code == 200


def assert_still_serving(client: Any, run_id: str) -> None:
    """After the run's session was forgotten: the mock still answers, the run is gone (404)."""
    response = client.get(f"{API}/capabilities")
    assert response.status_code == 200, response.text
    expect_error(client.get(f"{API}/runs/{run_id}"), 404, "not_found")


def test_bug_1_run_failed_by_the_server_while_cancelling_then_forgotten(make_mock):
    """Found by ``tests/backend/test_stateful_api.py`` (``AVOID_BUG_1`` steers the machine
    around it):
    cancel (LIFE-7) -> the control plane fails the run while it is ``cancelling`` -> close the
    session -> ``closed_retention`` more sessions close -> time passes ``cancel_at``."""
    clock = FakeClock()
    mock = make_mock(clock=clock, control_plane=True, cancel_delay_ms=50)
    mock.backend.closed_retention = 1
    client = mock.client(KEY)
    handle = new_run(client)
    assert client.post(handle.url("cancel"), json={}).json()["state"] == "cancelling"
    response = client.post("/_mock/faults", json={"kind": "fail_run", "run_id": handle.run_id})
    assert response.status_code == 201, response.text
    assert handle.view()["state"] == "failed"
    assert client.post(f"{API}/sessions/{handle.session_id}/close", json={}).status_code == 200
    close_new_sessions(client, 1)  # the run's session leaves the retention window
    clock.advance(1)  # past the run's cancel_at
    assert_still_serving(client, handle.run_id)


def test_bug_1_session_expired_while_its_run_was_cancelling_then_forgotten(make_mock):
    """The same stale entry through LIFE-4: the session expires while its run is still
    ``cancelling``, so the run reads ``cancelled`` without passing through ``_settle``."""
    clock = FakeClock()
    mock = make_mock(clock=clock, cancel_delay_ms=50)
    mock.backend.closed_retention = 1
    client = mock.client(KEY)
    handle = new_run(client, ttl_seconds=1)
    assert client.post(handle.url("cancel"), json={}).json()["state"] == "cancelling"
    clock.advance(2)  # expiry and cancel_at pass in the same tick
    assert handle.view()["state"] == "cancelled"
    assert client.get(f"{API}/sessions/{handle.session_id}").json()["state"] == "expired"
    close_new_sessions(client, 1)
    assert_still_serving(client, handle.run_id)

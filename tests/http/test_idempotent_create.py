"""LIFE-9 (contract 1.1, optional feature ``idempotent_create``): ``Idempotency-Key`` on
``POST /sessions`` and ``POST /sessions/{sid}/runs``.

The reference is a count kept on the side: which sessions and runs each key must own after the
requests sent (one per distinct creation), read back from the backend's own tables, plus the
bytes of the first answer (a replay repeats them exactly).
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from conftest import API, KEY, MODEL, OTHER_KEY, FakeClock, expect_error

from mock_server import Features

RUN_BODY = {"base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0, "seed": 1},
            "optimizer": "adamw"}


def owned(mock, key: str) -> list[str]:
    return [sid for sid, s in mock.backend.sessions.items() if s.key == key]


def post(client: httpx.Client, path: str, body: dict | None = None, key: str | None = None,
         **kwargs) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post(f"{API}{path}", json=body if body is not None else {}, headers=headers,
                       **kwargs)


def test_same_key_same_body_is_one_session_answered_twice(mock, client) -> None:
    first = post(client, "/sessions", {"metadata": {"job": "a"}}, "k-1")
    assert first.status_code == 201 and "whitney-replayed" not in first.headers
    # JSON-equal: other key order and whitespace
    again = client.post(f"{API}/sessions", content=b'{ "metadata" : {"job":"a"} }',
                        headers={"Idempotency-Key": "k-1", "Content-Type": "application/json"})
    assert again.status_code == 201 and again.headers["whitney-replayed"] == "true"
    assert again.content == first.content
    assert owned(mock, KEY) == [first.json()["session_id"]]


def test_same_key_other_body_is_409_and_creates_nothing(mock, client) -> None:
    first = post(client, "/sessions", {"metadata": {"job": "a"}}, "k-1")
    for body in ({"metadata": {"job": "b"}}, {}, {"metadata": {"job": "a"}, "ttl_seconds": 60}):
        error = expect_error(post(client, "/sessions", body, "k-1"), 409, "idempotency_conflict")
        assert error["details"]["idempotency_key"] == "k-1"
    # the key is scoped to its creation path too: reusing it for a run is a conflict
    sid = first.json()["session_id"]
    expect_error(post(client, f"/sessions/{sid}/runs", RUN_BODY, "k-1"), 409,
                 "idempotency_conflict")
    assert owned(mock, KEY) == [sid] and mock.backend.sessions[sid].run_ids == []


def test_keys_are_scoped_to_the_api_key(mock, client, other_client) -> None:
    """SEC-2: another API key's same Idempotency-Key is independent of this one."""
    mine = post(client, "/sessions", {"metadata": {"job": "a"}}, "shared")
    theirs = post(other_client, "/sessions", {"metadata": {"job": "a"}}, "shared")
    assert theirs.status_code == 201 and "whitney-replayed" not in theirs.headers
    assert theirs.json()["session_id"] != mine.json()["session_id"]
    assert owned(mock, KEY) == [mine.json()["session_id"]]
    assert owned(mock, OTHER_KEY) == [theirs.json()["session_id"]]
    other = post(other_client, "/sessions", {"metadata": {"job": "z"}}, "shared")
    expect_error(other, 409, "idempotency_conflict")  # its own first use, not mine


def test_run_creation_is_idempotent_within_its_session(mock, client) -> None:
    sid = post(client, "/sessions").json()["session_id"]
    first = post(client, f"/sessions/{sid}/runs", RUN_BODY, "run-1")
    again = post(client, f"/sessions/{sid}/runs", RUN_BODY, "run-1")
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.content == first.content and again.headers["whitney-replayed"] == "true"
    assert mock.backend.sessions[sid].run_ids == [first.json()["run_id"]]
    second = post(client, f"/sessions/{sid}/runs", RUN_BODY, "run-2")
    assert mock.backend.sessions[sid].run_ids == [first.json()["run_id"],
                                                  second.json()["run_id"]]
    view = client.get(f"{API}/sessions/{sid}").json()
    assert [r["run_id"] for r in view["runs"]] == mock.backend.sessions[sid].run_ids


def test_a_replay_is_answered_before_quotas_and_after_close(make_mock) -> None:
    mock = make_mock(limits={"max_sessions": 1, "max_runs_per_session": 1})
    client = mock.client(KEY)
    created = post(client, "/sessions", {}, "only")
    assert post(client, "/sessions", {}, "only").content == created.content  # quota full
    expect_error(post(client, "/sessions", {}, "new"), 409, "quota_exceeded")
    sid = created.json()["session_id"]
    run = post(client, f"/sessions/{sid}/runs", RUN_BODY, "r")
    assert post(client, f"/sessions/{sid}/runs", RUN_BODY, "r").content == run.content
    client.post(f"{API}/runs/{run.json()['run_id']}/finish", json={})
    assert client.post(f"{API}/sessions/{sid}/close", json={}).json()["state"] == "closed"
    # the remembered answer, byte for byte, while the session is retained
    replay = post(client, f"/sessions/{sid}/runs", RUN_BODY, "r")
    assert replay.status_code == 201 and replay.content == run.content
    assert post(client, "/sessions", {}, "only").content == created.content
    expect_error(post(client, f"/sessions/{sid}/runs", RUN_BODY, "r-new"), 409,
                 "session_not_open")


def test_a_refused_creation_is_not_remembered(make_mock) -> None:
    mock = make_mock(limits={"max_sessions": 1})
    client = mock.client(KEY)
    blocker = post(client, "/sessions").json()["session_id"]
    expect_error(post(client, "/sessions", {"metadata": {"n": "1"}}, "k"), 409, "quota_exceeded")
    expect_error(post(client, "/sessions", {"ttl_seconds": 0}, "k2"), 422)
    client.post(f"{API}/sessions/{blocker}/close", json={})
    # nothing was created under "k", so it may be sent again, even with another body
    created = post(client, "/sessions", {"metadata": {"n": "2"}}, "k")
    assert created.status_code == 201 and "whitney-replayed" not in created.headers
    assert len(owned(mock, KEY)) == 2


def test_keys_live_as_long_as_their_session(make_mock) -> None:
    clock = FakeClock()
    mock = make_mock(clock=clock, closed_retention=2)
    client = mock.client(KEY)
    first = post(client, "/sessions", {}, "k").json()["session_id"]
    client.post(f"{API}/sessions/{first}/close", json={})
    for _ in range(2):  # two newer closes: the first session leaves the window
        sid = post(client, "/sessions").json()["session_id"]
        client.post(f"{API}/sessions/{sid}/close", json={})
    assert first not in mock.backend.sessions
    again = post(client, "/sessions", {}, "k")
    assert again.status_code == 201 and "whitney-replayed" not in again.headers
    assert again.json()["session_id"] != first
    assert ("test-key-1", "k") in mock.backend._creations
    assert len(mock.backend._creations) == 1  # the evicted session's key went with it


@pytest.mark.parametrize("headers", [
    [("Idempotency-Key", "")],
    [("Idempotency-Key", "x" * 256)],
    [("Idempotency-Key", "has space")],
    [("Idempotency-Key", "caf\u00e9".encode("utf-8"))],
    [("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
])
def test_a_bad_idempotency_key_is_422_without_effect(mock, client, headers) -> None:
    response = client.post(f"{API}/sessions", content=b"{}", headers=headers)
    error = expect_error(response, 422, "validation_error")
    assert error["details"]["errors"][0]["loc"] == ["header", "Idempotency-Key"]
    assert owned(mock, KEY) == []


def test_longest_key_is_accepted(mock, client) -> None:
    key = "~" * 255
    assert post(client, "/sessions", {}, key).status_code == 201
    assert post(client, "/sessions", {}, key).headers["whitney-replayed"] == "true"


def test_concurrent_duplicates_create_once(mock, client) -> None:
    replies: list[httpx.Response] = []
    barrier = threading.Barrier(6)

    def send() -> None:
        barrier.wait()
        replies.append(post(client, "/sessions", {"metadata": {"c": "1"}}, "race"))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [r.status_code for r in replies] == [201] * 6
    assert len({r.content for r in replies}) == 1
    assert sum(r.headers.get("whitney-replayed") == "true" for r in replies) == 5
    assert len(owned(mock, KEY)) == 1


def test_a_dropped_creation_response_is_recovered_by_replay(whitney_mock) -> None:
    """The situation LIFE-9 exists for: the response to a creation is lost after the server
    created the resource; the retry with the same key learns the id, nothing twice."""
    client = whitney_mock.client
    whitney_mock.inject_fault("drop", "create_session")
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, "/sessions", {}, "s")
    session = post(client, "/sessions", {}, "s")
    assert session.headers["whitney-replayed"] == "true"
    sid = session.json()["session_id"]
    whitney_mock.inject_fault("drop", "create_run")
    with pytest.raises(httpx.RemoteProtocolError):
        post(client, f"/sessions/{sid}/runs", RUN_BODY, "r")
    run = post(client, f"/sessions/{sid}/runs", RUN_BODY, "r")
    assert run.headers["whitney-replayed"] == "true"
    assert list(whitney_mock.backend.sessions) == [sid]
    assert whitney_mock.backend.sessions[sid].run_ids == [run.json()["run_id"]]


def test_without_the_feature_the_header_is_ignored(make_mock) -> None:
    mock = make_mock(features=Features(idempotent_create=False))
    client = mock.client(KEY)
    caps = client.get(f"{API}/capabilities").json()
    assert caps["features"]["idempotent_create"] is False
    first = post(client, "/sessions", {}, "k")
    second = post(client, "/sessions", {"metadata": {"x": "y"}}, "k")
    assert (first.status_code, second.status_code) == (201, 201)
    assert "whitney-replayed" not in second.headers
    assert len(owned(mock, KEY)) == 2
    assert json.loads(first.content)["session_id"] != json.loads(second.content)["session_id"]

"""EXPORT-2 (contract 1.1, optional feature ``exports_after_close``): an export can be
downloaded after its run finished and its session closed (the seed's order is save_state ->
export_lora -> finish -> close), for as long as the session stays readable (the mock's
``closed_retention`` window); then 404 with a message saying the session was closed and
evicted. Checkpoints follow the same rule (CKPT-1: another run of the key may load them until
then). The reference for the bytes is the export's own listing (sizes and sha256).
"""

from __future__ import annotations

import hashlib

from conftest import API, KEY, OTHER_KEY, expect_error, new_run

from mock_server import Features


def exported_and_closed(client, *, close: bool = True):
    run = new_run(client)
    checkpoint = run.ok("save_state", {"name": "final"})
    export = run.ok("export_lora", {})
    assert client.post(run.url("finish"), json={}).json()["state"] == "finished"
    if close:
        assert client.post(f"{API}/sessions/{run.session_id}/close",
                           json={}).json()["state"] == "closed"
    return run, checkpoint, export


def close_empty_sessions(client, n: int) -> None:
    for _ in range(n):
        sid = client.post(f"{API}/sessions", json={}).json()["session_id"]
        assert client.post(f"{API}/sessions/{sid}/close", json={}).status_code == 200


def test_exports_download_after_close_until_eviction(make_mock) -> None:
    mock = make_mock(closed_retention=3)
    client = mock.client(KEY)
    run, _, export = exported_and_closed(client)
    urls = {f["name"]: run.url(f"exports/{export['export_id']}/{f['name']}")
            for f in export["files"]}
    for entry in export["files"]:
        response = client.get(urls[entry["name"]])
        assert response.status_code == 200, response.text
        assert len(response.content) == entry["bytes"]
        assert hashlib.sha256(response.content).hexdigest() == entry["sha256"]
    # ORD-3 on the closed run lists the same files, and they are still there
    replay = run.post("export_lora", {}, seq=2)
    assert replay.headers["whitney-replayed"] == "true" and replay.json() == export
    close_empty_sessions(client, 2)  # still inside the window of 3
    assert client.get(urls["adapter_config.json"]).status_code == 200
    close_empty_sessions(client, 1)  # now evicted
    for _name, url in urls.items():
        error = expect_error(client.get(url), 404, "export_not_found")
        assert "closed" in error["message"] and "evicted" in error["message"], error
        assert run.session_id in error["message"]
    # the run and the session themselves say why they are gone, to their owner
    for path in (run.url(), f"{API}/sessions/{run.session_id}"):
        assert "evicted" in expect_error(client.get(path), 404, "not_found")["message"]


def test_another_key_learns_nothing_before_or_after_eviction(make_mock) -> None:
    mock = make_mock(closed_retention=1)
    client, other = mock.client(KEY), mock.client(OTHER_KEY)
    run, _, export = exported_and_closed(client)
    url = run.url(f"exports/{export['export_id']}/adapter_config.json")
    unknown = expect_error(other.get(f"{API}/runs/run_unknown/exports/x/adapter_config.json"),
                           404)
    before = expect_error(other.get(url), 404)
    close_empty_sessions(client, 1)
    after = expect_error(other.get(url), 404)
    assert before["type"] == after["type"] == unknown["type"] == "not_found"
    assert "evicted" not in after["message"] and "evicted" not in before["message"]
    assert "evicted" in expect_error(client.get(url), 404)["message"]


def test_checkpoints_of_a_closed_session_load_until_eviction(make_mock) -> None:
    mock = make_mock(closed_retention=2)
    client = mock.client(KEY)
    _, checkpoint, _ = exported_and_closed(client)
    loader = new_run(client)
    loaded = loader.ok("load_state", {"checkpoint_id": checkpoint["checkpoint_id"],
                                      "with_optimizer": True})
    assert loaded == {"checkpoint_id": checkpoint["checkpoint_id"], "step": 0}
    close_empty_sessions(client, 2)
    expect_error(loader.post("load_state", {"checkpoint_id": checkpoint["checkpoint_id"],
                                            "with_optimizer": True}), 404, "checkpoint_not_found")


def test_without_the_feature_exports_go_at_close(make_mock) -> None:
    mock = make_mock(features=Features(exports_after_close=False))
    client = mock.client(KEY)
    run, _, export = exported_and_closed(client, close=False)
    url = run.url(f"exports/{export['export_id']}/adapter_config.json")
    assert client.get(url).status_code == 200
    client.post(f"{API}/sessions/{run.session_id}/close", json={})
    error = expect_error(client.get(url), 404, "export_not_found")
    assert "before close" in error["message"]

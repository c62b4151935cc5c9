"""The dashboard without a browser: ``/_mock/ui`` and its JSON, ``GET /_mock/ui/state``.

The reference is what each test did itself through the contract's API (the responses it got,
the seqs it sent), never the read model's own code: the state must show exactly that, and only
to the key that did it (SEC-2).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
import pytest
from conftest import (
    ADAMW,
    API,
    KEY,
    OTHER_KEY,
    ce_datum,
    new_run,
    text_tokens,
    wait_held,
)

from mock_server.backend import readmodel

STATE = "/_mock/ui/state"


@pytest.fixture
def ui_mock(make_mock: Any) -> Any:
    return make_mock(control_plane=True, order_wait_ms=300)


def state(client: httpx.Client, since: int | None = None) -> dict[str, Any]:
    response = client.get(STATE, params=None if since is None else {"since": since})
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    return response.json()  # type: ignore[no-any-return]


def run_of(data: dict[str, Any], run_id: str) -> dict[str, Any]:
    (found,) = [run for run in data["runs"] if run["run_id"] == run_id]
    return found


# -- the page ---------------------------------------------------------------------------------
def test_the_page_is_served_only_with_the_control_plane(make_mock: Any) -> None:
    plain = make_mock().client(KEY)
    assert plain.get("/_mock/ui").status_code == 404
    assert plain.get(STATE).status_code == 404


def test_the_page_and_its_files_are_public_static_and_self_contained(ui_mock: Any) -> None:
    anonymous = ui_mock.client(None)
    page = anonymous.get("/_mock/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "script-src 'self'" in csp  # no inline script, nothing from elsewhere
    for name, media in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        asset = anonymous.get(f"/_mock/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(media)
        assert f"/_mock/ui/{name}" in page.text
        # offline: no absolute URL to fetch anything from (http://, https://, //host)
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", asset.text, re.I), name
    assert not re.search(r"https?://", page.text)
    assert anonymous.get("/_mock/ui/other.js").status_code == 404
    assert anonymous.get("/_mock/ui/").status_code == 200


def test_the_data_needs_a_key(ui_mock: Any) -> None:
    assert ui_mock.client(None).get(STATE).status_code == 401
    assert ui_mock.client("not-a-key").get(STATE).status_code == 401
    bad = ui_mock.client(KEY).get(STATE, params={"since": "-1"})
    assert bad.status_code == 422 and "since" in bad.json()["error"]["message"]


# -- isolation (SEC-2 in the page) ------------------------------------------------------------
def arm(client: httpx.Client, **fault: Any) -> dict[str, Any]:
    response = client.post("/_mock/faults", json={"kind": "latency", "delay_ms": 0, **fault})
    assert response.status_code == 201, response.text
    return response.json()  # type: ignore[no-any-return]


def test_a_key_sees_only_its_own_sessions_runs_and_faults(ui_mock: Any) -> None:
    mine, theirs = ui_mock.client(KEY), ui_mock.client(OTHER_KEY)
    # a fault for every tenant needs the control key where the mock has one
    control_key = getattr(ui_mock.app.state, "control_key", None)
    control = ui_mock.client(control_key) if control_key else mine
    handle = new_run(mine, ttl_seconds=600)
    handle.save(0)
    other_handle = new_run(theirs)
    everyone = arm(control, primitive="capabilities", count=None)
    on_my_run = arm(mine, primitive="get_run", run_id=handle.run_id)
    on_their_run = arm(theirs, primitive="get_run", run_id=other_handle.run_id)

    seen_by_them = state(theirs)
    assert [s["session_id"] for s in seen_by_them["sessions"]] == [other_handle.session_id]
    assert [r["run_id"] for r in seen_by_them["runs"]] == [other_handle.run_id]
    assert [f["fault_id"] for f in seen_by_them["faults"]] == [everyone["fault_id"],
                                                              on_their_run["fault_id"]]
    text = orjson_text(seen_by_them)
    for secret in (handle.session_id, handle.run_id, on_my_run["fault_id"]):
        assert secret not in text

    seen_by_me = state(mine)
    assert [s["session_id"] for s in seen_by_me["sessions"]] == [handle.session_id]
    assert [f["fault_id"] for f in seen_by_me["faults"]] == [everyone["fault_id"],
                                                            on_my_run["fault_id"]]
    assert other_handle.run_id not in orjson_text(seen_by_me)
    assert on_their_run["fault_id"] not in orjson_text(seen_by_me)
    assert [f["scope"] for f in seen_by_me["faults"]] == ["every tenant", "this key"]


def orjson_text(data: Any) -> str:
    import orjson

    return orjson.dumps(data).decode()


# -- content ----------------------------------------------------------------------------------
def test_sessions_show_state_ttl_and_metadata(ui_mock: Any) -> None:
    client = ui_mock.client(KEY)
    created = client.post(f"{API}/sessions", json={"ttl_seconds": 120,
                                                   "metadata": {"job": "unit"}}).json()
    (session,) = state(client)["sessions"]
    assert session["session_id"] == created["session_id"] and session["state"] == "open"
    assert session["metadata"] == {"job": "unit"} and session["ttl_seconds"] == 120
    assert session["expires_at"] - session["created_at"] == pytest.approx(120)
    client.post(f"{API}/sessions/{created['session_id']}/close", json={})
    (session,) = state(client)["sessions"]
    assert session["state"] == "closed"


def test_the_timeline_is_what_the_client_did_in_seq_order(ui_mock: Any) -> None:
    client = ui_mock.client(KEY)
    handle = new_run(client)
    did: list[tuple[int, str, str]] = []  # (seq, primitive, outcome) as the API answered

    def step(primitive: str, body: dict[str, Any], seq: int | None = None) -> dict[str, Any]:
        response = handle.post(primitive, body, seq=seq)
        outcome = "completed" if response.status_code == 200 else \
            response.json()["error"]["type"]
        if seq is None:
            did.append((handle.seq.last, primitive, outcome))
        return response.json()  # type: ignore[no-any-return]

    saved = step("save_weights_for_sampler", {"version": 0})
    sample = step("sample", {"version": 0, "prompt": {"token_ids": text_tokens("Hi")},
                             "num_samples": 2, "sampling": {"max_tokens": 10, "temperature": 1.0,
                                                            "top_k": 0, "top_p": 1.0, "seed": 3}})
    data = [ce_datum(text_tokens("hello world"))]
    fb1 = step("forward_backward", {"loss_function": "cross_entropy", "loss_config": {},
                                    "data": data})
    fb2 = step("forward_backward", {"loss_function": "cross_entropy", "loss_config": {},
                                    "data": data})
    opt = step("optim_step", {"adamw": ADAMW})
    step("optim_step", {"adamw": ADAMW})  # 409 no_gradients, recorded (ORD-4)
    saved1 = step("save_weights_for_sampler", {"version": 1})
    logprobs = step("logprobs", {"version": 1, "token_ids": text_tokens("ok")})
    # a replay of seq 5 (the optim_step): same bytes, answered from the record
    replay = handle.post("optim_step", {"adamw": ADAMW}, seq=5)
    assert replay.headers["whitney-replayed"] == "true"

    run = run_of(state(client), handle.run_id)
    assert [(op["seq"], op["primitive"],
             op["status"] if op["status"] == "completed" else op["error"]) for op in run["ops"]] \
        == did
    by_seq = {op["seq"]: op for op in run["ops"]}
    assert by_seq[5]["replays"] == 1 and sum(op["replays"] for op in run["ops"]) == 1
    assert all(op["duration_ms"] >= 0 and op["held_ms"] is None for op in run["ops"])
    assert by_seq[6]["http_status"] == 409
    assert (by_seq[1]["version"], by_seq[1]["step"]) == (saved["version"], saved["step"])
    assert (by_seq[7]["version"], by_seq[7]["step"]) == (saved1["version"], saved1["step"])
    assert by_seq[3]["loss"] == fb1["loss"] and by_seq[4]["loss"] == fb2["loss"]
    assert (run["step"], run["next_seq"], run["state"]) == (1, 9, "active")
    assert [(v["version"], v["step"]) for v in run["versions"]] == [(0, 0), (1, 1)]
    # which samples used which version
    assert run["uses"] == [{"seq": 2, "primitive": "sample", "version": 0},
                           {"seq": 8, "primitive": "logprobs", "version": logprobs["version"]}]
    # one curve point per optimizer step: the loss it applied (GRAD-1: both forward_backward
    # calls since the last step), and its norms as optim_step answered them
    assert run["points"] == [{"seq": 5, "step": opt["step"], "loss": fb1["loss"] + fb2["loss"],
                              "grad_norm": opt["grad_norm"], "update_norm": opt["update_norm"]}]
    # previews: the sampled bytes decoded, EOS marked
    previews = by_seq[2]["previews"]
    assert len(previews) == 2
    for shown, sequence in zip(previews, sample["sequences"], strict=False):
        text = bytes(t for t in sequence["tokens"] if t < 256).decode("utf-8", "replace")
        assert shown["text"].replace("\u27e8eos\u27e9", "") == text
        assert shown["tokens"] == len(sequence["tokens"])
        assert shown["stop_reason"] == sequence["stop_reason"]


def test_since_returns_only_what_changed(ui_mock: Any) -> None:
    client = ui_mock.client(KEY)
    handle = new_run(client)
    handle.save(0)
    first = state(client)
    assert len(run_of(first, handle.run_id)["ops"]) == 1
    again = state(client, since=first["cursor"])
    assert again["cursor"] > first["cursor"]
    assert run_of(again, handle.run_id)["ops"] == []  # sessions and runs still come whole
    handle.save(1)
    handle.post("save_weights_for_sampler", {"version": 0}, seq=1)  # replay: seq 1 changed
    answer = state(client, since=again["cursor"])
    later = run_of(answer, handle.run_id)
    assert [(op["seq"], op["replays"]) for op in later["ops"]] == [(1, 1), (2, 0)]
    handle.post("save_weights_for_sampler", {"version": 1}, seq=2)  # replays only
    handle.post("save_weights_for_sampler", {"version": 0}, seq=1)
    replays = run_of(state(client, since=answer["cursor"]), handle.run_id)
    assert [(op["seq"], op["replays"]) for op in replays["ops"]] == [(1, 2), (2, 1)]


def test_held_requests_show_while_held_then_how_long_they_waited(ui_mock: Any) -> None:
    client = ui_mock.client(KEY)
    handle = new_run(client)
    handle.save(0)
    # seq 3 (optim_step) arrives before seq 2 (forward_backward): held until 2 executes
    answers: dict[str, httpx.Response] = {}
    ahead = threading.Thread(target=lambda: answers.update(
        opt=handle.post("optim_step", {"adamw": ADAMW}, seq=3)))
    ahead.start()
    wait_held(ui_mock.backend, handle.run_id, 3)
    time.sleep(0.05)
    (held,) = run_of(state(client), handle.run_id)["held"]
    assert (held["seq"], held["primitive"]) == (3, "optim_step") and held["held_ms"] >= 40
    fb = handle.post("forward_backward", {"loss_function": "cross_entropy", "loss_config": {},
                                          "data": [ce_datum(text_tokens("abc"))]}, seq=2)
    ahead.join(10)
    assert fb.status_code == 200 and answers["opt"].status_code == 200
    run = run_of(state(client), handle.run_id)
    assert run["held"] == []
    by_seq = {op["seq"]: op for op in run["ops"]}
    assert by_seq[2]["held_ms"] is None and by_seq[3]["held_ms"] >= 40
    assert by_seq[3]["status"] == "completed" and by_seq[3]["step"] == 1


def test_holds_that_end_without_executing_are_listed(ui_mock: Any) -> None:
    client = ui_mock.client(KEY)
    handle = new_run(client)
    gap = handle.post("save_weights_for_sampler", {"version": 0}, seq=2)  # 300 ms, then 409
    assert gap.json()["error"]["type"] == "seq_gap"
    answers: dict[str, httpx.Response] = {}
    waiting = threading.Thread(target=lambda: answers.update(
        held=handle.post("save_weights_for_sampler", {"version": 0}, seq=4)))
    waiting.start()
    wait_held(ui_mock.backend, handle.run_id, 4)
    client.post(handle.url("cancel"), json={})
    waiting.join(10)
    assert answers["held"].json()["error"]["type"] == "run_cancelled"
    run = run_of(state(client), handle.run_id)
    assert [(e["seq"], e["primitive"], e["outcome"]) for e in run["ended_holds"]] == [
        (2, "save_weights_for_sampler", "seq_gap"), (4, "save_weights_for_sampler",
                                                     "run_cancelled")]
    assert run["ended_holds"][0]["held_ms"] >= 250
    assert run["ops"] == [] and run["state"] in ("cancelling", "cancelled")


def test_an_answer_keeps_the_newest_operations_of_a_long_run(ui_mock: Any,
                                                               monkeypatch: Any) -> None:
    monkeypatch.setattr(readmodel, "OPS_PER_RUN", 3)
    client = ui_mock.client(KEY)
    handle = new_run(client)
    for version in range(5):
        handle.save(version)
    run = run_of(state(client), handle.run_id)
    assert [op["seq"] for op in run["ops"]] == [3, 4, 5] and run["ops_omitted"] == 2
    assert run["operations"] == 5 and len(run["versions"]) == 5


def test_previews_are_text_for_the_byte_model_and_ids_otherwise() -> None:
    text = readmodel.preview([256, *b"caf\xc3\xa9", 257], byte_model=True, stop_reason="stop")
    assert text == {"tokens": 7, "truncated": False, "stop_reason": "stop",
                    "text": "\u27e8bos\u27e9caf\u00e9\u27e8eos\u27e9"}
    ids = readmodel.preview(range(200), byte_model=False)
    assert ids["ids"] == list(range(readmodel.PREVIEW_TOKENS)) and ids["truncated"]
    assert "text" not in ids


def test_the_read_model_knows_no_starlette() -> None:
    code = ("import sys, mock_server.backend.readmodel; "
            "print([m for m in sys.modules if m.startswith(('starlette', 'mock_server.http'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_mock_command_prints_the_dashboard_url() -> None:
    """``python -m mock_server --control-plane`` names the page; the page is there."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "mock_server", "--control-plane",
                               "--port", str(port)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        lines: list[str] = []
        while not any("/_mock/ui" in line for line in lines):
            line = server.stdout.readline()
            assert line, f"the mock stopped without naming the dashboard: {lines}"
            lines.append(line)
        (url,) = re.findall(r"http://\S+/_mock/ui", lines[-1])
        assert url == f"http://127.0.0.1:{port}/_mock/ui"
        deadline = time.monotonic() + 20
        while True:
            try:
                page = httpx.get(url, timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the dashboard never answered"
                time.sleep(0.1)
        assert page.status_code == 200 and "dashboard.js" in page.text
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


def test_previews_of_a_declared_model_are_token_ids(make_mock: Any) -> None:
    mock = make_mock(control_plane=True, base_models=["acme/tiny:vocab_size=1000,eos=999"])
    client = mock.client(KEY)
    session = client.post(f"{API}/sessions", json={}).json()
    run = client.post(f"{API}/sessions/{session['session_id']}/runs", json={
        "base_model": "acme/tiny", "lora": {"rank": 4, "alpha": 8, "seed": 1},
        "optimizer": "adamw"}).json()
    url = f"{API}/runs/{run['run_id']}"
    assert client.post(f"{url}/save_weights_for_sampler", json={"seq": 1, "version": 0}) \
        .status_code == 200
    sample = client.post(f"{url}/sample", json={
        "seq": 2, "version": 0, "prompt": {"token_ids": [5, 600]}, "num_samples": 2,
        "sampling": {"max_tokens": 6, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                     "seed": 1}}).json()
    shown = run_of(state(client), run["run_id"])
    assert shown["byte_model"] is False
    (op,) = [op for op in shown["ops"] if op["primitive"] == "sample"]
    assert [p["ids"] for p in op["previews"]] == [s["tokens"] for s in sample["sequences"]]

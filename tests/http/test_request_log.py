"""One structured log line per request (logger ``mock_server.requests``, INFO).

The reference for every field is what the test itself sent and what the client received.
"""

from __future__ import annotations

import logging
import shlex
import socket
import subprocess
import sys
import time

import httpx
import orjson
import pytest
from conftest import API, ce_datum, new_run, text_tokens

from mock_server.http.logs import REQUEST_LOGGER, find_seq, format_fields

FB = {"loss_function": "cross_entropy", "loss_config": {},
      "data": [ce_datum(text_tokens("logged"))]}


def logged(caplog: pytest.LogCaptureFixture) -> list[dict]:
    return [r.whitney_request for r in caplog.records if r.name == REQUEST_LOGGER]


def parse_logfmt(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in shlex.split(line))


def test_one_line_per_request_with_what_the_client_saw(whitney_mock, caplog) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("throttle", "forward_backward", retry_after=0)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        sent = [
            run.post("forward_backward", FB, seq=1, headers={"X-Request-Id": "r-1"}),  # 429
            run.post("forward_backward", FB, seq=1),
            run.post("forward_backward", FB, seq=1),  # replay
            whitney_mock.client.get(run.url()),
        ]
    lines = logged(caplog)
    assert len(lines) == len(sent)
    expected = [
        {"method": "POST", "path": run.url("forward_backward"), "status": 429, "run": run.run_id,
         "seq": 1, "replayed": False, "fault": "throttle", "request_id": "r-1", "error": None},
        {"method": "POST", "path": run.url("forward_backward"), "status": 200, "run": run.run_id,
         "seq": 1, "replayed": False, "fault": None},
        {"method": "POST", "path": run.url("forward_backward"), "status": 200, "run": run.run_id,
         "seq": 1, "replayed": True, "fault": None},
        {"method": "GET", "path": run.url(), "status": 200, "run": run.run_id, "seq": None,
         "replayed": False, "fault": None},
    ]
    for line, want, response in zip(lines, expected, sent, strict=False):
        assert {k: line[k] for k in want} == want
        assert line["request_id"] == response.headers["x-request-id"]
        assert float(line["ms"]) >= 0
    text = [r.getMessage() for r in caplog.records if r.name == REQUEST_LOGGER]
    replay = parse_logfmt(text[2])
    assert set(replay) == {"method", "path", "status", "ms", "run", "seq", "replayed", "fault",
                           "request_id", "error"}
    assert {k: replay[k] for k in ("method", "path", "status", "run", "seq", "replayed", "fault",
                                   "error")} == {
        "method": "POST", "path": run.url("forward_backward"), "status": "200",
        "run": run.run_id, "seq": "1", "replayed": "true", "fault": "-", "error": "-"}


def test_a_dropped_response_is_logged_with_its_fault(whitney_mock, caplog) -> None:
    run = new_run(whitney_mock.client)
    whitney_mock.inject_fault("drop", "forward_backward")
    with caplog.at_level(logging.INFO, logger=REQUEST_LOGGER):
        with pytest.raises(httpx.RemoteProtocolError):
            run.post("forward_backward", FB)
    (line,) = logged(caplog)
    assert (line["fault"], line["error"], line["seq"]) == ("drop", "InjectedDrop", 1)


def test_nothing_is_logged_below_info(whitney_mock, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=REQUEST_LOGGER):
        new_run(whitney_mock.client).post("forward_backward", FB)
    assert logged(caplog) == []


@pytest.mark.parametrize("body,seq", [
    ({"seq": 5, "version": 1}, 5),
    ({"version": 1, "seq": 12}, 12),
    ({"loss_config": {"seq": 3.0}, "seq": 7, "data": []}, 7),  # "seq" twice: parsed
    ({"loss_inputs": {"seq": [1, 2]}, "seq": 8}, 8),
    ({"version": 1}, None),
    ({"seq": True}, None),
])
def test_find_seq_reads_the_top_level_seq(body, seq) -> None:
    assert find_seq(orjson.dumps(body)) == seq
    assert find_seq(b'{ "seq" :  42 ,"x":1}') == 42


def test_logfmt_quotes_what_needs_quoting() -> None:
    line = format_fields({"a": None, "b": True, "c": "two words", "d": 'q"uote', "e": 1.5})
    assert parse_logfmt(line) == {"a": "-", "b": "true", "c": "two words", "d": 'q"uote',
                                  "e": "1.5"}


def test_cli_help_is_complete() -> None:
    out = subprocess.run([sys.executable, "-m", "mock_server", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for option in ("--host", "--port", "--api-key", "--seed", "--order-wait-ms",
                   "--cancel-delay-ms", "--control-plane", "--control-key", "--log-level"):
        assert option in out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_cli_at_log_level_info_logs_each_request() -> None:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mock_server", "--port", str(port), "--log-level", "info",
         "--control-plane", "--control-key", "cli-control"], stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": "Bearer whitney-mock-key", "X-Request-Id": "cli-check"}
        deadline = time.monotonic() + 60
        while True:  # wait for the server to listen (not a timing assertion)
            try:
                response = httpx.get(f"{base}{API}/capabilities", headers=headers)
                break
            except httpx.ConnectError:
                assert process.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.05)
        assert response.status_code == 200
        control = {**headers, "Authorization": "Bearer cli-control"}  # a fault on every call
        httpx.post(f"{base}/_mock/faults", headers=control,
                   json={"kind": "throttle", "primitive": "capabilities"})
        assert httpx.get(f"{base}{API}/capabilities", headers=headers).status_code == 429
    finally:
        process.terminate()
        stderr = process.communicate(timeout=30)[1]
    lines = [parse_logfmt(line.split(": ", 1)[1]) for line in stderr.splitlines()
             if "mock_server.requests" in line]
    assert [(x["method"], x["path"], x["status"], x["fault"], x["request_id"]) for x in lines] == [
        ("GET", f"{API}/capabilities", "200", "-", "cli-check"),
        ("POST", "/_mock/faults", "201", "-", "cli-check"),
        ("GET", f"{API}/capabilities", "429", "throttle", "cli-check")]

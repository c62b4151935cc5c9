"""Limits and quotas (DISC-1 ``limits``, ERR-2 413/422, §4a quotas): each one is published in
``GET /capabilities`` and enforced exactly at its boundary: the value AT the limit is accepted,
limit + 1 is refused in the ERR-1 envelope, and the refusal changes nothing (ERR-3, ORD-4).

The limits are made small through ``create_app(limits={...})`` so every boundary is cheap to
reach. Expected statuses and error types come from the contract text (§1, §4a), not from the
mock's code.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from conftest import (
    API, BOS, KEY, MODEL, OTHER_KEY, RunHandle, assert_same_state, ce_datum, expect_error,
    live_server, new_run, state_snapshot,
)

MAX_CONTEXT = 2048  # whitney-mock/tiny-byte, published in capabilities.base_models (checked)


def capabilities(client: httpx.Client) -> dict[str, Any]:
    response = client.get(f"{API}/capabilities")
    assert response.status_code == 200, response.text
    return response.json()


def padded(document: dict[str, Any], size: int) -> bytes:
    """``document`` as JSON followed by spaces up to exactly ``size`` bytes (still valid JSON)."""
    raw = orjson.dumps(document)
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def session_count(mock: Any) -> int:
    return len(mock.backend.sessions)


def datum_of_length(n: int, start: int = 0) -> dict[str, Any]:
    """A cross_entropy datum with exactly ``n`` positions (n + 1 byte tokens)."""
    tokens = [BOS] + [97 + (start + i) % 26 for i in range(n)]
    return ce_datum(tokens)


# -- DISC-1: every limit is published with the configured value ------------------------------
SMALL_LIMITS = {
    "max_body_bytes": 4096, "max_datums_per_request": 3, "max_tokens_per_request": 20,
    "max_num_samples": 3, "max_sample_tokens": 5, "order_wait_ms": 250, "max_sessions": 2,
    "max_runs_per_session": 2, "max_versions_per_run": 2, "min_ttl_seconds": 2,
    "max_ttl_seconds": 10,
}


def test_disc_1_every_limit_is_published_with_its_configured_value(make_mock):
    mock = make_mock(limits=SMALL_LIMITS, order_wait_ms=None)
    published = capabilities(mock.client(KEY))
    assert published["limits"] == SMALL_LIMITS
    [model] = [m for m in published["base_models"] if m["id"] == MODEL]
    assert model["max_context"] == MAX_CONTEXT


def test_disc_1_order_wait_ms_argument_is_what_capabilities_publish(make_mock):
    mock = make_mock(order_wait_ms=37)
    assert capabilities(mock.client(KEY))["limits"]["order_wait_ms"] == 37


def test_unknown_limit_name_is_refused_at_construction(make_mock):
    with pytest.raises(ValueError, match="unknown limit"):
        make_mock(limits={"max_bodies": 1})


# -- max_body_bytes (ERR-2: 413 body_too_large, refused before the body is read whole) -------
LIMIT = 4096


@pytest.fixture
def small_body_mock(make_mock):
    return make_mock(limits={"max_body_bytes": LIMIT})


def test_err_2_session_body_at_max_body_bytes_is_accepted_one_more_is_413(small_body_mock):
    client = small_body_mock.client(KEY)
    at_limit = client.post(f"{API}/sessions", content=padded({"metadata": {"k": "v"}}, LIMIT))
    assert at_limit.status_code == 201, at_limit.text
    before = session_count(small_body_mock)
    over = client.post(f"{API}/sessions", content=padded({"metadata": {"k": "v"}}, LIMIT + 1))
    error = expect_error(over, 413, "body_too_large")
    assert error["details"].get("max_body_bytes", LIMIT) == LIMIT
    assert session_count(small_body_mock) == before  # ERR-3: no session was created


def test_err_2_primitive_body_over_max_body_bytes_is_413_and_consumes_no_seq(small_body_mock):
    client = small_body_mock.client(KEY)
    run = new_run(client)
    url = run.url("save_weights_for_sampler")
    before = state_snapshot(small_body_mock.backend, run.run_id)
    over = client.post(url, content=padded({"seq": 1, "version": 0}, LIMIT + 1))
    expect_error(over, 413, "body_too_large")
    assert_same_state(before, state_snapshot(small_body_mock.backend, run.run_id))  # ORD-4
    at_limit = client.post(url, content=padded({"seq": 1, "version": 0}, LIMIT))
    assert at_limit.status_code == 200, at_limit.text
    assert at_limit.json() == {"version": 0, "step": 0}


class CountingBody:
    """An async request body that would be ``total`` bytes long; counts what was pulled."""

    def __init__(self, chunk: int = 1024, total: int = 1 << 40, head: bytes = b"") -> None:
        self.chunk, self.total, self.head = chunk, total, head
        self.consumed = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.head:
            self.consumed += len(self.head)
            yield self.head
        while self.consumed < self.total:
            piece = b" " * min(self.chunk, self.total - self.consumed)
            self.consumed += len(piece)
            yield piece


async def _stream_post(app: Any, path: str, body: CountingBody) -> httpx.Response:
    # httpx's ASGITransport pulls the request stream lazily, one chunk per ASGI receive(),
    # and sends no Content-Length for an async generator: the app must count as it reads.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://mock") as client:
        return await client.post(path, content=body, headers={"Authorization": f"Bearer {KEY}"})


def test_err_2_streamed_body_is_refused_after_reading_at_most_one_chunk_past_the_limit(
        small_body_mock):
    body = CountingBody(chunk=1024)  # a terabyte, if anyone read it
    response = asyncio.run(_stream_post(small_body_mock.app, f"{API}/sessions", body))
    expect_error(response, 413, "body_too_large")
    assert body.consumed <= LIMIT + body.chunk
    assert session_count(small_body_mock) == 0


def test_err_2_streamed_body_within_the_limit_is_read_whole(small_body_mock):
    """The streaming check counts bytes, it does not refuse chunked bodies as such."""
    head = orjson.dumps({"metadata": {"streamed": "yes"}})
    body = CountingBody(chunk=1000, total=LIMIT, head=head)
    response = asyncio.run(_stream_post(small_body_mock.app, f"{API}/sessions", body))
    assert response.status_code == 201, response.text
    assert response.json()["metadata"] == {"streamed": "yes"}
    assert body.consumed == LIMIT


def test_err_2_declared_content_length_is_refused_before_any_body_byte_over_uvicorn(
        small_body_mock):
    """Over a real socket: headers announce 10^12 bytes, no body byte is ever sent, and the
    413 still arrives, so the mock decided from ``Content-Length`` alone."""
    with live_server(small_body_mock.app) as base_url:
        host, port = base_url.removeprefix("http://").split(":")
        request = (f"POST {API}/sessions HTTP/1.1\r\nHost: {host}\r\n"
                   f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {10**12}\r\n\r\n").encode()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(request)
            received = b""
            while b"\r\n\r\n" not in received or not _complete(received):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].split(b" ")[1] == b"413", head
    error = orjson.loads(payload)["error"]
    assert error["type"] == "body_too_large"
    assert set(error) == {"type", "message", "details"}
    assert session_count(small_body_mock) == 0


def _complete(received: bytes) -> bool:
    head, _, payload = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(payload) >= int(value)
    return False


# -- per-request limits (§4a: 422 limit_exceeded, refused before the turn, ORD-4) -------------
def refused_without_effect(mock: Any, run: RunHandle, primitive: str, body: dict[str, Any],
                           limit: str) -> None:
    before = state_snapshot(mock.backend, run.run_id)
    error = expect_error(run.post(primitive, body, seq=before["next_seq"]), 422,
                         "limit_exceeded")
    assert error["details"].get("limit", limit) == limit
    assert_same_state(before, state_snapshot(mock.backend, run.run_id))


def accepted(run: RunHandle, primitive: str, body: dict[str, Any]) -> Any:
    response = run.post(primitive, body, seq=run.view()["next_seq"])
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("primitive", ["forward", "forward_backward"])
def test_max_datums_per_request_at_limit_and_one_over(make_mock, primitive):
    mock = make_mock(limits={"max_datums_per_request": 3})
    run = new_run(mock.client(KEY))
    assert capabilities(run.client)["limits"]["max_datums_per_request"] == 3
    body = {"loss_function": "cross_entropy", "loss_config": {}}
    refused_without_effect(mock, run, primitive,
                           {**body, "data": [datum_of_length(2, i) for i in range(4)]},
                           "max_datums_per_request")
    result = accepted(run, primitive, {**body, "data": [datum_of_length(2, i) for i in range(3)]})
    assert len(result["outputs"]) == 3


@pytest.mark.parametrize("primitive", ["forward", "forward_backward"])
def test_max_tokens_per_request_at_limit_and_one_over(make_mock, primitive):
    mock = make_mock(limits={"max_tokens_per_request": 20})
    run = new_run(mock.client(KEY))
    assert capabilities(run.client)["limits"]["max_tokens_per_request"] == 20
    body = {"loss_function": "cross_entropy", "loss_config": {}}
    refused_without_effect(mock, run, primitive,
                           {**body, "data": [datum_of_length(10), datum_of_length(11)]},
                           "max_tokens_per_request")
    result = accepted(run, primitive, {**body, "data": [datum_of_length(10),
                                                        datum_of_length(10)]})
    assert result["metrics"]["tokens"] == 20


def test_max_tokens_per_request_applies_to_logprobs(make_mock):
    mock = make_mock(limits={"max_tokens_per_request": 20})
    run = new_run(mock.client(KEY))
    run.save(0)
    refused_without_effect(mock, run, "logprobs", {"version": 0, "token_ids": [BOS] + [97] * 20},
                           "max_tokens_per_request")
    result = accepted(run, "logprobs", {"version": 0, "token_ids": [BOS] + [97] * 19})
    assert len(result["logprobs"]) == 20


def sample_body(num_samples: int = 1, max_tokens: int = 2, prompt_len: int = 2) -> dict:
    return {"version": 0, "prompt": {"token_ids": [BOS] + [97] * (prompt_len - 1)},
            "num_samples": num_samples,
            "sampling": {"max_tokens": max_tokens, "temperature": 1.0, "top_k": 0,
                         "top_p": 1.0, "seed": 3}}


def test_max_num_samples_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_num_samples": 3})
    run = new_run(mock.client(KEY))
    run.save(0)
    assert capabilities(run.client)["limits"]["max_num_samples"] == 3
    refused_without_effect(mock, run, "sample", sample_body(num_samples=4), "max_num_samples")
    assert len(accepted(run, "sample", sample_body(num_samples=3))["sequences"]) == 3


def test_max_sample_tokens_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_sample_tokens": 5})
    run = new_run(mock.client(KEY))
    run.save(0)
    assert capabilities(run.client)["limits"]["max_sample_tokens"] == 5
    refused_without_effect(mock, run, "sample", sample_body(max_tokens=6), "max_sample_tokens")
    body = sample_body(num_samples=3, max_tokens=5)
    body["sampling"]["stop_token_ids"] = []  # no stop token: every row runs to max_tokens
    sequences = accepted(run, "sample", body)["sequences"]
    assert [len(s["tokens"]) for s in sequences] == [5, 5, 5]
    assert {s["stop_reason"] for s in sequences} == {"length"}


def test_max_context_prompt_plus_max_tokens_at_limit_and_one_over(mock, client):
    run = new_run(client)
    run.save(0)
    refused_without_effect(mock, run, "sample",
                           sample_body(max_tokens=5, prompt_len=MAX_CONTEXT - 4), "max_context")
    body = sample_body(max_tokens=5, prompt_len=MAX_CONTEXT - 5)
    assert len(accepted(run, "sample", body)["sequences"]) == 1


@pytest.mark.parametrize("primitive", ["forward", "logprobs"])
def test_max_context_single_datum_at_limit_and_one_over(mock, client, primitive):
    run = new_run(client)
    run.save(0)

    def body(n: int) -> dict[str, Any]:
        if primitive == "logprobs":
            return {"version": 0, "token_ids": [BOS] + [97] * (n - 1)}
        return {"loss_function": "cross_entropy", "loss_config": {},
                "data": [datum_of_length(n)]}

    refused_without_effect(mock, run, primitive, body(MAX_CONTEXT + 1), "max_context")
    result = accepted(run, primitive, body(MAX_CONTEXT))
    lengths = [len(result["logprobs"])] if primitive == "logprobs" \
        else [len(o["logprobs"]) for o in result["outputs"]]
    assert lengths == [MAX_CONTEXT]


# -- quotas (§4a: 409 quota_exceeded) ----------------------------------------------------------
def test_max_sessions_per_key_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_sessions": 2})
    a, b = mock.client(KEY), mock.client(OTHER_KEY)
    assert capabilities(a)["limits"]["max_sessions"] == 2
    first = [a.post(f"{API}/sessions", json={}) for _ in range(2)]
    assert [r.status_code for r in first] == [201, 201]
    before = session_count(mock)
    error = expect_error(a.post(f"{API}/sessions", json={}), 409, "quota_exceeded")
    assert error["details"].get("limit", "max_sessions") == "max_sessions"
    assert session_count(mock) == before
    # Per key: the other tenant still has its whole quota (SEC-2).
    assert [b.post(f"{API}/sessions", json={}).status_code for _ in range(2)] == [201, 201]
    expect_error(b.post(f"{API}/sessions", json={}), 409, "quota_exceeded")
    # The quota counts open sessions: closing one gives its slot back (a long-lived client
    # that closes what it opens never runs out).
    closed = a.post(f"{API}/sessions/{first[0].json()['session_id']}/close", json={})
    assert closed.status_code == 200, closed.text
    assert a.post(f"{API}/sessions", json={}).status_code == 201


def create_run(client: httpx.Client, session_id: str) -> httpx.Response:
    return client.post(f"{API}/sessions/{session_id}/runs", json={
        "base_model": MODEL, "lora": {"rank": 2, "alpha": 4.0, "seed": 0}, "optimizer": "adamw"})


def test_max_runs_per_session_at_limit_and_one_over(make_mock):
    mock = make_mock(limits={"max_runs_per_session": 2})
    client = mock.client(KEY)
    assert capabilities(client)["limits"]["max_runs_per_session"] == 2
    session_id = client.post(f"{API}/sessions", json={}).json()["session_id"]
    assert [create_run(client, session_id).status_code for _ in range(2)] == [201, 201]
    runs_before = dict(mock.backend.runs)
    error = expect_error(create_run(client, session_id), 409, "quota_exceeded")
    assert error["details"].get("limit", "max_runs_per_session") == "max_runs_per_session"
    assert mock.backend.runs.keys() == runs_before.keys()
    # Per session: another session of the same key has its own quota.
    other = client.post(f"{API}/sessions", json={}).json()["session_id"]
    assert create_run(client, other).status_code == 201


def test_max_versions_per_run_at_limit_and_one_over_is_recorded(make_mock):
    """§4a: ``quota_exceeded`` at its turn is recorded as failed, consumes its seq (ORD-4) and
    changes no training state (ERR-3)."""
    mock = make_mock(limits={"max_versions_per_run": 2})
    run = new_run(mock.client(KEY))
    assert capabilities(run.client)["limits"]["max_versions_per_run"] == 2
    run.save(0)
    run.save(5)
    before = state_snapshot(mock.backend, run.run_id)
    seq = before["next_seq"]
    error = expect_error(run.post("save_weights_for_sampler", {"version": 6}, seq=seq), 409,
                         "quota_exceeded")
    after = state_snapshot(mock.backend, run.run_id)
    assert after["next_seq"] == seq + 1 and after["ops"] == before["ops"] + [seq]
    record = run.operation(seq).json()
    assert record["status"] == "failed" and record["error"] == error
    for key in ("next_seq", "ops"):
        after[key] = before[key]
    assert_same_state(before, after)
    assert [v["version"] for v in run.view()["versions"]] == [0, 5]


# -- TTL bounds (LIFE-2: ttl_seconds in [min_ttl_seconds, max_ttl_seconds], else 422) ----------
@pytest.mark.parametrize("ttl,status", [(2, 201), (10, 201), (1, 422), (11, 422)])
def test_ttl_bounds_at_limits_and_one_outside(make_mock, ttl, status):
    mock = make_mock(limits={"min_ttl_seconds": 2, "max_ttl_seconds": 10})
    client = mock.client(KEY)
    limits = capabilities(client)["limits"]
    assert (limits["min_ttl_seconds"], limits["max_ttl_seconds"]) == (2, 10)
    response = client.post(f"{API}/sessions", json={"ttl_seconds": ttl})
    if status == 201:
        assert response.status_code == 201, response.text
    else:
        expect_error(response, 422)
        assert session_count(mock) == 0


# -- a client that hangs up before its body is read ---------------------------------------------
class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_client_that_hangs_up_before_its_body_is_read_is_not_a_server_error(mock):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": f"{API}/sessions", "raw_path": b"",
             "root_path": "", "query_string": b"", "server": ("mock", 80),
             "client": ("127.0.0.1", 5000),
             "headers": [(b"authorization", f"Bearer {KEY}".encode()),
                         (b"content-type", b"application/json"), (b"content-length", b"2")]}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    errors = _Records()
    logger = logging.getLogger("mock_server")
    logger.addHandler(errors)
    try:
        asyncio.run(mock.app(scope, receive, send))
    finally:
        logger.removeHandler(errors)
    assert session_count(mock) == 0
    assert [r.getMessage() for r in errors.records] == []

"""Request body size and reading (ERR-2 413 ``body_too_large``, DISC-1 ``max_body_bytes``):
a body AT ``max_body_bytes`` is accepted, one byte more is refused in the ERR-1 envelope
before the body is read whole, and the refusal changes nothing (ERR-3, ORD-4). A client that
hangs up before its body is read is not a server error.

Split from test_limits.py (per-request limits and quotas). Expected statuses and error types
come from the contract text (§1), not from the mock's code.
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
    API,
    KEY,
    assert_same_state,
    expect_error,
    live_server,
    new_run,
    state_snapshot,
)


def padded(document: dict[str, Any], size: int) -> bytes:
    """``document`` as JSON followed by spaces up to exactly ``size`` bytes (still valid JSON)."""
    raw = orjson.dumps(document)
    assert len(raw) <= size
    return raw + b" " * (size - len(raw))


def session_count(mock: Any) -> int:
    return len(mock.backend.sessions)


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

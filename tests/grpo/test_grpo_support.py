"""Client-side tracing and fault injection for the grpo tests (import: ``from test_grpo_support
import ...``, like ``conftest``).

``Tap`` wraps the mock's transport: it records every request the grpo client sends (label,
seq, body) and, for chosen calls, answers an error envelope, throttles with 429, or drops the
connection before or after the mock executed the request. The mock itself is untouched, so the
tests also hold against a real endpoint's behaviour as the contract describes it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from conftest import KEY

from grpo.client import RetryPolicy, WhitneyClient

__all__ = ["Call", "Fault", "Tap", "label_of", "tapped_client"]

_LABELS = [
    (r"GET /v1/training/capabilities$", "capabilities"),
    (r"POST /v1/training/sessions$", "create_session"),
    (r"POST /v1/training/sessions/[^/]+/runs$", "create_run"),
    (r"POST /v1/training/sessions/[^/]+/close$", "close_session"),
    (r"GET /v1/training/sessions/[^/]+$", "get_session"),
    (r"GET /v1/training/runs/[^/]+$", "get_run"),
    (r"GET /v1/training/runs/[^/]+/exports/.+$", "download"),
    (r"GET /v1/training/runs/[^/]+/operations/\d+$", "operation"),
    (r"POST /v1/training/runs/[^/]+/(\w+)$", None),  # primitives, finish, cancel
]


def label_of(method: str, path: str) -> str:
    """``sample``, ``finish``, ``create_session`` ... for one request."""
    line = f"{method} {path}"
    for pattern, label in _LABELS:
        match = re.match(pattern, line)
        if match:
            return label or match.group(1)
    return line


@dataclass
class Call:
    label: str
    method: str
    path: str
    raw: bytes
    status: int | None = None

    @property
    def body(self) -> Any:
        return json.loads(self.raw) if self.raw else None


@dataclass
class Fault:
    """Hit the ``nth`` (1-based) call labelled ``label`` and the ``times - 1`` calls after it.

    ``kind``: ``"respond"`` (answer ``status`` with an ERR-1 envelope of type ``error_type``
    without forwarding), ``"throttle"`` (429 + ``Retry-After``), ``"drop_before"`` (ConnectError,
    never sent), ``"drop_after"`` (forwarded and executed, then ReadError: the response is lost).
    """

    label: str
    nth: int = 1
    kind: str = "respond"
    status: int = 500
    error_type: str = "injected_fault"
    times: int = 1
    retry_after: str = "0"
    seen: int = 0
    fired: int = 0


@dataclass
class Tap(httpx.BaseTransport):
    inner: httpx.BaseTransport
    faults: list[Fault] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    rewrite: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        raw = request.read()
        call = Call(label_of(request.method, request.url.path), request.method,
                    request.url.path, raw)
        if call.label in self.delay:
            time.sleep(self.delay[call.label])  # only to force an arrival order, never timed
        self.calls.append(call)  # in the order requests reach the server
        for fault in self.faults:
            if fault.label != call.label:
                continue
            fault.seen += 1
            if fault.seen >= fault.nth and fault.fired < fault.times:
                fault.fired += 1
                return self._fire(fault, request, call)
        response = self.inner.handle_request(request)
        call.status = response.status_code
        if call.label in self.rewrite and response.status_code < 300:
            body = self.rewrite[call.label](response.json())
            response = httpx.Response(response.status_code, headers={"X-Request-Id": "tap"},
                                      json=body)
        return response

    def _fire(self, fault: Fault, request: httpx.Request, call: Call) -> httpx.Response:
        if fault.kind == "drop_before":
            raise httpx.ConnectError("injected: connection refused", request=request)
        if fault.kind == "drop_after":
            call.status = self.inner.handle_request(request).status_code
            raise httpx.ReadError("injected: response lost", request=request)
        status = 429 if fault.kind == "throttle" else fault.status
        call.status = status
        headers = {"Retry-After": fault.retry_after} if fault.kind == "throttle" else {}
        error_type = "rate_limited" if fault.kind == "throttle" else fault.error_type
        return httpx.Response(status, headers=headers, json={
            "error": {"type": error_type, "message": "injected by the test", "details": {}}})

    def close(self) -> None:
        self.inner.close()

    def labels(self, *, skip: tuple[str, ...] = ()) -> list[str]:
        return [call.label for call in self.calls if call.label not in skip]


def tapped_client(mock: Any, *, key: str = KEY, max_attempts: int = 3,
                  sleeps: list[float] | None = None) -> tuple[WhitneyClient, Tap]:
    """A ``WhitneyClient`` on ``mock`` (conftest's ``Mock``) through a fresh ``Tap``.

    Retries do not sleep: the delays the client asked for are appended to ``sleeps``.
    """
    tap = Tap(mock.transport)
    http = httpx.Client(transport=tap, base_url="http://whitney.mock",
                        headers={"Authorization": f"Bearer {key}"})
    mock.clients.append(http)
    record = sleeps if sleeps is not None else []
    client = WhitneyClient(http, retry=RetryPolicy(max_attempts=max_attempts),
                           sleep=record.append)
    return client, tap


@pytest.mark.parametrize(
    ("method", "path", "label"),
    [
        ("GET", "/v1/training/capabilities", "capabilities"),
        ("POST", "/v1/training/sessions", "create_session"),
        ("POST", "/v1/training/sessions/s1/runs", "create_run"),
        ("POST", "/v1/training/sessions/s1/close", "close_session"),
        ("POST", "/v1/training/runs/r1/forward_backward", "forward_backward"),
        ("POST", "/v1/training/runs/r1/finish", "finish"),
        ("GET", "/v1/training/runs/r1", "get_run"),
        ("GET", "/v1/training/runs/r1/exports/e1/adapter_config.json", "download"),
    ],
)
def test_label_of_names_each_call_the_loop_makes(method: str, path: str, label: str) -> None:
    assert label_of(method, path) == label

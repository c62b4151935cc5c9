"""The suite's HTTP layer: auth, schema validation of every response, resource bookkeeping.

Every request a check makes goes through :meth:`Wire.call`. It

- adds ``Authorization: Bearer`` for the chosen key (or none, or a literal header for SEC-1),
- validates the response against ``openapi.yaml`` and records any problem (reported under
  SCHEMA-1 together with the check that received it) and any missing ``X-Request-Id``
  (reported under TRANSPORT-1),
- notices every session and run the endpoint creates (from 201 responses, whoever sent the
  request: checks or the schemathesis pass) so teardown can close them all,
- counts requests and the tokens of accepted payloads (a real endpoint bills per token).

Thread-safe: ORD-2 sends truly concurrent requests from several threads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from .schema import OpenAPI
from .target import Target, mask_secrets

__all__ = ["Wire", "Reply", "PRIMARY", "SECOND", "NO_AUTH", "TERMINAL", "Tracker"]

PRIMARY = "primary"
SECOND = "second"
NO_AUTH = "none"
TERMINAL = frozenset({"finished", "cancelled", "failed"})  # LIFE-8


@dataclass
class Reply:
    """One response, parsed once."""

    method: str
    path: str
    status: int
    headers: httpx.Headers
    content: bytes
    body: Any  # parsed JSON, or None when the body is not JSON
    elapsed: float

    @property
    def error_type(self) -> str | None:
        if isinstance(self.body, dict) and isinstance(self.body.get("error"), dict):
            value = self.body["error"].get("type")
            return value if isinstance(value, str) else None
        return None

    @property
    def error_details(self) -> dict[str, Any]:
        if self.error_type is not None:
            details = self.body["error"].get("details")
            return details if isinstance(details, dict) else {}
        return {}

    @property
    def replayed(self) -> bool:
        """ORD-3 / EXT-1: only ``Whitney-Replayed: true`` marks a replay; absence, or any
        other value (``false`` included), does not."""
        value: str = self.headers.get("whitney-replayed", "")
        return value.strip().lower() == "true"

    def describe(self) -> str:
        """``POST /runs/x/forward -> 422 unknown_field: message`` for failure details."""
        text = f"{self.method} {self.path} -> {self.status}"
        if self.error_type is not None:
            message = str(self.body["error"].get("message", ""))[:160]
            text += f" {self.error_type}: {message}"
        elif self.status >= 400:
            text += f" {self.content[:160]!r}"
        return text


@dataclass
class TrackedRun:
    run_id: str
    session_id: str
    key: str
    check_id: str
    terminal: bool = False


@dataclass
class TrackedSession:
    session_id: str
    key: str
    check_id: str
    closed: bool = False


@dataclass
class Tracker:
    """Every session and run created during the suite, and whether teardown ended it."""

    sessions: dict[str, TrackedSession] = field(default_factory=dict)
    runs: dict[str, TrackedRun] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, method: str, path: str, key: str, status: int, body: Any,
                check_id: str) -> None:
        if not isinstance(body, dict):
            return
        parts = path.strip("/").split("/")
        with self.lock:
            if method == "POST" and status == 201 and parts == ["sessions"]:
                sid = body.get("session_id")
                if isinstance(sid, str):
                    self.sessions.setdefault(sid, TrackedSession(sid, key, check_id))
            elif (method == "POST" and status == 201 and len(parts) == 3
                  and parts[0] == "sessions" and parts[2] == "runs"):
                rid = body.get("run_id")
                if isinstance(rid, str):
                    self.runs.setdefault(rid, TrackedRun(rid, parts[1], key, check_id))
            state = body.get("state")
            if isinstance(body.get("run_id"), str) and body["run_id"] in self.runs:
                if state in TERMINAL:
                    self.runs[body["run_id"]].terminal = True
            if (isinstance(body.get("session_id"), str) and "run_id" not in body
                    and body["session_id"] in self.sessions and state in ("closed", "expired")):
                self.sessions[body["session_id"]].closed = True


class Wire:
    """Send requests to the target; see the module docstring."""

    def __init__(self, target: Target, openapi: OpenAPI | None,
                 strict_openapi: OpenAPI | None = None) -> None:
        self.target = target
        self.client = target.client()
        self.openapi = openapi
        self.strict_openapi = strict_openapi
        self.tracker = Tracker()
        self.current_check = "(suite)"
        self.schema_problems: list[tuple[str, str]] = []  # (check id, problem)
        self.strict_problems: list[tuple[str, str]] = []  # only against the strict overlay
        self.request_id_problems: list[tuple[str, str]] = []
        self.requests = 0
        self.cache: dict[str, Any] = {}  # replies worth sending once per run (the 413 probe)
        self.tokens_sent = 0
        self.sample_tokens_requested = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    # The check id is per thread so helper threads of a check report under that check.
    @property
    def check_id(self) -> str:
        return getattr(self._local, "check_id", None) or self.current_check

    def key_for(self, auth: str) -> str | None:
        if auth == PRIMARY:
            return self.target.api_key
        if auth == SECOND:
            return self.target.second_api_key
        return None

    def mask(self, text: str) -> str:
        return mask_secrets(text, self.target.secrets())

    def call(self, method: str, path: str, json: Any = None, *, auth: str = PRIMARY,
             content: bytes | None = None, headers: dict[str, str] | None = None,
             authorization: str | None = None,
             params: dict[str, str | int] | None = None) -> Reply:
        """Send one request; ``path`` is relative to ``/v1/training`` (``/runs/abc/forward``).

        ``auth`` picks the key (``PRIMARY``, ``SECOND``, ``NO_AUTH``); ``authorization`` sends
        that literal header instead (SEC-1). ``json`` (None: no body) is serialised with
        orjson; ``content`` sends raw bytes (malformed JSON, oversized bodies) as
        ``application/json``. ``params``: the query string (kept out of ``Reply.path``).
        """
        send_headers = dict(headers or {})
        key = self.key_for(auth)
        if authorization is not None:
            send_headers["Authorization"] = authorization
        elif key is not None:
            send_headers["Authorization"] = f"Bearer {key}"
        elif auth == SECOND:
            raise RuntimeError("no second API key configured")
        data: bytes | None = None
        if json is not None:
            data = orjson.dumps(json)
        elif content is not None:
            data = content
        if data is not None:
            send_headers.setdefault("Content-Type", "application/json")
        started = time.monotonic()
        response = self.client.request(method, path, content=data, headers=send_headers,
                                       params=params)
        if json is not None and response.status_code == 200:
            self._count_tokens(path, json)  # refused requests are not processed, nor billed
        return self.record(method, path, response, started=started,
                           auth_label=auth if authorization is None else "literal")

    def record(self, method: str, path: str, response: httpx.Response, *,
               started: float | None = None, auth_label: str = PRIMARY) -> Reply:
        """Parse ``response`` once, note created resources, check TRANSPORT-1 and SCHEMA-1."""
        with self._lock:
            self.requests += 1
        raw = response.content
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        elapsed = time.monotonic() - started if started is not None else 0.0
        reply = Reply(method, path, response.status_code, response.headers, raw, body, elapsed)
        self.tracker.observe(method, path, auth_label, reply.status, body, self.check_id)
        self.inspect(reply)
        return reply

    def state_of(self, path: str, auth: str = PRIMARY) -> str | None:
        """``state`` of the session or run at ``path``; None when it cannot be read."""
        reply = self.call("GET", path, auth=auth)
        state = reply.body.get("state") if isinstance(reply.body, dict) else None
        return state if reply.status == 200 and isinstance(state, str) else None

    def wait_terminal(self, run_id: str, auth: str = PRIMARY, timeout: float = 10.0
                      ) -> str | None:
        """Poll ``GET /runs/{rid}`` until a terminal state (LIFE-7) or ``timeout``; the last
        state read (None when the run cannot be read)."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            state = self.state_of(f"/runs/{run_id}", auth)
            if state is None or state in TERMINAL or time.monotonic() >= deadline:
                return state
            time.sleep(delay)
            delay = min(delay * 2, 0.25)

    def inspect(self, reply: Reply) -> None:
        """Record TRANSPORT-1 and SCHEMA-1 problems of a response (and, under the strict
        profile, what only the strict overlay finds)."""
        where = f"{reply.method} {reply.path} -> {reply.status}"
        if not reply.headers.get("x-request-id"):
            self.request_id_problems.append((self.check_id, f"{where}: no X-Request-Id"))
        if self.openapi is None:
            return
        args = (reply.method, reply.path, reply.status, reply.headers, reply.content)
        problems = self.openapi.validate_response(*args)
        self.schema_problems += [(self.check_id, self.mask(p)) for p in problems]
        if self.strict_openapi is not None:
            self.strict_problems += [(self.check_id, self.mask(p))
                                     for p in self.strict_openapi.validate_response(*args)
                                     if p not in problems]

    def _count_tokens(self, path: str, body: Any) -> None:
        if not isinstance(body, dict):
            return
        tokens = 0
        for datum in body.get("data") or []:
            if isinstance(datum, dict):
                ids = (datum.get("model_input") or {}).get("token_ids")
                tokens += len(ids) if isinstance(ids, list) else 0
        if isinstance(body.get("token_ids"), list):
            tokens += len(body["token_ids"])
        prompt = body.get("prompt")
        samples = 0
        if isinstance(prompt, dict) and isinstance(prompt.get("token_ids"), list):
            requested = body.get("num_samples")
            n = requested if isinstance(requested, int) else 1
            tokens += len(prompt["token_ids"]) * max(0, min(n, 1024))
            sampling = body.get("sampling") or {}
            max_tokens = sampling.get("max_tokens") if isinstance(sampling, dict) else None
            if isinstance(max_tokens, int):
                samples = max(0, min(n, 1024)) * max(0, max_tokens)
        with self._lock:
            self.tokens_sent += tokens
            self.sample_tokens_requested += samples

    def bind_thread(self, check_id: str) -> None:
        """Attribute requests from the calling (helper) thread to ``check_id``."""
        self._local.check_id = check_id

    def close(self) -> None:
        self.client.close()

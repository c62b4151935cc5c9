"""A small synchronous client for the Whitney JSON primitive contract.

``WhitneyClient`` speaks HTTP through one ``httpx.Client`` (a real base URL, or the embedded
in-process mock by default), retries what is safe to retry, and turns error envelopes into
typed errors (:mod:`grpo.errors`). ``RunHandle`` assigns each primitive its ``seq`` (ORD-1) and may
pipeline: ``run.submit(...)`` takes the next seq at once and sends from a worker thread, so
forward_backward seq N and optim_step seq N+1 travel concurrently (ORD-2).

Retries (replay-safe by ORD-3): a primitive is re-sent with the *same* seq and the *same bytes*
after 429 (waiting ``Retry-After``), 5xx, or a dropped connection; if the first attempt did
execute, the server answers the recorded response again (``Whitney-Replayed: true``).

Creations (``POST /sessions``, ``POST .../runs``) carry an ``Idempotency-Key`` (contract 1.1,
LIFE-9), one per logical creation, the same on every retry. When the server declares
``features.idempotent_create`` (read by :meth:`WhitneyClient.capabilities`) they are retried
like primitives: a lost response comes back as the first answer, replayed, and nothing is
created twice; after the retries are used up :meth:`WhitneyClient.recover_creation` sends the
same creation once more so that the caller can learn the resource and clean it up. A server
that does not declare it gets today's behaviour: a creation is retried only when it certainly
had no effect (429, refused before its turn, or a connection that never opened), and a lost
creation response leaves a resource the client does not know (the documented limitation:
close then answers 409 ``runs_not_terminal`` until the session's TTL ends it).
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from grpo.config import AdamW
from grpo.errors import (
    ConnectionFailed,
    IntegrityError,
    ProtocolError,
    ServerError,
    api_error_class,
)

__all__ = ["AdamW", "RetryPolicy", "WhitneyClient", "RunHandle", "Run", "TERMINAL_RUN_STATES",
           "PREFIX", "server_root"]

PREFIX = "/v1/training"
TERMINAL_RUN_STATES = frozenset({"finished", "cancelled", "failed"})  # LIFE-8

_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_MAYBE_SENT = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry. ``max_attempts`` counts the first try."""

    max_attempts: int = 6
    backoff_seconds: float = 0.05
    max_backoff_seconds: float = 2.0
    max_retry_after_seconds: float = 60.0

    def backoff(self, attempt: int) -> float:
        return min(self.max_backoff_seconds, self.backoff_seconds * 2.0 ** (attempt - 1))


def _retry_after_seconds(response: httpx.Response) -> float | None:
    """``Retry-After`` as seconds: delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass  # not delta-seconds: an HTTP date
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def server_root(url: str) -> str:
    """The server root of a Whitney URL: the root itself or the root plus ``/v1/training``
    (what the mock's banner prints), trailing slashes ignored. The client puts
    ``/v1/training`` before every path. ``ValueError`` for anything but ``http(s)://host...``.
    """
    root = url.strip().rstrip("/")
    if root.endswith(PREFIX):
        root = root[: -len(PREFIX)].rstrip("/")
    parsed = httpx.URL(root)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"base URL {url!r}: expected http(s)://host[:port][/path], the "
                         f"server root or the root plus {PREFIX}")
    return root


def _encode(body: Any) -> bytes:
    # Encoded once per logical request, so every retry sends the same bytes; NaN/Infinity are
    # refused here rather than by the server (ERR-2).
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()


class WhitneyClient:
    """Synchronous client over one ``httpx.Client``.

    Build one with :meth:`connect` (environment or embedded mock) or pass any configured
    ``httpx.Client`` (its ``base_url`` is the server root, its headers carry the key).
    """

    def __init__(
        self,
        http: httpx.Client,
        *,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.http = http
        self.retry = retry or RetryPolicy()
        self._sleep = sleep
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        #: ``capabilities.features`` as last read by :meth:`capabilities` (empty before).
        self.features: dict[str, Any] = {}
        # The creation whose outcome is unknown (its response lost, or a 5xx): (path, body,
        # Idempotency-Key), for recover_creation (LIFE-9).
        self._unsettled: tuple[str, dict[str, Any], str] | None = None

    @classmethod
    def connect(
        cls,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> WhitneyClient:
        """A client for ``base_url`` / ``api_key``, else ``WHITNEY_BASE_URL`` /
        ``WHITNEY_API_KEY``, else the embedded in-process mock (:mod:`grpo.embedded`).
        ``transport`` replaces httpx's network transport for a base URL (proxies, tests).
        ``base_url`` is the server root or the root plus ``/v1/training`` (:func:`server_root`)."""
        base_url = base_url or os.environ.get("WHITNEY_BASE_URL")
        api_key = api_key or os.environ.get("WHITNEY_API_KEY")
        if not base_url:
            from grpo.embedded import embedded_http_client

            return cls(embedded_http_client(api_key=api_key), retry=retry)
        if not api_key:
            raise ValueError("a base URL needs an API key: pass api_key or set WHITNEY_API_KEY")
        http = httpx.Client(
            base_url=server_root(base_url),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )
        return cls(http, retry=retry)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self.http.close()

    def __enter__(self) -> WhitneyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------

    @property
    def idempotent_create(self) -> bool:
        """Whether the server declared LIFE-9 (``features.idempotent_create``), so creations
        are retried like primitives."""
        return self.features.get("idempotent_create") is True

    def request(
        self, method: str, path: str, body: Any = None, *, replay_safe: bool,
        headers: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one request (retrying as the module docstring says) and return its JSON object."""
        response = self._send(method, path, body, replay_safe=replay_safe, headers=headers)
        try:
            document = response.json()
        except ValueError:
            document = None
        if not isinstance(document, dict):
            raise ProtocolError(
                f"{method} {self.url(path)}: {response.status_code} body is not a JSON object",
                status=response.status_code,
            )
        return document

    def _send(self, method: str, path: str, body: Any, *, replay_safe: bool,
              headers: dict[str, str] | None = None) -> httpx.Response:
        content = None if body is None else _encode(body)
        headers = {**(headers or {}), "X-Request-Id": uuid.uuid4().hex}
        if content is not None:
            headers["Content-Type"] = "application/json"
        attempt = 0
        while True:
            attempt += 1
            last_try = attempt >= self.retry.max_attempts
            try:
                response = self.http.request(method, path, content=content, headers=headers)
            except _NEVER_SENT as exc:
                if last_try:
                    raise ConnectionFailed(f"{method} {self.url(path)}: {exc!r}") from exc
                self._sleep(self.retry.backoff(attempt))
                continue
            except _MAYBE_SENT as exc:
                if last_try or not replay_safe:
                    raise ConnectionFailed(f"{method} {self.url(path)}: {exc!r}") from exc
                self._sleep(self.retry.backoff(attempt))
                continue
            status = response.status_code
            retryable = status == 429 or (status >= 500 and replay_safe)
            if retryable and not last_try:
                delay = _retry_after_seconds(response) if status == 429 else None
                if delay is None:
                    delay = self.retry.backoff(attempt)
                self._sleep(min(delay, self.retry.max_retry_after_seconds))
                continue
            if status >= 400:
                raise self._error(method, path, response)
            return response

    def url(self, path: str) -> str:
        """The full URL a request to ``path`` goes to (errors name it)."""
        return str(self.http.base_url).rstrip("/") + "/" + path.lstrip("/")  # as httpx merges

    def _error(self, method: str, path: str, response: httpx.Response) -> Exception:
        try:
            inner = response.json()["error"]
            type_, message = inner["type"], inner["message"]
            details = inner.get("details") or {}
        except (ValueError, KeyError, TypeError):
            return ProtocolError(
                f"{method} {self.url(path)}: {response.status_code} without the ERR-1 "
                f"envelope: {response.text[:200]!r}",
                status=response.status_code,
            )
        return api_error_class(response.status_code)(
            response.status_code,
            type_,
            message,
            details,
            method=method,
            path=path,
            url=self.url(path),
            request_id=response.headers.get("X-Request-Id"),
        )

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="whitney")
            return self._pool

    # -- discovery, sessions, runs ----------------------------------------------------------

    def capabilities(self) -> dict[str, Any]:
        """DISC-1 ``GET /capabilities``; its ``features`` are kept (:attr:`features`)."""
        document = self.request("GET", f"{PREFIX}/capabilities", replay_safe=True)
        features = document.get("features")
        self.features = dict(features) if isinstance(features, dict) else {}
        return document

    def _create(self, path: str, body: dict[str, Any], idempotency_key: str | None
                ) -> dict[str, Any]:
        """LIFE-9: one logical creation, one ``Idempotency-Key`` on every attempt; retried like
        a primitive when the server declares ``idempotent_create``."""
        key = idempotency_key or uuid.uuid4().hex
        self._unsettled = None
        try:
            return self.request("POST", path, body, replay_safe=self.idempotent_create,
                                headers={"Idempotency-Key": key})
        except (ConnectionFailed, ServerError):  # it may have been created: recover_creation
            self._unsettled = (path, body, key)
            raise

    def recover_creation(self) -> dict[str, Any] | None:
        """After a creation raised with its outcome unknown (a lost response, a 5xx), send it
        once more with the same ``Idempotency-Key`` (LIFE-9) and return the view of what it
        created (a replay), so the caller can clean it up; None when the server does not
        declare ``idempotent_create``, nothing is unsettled, or it still fails."""
        unsettled, self._unsettled = self._unsettled, None
        if unsettled is None or not self.idempotent_create:
            return None
        path, body, key = unsettled
        try:
            return self.request("POST", path, body, replay_safe=True,
                                headers={"Idempotency-Key": key})
        except Exception:  # the cleanup reports what it could not reach
            return None

    def create_session(
        self, *, ttl_seconds: int | None = None, metadata: dict[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """LIFE-1 ``POST /sessions``; fields left ``None`` are not sent. ``idempotency_key``:
        LIFE-9's key (default: a fresh one per call)."""
        body: dict[str, Any] = {}
        if ttl_seconds is not None:
            body["ttl_seconds"] = ttl_seconds
        if metadata is not None:
            body["metadata"] = metadata
        return self._create(f"{PREFIX}/sessions", body, idempotency_key)

    def get_session(self, session_id: str) -> dict[str, Any]:
        return self.request("GET", f"{PREFIX}/sessions/{session_id}", replay_safe=True)

    def close_session(self, session_id: str) -> dict[str, Any]:
        """LIFE-3; closing twice is a no-op, so it is retried freely."""
        return self.request("POST", f"{PREFIX}/sessions/{session_id}/close", {}, replay_safe=True)

    def heartbeat(self, session_id: str) -> dict[str, Any]:
        """LIFE-2 (optional: session_ttl)."""
        path = f"{PREFIX}/sessions/{session_id}/heartbeat"
        return self.request("POST", path, {}, replay_safe=True)

    def create_run(
        self, session_id: str, *, base_model: str, rank: int, alpha: float, seed: int | None = None,
        idempotency_key: str | None = None,
    ) -> RunHandle:
        """LIFE-5: a LoRA run with the AdamW optimizer; returns a :class:`RunHandle`.
        ``idempotency_key``: LIFE-9's key (default: a fresh one per call)."""
        lora: dict[str, Any] = {"rank": rank, "alpha": alpha}
        if seed is not None:
            lora["seed"] = seed
        body = {"base_model": base_model, "lora": lora, "optimizer": "adamw"}
        view = self._create(f"{PREFIX}/sessions/{session_id}/runs", body, idempotency_key)
        return RunHandle(self, view)

    def get_run(self, run_id: str) -> dict[str, Any]:
        return self.request("GET", f"{PREFIX}/runs/{run_id}", replay_safe=True)


class RunHandle:
    """One LoRA run: assigns ``seq`` (ORD-1) and wraps each primitive.

    Primitive methods take and return plain JSON dicts, the contract's bodies without ``seq``.
    After an error the handle re-reads ``next_seq`` from the server before the next primitive,
    because whether a failed request consumed its seq depends on where it failed (ORD-4).
    """

    def __init__(self, client: WhitneyClient, view: dict[str, Any]) -> None:
        self.client = client
        self.run_id: str = view["run_id"]
        self.session_id: str = view["session_id"]
        self.view = view
        self._lock = threading.Lock()
        self._next_seq: int = view["next_seq"]
        self._in_flight = 0
        self._resync = False

    @property
    def path(self) -> str:
        return f"{PREFIX}/runs/{self.run_id}"

    def _take_seq(self) -> int:
        with self._lock:
            if self._resync and self._in_flight == 0:
                self._next_seq = self.client.get_run(self.run_id)["next_seq"]
                self._resync = False
            seq = self._next_seq
            self._next_seq += 1
            self._in_flight += 1
            return seq

    def _post(self, primitive: str, seq: int, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.client.request(
                "POST", f"{self.path}/{primitive}", {"seq": seq, **body}, replay_safe=True
            )
        except Exception:
            with self._lock:
                self._resync = True
            raise
        finally:
            with self._lock:
                self._in_flight -= 1

    def call(self, primitive: str, body: dict[str, Any]) -> dict[str, Any]:
        """Send ``primitive`` with the next seq and wait for its result."""
        if "seq" in body:
            raise ValueError("seq is assigned by the client; leave it out of the body")
        return self._post(primitive, self._take_seq(), body)

    def submit(self, primitive: str, body: dict[str, Any]) -> Future[dict[str, Any]]:
        """Pipelining (ORD-2): take the next seq now, send from a worker thread.

        Submission order is seq order; the server holds a later seq until the earlier ones ran.
        """
        if "seq" in body:
            raise ValueError("seq is assigned by the client; leave it out of the body")
        seq = self._take_seq()
        return self.client._executor().submit(self._post, primitive, seq, body)

    # -- primitives (§4) --------------------------------------------------------------------

    def forward(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``forward``: loss and logprobs, gradient buffer untouched (GRAD-1)."""
        return self.call("forward", payload)

    def forward_backward(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``forward_backward`` with ``{"loss_function", "loss_config", "data"}``."""
        return self.call("forward_backward", payload)

    def optim_step(self, adamw: AdamW) -> dict[str, Any]:
        """``optim_step`` with all six AdamW fields (OPT-1)."""
        return self.call("optim_step", {"adamw": adamw.to_json()})

    def save_weights_for_sampler(self, version: int) -> dict[str, Any]:
        """VER-1: versions strictly increase per run."""
        return self.call("save_weights_for_sampler", {"version": version})

    def sample(self, request: dict[str, Any]) -> dict[str, Any]:
        """``sample`` with ``{"version", "prompt", "num_samples", "sampling"}`` (VER-2, VER-3)."""
        return self.call("sample", request)

    def logprobs(self, version: int, token_ids: list[int]) -> dict[str, Any]:
        """``logprobs`` of ``token_ids`` under saved ``version``: ``[null, float, ...]``."""
        return self.call("logprobs", {"version": version, "token_ids": token_ids})

    def save_state(self, name: str) -> dict[str, Any]:
        """CKPT-1 ``save_state``."""
        return self.call("save_state", {"name": name})

    def load_state(self, checkpoint_id: str, *, with_optimizer: bool) -> dict[str, Any]:
        """CKPT-1 ``load_state``."""
        body = {"checkpoint_id": checkpoint_id, "with_optimizer": with_optimizer}
        return self.call("load_state", body)

    def export_lora(self) -> dict[str, Any]:
        """EXPORT-1 ``export_lora``: ``{"export_id", "format", "files"}``."""
        return self.call("export_lora", {})

    # -- lifecycle and reads ----------------------------------------------------------------

    def get(self) -> dict[str, Any]:
        self.view = self.client.get_run(self.run_id)
        return self.view

    def operation(self, seq: int) -> dict[str, Any]:
        """ORD-5: the recorded outcome of ``seq``."""
        return self.client.request("GET", f"{self.path}/operations/{seq}", replay_safe=True)

    def finish(self) -> dict[str, Any]:
        """LIFE-6; idempotent on a terminal run (LIFE-8), so retried freely."""
        self.view = self.client.request("POST", f"{self.path}/finish", {}, replay_safe=True)
        return self.view

    def cancel(self) -> dict[str, Any]:
        """LIFE-7: 202 ``cancelling``; poll :meth:`get` until terminal."""
        self.view = self.client.request("POST", f"{self.path}/cancel", {}, replay_safe=True)
        return self.view

    def download_export(self, export_id: str, file: dict[str, Any]) -> bytes:
        """Fetch one file of an export and check its size and sha256 (EXPORT-1)."""
        path = f"{self.path}/exports/{export_id}/{file['name']}"
        content = self.client._send("GET", path, None, replay_safe=True).content
        digest = hashlib.sha256(content).hexdigest()
        if len(content) != file["bytes"] or digest != file["sha256"]:
            raise IntegrityError(
                f"{file['name']}: got {len(content)} bytes sha256 {digest}, "
                f"announced {file['bytes']} bytes sha256 {file['sha256']}"
            )
        return content


#: The former name of :class:`RunHandle`, kept because it was public. (``mock_server`` keeps
#: a record of each run under the name ``Run``; this is the client's handle to one.)
Run = RunHandle

"""``MockWhitney``: the mock server as a test fixture, in-process or over a real socket.

The pytest plugin (:mod:`mock_server.testing.plugin`) hands these out as ``whitney_mock`` and
``whitney_server``; they also work on their own::

    with MockWhitney.in_process(seed=0) as whitney:
        train(whitney.client)                       # any code taking an httpx.Client
        assert whitney.primitives(run_id) == ["forward_backward", "optim_step"]

    with MockWhitney.serve() as whitney:            # uvicorn on 127.0.0.1, a free port
        train_from_url(whitney.base_url, whitney.api_key)

Every method here goes through the HTTP control plane (``/_mock/``), so it is safe while the
code under test has requests in flight, and behaves the same in both modes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable, Mapping
from os import PathLike
from types import TracebackType
from typing import Any, overload

import httpx

from ..backend.config import DEFAULT_API_KEY
from ..backend.state import Backend
from ..engine.specs import ModelSpec
from ..http.app import create_app
from ..transport import InProcessTransport

__all__ = ["DEFAULT_API_KEY", "IN_PROCESS_BASE_URL", "MockControlError", "MockWhitney",
           "TraceEntry"]

IN_PROCESS_BASE_URL = "http://whitney.mock"

TraceEntry = dict[str, Any]  # {"seq": int, "primitive": str, "status": "completed" | "failed"}
#: One base model declaration, as ``create_app(base_models=...)`` takes it.
BaseModelDeclaration = ModelSpec | str | Mapping[str, Any] | PathLike[str]


class _Borrowed(httpx.BaseTransport):
    """A view of a shared transport whose ``close()`` does nothing: code under test may close
    the clients it builds on ``MockWhitney.transport`` without stopping the mock."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        pass


class _UvicornThread:
    """uvicorn serving ``app`` on an already bound socket, on its own thread and loop."""

    def __init__(self, app: Any, host: str) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))  # the kernel picks a free port; no race with other tests
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name=f"whitney-mock-uvicorn-{self.port}", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=10)
        self.sock.close()


class MockWhitney:
    """A running mock Whitney with its control plane enabled.

    Attributes for the code under test:

    - ``client``: an ``httpx.Client`` with ``base_url`` and the ``Authorization`` header set;
    - ``transport``: the transport behind it (in-process: the app itself, no socket), for code
      that builds its own ``httpx.Client(transport=..., base_url=..., headers=...)``; closing
      such clients never stops the mock;
    - ``base_url`` / ``api_key`` / ``headers`` / ``env`` (``WHITNEY_BASE_URL`` and
      ``WHITNEY_API_KEY``): for code that opens its own connections — only a served mock
      (:meth:`serve`) is reachable that way, the in-process ``base_url`` is not a real host;
    - ``app`` and ``backend``: the Starlette app and its state machine. Read ``backend`` only
      while no request is in flight (it lives on the app's event loop).
    """

    def __init__(self, app: Any, *, base_url: str, transport: httpx.BaseTransport,
                 api_keys: Iterable[str], server: _UvicornThread | None = None,
                 timeout: float = 60.0) -> None:
        self.app = app
        self.base_url = base_url
        self._inner_transport = transport
        self.transport: httpx.BaseTransport = _Borrowed(transport)
        self._server = server
        self._timeout = timeout
        self._clients: list[httpx.Client] = []
        self.api_keys: tuple[str, ...] = tuple(api_keys)
        #: The control plane's own key (reset, faults on any call, every tenant's trace); the
        #: methods below use it. Not an API key: the contract's paths answer it 401.
        self.control_key: str = app.state.control_key
        self._control = self.new_client(headers=self.control_headers)
        self.client = self.new_client()

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def in_process(cls, *, seed: int = 0, limits: Mapping[str, int] | None = None,
                   api_keys: Iterable[str] = (DEFAULT_API_KEY,),
                   cancel_delay_ms: int = 50,
                   base_models: Iterable[BaseModelDeclaration] | None = None) -> MockWhitney:
        """A fresh mock served through :class:`InProcessTransport` (no socket).

        ``base_models``: what ``create_app(base_models=...)`` takes (``ModelSpec``, one-line
        declaration ``"ID:vocab_size=N,eos=N[,bos=N]..."``, capabilities-shaped mapping, or a
        ``pathlib.Path`` to a Hugging Face model folder); none = the built-in byte model.
        """
        keys = tuple(api_keys)
        app = create_app(api_keys=keys, seed=seed, limits=dict(limits or {}),
                         cancel_delay_ms=cancel_delay_ms, control_plane=True,
                         base_models=base_models)
        return cls(app, base_url=IN_PROCESS_BASE_URL, transport=InProcessTransport(app),
                   api_keys=keys)

    @classmethod
    def serve(cls, *, seed: int = 0, limits: Mapping[str, int] | None = None,
              api_keys: Iterable[str] = (DEFAULT_API_KEY,), cancel_delay_ms: int = 50,
              host: str = "127.0.0.1",
              base_models: Iterable[BaseModelDeclaration] | None = None) -> MockWhitney:
        """A fresh mock served by uvicorn on ``host`` and a free port, on a background thread
        (``base_models`` as for :meth:`in_process`)."""
        keys = tuple(api_keys)
        app = create_app(api_keys=keys, seed=seed, limits=dict(limits or {}),
                         cancel_delay_ms=cancel_delay_ms, control_plane=True,
                         base_models=base_models)
        server = _UvicornThread(app, host)
        server.start()
        return cls(app, base_url=f"http://{host}:{server.port}", transport=httpx.HTTPTransport(),
                   api_keys=keys, server=server)

    # -- for the code under test -----------------------------------------------------------
    @property
    def api_key(self) -> str:
        """The first accepted key (the one ``client`` sends)."""
        return self.api_keys[0]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def control_headers(self) -> dict[str, str]:
        """``Authorization`` with the control key, for ``/_mock/`` calls of your own."""
        return {"Authorization": f"Bearer {self.control_key}"}

    @property
    def env(self) -> dict[str, str]:
        """``WHITNEY_BASE_URL`` / ``WHITNEY_API_KEY`` for ``monkeypatch.setenv``."""
        return {"WHITNEY_BASE_URL": self.base_url, "WHITNEY_API_KEY": self.api_key}

    @property
    def backend(self) -> Backend:
        backend: Backend = self.app.state.backend
        return backend

    @property
    def base_models(self) -> list[dict[str, Any]]:
        """The served base models, as ``GET /capabilities`` lists them (``id``,
        ``vocab_size``, ``eos_token_id``, ``bos_token_id`` when there is one, ...)."""
        return [spec.capabilities_entry() for spec in self.backend.base_models.values()]

    def new_client(self, **kwargs: Any) -> httpx.Client:
        """Another ``httpx.Client`` on this mock (closed with the mock); kwargs go to httpx."""
        kwargs.setdefault("timeout", self._timeout)
        headers = {**self.headers, **kwargs.pop("headers", {})}
        client = httpx.Client(transport=self.transport, base_url=self.base_url, headers=headers,
                              **kwargs)
        self._clients.append(client)
        return client

    # -- control plane ---------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None,
              params: dict[str, str] | None = None) -> Any:
        response = self._control.request(method, path, json=body, params=params)
        if response.status_code >= 400:
            error = response.json().get("error", {})
            raise MockControlError(response.status_code, error.get("type", ""),
                                   error.get("message", response.text), error.get("details", {}))
        return response.json()

    @overload
    def trace(self) -> dict[str, list[TraceEntry]]: ...

    @overload
    def trace(self, run_id: str) -> list[TraceEntry]: ...

    def trace(self, run_id: str | None = None
              ) -> dict[str, list[TraceEntry]] | list[TraceEntry]:
        """``run_id``'s executed primitives in seq order, ``[{seq, primitive, status}]``; without
        ``run_id``, every run's: ``{run_id: [...]}``.

        Only what reached its turn and was recorded (ORD-4) is here: requests refused before
        their turn, or answered by an injected fault before execution, are not.
        """
        params = None if run_id is None else {"run_id": run_id}
        runs: dict[str, list[TraceEntry]] = self._call("GET", "/_mock/trace", params=params)["runs"]
        return runs if run_id is None else runs[run_id]

    def primitives(self, run_id: str) -> list[str]:
        """The names of the primitives ``run_id`` executed, in seq order."""
        return [entry["primitive"] for entry in self.trace(run_id)]

    def inject_fault(self, kind: str, primitive: str | None = None, *,
                     run_id: str | None = None, count: int | None = 1, skip: int = 0,
                     probability: float = 1.0, seed: int | None = None,
                     **options: Any) -> dict[str, Any]:
        """Register a fault (``POST /_mock/faults``) and return its view with ``fault_id``.

        ``kind``: ``error`` (``status=503``, ``error={"type", "message", "details"}``,
        ``after_execute=False``), ``throttle`` (``retry_after=1`` seconds), ``latency``
        (``delay_ms``), ``drop`` (``after_execute=True``), ``fail_run`` (``run_id``, ``reason``;
        immediate without ``primitive``). ``count=None`` fires on every matching call.
        """
        body: dict[str, Any] = {"kind": kind, "count": count, "skip": skip,
                                "probability": probability, **options}
        for name, value in (("primitive", primitive), ("run_id", run_id), ("seed", seed)):
            if value is not None:
                body[name] = value
        fault: dict[str, Any] = self._call("POST", "/_mock/faults", body)
        return fault

    def fail_run(self, run_id: str, reason: str = "failed by the test") -> dict[str, Any]:
        """Move ``run_id`` to ``failed`` now (a ``fail_run`` fault without trigger)."""
        return self.inject_fault("fail_run", run_id=run_id, reason=reason)

    def faults(self) -> list[dict[str, Any]]:
        """Every fault since the last reset, with ``seen`` / ``fired`` / ``remaining``."""
        faults: list[dict[str, Any]] = self._call("GET", "/_mock/faults")["faults"]
        return faults

    def clear_faults(self) -> int:
        cleared: int = self._call("DELETE", "/_mock/faults")["cleared"]
        return cleared

    def reset(self, *, seed: int | None = None, limits: Mapping[str, int] | None = None,
              api_keys: Iterable[str] | None = None,
              cancel_delay_ms: int | None = None) -> dict[str, Any]:
        """Forget all state and faults. Arguments replace the configuration the mock was built
        with (``limits`` override its limits); omitted ones return to it."""
        body: dict[str, Any] = {}
        if seed is not None:
            body["seed"] = seed
        if limits:
            body["limits"] = dict(limits)
        if api_keys is not None:
            body["api_keys"] = list(api_keys)
        if cancel_delay_ms is not None:
            body["cancel_delay_ms"] = cancel_delay_ms
        result: dict[str, Any] = self._call("POST", "/_mock/reset", body)
        self.api_keys = tuple(self.backend.api_keys)
        for client in self._clients:
            if client is not self._control:
                client.headers["Authorization"] = f"Bearer {self.api_key}"
        return result

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._inner_transport.close()
        if self._server is not None:
            self._server.stop()

    def __enter__(self) -> MockWhitney:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class MockControlError(Exception):
    """A control-plane call was refused (the envelope's status, type, message, details)."""

    def __init__(self, status: int, type: str, message: str, details: dict[str, Any]) -> None:
        self.status, self.type, self.message, self.details = status, type, message, details
        super().__init__(f"{status} {type}: {message}")

"""Fault injection for the mock's control plane (contract §5), as ASGI middleware.

Not part of the Whitney contract; installed by ``create_app(control_plane=True)`` and armed
through ``POST /_mock/faults`` (:mod:`mock_server.http.control`). Faults wrap the app, so the
state machine never knows about them: a fault that answers *before* the request reaches the backend
consumes no seq (like a 5xx from a load balancer, ORD-4); one marked ``after_execute`` lets the
backend execute and record the request first (so a retry with the same seq gets the recorded
response back, ORD-3).

The fault middleware sits outside ``EnvelopeMiddleware``: a drop must escape the app as an
exception, which the envelope would turn into a 500. Injected answers therefore add
``X-Request-Id`` themselves (TRANSPORT-1).

Fault kinds (``POST /_mock/faults``):

- ``error``    answer ``status`` (4xx/5xx, not 429) with an ERR-1 envelope; ``after_execute``.
- ``throttle`` answer 429 ``rate_limited`` with ``Retry-After: retry_after`` (ERR-2).
- ``latency``  wait ``delay_ms`` before the request reaches the backend.
- ``drop``     execute (unless ``after_execute`` is false), then drop the connection instead of
               answering: in-process the client's ``httpx`` call raises
               ``httpx.RemoteProtocolError``; over uvicorn the status line and headers go out,
               then the connection closes before the body (httpx: ``RemoteProtocolError``,
               "peer closed connection without sending complete message body").
- ``fail_run`` move ``run_id`` to ``failed`` now, or when the next matching call arrives (that
               call then meets the failed run: 409 ``run_not_active``).

A fault matches a call by route name (a primitive such as ``optim_step``, or any other route of
:data:`mock_server.http.routes.ROUTES`, such as ``get_run``) and optionally ``run_id``. It lets
the first ``skip`` matching calls through, then fires on each later matching call with
probability ``probability`` (drawn from ``random.Random(seed)``, ``seed`` defaulting to the
mock's seed, so a faulty run replays exactly), at most ``count`` times (``null``: until reset).
Faults are checked in the order they were added; every matching ``latency`` fault adds its
delay, the first other fault that fires answers the call.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import httpx
from pydantic import Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..backend import schemas
from ..backend.errors import NotFound, ValidationFailed, WhitneyError
from ..backend.state import Backend
from .responses import error_messages, request_id
from .routes import ROUTES, match

__all__ = ["FAULT_KINDS", "Fault", "FaultMiddleware", "FaultRegistry", "InjectedDrop", "TARGETS",
           "classify", "parse_fault"]

#: The names a fault can target: every route of the contract.
TARGETS = frozenset(spec.name for spec in ROUTES)
_DEFAULT_ERROR_TYPES = {500: "internal_error", 502: "bad_gateway", 503: "service_unavailable",
                        504: "gateway_timeout"}


def classify(method: str, path: str) -> tuple[str, str | None] | None:
    """``(route name, run_id or None)`` of a contract request, ``None`` for anything else."""
    found = match(method, path)
    if found is None:
        return None
    spec, params = found
    return spec.name, params.get("run_id")


# -- fault specifications (validated like contract bodies: strict, unknown fields 422) --------
Count = Annotated[int, Field(ge=1)] | None


class _FaultBase(schemas.Body):
    primitive: str | None = None
    run_id: str | None = None
    count: Count = 1
    skip: Annotated[int, Field(ge=0)] = 0
    probability: Annotated[float, Field(gt=0, le=1)] = 1.0
    seed: Annotated[int, Field(ge=0, le=schemas.INT64_MAX)] | None = None


class ErrorDetail(schemas.Body):
    type: str | None = None
    message: str | None = None
    details: dict[str, Any] | None = None


class ErrorFault(_FaultBase):
    kind: Literal["error"]
    status: Annotated[int, Field(ge=400, le=599)] = 503
    error: ErrorDetail | None = None
    after_execute: bool = False


class ThrottleFault(_FaultBase):
    kind: Literal["throttle"]
    retry_after: Annotated[int, Field(ge=0, le=3600)] = 1


class LatencyFault(_FaultBase):
    kind: Literal["latency"]
    delay_ms: Annotated[int, Field(ge=0, le=600_000)]


class DropFault(_FaultBase):
    kind: Literal["drop"]
    after_execute: bool = True


class FailRunFault(_FaultBase):
    kind: Literal["fail_run"]
    run_id: str  # required here
    reason: str = "failed by the mock control plane"



def parse_fault(payload: Any) -> Any:
    """Validate a ``POST /_mock/faults`` body; 422 in the envelope for anything wrong."""
    kind = payload.get("kind") if isinstance(payload, dict) else None
    if kind not in FAULT_KINDS:
        close = difflib.get_close_matches(str(kind), list(FAULT_KINDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValidationFailed(f"kind must be one of {', '.join(FAULT_KINDS)}, got {kind!r}{hint}",
                               details={"loc": "kind", "kinds": list(FAULT_KINDS)})
    spec = schemas.validate(FAULT_KINDS[kind].model, payload)
    if spec.primitive is not None and spec.primitive not in TARGETS:
        close = difflib.get_close_matches(spec.primitive, sorted(TARGETS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValidationFailed(f"primitive {spec.primitive!r} is not a primitive or endpoint "
                               f"name; {hint}valid names: {', '.join(sorted(TARGETS))}",
                               details={"loc": "primitive", "known": sorted(TARGETS)})
    if spec.primitive is None and kind != "fail_run":
        raise ValidationFailed(f"a {kind} fault needs 'primitive' (which calls it affects)",
                               details={"loc": "primitive"})
    if kind == "error" and spec.status == 429:
        raise ValidationFailed("use kind 'throttle' for 429: it always carries Retry-After "
                               "(ERR-2)", details={"loc": "status"})
    return spec


@dataclass
class Fault:
    """One registered fault and its counters."""

    fault_id: str
    spec: Any
    seed: int
    remaining: int | None
    owner: str | None = None  # the API key that armed it (fires on its calls only) or None
    rng: random.Random = field(init=False)
    seen: int = 0
    fired: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def kind(self) -> str:
        return str(self.spec.kind)

    def matches(self, name: str, run_id: str | None, caller: Callable[[], str | None]) -> bool:
        """Whether this fault applies to a call of route ``name`` on ``run_id``; ``caller()``
        is the call's API key, asked only for a fault armed by an API key."""
        return (self.remaining != 0 and self.spec.primitive == name
                and (self.spec.run_id is None or self.spec.run_id == run_id)
                and (self.owner is None or caller() == self.owner))

    def trigger(self) -> bool:
        """Count one matching call; True when the fault fires on it."""
        self.seen += 1
        if self.seen <= self.spec.skip:
            return False
        if self.spec.probability < 1 and self.rng.random() >= self.spec.probability:
            return False
        self.fired += 1
        if self.remaining is not None:
            self.remaining -= 1
        return True

    def view(self) -> dict[str, Any]:
        return {"fault_id": self.fault_id, **self.spec.model_dump(exclude_none=True),
                "seed": self.seed, "remaining": self.remaining, "seen": self.seen,
                "fired": self.fired, "active": self.remaining != 0}


@dataclass
class FaultRegistry:
    """The faults of one app, and the configuration ``reset`` returns to."""

    backend: Backend
    initial: dict[str, Any]
    faults: list[Fault] = field(default_factory=list)
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep  # swapped by tests: no timing
    _counter: int = 0

    def add(self, spec: Any, owner: str | None = None) -> Fault:
        """Register ``spec``; ``owner``: the API key arming it (None: the control key)."""
        if spec.kind == "fail_run" and spec.run_id not in self.backend.runs:
            raise NotFound(f"run {spec.run_id!r} not found")
        self._counter += 1
        seed = self.backend.seed if spec.seed is None else spec.seed
        fault = Fault(f"fault_{self._counter:04d}", spec, seed, spec.count, owner)
        if spec.kind == "fail_run":
            if spec.primitive is None:  # immediate
                self.backend.fail_run(run_id=spec.run_id, reason=spec.reason)
                fault.seen = fault.fired = 1
                fault.remaining = 0
        self.faults.append(fault)
        return fault

    def select(self, name: str, run_id: str | None,
               authorization: str | None = None) -> tuple[int, Fault | None]:
        """Total latency (ms) and the answering fault, if any, for one call (``authorization``:
        its header, read only when a fault armed by an API key could match)."""
        delay_ms, chosen = 0, None
        found: list[str | None] = []

        def caller() -> str | None:
            if not found:
                try:
                    found.append(self.backend.authenticate(authorization))
                except WhitneyError:
                    found.append(None)
            return found[0]

        for fault in self.faults:
            if not fault.matches(name, run_id, caller):
                continue
            if FAULT_KINDS[fault.kind].answer is None:  # latency: delays, never answers
                if fault.trigger():
                    delay_ms += fault.spec.delay_ms
            elif chosen is None and fault.trigger():
                chosen = fault
        return delay_ms, chosen


class InjectedDrop(httpx.RemoteProtocolError):
    """Raised through the app by a ``drop`` fault: in-process, the client sees exactly this
    ``httpx.RemoteProtocolError``; uvicorn closes the connection after the headers."""


class _QuietDrops(logging.Filter):
    """uvicorn logs an app exception with a traceback; an injected drop is intended, so it
    becomes one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, InjectedDrop):
            record.msg, record.args = "injected fault: %s", (str(exc),)
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_QUIET_DROPS = _QuietDrops()


async def _drain(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body"):
            return


class FaultMiddleware:
    """Applies the registry's faults to contract requests (see the module docstring)."""

    def __init__(self, app: ASGIApp, registry: FaultRegistry) -> None:
        self.app = app
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = None
        if scope["type"] == "http" and self.registry.faults:
            target = classify(scope["method"], scope["path"])
        if target is None:
            await self.app(scope, receive, send)
            return
        authorization = next((value.decode("latin-1") for name, value in scope["headers"]
                              if name == b"authorization"), None)
        delay_ms, fault = self.registry.select(*target, authorization)
        if delay_ms:
            await self.registry.sleep(delay_ms / 1000)
        answer = None if fault is None else FAULT_KINDS[fault.kind].answer
        if fault is None or answer is None:
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["whitney_fault"] = fault.kind
        await answer(self, fault, scope, receive, send)

    async def execute_captured(self, scope: Scope, receive: Receive) -> Message:
        """Let the backend execute the request; keep its response start instead of sending it."""
        captured: list[Message] = []

        async def capture(message: Message) -> None:
            captured.append(message)

        await self.app(scope, receive, capture)
        return next(m for m in captured if m["type"] == "http.response.start")


def _id_header(scope: Scope) -> tuple[bytes, bytes]:
    """TRANSPORT-1 on an injected answer (this middleware sits outside the envelope's)."""
    return b"x-request-id", request_id(scope).encode("latin-1")


def _where(scope: Scope) -> str:
    return f"{scope['method']} {scope['path']}"


async def _send_all(send: Send, messages: list[Message]) -> None:
    for message in messages:
        await send(message)


# -- how each kind answers a call it fires on ------------------------------------------------
Answer = Callable[[FaultMiddleware, Fault, Scope, Receive, Send], Awaitable[None]]


async def _answer_error(middleware: FaultMiddleware, fault: Fault, scope: Scope,
                        receive: Receive, send: Send) -> None:
    spec = fault.spec
    if spec.after_execute:
        await middleware.execute_captured(scope, receive)
    else:
        await _drain(receive)
    error = spec.error or ErrorDetail()
    injected = WhitneyError(
        error.message or f"injected fault {fault.fault_id}: {spec.status} on {_where(scope)}",
        type=error.type or _DEFAULT_ERROR_TYPES.get(spec.status, "injected_error"),
        status=spec.status,
        details=error.details if error.details is not None
        else {"fault_id": fault.fault_id, "executed": spec.after_execute})
    await _send_all(send, error_messages(injected, _id_header(scope)))


async def _answer_throttle(middleware: FaultMiddleware, fault: Fault, scope: Scope,
                           receive: Receive, send: Send) -> None:
    retry_after = fault.spec.retry_after
    await _drain(receive)
    throttled = WhitneyError(f"throttled by an injected fault ({fault.fault_id}); retry after "
                             f"{retry_after} s", type="rate_limited", status=429,
                             details={"retry_after": retry_after, "fault_id": fault.fault_id})
    await _send_all(send, error_messages(throttled, _id_header(scope),
                                         (b"retry-after", str(retry_after).encode())))


async def _answer_drop(middleware: FaultMiddleware, fault: Fault, scope: Scope,
                       receive: Receive, send: Send) -> None:
    after_execute = fault.spec.after_execute
    if after_execute:
        start = await middleware.execute_captured(scope, receive)
    else:  # headers of a 502 that never completes: still a dropped response
        await _drain(receive)
        dropped = WhitneyError("dropped by an injected fault", type="bad_gateway", status=502)
        start = error_messages(dropped, _id_header(scope))[0]
    await send(start)
    logging.getLogger("uvicorn.error").addFilter(_QUIET_DROPS)  # idempotent
    raise InjectedDrop(f"{fault.fault_id} dropped the response to {_where(scope)}"
                       f"{' after executing it' if after_execute else ''}")


async def _answer_fail_run(middleware: FaultMiddleware, fault: Fault, scope: Scope,
                           receive: Receive, send: Send) -> None:
    backend = middleware.registry.backend
    if fault.spec.run_id in backend.runs:  # else forgotten since: nothing to fail
        backend.fail_run(run_id=fault.spec.run_id, reason=fault.spec.reason)
    await middleware.app(scope, receive, send)


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: the model of its specification (a ``POST /_mock/faults`` body) and
    how a fault of this kind answers a call it fires on (``None``: it only delays the call)."""

    model: type[_FaultBase]
    answer: Answer | None


#: Every fault kind, the one table the control plane and the middleware read.
FAULT_KINDS: dict[str, FaultKind] = {
    "error": FaultKind(ErrorFault, _answer_error),
    "throttle": FaultKind(ThrottleFault, _answer_throttle),
    "latency": FaultKind(LatencyFault, None),
    "drop": FaultKind(DropFault, _answer_drop),
    "fail_run": FaultKind(FailRunFault, _answer_fail_run),
}

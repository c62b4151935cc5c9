"""HTTP endpoints (Starlette): read and validate the body, call the Backend, render JSON.

Endpoints hold no state of their own: each reads ``request.app.state.backend`` and, for
bodies, ``request.app.state.body_reader`` (:func:`read_json` unless the app was built with
another reader). A ``WhitneyError`` raised anywhere below becomes the ERR-1 envelope in
:func:`whitney_error`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..backend import schemas
from ..backend.errors import BodyTooLarge, WhitneyError
from ..backend.primitives import PRIMITIVES
from ..backend.state import Backend
from .responses import error_response, json_response

__all__ = ["BodyReader", "http_error", "primitive_endpoint", "read_json", "read_body",
           "whitney_error"]

#: ``read(raw, model) -> payload``: a request body's bytes to the JSON value validated against
#: ``model`` (the model lets a reader treat request types differently).
BodyReader = Callable[[bytes, type[schemas.Body]], Any]


def read_json(raw: bytes, model: type[schemas.Body]) -> Any:
    """The faithful reader: strict RFC 8259 JSON, an empty body read as ``{}`` (ERR-2)."""
    return schemas.parse_json(raw)


async def whitney_error(request: Request, exc: Exception) -> Response:
    """Every ``WhitneyError`` in the ERR-1 envelope."""
    assert isinstance(exc, WhitneyError)
    return error_response(exc)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in the envelope, not plain text (ERR-1)."""
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(WhitneyError(str(exc.detail), type=kind, status=exc.status_code),
                          exc.headers)


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def _key(request: Request) -> str:
    backend = _backend(request)
    backend.tick()
    return backend.authenticate(request.headers.get("authorization"))


async def read_body(request: Request) -> bytes:
    """Read the body, refusing it with 413 before it is read whole (ERR-2)."""
    limit = _backend(request).limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes exceeds max_body_bytes {limit}",
                           details={"max_body_bytes": limit})
    chunks: list[bytes] = []
    size = 0
    receive = request.receive  # the ASGI messages themselves: no stream generator per request
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body exceeds max_body_bytes {limit}",
                               details={"max_body_bytes": limit})
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _body(request: Request, model: type[schemas.Body]) -> tuple[Any, bytes]:
    """The validated body and its ORD-3 digest (the JSON value, contract 1.1)."""
    read: BodyReader = request.app.state.body_reader
    raw = await read_body(request)
    if read is read_json:  # the faithful reader: one pass where it can (schemas.decode)
        return schemas.decode(raw, model)
    payload = read(raw, model)
    return schemas.validate(model, payload), schemas.canonical_digest(payload)


# -- discovery and lifecycle ----------------------------------------------------------------
async def capabilities(request: Request) -> Response:
    _key(request)
    return json_response(_backend(request).capabilities())


async def create_session(request: Request) -> Response:
    key = _key(request)
    body, _ = await _body(request, schemas.CreateSession)
    return json_response(_backend(request).create_session(key=key, body=body), 201)


async def get_session(request: Request) -> Response:
    key = _key(request)
    return json_response(_backend(request).get_session(
        key=key, session_id=request.path_params["session_id"]))


async def heartbeat(request: Request) -> Response:
    key = _key(request)
    await _body(request, schemas.Empty)
    return json_response(_backend(request).heartbeat(
        key=key, session_id=request.path_params["session_id"]))


async def close_session(request: Request) -> Response:
    key = _key(request)
    await _body(request, schemas.Empty)
    return json_response(_backend(request).close_session(
        key=key, session_id=request.path_params["session_id"]))


async def create_run(request: Request) -> Response:
    key = _key(request)
    body, _ = await _body(request, schemas.CreateRun)
    return json_response(_backend(request).create_run(
        key=key, session_id=request.path_params["session_id"], body=body), 201)


async def get_run(request: Request) -> Response:
    key = _key(request)
    return json_response(_backend(request).get_run(key=key, run_id=request.path_params["run_id"]))


async def finish_run(request: Request) -> Response:
    key = _key(request)
    await _body(request, schemas.Empty)
    return json_response(_backend(request).finish_run(
        key=key, run_id=request.path_params["run_id"]))


async def cancel_run(request: Request) -> Response:
    key = _key(request)
    await _body(request, schemas.Empty)
    status, view = _backend(request).cancel_run(key=key, run_id=request.path_params["run_id"])
    return json_response(view, status)


async def get_operation(request: Request) -> Response:
    key = _key(request)
    return json_response(_backend(request).operation(
        key=key, run_id=request.path_params["run_id"], seq=request.path_params["seq"]))


async def get_export_file(request: Request) -> Response:
    key = _key(request)
    name = request.path_params["name"]
    data = _backend(request).export_file(key=key, run_id=request.path_params["run_id"],
                                         export_id=request.path_params["export_id"], name=name)
    media = "application/json" if name.endswith(".json") else "application/octet-stream"
    return Response(data, media_type=media)


# -- primitives (ORD-1..5) ------------------------------------------------------------------
def primitive_endpoint(primitive: str) -> Callable[[Request], Awaitable[Response]]:
    """One endpoint per primitive: validate, then execute at the body's turn in the sequence."""
    model = PRIMITIVES[primitive].body

    async def endpoint(request: Request) -> Response:
        key = _key(request)
        run_id = request.path_params["run_id"]
        backend = _backend(request)
        backend.owned_run(key, run_id)  # 404 before the body is read
        body, digest = await _body(request, model)
        outcome = await backend.submit(key=key, run_id=run_id, primitive=primitive, body=body,
                                       digest=digest)
        headers = {"Whitney-Replayed": "true"} if outcome.replayed else None
        return json_response(outcome.payload, outcome.status, headers)

    endpoint.__name__ = primitive
    return endpoint

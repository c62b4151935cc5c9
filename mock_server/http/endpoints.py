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
from ..backend.config import API_PREFIX
from ..backend.errors import BodyTooLarge, Unauthorized, ValidationFailed, WhitneyError
from ..backend.primitives import PRIMITIVES
from ..backend.state import LIST_LIMIT_DEFAULT, Backend
from .responses import error_response, json_response

__all__ = ["BodyReader", "IDEMPOTENCY_KEY_MAX", "authorization", "http_error", "idempotency_key",
           "primitive_endpoint", "read_json", "read_body", "whitney_error"]

#: LIFE-9: the longest ``Idempotency-Key`` accepted (visible ASCII, 1 to this many characters).
IDEMPOTENCY_KEY_MAX = 255
#: LIFE-10: the query parameters of ``GET /sessions``.
LIST_PARAMETERS = ("state", "metadata_key", "metadata_value", "limit", "cursor")

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
    """Starlette's own 404/405 in the envelope, not plain text (ERR-1). The app does not
    redirect a trailing slash (no empty-bodied 307): it answers 404 here, naming the path
    without the slash when that one exists."""
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    message = str(exc.detail)
    path = request.url.path
    if exc.status_code == 404:
        message = f"no route {request.method} {path}"
        bare = path.rstrip("/")
        if bare != path and bare and _routed(request, bare):
            message += f" (no trailing slash: {bare})"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {path}"
    return error_response(WhitneyError(message, type=kind, status=exc.status_code),
                          exc.headers)


def _routed(request: Request, path: str) -> bool:
    """Whether any route of the app serves ``path`` (for any method)."""
    from starlette.routing import Match

    scope = {**request.scope, "path": path}
    return any(route.matches(scope)[0] is not Match.NONE for route in request.app.routes)


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def authorization(request: Request) -> str | None:
    """The request's one ``Authorization`` header (SEC-1): two or more are 401, whatever they
    say, rather than trusting whichever one a proxy or framework would pick."""
    values = request.headers.getlist("authorization")
    if len(values) > 1:
        raise Unauthorized(f"{len(values)} Authorization headers: send exactly one "
                           f"(Authorization: Bearer <key>)")
    return values[0] if values else None


def _key(request: Request) -> str:
    backend = _backend(request)
    backend.tick()
    return backend.authenticate(authorization(request))


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


def idempotency_key(request: Request) -> str | None:
    """LIFE-9: the request's ``Idempotency-Key`` (None when absent): once, visible ASCII, 1 to
    ``IDEMPOTENCY_KEY_MAX`` characters, else 422."""
    values = request.headers.getlist("idempotency-key")
    if not values:
        return None
    problem = None
    if len(values) > 1:
        problem = "Idempotency-Key was sent more than once"
    elif not 1 <= len(values[0]) <= IDEMPOTENCY_KEY_MAX:
        problem = f"Idempotency-Key must have 1 to {IDEMPOTENCY_KEY_MAX} characters"
    elif not all(0x21 <= ord(ch) <= 0x7E for ch in values[0]):
        problem = "Idempotency-Key must be visible ASCII (no spaces or control characters)"
    if problem is not None:
        raise ValidationFailed(problem, details={
            "errors": [{"loc": ["header", "Idempotency-Key"], "msg": problem}]})
    return values[0]


async def _create(request: Request, model: type[schemas.Body], scope: str,
                  create: Callable[[str, Any], dict[str, Any]]) -> Response:
    """LIFE-1 / LIFE-5 with LIFE-9: validate, then create once per ``Idempotency-Key``."""
    key = _key(request)
    once = idempotency_key(request)
    body, digest = await _body(request, model)
    content, replayed = _backend(request).create_once(
        key=key, idempotency_key=once, scope=scope, digest=digest,
        create=lambda: create(key, body))
    return json_response(content, 201, {"Whitney-Replayed": "true"} if replayed else None)


# -- discovery and lifecycle ----------------------------------------------------------------
async def capabilities(request: Request) -> Response:
    _key(request)
    return json_response(_backend(request).capabilities())


async def create_session(request: Request) -> Response:
    backend = _backend(request)
    return await _create(request, schemas.CreateSession, "POST /sessions",
                         lambda key, body: backend.create_session(key=key, body=body))


async def list_sessions(request: Request) -> Response:
    """LIFE-10 (optional: session_listing): ``GET /sessions``."""
    key = _key(request)
    backend = _backend(request)
    if not backend.features.session_listing:
        raise WhitneyError(f"GET {API_PREFIX}/sessions is not served here "
                           f"(features.session_listing is false)", type="method_not_allowed",
                           status=405)
    items = request.query_params.multi_items()
    unknown = sorted({name for name, _ in items if name not in LIST_PARAMETERS})
    if unknown:
        raise ValidationFailed(f"unknown query parameter(s): {', '.join(unknown)}; known: "
                               f"{', '.join(LIST_PARAMETERS)}", type="unknown_field",
                               details={"fields": unknown})
    params: dict[str, str] = {}
    for name, value in items:
        if name in params:
            raise ValidationFailed(f"query parameter {name} given twice", details={
                "errors": [{"loc": ["query", name], "msg": "given twice"}]})
        params[name] = value
    limit = LIST_LIMIT_DEFAULT
    if "limit" in params:
        if not (params["limit"].isascii() and params["limit"].isdigit()):
            raise ValidationFailed(f"limit must be a decimal integer, got {params['limit']!r}",
                                   details={"errors": [{"loc": ["query", "limit"],
                                                        "msg": "not a decimal integer"}]})
        limit = int(params["limit"]) if len(params["limit"]) < 10 else 10**9
    return json_response(backend.list_sessions(
        key=key, state=params.get("state"), metadata_key=params.get("metadata_key"),
        metadata_value=params.get("metadata_value"), limit=limit, cursor=params.get("cursor")))


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
    backend = _backend(request)
    session_id = request.path_params["session_id"]
    return await _create(request, schemas.CreateRun, f"POST /sessions/{session_id}/runs",
                         lambda key, body: backend.create_run(key=key, session_id=session_id,
                                                              body=body))


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
    """One endpoint per primitive: validate, then execute at the body's turn in the sequence.

    It answers its own ``WhitneyError``s in the envelope (the same response as
    :func:`whitney_error`), so the hot path needs no exception-handler layer."""
    model = PRIMITIVES[primitive].body

    async def endpoint(request: Request) -> Response:
        try:
            key = _key(request)
            backend = _backend(request)
            run_id = request.path_params["run_id"]
            run = backend.owned_run(key, run_id)  # 404 before the body is read
            try:
                body, digest = await _body(request, model)
            except WhitneyError as exc:  # 400, 413, 422: refused before its turn (ORD-6)
                raise backend.with_seq_state(run, exc) from None
            outcome = await backend.submit(key=key, run_id=run_id, primitive=primitive,
                                           body=body, digest=digest)
        except WhitneyError as exc:
            return error_response(exc)
        headers = {"Whitney-Replayed": "true"} if outcome.replayed else None
        return json_response(outcome.payload, outcome.status, headers)

    endpoint.__name__ = primitive
    return endpoint

"""What goes on the wire around a result: JSON bodies, the ERR-1 error envelope, and
TRANSPORT-1's ``X-Request-Id``, for endpoints (Starlette responses) and middleware (raw ASGI
messages) alike.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..backend.errors import WhitneyError

__all__ = ["EnvelopeMiddleware", "error_messages", "error_response", "json_response",
           "request_id"]

logger = logging.getLogger("mock_server")


def json_response(content: Any, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> Response:
    """``content`` (already-encoded bytes, or anything orjson encodes) as a JSON response."""
    body = content if isinstance(content, bytes) else orjson.dumps(content)
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_response(error: WhitneyError, headers: Mapping[str, str] | None = None) -> Response:
    """``error`` in the ERR-1 envelope; a 401 names its scheme (``WWW-Authenticate``)."""
    extra = dict(headers or {})
    if error.status == 401:
        extra["WWW-Authenticate"] = "Bearer"
    return json_response(error.envelope(), error.status, extra)


def error_messages(error: WhitneyError, *headers: tuple[bytes, bytes]) -> list[Message]:
    """``error`` in the ERR-1 envelope as the two ASGI messages of a response, for middleware
    answering on its own; ``headers`` are added after the content headers."""
    body = orjson.dumps(error.envelope())
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return [{"type": "http.response.start", "status": error.status,
             "headers": [*start, *headers]},
            {"type": "http.response.body", "body": body}]


def request_id(scope: Scope) -> str:
    """TRANSPORT-1: the client's ``X-Request-Id`` (first 200 characters) or a fresh one, kept
    in the request's scope so every layer that answers uses the same."""
    state = scope.setdefault("state", {})
    found: str | None = state.get("request_id")
    if found is None:
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                found = value.decode("latin-1")[:200]
                break
        found = found or os.urandom(16).hex()  # uuid4().hex's format, 5x cheaper
        state["request_id"] = found
    return found


class EnvelopeMiddleware:
    """TRANSPORT-1 ``X-Request-Id`` on every response, and a 500 envelope for any crash.

    Starlette's ServerErrorMiddleware re-raises after answering; the mock must answer in the
    contract's envelope and keep serving, so unexpected exceptions stop here.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        started = False

        header = (b"x-request-id", rid.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = message.get("headers")
                if type(headers) is list:  # a response's own fresh list: append in place
                    headers.append(header)
                else:
                    message = {**message, "headers": [*(headers or ()), header]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ClientDisconnect:  # the client hung up before its body was read: no one to answer
            return
        except Exception:
            logger.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                raise
            crash = WhitneyError("the mock hit an internal error", details={"request_id": rid})
            for message in error_messages(crash):
                await send_with_id(message)

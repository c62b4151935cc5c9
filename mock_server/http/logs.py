"""One structured log line per request, on logger ``mock_server.requests`` at INFO.

The line is logfmt (``key=value``, values with spaces quoted)::

    method=POST path=/v1/training/runs/run_0001/optim_step status=200 ms=3.1 run=run_0001 seq=2
    replayed=false fault=- request_id=4f0c... error=-

and the same fields ride on the record as ``record.whitney_request`` (a dict) for JSON
formatters. When the logger is not enabled for INFO the middleware passes requests straight
through: nothing is buffered or parsed. ``run`` comes from the route table (:mod:`.routes`);
``seq`` is found in the raw body of primitive calls with a regular expression; only a body where
it is ambiguous (``"seq"`` more than once) is parsed.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..backend.primitives import PRIMITIVES
from .routes import match

__all__ = ["REQUEST_LOGGER", "RequestLogMiddleware", "configure_logging", "format_fields"]

REQUEST_LOGGER = "mock_server.requests"
logger = logging.getLogger(REQUEST_LOGGER)

_SEQ = re.compile(rb'"seq"\s*:\s*(-?\d+)')
_BARE = re.compile(r"[^\s\"=\\]+")


def find_seq(body: bytes) -> int | None:
    """The top-level integer ``seq`` of a primitive body, or None."""
    found = _SEQ.findall(body)
    if len(found) == 1:
        return int(found[0])
    if not found:
        return None
    try:  # "seq" also appears deeper (a loss_config key, say): only a parse can tell
        value = orjson.loads(body).get("seq")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def format_fields(fields: dict[str, Any]) -> str:
    """logfmt: ``key=value`` pairs, ``-`` for None, lowercase booleans, quoted when needed."""
    parts = []
    for key, value in fields.items():
        if value is None:
            text = "-"
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        if not _BARE.fullmatch(text):
            text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
        parts.append(f"{key}={text}")
    return " ".join(parts)


class RequestLogMiddleware:
    """Pure ASGI middleware: method, path, status, ms, run, seq, replayed (+ fault, request_id,
    error) for every HTTP request, logged when the response is done or the app raised."""

    def __init__(self, app: ASGIApp, log: logging.Logger | None = None) -> None:
        self.app = app
        self.log = log or logger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path: str = scope["path"]
        route = match(None, path)
        spec, params = route if route is not None else (None, {})
        capture = spec is not None and spec.name in PRIMITIVES and scope["method"] == spec.method
        chunks: list[bytes] = []
        response: dict[str, Any] = {"status": None, "replayed": False, "request_id": None}

        async def receive_logged() -> Message:
            message = await receive()
            if capture and message["type"] == "http.request":
                chunks.append(message.get("body", b""))
            return message

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                for name, value in message.get("headers", []):
                    name = name.lower()
                    if name == b"whitney-replayed":
                        response["replayed"] = value.lower() == b"true"
                    elif name == b"x-request-id":
                        response["request_id"] = value.decode("latin-1")
            await send(message)

        error = None
        try:
            await self.app(scope, receive_logged, send_logged)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            seq = find_seq(chunks[0] if len(chunks) == 1 else b"".join(chunks)) if capture \
                else None
            fields = {
                "method": scope["method"], "path": path, "status": response["status"],
                "ms": f"{(time.perf_counter() - started) * 1000:.1f}",
                "run": params.get("run_id"), "seq": seq,
                "replayed": response["replayed"],
                "fault": scope.get("state", {}).get("whitney_fault"),
                "request_id": response["request_id"], "error": error,
            }
            self.log.info("%s", format_fields(fields), extra={"whitney_request": fields})


def configure_logging(level: str = "warning") -> None:
    """Send the ``mock_server`` loggers to stderr at ``level`` (``info``: one line per request).

    For the CLI; idempotent. Library users configure logging themselves instead.
    """
    root = logging.getLogger("mock_server")
    root.setLevel(level.upper())
    if not any(getattr(h, "whitney_mock", False) for h in root.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.whitney_mock = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    root.propagate = False

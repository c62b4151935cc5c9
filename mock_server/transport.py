"""A synchronous httpx transport that runs an ASGI app in-process.

``httpx.ASGITransport`` only serves ``httpx.AsyncClient``. Training code and the conformance
suite are synchronous, and pipelined clients send requests from several threads at once, so
this transport owns one background event loop and hands every request to
``ASGITransport`` on that loop. Requests from many threads are therefore truly concurrent
inside the app (a request held for ordering does not block the next one), exactly as they
would be over TCP with uvicorn.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx

__all__ = ["InProcessTransport"]


class InProcessTransport(httpx.BaseTransport):
    """Serve ``app`` to a synchronous ``httpx.Client`` without a socket.

    >>> client = httpx.Client(transport=InProcessTransport(app), base_url="http://mock")
    """

    def __init__(self, app: Any, *, raise_app_exceptions: bool = True) -> None:
        self.app = app
        self._asgi = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="whitney-inprocess-loop", daemon=True
        )
        self._thread.start()
        self._closed = False

    async def _handle(self, request: httpx.Request) -> httpx.Response:
        response = await self._asgi.handle_async_request(request)
        content = await response.aread()
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            content=content,
            extensions={"http_version": b"HTTP/1.1"},
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise httpx.TransportError("InProcessTransport is closed")
        # The sync client hands over a stream that is also async-iterable (ByteStream);
        # read it here so the loop thread never touches a sync-only stream.
        body = request.read()
        forwarded = httpx.Request(
            request.method, request.url, headers=request.headers, content=body,
            extensions=request.extensions,
        )
        future = asyncio.run_coroutine_threadsafe(self._handle(forwarded), self._loop)
        return future.result()

    def run(self, coro: Any) -> Any:
        """Run a coroutine on the transport's loop (the app's loop) and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

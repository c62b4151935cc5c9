"""A minimal keep-alive HTTP/1.1 client on asyncio streams, for load generation.

With 64 connections in one process, httpx's async pool costs the client about three times the
CPU of the same requests sent one at a time, and on two cores that client then competes with
the server it measures. This client does only what the mock's answers need: one request at a
time per connection, a ``Content-Length`` body (Starlette always sends one), no redirects, no
TLS, no chunked encoding (refused loudly rather than misread).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


class RawConnection:
    """One keep-alive connection; ``request`` must not be called concurrently on it."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.fixed = "".join(f"{k}: {v}\r\n" for k, v in
                             {"Host": f"{self.host}:{self.port}", **headers}.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """Send one request; return ``(status, body)``."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (f"{method} {self.prefix}{path} HTTP/1.1\r\n{self.fixed}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode("latin-1") + body)
        raw_head = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding":
                raise RuntimeError("chunked responses are not supported by this client")
        if length is None:
            raise RuntimeError(f"response without Content-Length: {lines[0]}")
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
            self.writer = self.reader = None

"""Where the suite sends its requests: a base URL and API keys, or the embedded mock.

This is the only module of the package that imports ``mock_server``, and only inside
:func:`_embedded_transport`, for the default target (no base URL given). Every check talks to
the endpoint through the ``httpx.Client`` built here, so one run works the same over TCP,
over the in-process transport and against a real service.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "API_PREFIX", "EMBEDDED_BASE_URL", "EMBEDDED_API_KEY", "EMBEDDED_SECOND_API_KEY",
    "Target", "open_target", "mask_secrets", "server_root",
]

API_PREFIX = "/v1/training"
EMBEDDED_BASE_URL = "http://whitney.mock"
EMBEDDED_API_KEY = "whitney-mock-key"
EMBEDDED_SECOND_API_KEY = "whitney-mock-key-2"

# Embedded mock settings: ORD-2's seq_gap clause waits order_wait_ms, so keep it short; quotas
# small enough that the suite fills them (VER-1, LIFE-1) within its probe budget.
EMBEDDED_DEFAULTS: dict[str, Any] = {
    "seed": 0, "order_wait_ms": 1000, "cancel_delay_ms": 50,
    "limits": {"max_versions_per_run": 12, "max_sessions": 12},
}


@dataclass
class Target:
    """An endpoint under test: base URL (without ``/v1/training``), keys, and a client."""

    base_url: str
    api_key: str
    second_api_key: str | None
    timeout: float
    embedded: bool
    transport: httpx.BaseTransport | None = None
    _clients: list[httpx.Client] = field(default_factory=list, repr=False)

    @property
    def description(self) -> str:
        return "embedded in-process mock" if self.embedded else self.base_url

    def client(self) -> httpx.Client:
        """A new client for this target (closed by :meth:`close`)."""
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=16)
        transport = _Shared(self.transport) if self.transport is not None else None
        client = httpx.Client(base_url=self.base_url.rstrip("/") + API_PREFIX,
                              transport=transport, timeout=self.timeout, limits=limits)
        self._clients.append(client)
        return client

    def secrets(self) -> list[str]:
        return [key for key in (self.api_key, self.second_api_key) if key]

    def close(self) -> None:
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self.transport is not None:
            self.transport.close()


class _Shared(httpx.BaseTransport):
    """The target's transport as seen by one client: closing the client leaves it open, so
    several runs can share one embedded mock (the target closes it)."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner = inner

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self.inner.handle_request(request)

    def close(self) -> None:
        pass


def server_root(url: str) -> str:
    """The endpoint root of ``--base-url``: the root itself or the root plus ``/v1/training``
    (what ``python -m mock_server`` prints), trailing slashes ignored."""
    root = url.strip().rstrip("/")
    if root.endswith(API_PREFIX):
        root = root[: -len(API_PREFIX)].rstrip("/")
    return root


def _embedded_transport(mock_options: dict[str, Any] | None) -> httpx.BaseTransport:
    # The one import of mock_server in the package (see the module docstring).
    from mock_server import InProcessTransport, create_app

    options = {**EMBEDDED_DEFAULTS, **(mock_options or {})}
    app = create_app(api_keys=(EMBEDDED_API_KEY, EMBEDDED_SECOND_API_KEY), **options)
    return InProcessTransport(app)


def open_target(
    base_url: str | None = None,
    api_key: str | None = None,
    second_api_key: str | None = None,
    *,
    timeout: float = 30.0,
    mock_options: dict[str, Any] | None = None,
    use_env: bool = True,
) -> Target:
    """Resolve the target from arguments, then ``WHITNEY_BASE_URL`` / ``WHITNEY_API_KEY`` /
    ``WHITNEY_SECOND_API_KEY``; with no URL at all, start the embedded mock (both keys known).

    ``mock_options`` are passed to ``mock_server.create_app`` for the embedded target only
    (tests use them to switch on contract violations).
    """
    if use_env:
        base_url = base_url or os.environ.get("WHITNEY_BASE_URL") or None
        api_key = api_key or os.environ.get("WHITNEY_API_KEY") or None
        second_api_key = second_api_key or os.environ.get("WHITNEY_SECOND_API_KEY") or None
    if base_url:
        if mock_options:
            raise ValueError("mock_options apply to the embedded mock only, not to a base URL")
        if not api_key:
            raise ValueError("an API key is required with a base URL "
                             "(--api-key or WHITNEY_API_KEY)")
        return Target(base_url=server_root(base_url), api_key=api_key,
                  second_api_key=second_api_key,
                      timeout=timeout, embedded=False)
    return Target(base_url=EMBEDDED_BASE_URL, api_key=EMBEDDED_API_KEY,
                  second_api_key=EMBEDDED_SECOND_API_KEY, timeout=timeout, embedded=True,
                  transport=_embedded_transport(mock_options))


# A key is masked where it stands as a whole value, never inside a longer word ("e" in
# "limit_exceeded"): it must not touch a letter, digit, "_" or "-" on either side.
_WORD_CHARS = r"A-Za-z0-9_\-"


def mask_secrets(text: str, secrets: list[str]) -> str:
    """Replace every API key that appears in ``text`` as a whole token by ``***`` (keys never
    reach a report or log; other words are left as they are)."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            pattern = rf"(?<![{_WORD_CHARS}]){re.escape(secret)}(?![{_WORD_CHARS}])"
            text = re.sub(pattern, "***", text)
    return text

"""The embedded default target: the mock server, in-process, no socket.

This is the one module of ``grpo`` that imports ``mock_server``, and it uses only its public
``create_app`` and ``InProcessTransport``. Everything else in ``grpo`` speaks HTTP and works
unchanged against a real Whitney endpoint.
"""

from __future__ import annotations

import httpx

__all__ = ["EMBEDDED_API_KEY", "EMBEDDED_BASE_URL", "embedded_http_client"]

EMBEDDED_API_KEY = "whitney-mock-key"
EMBEDDED_BASE_URL = "http://whitney.mock"


def embedded_http_client(
    *, api_key: str | None = None, seed: int = 0, order_wait_ms: int = 2000
) -> httpx.Client:
    """An ``httpx.Client`` bound to a fresh in-process mock (its own state, its own key)."""
    from mock_server import InProcessTransport, create_app

    key = api_key or EMBEDDED_API_KEY
    app = create_app(
        api_keys=(key,),
        seed=seed,
        order_wait_ms=order_wait_ms,
        cancel_delay_ms=50,
        control_plane=False,
    )
    return httpx.Client(
        transport=InProcessTransport(app),
        base_url=EMBEDDED_BASE_URL,
        headers={"Authorization": f"Bearer {key}"},
    )

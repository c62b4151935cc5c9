"""The embedded default target: the mock server, in-process, no socket.

This is the one module of ``grpo`` that imports ``mock_server``, and it uses only its public
``create_app`` and ``InProcessTransport`` (and, for declared base models, the declaration
readers of ``mock_server.engine.specs``, as ``python -m mock_server`` does). Everything else in
``grpo`` speaks HTTP and works unchanged against a real Whitney endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

__all__ = ["EMBEDDED_API_KEY", "EMBEDDED_BASE_URL", "embedded_http_client"]

EMBEDDED_API_KEY = "whitney-mock-key"
EMBEDDED_BASE_URL = "http://whitney.mock"


def embedded_http_client(
    *,
    api_key: str | None = None,
    seed: int = 0,
    order_wait_ms: int = 2000,
    base_models: Sequence[str] = (),
    base_models_from: Sequence[str] = (),
) -> httpx.Client:
    """An ``httpx.Client`` bound to a fresh in-process mock (its own state, its own key).

    The mock serves ``base_models`` (one-line declarations
    ``ID:vocab_size=N,eos=N[,bos=N][,max_context=N][,max_lora_rank=N]``) and then
    ``base_models_from`` (``[ID=]DIR``: local Hugging Face model folders), exactly as
    ``python -m mock_server --base-model ... --base-model-from ...``; neither = the built-in
    byte model. A bad declaration is a ``ValueError`` with one line naming it.

    The mock computes in this process, so this also applies the server's process settings
    to it: glibc ``malloc`` thresholds (``mock_server.engine.allocator.tune_malloc``: no
    per-call page faults) and one BLAS thread (``mock_server.engine.model.pin_blas_threads``).
    """
    from mock_server import InProcessTransport, create_app
    from mock_server.engine.allocator import tune_malloc
    from mock_server.engine.model import pin_blas_threads
    from mock_server.engine.specs import ModelSpec, base_model_from_folder

    declared: list[str | ModelSpec] = list(base_models)
    for folder in base_models_from:
        try:
            declared.append(base_model_from_folder(folder))
        except ValueError as exc:
            raise ValueError(f"--mock-base-model-from {folder}: {exc}") from None
    key = api_key or EMBEDDED_API_KEY
    tune_malloc()
    pin_blas_threads()
    app = create_app(
        api_keys=(key,),
        seed=seed,
        order_wait_ms=order_wait_ms,
        cancel_delay_ms=50,
        control_plane=False,
        base_models=declared,
    )
    return httpx.Client(
        transport=InProcessTransport(app),
        base_url=EMBEDDED_BASE_URL,
        headers={"Authorization": f"Bearer {key}"},
    )

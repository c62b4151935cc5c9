"""The checks of the suite, one module per rule family of the contract.

Importing this package imports every family module; each registers its checks into the leaf
:mod:`conformance.registry` with the ``@check`` decorator. Where to add a check: the module of
its rule family (``ORD-*`` in ``ordering.py`` ...), decorated with ``@check("ORD-6", "name",
title=...)``; nothing else needs to change.

    transport    TRANSPORT-1          security     SEC-1, SEC-2
    errors       ERR-1..4             discovery    DISC-1, DISC-2
    lifecycle    LIFE-1..8            ordering     ORD-1..5
    versions     VER-1..4, SAMPLE-1   losses       LOSS-1..6, GRAD-1
    optimizer    OPT-1..4             checkpoints  CKPT-1, EXPORT-1
    schema       SCHEMA-1, SCHEMA-2 (the suite's own: every response against openapi.yaml)

Contract 1.1's optional features, one module each (``unsupported`` unless declared):

    idempotency  LIFE-9 (idempotent_create)    listing              LIFE-10 (session_listing)
    seq_state    ORD-6 (seq_error_details)     exports_after_close  EXPORT-2
"""

from __future__ import annotations

from ..registry import Check, registered
from . import (  # noqa: F401 - imported for their registrations
    checkpoints,
    discovery,
    errors,
    exports_after_close,
    idempotency,
    lifecycle,
    listing,
    losses,
    optimizer,
    ordering,
    schema,
    security,
    seq_state,
    transport,
    versions,
)

__all__ = ["all_checks"]


def all_checks() -> list[Check]:
    """Every check of the suite, in report order (family, rule number, registration)."""
    return registered()

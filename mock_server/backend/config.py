"""The mock's configuration: the constants every layer shares, and the limits and feature
flags it publishes in ``GET /capabilities`` (DISC-1) and enforces.

Imports only the standard library, so the pytest plugin and the CLI can read it for free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

__all__ = ["API_PREFIX", "CONTRACT_VERSION", "DEFAULT_API_KEY", "Features", "Limits"]

#: Where the contract's routes live (``/v1/training/capabilities`` ...).
API_PREFIX = "/v1/training"
#: The key a mock accepts when none is configured (CLI, fixtures, ``create_app``).
DEFAULT_API_KEY = "whitney-mock-key"
#: ``contract_version`` of the capabilities document (1.1: the optional features below).
CONTRACT_VERSION = "1.1"


@dataclass(frozen=True)
class Limits:
    """Per-request limits (422 ``limit_exceeded``) and quotas (409 ``quota_exceeded``).

    Defaults suit tests: generous enough for the benchmarks (64 datums x 1024 tokens), small
    enough that a runaway client hits a clear error instead of exhausting memory.
    """

    max_body_bytes: int = 32 * 1024 * 1024
    max_datums_per_request: int = 256
    max_tokens_per_request: int = 131_072
    max_num_samples: int = 64
    max_sample_tokens: int = 1024
    order_wait_ms: int = 2000
    max_sessions: int = 64
    max_runs_per_session: int = 16
    max_versions_per_run: int = 2048
    min_ttl_seconds: int = 1
    max_ttl_seconds: int = 86_400

    def with_overrides(self, overrides: dict[str, Any] | None) -> Limits:
        """A copy with ``overrides`` applied; ``ValueError`` names any unknown limit."""
        if not overrides:
            return self
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown limit(s): {sorted(unknown)}; known: {sorted(known)}")
        return replace(self, **overrides)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Features:
    """The ``features`` object of the capabilities document.

    Contract 1.1 adds four optional features (absent means false); the mock declares and
    implements all of them, and behaves as a 1.0 server for any one switched off:
    ``idempotent_create`` (LIFE-9, ``Idempotency-Key`` on creations), ``session_listing``
    (LIFE-10, ``GET /sessions`` and the session view's ``runs``), ``seq_error_details`` (ORD-6,
    ``details.next_seq`` / ``details.seq_consumed`` on primitive errors) and
    ``exports_after_close`` (EXPORT-2, exports downloadable while the session is retained).
    """

    deterministic_sampling: bool = True
    session_ttl: bool = True
    logprob_tolerance: float = 1e-6
    idempotent_create: bool = True
    session_listing: bool = True
    seq_error_details: bool = True
    exports_after_close: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

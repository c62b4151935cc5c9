"""The knobs of a run (CLI flags and pytest options). Standard library only: the pytest plugin
reads the defaults below at load time, before anything heavy is imported."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Options"]


@dataclass
class Options:
    """Budget knobs of a run."""

    max_wait_seconds: float = 5.0  # longest deliberate wait (LIFE-4 TTL expiry)
    quota_probe: int = 16  # largest quota the suite fills to see 409 quota_exceeded
    fuzz_examples: int = 3  # schemathesis examples per operation (0: no fuzz pass)
    body_probe_bytes: int = 64 * 1024 * 1024  # largest body sent to provoke 413

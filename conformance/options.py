"""The knobs of a run (CLI flags and pytest options). Standard library only: the pytest plugin
reads the defaults below at load time, before anything heavy is imported."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Options", "PROFILES"]

# ``contract``: only what the contract requires (EXT-1). ``strict``: also the mock's exact shapes
# and choices (``strict.yaml`` and the checks' strict-only clauses), reported apart.
PROFILES = ("contract", "strict")


@dataclass
class Options:
    """What a run checks, and its budget."""

    profile: str = "contract"
    max_wait_seconds: float = 5.0  # longest deliberate wait (LIFE-4 TTL expiry)
    max_duration_seconds: float | None = None  # bound on the whole run (None: unbounded)
    quota_probe: int = 16  # largest quota the suite fills to see 409 quota_exceeded
    fuzz_examples: int = 3  # schemathesis examples per operation (0: no fuzz pass)
    body_probe_bytes: int = 64 * 1024 * 1024  # largest body sent to provoke 413

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown profile {self.profile!r} (one of {', '.join(PROFILES)})")

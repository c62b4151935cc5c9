"""Domain errors of the Whitney contract.

Each error carries the HTTP status and the ``error.type`` of the ERR-1 envelope, but no HTTP
machinery: the state machine raises them (and records the envelope of a primitive that fails at
its turn), and :mod:`mock_server.http.envelope` puts them on the wire.
"""

from __future__ import annotations

from typing import Any


def error_envelope(type: str, message: str, details: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The ERR-1 envelope ``{"error": {"type", "message", "details"}}``: the one place it is
    built, for recorded failures, error responses, the 500 fallback and injected faults."""
    return {"error": {"type": type, "message": message, "details": details or {}}}


class WhitneyError(Exception):
    """An error the contract names: ``status`` plus envelope ``{"type", "message", "details"}``."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, type: str | None = None,
                 details: dict[str, Any] | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if type is not None:
            self.type = type
        if status is not None:
            self.status = status
        self.details = details or {}

    def envelope(self) -> dict[str, Any]:
        """This error as the ERR-1 envelope."""
        return error_envelope(self.type, self.message, self.details)


class MalformedJSON(WhitneyError):
    status, type = 400, "malformed_json"


class Unauthorized(WhitneyError):
    status, type = 401, "unauthorized"


class NotFound(WhitneyError):
    """Unknown or foreign resource (SEC-2: never 403)."""

    status, type = 404, "not_found"


class Conflict(WhitneyError):
    """State or ordering conflict; ``type`` names which (seq_gap, no_gradients ...)."""

    status = 409


class BodyTooLarge(WhitneyError):
    status, type = 413, "body_too_large"


class ValidationFailed(WhitneyError):
    """422: wrong types, out-of-range or non-finite values, per-request limits, unknown fields.

    A ``details["loc"]`` given as a dotted path (``"data[0].loss_inputs.mask"``) becomes the
    contract's ``details.errors = [{"loc": ["data", 0, "loss_inputs", "mask"], "msg": ...}]``.
    """

    status, type = 422, "validation_error"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        loc = self.details.pop("loc", None)
        if loc is not None and "errors" not in self.details:
            self.details["errors"] = [{"loc": split_loc(loc), "msg": message}]


def split_loc(path: str) -> list[str | int]:
    """``"data[0].model_input.token_ids[3]"`` -> ``["data", 0, "model_input", "token_ids", 3]``."""
    parts: list[str | int] = []
    for piece in path.replace("[", ".[").split("."):
        if piece.startswith("[") and piece.endswith("]") and piece[1:-1].isdigit():
            parts.append(int(piece[1:-1]))
        elif piece:
            parts.append(piece)
    return parts

"""Typed errors raised by the Whitney client and the GRPO loop.

Every HTTP error the server answers with the contract envelope (ERR-1,
``{"error": {"type", "message", "details"}}``) becomes an :class:`APIError` subclass chosen by
status code; the envelope's ``type`` (``seq_gap``, ``no_gradients`` ...) is kept in
``error.type`` so callers branch on it, never on message text.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "WhitneyClientError",
    "WhitneyError",
    "APIError",
    "BadRequestError",
    "AuthenticationError",
    "NotFoundError",
    "ConflictError",
    "PayloadTooLargeError",
    "ValidationError",
    "RateLimitError",
    "ServerError",
    "ProtocolError",
    "ConnectionFailed",
    "IntegrityError",
    "CapabilityError",
    "RewardError",
    "TrainingError",
]


class WhitneyClientError(Exception):
    """Base class of every error this package raises on purpose."""


#: The former name of :class:`WhitneyClientError`, kept because it was public. Not to be
#: confused with ``mock_server``'s domain error of that name (the server side of ERR-1).
WhitneyError = WhitneyClientError


class APIError(WhitneyClientError):
    """The server answered 4xx/5xx with a contract error envelope (ERR-1)."""

    def __init__(
        self,
        status: int,
        type: str,
        message: str,
        details: dict[str, Any] | None = None,
        *,
        method: str = "",
        path: str = "",
        request_id: str | None = None,
        url: str | None = None,
    ) -> None:
        self.status = status
        self.type = type
        self.message = message
        self.details = details or {}
        self.method = method
        self.path = path
        self.url = url or path  # the full URL requested (the client sets it)
        self.request_id = request_id
        super().__init__(f"{method} {self.url} -> {status} {type}: {message}".strip())


class BadRequestError(APIError):
    """400, e.g. ``malformed_json``."""


class AuthenticationError(APIError):
    """401: missing or unknown API key (SEC-1)."""


class NotFoundError(APIError):
    """404: unknown or foreign resource (SEC-2), ``version_not_found`` ..."""


class ConflictError(APIError):
    """409: state or ordering conflict (``seq_gap``, ``run_not_active``, ``no_gradients`` ...)."""


class PayloadTooLargeError(APIError):
    """413 ``body_too_large``."""


class ValidationError(APIError):
    """422: wrong types, out-of-range values, ``unknown_field``, ``limit_exceeded`` ..."""


class RateLimitError(APIError):
    """429 still answered after the client's retries were used up."""


class ServerError(APIError):
    """5xx still answered after the client's retries were used up."""


_BY_STATUS: dict[int, type[APIError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: ValidationError,
    429: RateLimitError,
}


def api_error_class(status: int) -> type[APIError]:
    """The :class:`APIError` subclass for an HTTP status."""
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, APIError)


class ProtocolError(WhitneyClientError):
    """The server broke the contract (an error without the envelope, a non-JSON 2xx body)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


class ConnectionFailed(WhitneyClientError):
    """The connection kept failing after the client's retries were used up."""


class IntegrityError(WhitneyClientError):
    """A downloaded export file does not match the size or sha256 the server announced."""


class CapabilityError(WhitneyClientError):
    """The server cannot run this algorithm as asked (DISC-2); raised before any session exists."""


class RewardError(WhitneyClientError):
    """The caller's reward function raised (or returned something that is not a finite
    number). The loop reports it as the caller's, not as a failure of its own: ``reward`` names
    the function, ``original`` is the exception it raised (also ``__cause__``; ``None`` for a
    bad return value) and :meth:`user_traceback` formats it from the caller's own frames."""

    def __init__(self, message: str, *, reward: str,
                 original: BaseException | None = None) -> None:
        self.reward = reward
        self.original = original
        super().__init__(message)

    def user_traceback(self) -> str:
        """The original exception's traceback, without the frames of this package above the
        reward function (empty when the reward returned a bad value)."""
        import traceback
        from pathlib import Path

        if self.original is None:
            return ""
        package = str(Path(__file__).resolve().parent)
        tb = self.original.__traceback__
        while tb is not None and tb.tb_next is not None and \
                str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(package):
            tb = tb.tb_next
        return "".join(traceback.format_exception(type(self.original), self.original, tb))


class TrainingError(WhitneyClientError):
    """The training loop failed; the run was cancelled and the session closed (seed: Cleanup).

    ``cycle`` is the cycle that failed (``None`` before the first cycle or after the last),
    ``phase`` the step of the loop (``"sample"``, ``"reward"``, ``"build_loss"``,
    ``"optim_step"`` ...), ``cleanup`` what the cleanup did (``run_state``, ``session_state``,
    ``errors``); the original exception is ``__cause__``. ``checkpoint``: when the run stopped
    for a reason on the caller's side (a uniform group, the reward raising) after at least one
    optimizer step, the ``save_state`` answer (``checkpoint_id``, ``step``) saved before the
    cancel; else ``None``.
    """

    def __init__(
        self,
        message: str,
        *,
        cycle: int | None,
        phase: str,
        run_id: str | None,
        session_id: str | None,
        cleanup: dict[str, Any],
        checkpoint: dict[str, Any] | None = None,
    ) -> None:
        self.cycle = cycle
        self.phase = phase
        self.run_id = run_id
        self.session_id = session_id
        self.cleanup = cleanup
        self.checkpoint = checkpoint
        super().__init__(message)

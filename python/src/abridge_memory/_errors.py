"""Typed errors: one class per error `code` the server sends, each keeping its `hint`."""

from __future__ import annotations

from typing import Any, Optional


class AbridgeError(Exception):
    """A request abridge refused or could not serve.

    ``status`` is the HTTP status (0 when no response came), ``code`` the server's stable
    error code, ``hint`` how to fix it when the server knows.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str = "",
        hint: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class InvalidInput(AbridgeError):
    """400: the request is malformed; the hint says what to change."""


class Unauthenticated(AbridgeError):
    """401: no token, or one the server does not know."""


class Forbidden(AbridgeError):
    """403: the token may not do this (a read-only token writing, another tenant's admin)."""


class NotFound(AbridgeError):
    """404: no such session, memory, job or summary for this token's tenant."""


class Conflict(AbridgeError):
    """409: the request conflicts with what is stored."""


class TooLarge(AbridgeError):
    """413: the body is over the server's limit."""


class Unprocessable(AbridgeError):
    """422: well-formed but unusable (an unknown transcript format, say)."""


class RateLimited(AbridgeError):
    """429: the tenant sent too much too fast; ``retry_after`` seconds until it may again."""

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class QuotaExhausted(AbridgeError):
    """429: the tenant's monthly model budget is spent until ``resets_at`` (ms since the epoch)."""

    def __init__(
        self,
        message: str,
        *,
        spent: float = 0.0,
        limit: float = 0.0,
        resets_at: int = 0,
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.spent = spent
        self.limit = limit
        self.resets_at = resets_at


class ModelFailed(AbridgeError):
    """502: the model server failed."""


class Unavailable(AbridgeError):
    """503: the service is shutting down, overloaded or a dependency is down."""


class VersionMismatch(AbridgeError):
    """The server's version (``server_version``) is not one this client speaks to."""

    def __init__(self, message: str, *, server_version: Optional[str] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.server_version = server_version


class ServerUnreachable(AbridgeError):
    """No response: nothing listens at the address, or the connection broke."""


_BY_CODE: dict[str, type[AbridgeError]] = {
    "invalid_input": InvalidInput,
    "unauthenticated": Unauthenticated,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "conflict": Conflict,
    "too_large": TooLarge,
    "unprocessable": Unprocessable,
    "rate_limited": RateLimited,
    "quota_exhausted": QuotaExhausted,
    "model_failed": ModelFailed,
    "unavailable": Unavailable,
}

_BY_STATUS: dict[int, type[AbridgeError]] = {
    400: InvalidInput,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    422: Unprocessable,
    429: RateLimited,
    502: ModelFailed,
    503: Unavailable,
}


def error_from_response(status: int, body: Any, retry_after: Optional[float]) -> AbridgeError:
    """The typed error for a response with ``status`` and JSON ``body`` (any shape)."""
    detail = body.get("error") if isinstance(body, dict) else None
    if not isinstance(detail, dict):
        text = body if isinstance(body, str) and body else f"HTTP {status}"
        cls = _BY_STATUS.get(status, AbridgeError)
        if cls is RateLimited:
            return RateLimited(str(text), status=status, retry_after=retry_after)
        return cls(str(text), status=status)
    code = str(detail.get("code", ""))
    message = str(detail.get("message", f"HTTP {status}"))
    hint = detail.get("hint")
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, AbridgeError)
    kw: dict[str, Any] = {"status": status, "code": code, "hint": hint}
    if cls is QuotaExhausted:
        q = detail.get("quota") or {}
        return QuotaExhausted(
            message,
            spent=float(q.get("spent", 0) or 0),
            limit=float(q.get("limit", 0) or 0),
            resets_at=int(q.get("resets_at_ms", 0) or 0),
            **kw,
        )
    if cls is RateLimited:
        return RateLimited(message, retry_after=retry_after, **kw)
    return cls(message, **kw)

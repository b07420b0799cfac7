"""Errors a caller can act on. Service functions raise these; REST and gRPC map them to codes
(`http_status`, and `grpc_status`: the name of a `grpc.StatusCode`)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# what a request meets when the database is gone or every connection is taken: 503, retry
DATABASE_ERRORS = (OperationalError, PoolTimeout)


class ServiceError(Exception):
    http_status = 400
    grpc_status = "INVALID_ARGUMENT"
    code = "bad_request"
    retry_after_s: int | None = None  # when set: Retry-After (REST), retry-after metadata (gRPC)

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            err["details"] = self.details
        return {"error": err}


class InvalidRequest(ServiceError):
    http_status = 422
    grpc_status = "INVALID_ARGUMENT"
    code = "invalid_request"

    @classmethod
    def from_validation(cls, exc: ValidationError) -> InvalidRequest:
        """One message naming each bad field, as REST words a rejected body."""
        details = [{"loc": [str(p) for p in e["loc"]], "message": e["msg"], "type": e["type"]} for e in exc.errors()]
        message = "; ".join(f"{'.'.join(d['loc']) or 'request'}: {d['message']}" for d in details)
        return cls(message, details)


class Unauthenticated(ServiceError):
    http_status = 401
    grpc_status = "UNAUTHENTICATED"
    code = "unauthenticated"


class PermissionDenied(ServiceError):
    http_status = 403
    grpc_status = "PERMISSION_DENIED"
    code = "permission_denied"


class NotFound(ServiceError):
    http_status = 404
    grpc_status = "NOT_FOUND"
    code = "not_found"


class Conflict(ServiceError):
    # the object's state forbids the request (cancel a task that ended, activate a changed adapter)
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"
    code = "conflict"


class IdempotencyKeyReused(ServiceError):
    # draft-ietf-httpapi-idempotency-key-header: same key, different payload -> 422
    http_status = 422
    grpc_status = "ALREADY_EXISTS"
    code = "idempotency_key_reused"


class TooLarge(ServiceError):
    http_status = 413
    grpc_status = "RESOURCE_EXHAUSTED"
    code = "payload_too_large"


class RateLimited(ServiceError):
    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"
    code = "rate_limited"

    def __init__(self, message: str, retry_after_s: int | None = None, details: Any = None) -> None:
        super().__init__(message, details)
        self.retry_after_s = retry_after_s  # sent as Retry-After (REST) or retry-after metadata (gRPC)


class QuotaExceeded(RateLimited):
    # what a tenant holds at once (tasks queued or running, registered apps) is at its quota
    code = "quota_exceeded"


class Unavailable(ServiceError):
    http_status = 503
    grpc_status = "UNAVAILABLE"
    code = "unavailable"

    def __init__(self, message: str, details: Any = None, retry_after_s: int | None = None) -> None:
        super().__init__(message, details)
        self.retry_after_s = retry_after_s  # sent as Retry-After (REST) or retry-after metadata (gRPC)


class DeadlineExceeded(ServiceError):
    http_status = 504
    grpc_status = "DEADLINE_EXCEEDED"
    code = "deadline_exceeded"


def database_unavailable(exc: BaseException) -> Unavailable:
    """A database connection that broke mid-request (sqlalchemy's OperationalError), or none free in the
    process's pool in time (its TimeoutError): the request's transaction was rolled back or never began, so
    nothing of it was written, and the retry gets a fresh connection."""
    if isinstance(exc, PoolTimeout):
        return Unavailable(
            "no database connection was free in time (every one of this process's pool is in use); nothing was "
            "written, retry",
            retry_after_s=1,
        )
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip()
    reason = text.splitlines()[0] if text else type(orig).__name__
    return Unavailable(f"the database is unavailable ({reason}); nothing was written, retry", retry_after_s=1)

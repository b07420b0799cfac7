"""Errors a caller can act on. Service functions raise these; REST and gRPC map them to codes."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    http_status = 400
    code = "bad_request"

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
    code = "invalid_request"


class Unauthenticated(ServiceError):
    http_status = 401
    code = "unauthenticated"


class PermissionDenied(ServiceError):
    http_status = 403
    code = "permission_denied"


class NotFound(ServiceError):
    http_status = 404
    code = "not_found"


class Conflict(ServiceError):
    http_status = 409
    code = "conflict"


class IdempotencyKeyReused(ServiceError):
    # draft-ietf-httpapi-idempotency-key-header: same key, different payload -> 422
    http_status = 422
    code = "idempotency_key_reused"


class TooLarge(ServiceError):
    http_status = 413
    code = "payload_too_large"


class Unavailable(ServiceError):
    http_status = 503
    code = "unavailable"

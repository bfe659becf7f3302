"""Typed errors. The service raises these; the HTTP and CLI layers translate them."""

from __future__ import annotations


class HongbaoError(Exception):
    """Base class. `code` is the machine-readable name used at the edges."""

    code = "error"


class InvalidRequest(HongbaoError, ValueError):
    """A request that can never succeed as written (bad amount, count, id...)."""

    code = "invalid_request"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SplitError(InvalidRequest):
    """A split that cannot satisfy its bounds (too little money, too many shares...)."""


class NotFound(HongbaoError):
    code = "not_found"


class PacketNotFound(NotFound):
    code = "packet_not_found"


class PacketExhausted(HongbaoError):
    code = "packet_exhausted"


class PacketExpired(HongbaoError):
    code = "packet_expired"


class InsufficientBalance(HongbaoError):
    code = "insufficient_balance"


class IdempotencyConflict(HongbaoError):
    """The same idempotency key was used before with a different request."""

    code = "idempotency_conflict"


class ConfigurationError(HongbaoError):
    code = "configuration_error"


class StorageError(HongbaoError):
    """Redis or the database failed or is unreachable."""

    code = "storage_unavailable"

"""Typed errors. The service raises these; the HTTP and CLI layers translate them."""

from __future__ import annotations

import math


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


class AuthError(HongbaoError):
    """A request without a valid credential; `reason` says what was wrong."""

    code = "unauthorized"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Forbidden(HongbaoError):
    """A caller who is who they say, but may not do this."""

    code = "forbidden"


class RetryLater(HongbaoError):
    """A refusal that ends by itself: the same request may succeed after `retry_after` s."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, at least 1 (Retry-After takes no fractions)."""
        return str(max(1, math.ceil(self.retry_after)))


class RateLimited(RetryLater):
    """Too many requests from one user or client address; retry after `retry_after` s."""

    code = "rate_limited"


class SendLimitReached(RateLimited):
    """The sender sent as many packets, or as much money, as a UTC day allows."""

    code = "send_limit_reached"


class TooManyAttempts(RateLimited):
    """Too many wrong passphrases for this packet: the user is locked out for a while."""

    code = "too_many_attempts"


class NotStarted(RetryLater):
    """The packet opens for grabs at its start time, `retry_after` s from now."""

    code = "not_started"


class NotInAudience(Forbidden):
    """The packet is for a list of users (its audience) that does not name this one."""

    code = "not_in_audience"


class WrongPassphrase(Forbidden):
    """The packet asks for a passphrase, and the grab sent none or another."""

    code = "wrong_passphrase"


class NotFound(HongbaoError):
    code = "not_found"


class PacketNotFound(NotFound):
    code = "packet_not_found"


class WebhookNotFound(NotFound):
    code = "webhook_not_found"


class PacketExhausted(HongbaoError):
    code = "packet_exhausted"


class PacketExpired(HongbaoError):
    code = "packet_expired"


class PacketCancelled(HongbaoError):
    """The sender (or an admin) cancelled the packet; what was left went back."""

    code = "packet_cancelled"


class WithdrawalNotFound(NotFound):
    code = "withdrawal_not_found"


class WithdrawalClosed(HongbaoError):
    """The withdrawal's outcome was reported already, and it was the other one."""

    code = "withdrawal_closed"


class WithdrawalAlreadyCompleted(WithdrawalClosed):
    """A failure reported for a withdrawal that completed: its money left the wallet."""

    code = "withdrawal_already_completed"


class WithdrawalAlreadyFailed(WithdrawalClosed):
    """A completion reported for a withdrawal that failed: its money went back."""

    code = "withdrawal_already_failed"


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

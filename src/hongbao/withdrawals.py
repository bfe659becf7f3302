"""Withdrawals: money out of a wallet, paid by the host's payment system.

`request` debits the wallet at once; the payment system pays out and reports the
outcome, `complete` or `fail`; a failed withdrawal's money goes back to the wallet,
once. Every step is one ledger transaction that also records its event
(`withdrawal.requested`, `.completed`, `.failed`) for the webhooks.

Callers check who may do what (the HTTP layer does); these methods trust their caller,
as `Hongbao.deposit` does.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hongbao.domain.ids import require_user_id
from hongbao.domain.withdrawals import (
    StatusPage,
    Withdrawal,
    WithdrawalPosition,
    WithdrawalsPage,
    WithdrawalStatus,
    new_withdrawal_id,
    require_note,
    require_withdrawal_amount,
    valid_withdrawal_id,
)
from hongbao.errors import InvalidRequest, WithdrawalNotFound
from hongbao.ledger import SqlLedger
from hongbao.ledger import withdrawals as ledger_withdrawals
from hongbao.ledger.schema import IDEMPOTENCY_KEY_LENGTH

#: withdrawals per page of a user's list: by default, and at most
DEFAULT_PAGE = 50
MAX_PAGE = 500
#: withdrawals per page of the list of one status across all users, at most
MAX_STATUS_PAGE = 200
#: the largest age `in_status` takes: ten years, seconds (older is before any ledger)
MAX_OLDER_THAN = 315_360_000


class Withdrawals:
    """Withdrawals in the ledger; `Hongbao.withdrawals` is one."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger

    async def request(
        self, user_id: str, amount: int, idempotency_key: str, actor: str | None = None
    ) -> tuple[Withdrawal, bool]:
        """Debit `amount` fen from the wallet for a payout (InsufficientBalance if it holds
        less). The same `idempotency_key` again returns the same withdrawal, debited once
        (created=False), or IdempotencyConflict for another amount. `actor` (who asks for
        the user: a service or an admin) is recorded."""
        require_user_id(user_id)
        require_withdrawal_amount(amount)
        if actor is not None:
            require_user_id(actor, "actor")
        if not isinstance(idempotency_key, str) or not (
            1 <= len(idempotency_key) <= IDEMPOTENCY_KEY_LENGTH
        ):
            raise InvalidRequest(
                f"Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_LENGTH} characters",
                "Idempotency-Key",
            )
        withdrawal_id = new_withdrawal_id()
        return await self.ledger.transaction(
            lambda conn: ledger_withdrawals.request(
                conn, withdrawal_id, user_id, amount, idempotency_key, actor
            )
        )

    async def complete(
        self, withdrawal_id: str, note: str | None = None, actor: str | None = None
    ) -> tuple[Withdrawal, bool]:
        """The money was paid out. Completing again changes nothing (changed=False);
        completing a failed withdrawal is WithdrawalAlreadyFailed."""
        return await self._settle(withdrawal_id, WithdrawalStatus.COMPLETED, note, actor)

    async def fail(
        self, withdrawal_id: str, note: str | None = None, actor: str | None = None
    ) -> tuple[Withdrawal, bool]:
        """The payout failed: the money goes back to the wallet, once. Failing again
        changes nothing (changed=False); failing a completed withdrawal is
        WithdrawalAlreadyCompleted."""
        return await self._settle(withdrawal_id, WithdrawalStatus.FAILED, note, actor)

    async def get(self, withdrawal_id: str) -> Withdrawal:
        """The withdrawal; WithdrawalNotFound for an unknown or malformed id."""
        _require_id(withdrawal_id)
        found = await self.ledger.read(lambda conn: ledger_withdrawals.get(conn, withdrawal_id))
        if found is None:
            raise WithdrawalNotFound(f"no withdrawal {withdrawal_id}")
        return found

    async def of_user(
        self,
        user_id: str,
        *,
        status: WithdrawalStatus | str | None = None,
        after: WithdrawalPosition | None = None,
        limit: int = DEFAULT_PAGE,
    ) -> WithdrawalsPage:
        """The user's withdrawals (of one `status`, or all), newest first, `limit` from
        after `after` (a page's `next_after`)."""
        require_user_id(user_id)
        chosen = None if status is None else _require_status(status)
        _require_limit(limit, MAX_PAGE)
        return await self.ledger.read(
            lambda conn: ledger_withdrawals.of_user(
                conn, user_id, status=chosen, after=after, limit=limit
            )
        )

    async def in_status(
        self,
        status: WithdrawalStatus | str = WithdrawalStatus.REQUESTED,
        *,
        older_than: int | None = None,
        after: WithdrawalPosition | None = None,
        limit: int = DEFAULT_PAGE,
    ) -> StatusPage:
        """Every user's withdrawals in `status`, oldest first, only those requested more
        than `older_than` seconds ago if given, `limit` from after `after` (a page's
        `next_after`). With the default status: the payouts still in flight, whose
        outcome the payment system has not reported."""
        chosen = _require_status(status)
        if older_than is not None and (
            type(older_than) is not int or not 0 <= older_than <= MAX_OLDER_THAN
        ):
            raise InvalidRequest(
                f"older_than must be a whole number of seconds from 0 to {MAX_OLDER_THAN}",
                "older_than",
            )
        _require_limit(limit, MAX_STATUS_PAGE)
        before = None
        if older_than is not None:
            before = datetime.now(UTC) - timedelta(seconds=older_than)
        return await self.ledger.read(
            lambda conn: ledger_withdrawals.in_status(
                conn, chosen, requested_before=before, after=after, limit=limit
            )
        )

    async def oldest_requested(self) -> datetime | None:
        """When the oldest withdrawal still in flight (requested) was requested; None
        when there is none."""
        return await self.ledger.read(
            lambda conn: ledger_withdrawals.oldest(conn, WithdrawalStatus.REQUESTED)
        )

    async def totals(self) -> dict[WithdrawalStatus, tuple[int, int]]:
        """Per status, how many withdrawals have it and their fen (zeros included)."""
        found = await self.ledger.read(ledger_withdrawals.totals)
        return {s: found.get(s.value, (0, 0)) for s in WithdrawalStatus}

    async def _settle(
        self,
        withdrawal_id: str,
        outcome: WithdrawalStatus,
        note: str | None,
        actor: str | None,
    ) -> tuple[Withdrawal, bool]:
        _require_id(withdrawal_id)
        note = require_note(note)
        if actor is not None:
            require_user_id(actor, "actor")
        return await self.ledger.transaction(
            lambda conn: ledger_withdrawals.settle(conn, withdrawal_id, outcome, note, actor)
        )


def _require_status(status: WithdrawalStatus | str) -> WithdrawalStatus:
    """A withdrawal state, given as one or as its name; InvalidRequest naming the states."""
    try:
        return WithdrawalStatus(status)
    except ValueError:
        states = ", ".join(s.value for s in WithdrawalStatus)
        raise InvalidRequest(f"status must be one of {states}", "status") from None


def _require_limit(limit: object, most: int) -> None:
    if type(limit) is not int or not 1 <= limit <= most:
        raise InvalidRequest(f"limit must be a whole number from 1 to {most}", "limit")


def _require_id(withdrawal_id: object) -> None:
    if not valid_withdrawal_id(withdrawal_id):
        shown = withdrawal_id if isinstance(withdrawal_id, str) else repr(withdrawal_id)
        raise WithdrawalNotFound(f"no withdrawal {shown[:40]!r}")

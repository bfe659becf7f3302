"""Withdrawals: money leaving a wallet for the host's payment system.

A withdrawal is `requested` (the wallet is debited at once), then the payment system
reports it `completed` (the money left) or `failed` (the money goes back to the wallet,
once). Both outcomes are final.
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from hongbao.domain.text import MAX_GREETING, require_greeting
from hongbao.errors import InvalidRequest

#: the largest single withdrawal, fen (100 million yuan), as for a deposit
MAX_WITHDRAWAL = 10_000_000_000
#: what the payment system may say of an outcome, characters (as a greeting)
MAX_NOTE = MAX_GREETING
#: "wd_" then 26 characters of Crockford base32: 48 bits of milliseconds, 80 random bits
WITHDRAWAL_ID_PATTERN = re.compile(r"^wd_[0-9a-hjkmnp-tv-z]{26}$")
_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


class WithdrawalStatus(StrEnum):
    REQUESTED = "requested"
    COMPLETED = "completed"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Withdrawal:
    id: str
    user_id: str
    #: fen debited from the wallet, positive
    amount: int
    status: WithdrawalStatus
    created_at: datetime
    #: when the status last changed (the request's time while it is requested)
    updated_at: datetime
    #: the payment system's reference on completion, or why it failed
    note: str | None = None
    #: who asked for the user: a service acting for them, or an admin; None: the user
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class WithdrawalPosition:
    """A withdrawal's place in a list ordered by its time, then its id (a user's list
    newest first, the list of one status oldest first)."""

    at_us: int
    id: str


@dataclass(frozen=True, slots=True)
class WithdrawalsPage:
    user_id: str
    items: list[Withdrawal]
    #: where the next page starts; None on the last page
    next_after: WithdrawalPosition | None = None


@dataclass(frozen=True, slots=True)
class StatusPage:
    """One page of the withdrawals in one status across all users, oldest first: for
    an operator looking for payouts the payment system never reported."""

    status: WithdrawalStatus
    items: list[Withdrawal]
    #: where the next page starts; None on the last page
    next_after: WithdrawalPosition | None = None


def new_withdrawal_id(now_ms: int | None = None) -> str:
    """ "wd_" and 26 characters that sort by creation time."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms << 80) | secrets.randbits(80)
    return "wd_" + "".join(_ALPHABET[(value >> shift) & 31] for shift in range(125, -1, -5))


def valid_withdrawal_id(withdrawal_id: object) -> bool:
    return (
        isinstance(withdrawal_id, str)
        and WITHDRAWAL_ID_PATTERN.fullmatch(withdrawal_id) is not None
    )


def require_withdrawal_amount(value: object) -> int:
    """A withdrawal's amount: a whole number of fen from 1 to MAX_WITHDRAWAL."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest("amount must be an integer number of fen", "amount")
    if not 1 <= value <= MAX_WITHDRAWAL:
        raise InvalidRequest(f"amount must be 1 to {MAX_WITHDRAWAL} fen", "amount")
    return value


def require_note(note: object) -> str | None:
    """An outcome's note: None, or text as a greeting may hold (at most MAX_NOTE
    characters, no control or text-direction characters)."""
    return None if note is None else require_greeting(note, "note")

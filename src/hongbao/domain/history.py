"""Value types of the red-packet record (received, sent), a wallet's entries and the
daily statement. Everything here is read from the SQL ledger only."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from typing import NamedTuple


class Keyset(NamedTuple):
    """A row's place in newest-first order: (time, then id), for keyset pagination.

    `at_us` is the row's time in unix microseconds (the ledger's precision); `row_id` the
    claim's numeric id, or the packet's id, which breaks ties between rows of one time."""

    at_us: int
    row_id: int | str


@dataclass(frozen=True, slots=True)
class Received:
    """A share the user grabbed, as the ledger holds it."""

    packet_id: str
    sender_id: str
    greeting: str
    mode: str
    amount: int
    claimed_at: datetime
    #: the largest share of a finished lucky packet (ties: the earliest grab)
    best_luck: bool
    position: Keyset


@dataclass(frozen=True, slots=True)
class ReceivedTotals:
    count: int = 0
    amount: int = 0
    #: finished lucky packets in which this user got the best luck
    best_luck_count: int = 0


@dataclass(frozen=True, slots=True)
class ReceivedPage:
    user_id: str
    year: int
    items: list[Received]
    totals: ReceivedTotals
    #: the ledger's clock when the answer was read: what the ledger committed before it
    #: is in the answer (a grab the persister has not applied yet is not)
    as_of: datetime
    #: where the next page starts; None on the last page
    next_after: Keyset | None = None


@dataclass(frozen=True, slots=True)
class Sent:
    """A packet the user sent, with its counters as the ledger holds them."""

    packet_id: str
    greeting: str
    mode: str
    total_amount: int
    count: int
    claimed_count: int
    claimed_amount: int
    refunded_amount: int
    status: str
    created_at: datetime
    expires_at: datetime
    position: Keyset


@dataclass(frozen=True, slots=True)
class SentTotals:
    count: int = 0
    amount: int = 0
    refunded: int = 0


@dataclass(frozen=True, slots=True)
class SentPage:
    user_id: str
    year: int
    items: list[Sent]
    totals: SentTotals
    as_of: datetime
    next_after: Keyset | None = None


@dataclass(frozen=True, slots=True)
class Entry:
    """A ledger entry of a wallet and the wallet's balance right after it."""

    id: int
    reference: str
    kind: str
    #: signed: credits positive, debits negative
    amount: int
    packet_id: str | None
    created_at: datetime
    balance_after: int


@dataclass(frozen=True, slots=True)
class EntriesPage:
    user_id: str
    #: the wallet's balance in the same snapshot as the entries
    balance: int
    items: list[Entry]
    as_of: datetime
    #: the id below which the next page starts; None on the last page
    next_after: int | None = None


@dataclass(frozen=True, slots=True)
class StatementLine:
    reference: str
    user_id: str
    kind: str
    amount: int
    packet_id: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class KindTotal:
    kind: str
    count: int
    amount: int


@dataclass(frozen=True, slots=True)
class WalletMismatch:
    """A wallet whose balance at the start of the day plus its entries of the day is not
    its balance at the end of the day."""

    user_id: str
    start: int
    entries: int
    end: int


@dataclass(frozen=True, slots=True)
class Statement:
    """Every ledger entry of one UTC day, and whether the day adds up.

    `start` (the wallets' balances when the day began) is the sum of every entry before
    the day; `end` (when it ended) is the wallets' balances now minus every entry after
    the day. Both come from different data than the day's entries, so a changed, added or
    removed entry anywhere makes `start + entries != end`."""

    day: date
    lines: list[StatementLine]
    by_kind: list[KindTotal]
    start: int
    entries: int
    end: int
    as_of: datetime
    wallets_off: list[WalletMismatch] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        return self.start + self.entries == self.end and not self.wallets_off

    @property
    def difference(self) -> int:
        """end - (start + entries): 0 when the day adds up."""
        return self.end - self.start - self.entries

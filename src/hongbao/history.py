"""The red-packet record and the ledger's statements, read from the SQL ledger only.

- `received`: the packets a user grabbed in a year, newest first, with the year's totals
  and how often the user got the best luck;
- `sent`: the packets a user sent in a year, newest first, with the year's totals;
- `entries`: a wallet's ledger entries, newest first, each with the balance after it;
- `statement`: every ledger entry of one UTC day and whether the day adds up (对账).

A grab shows up once the persister applied it to the ledger; each answer carries the
ledger's clock (`as_of`) at the snapshot it was read from. Callers check who may read
what (the HTTP layer does); these methods trust their caller, as `Hongbao.wallet` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, date, datetime

from hongbao.domain.history import EntriesPage, Keyset, ReceivedPage, SentPage, Statement
from hongbao.domain.ids import require_user_id, valid_packet_id
from hongbao.errors import InvalidRequest, StorageError
from hongbao.ledger import SqlLedger
from hongbao.ledger import history as ledger_history
from hongbao.ledger.schema import ENTRY_KINDS

#: rows per page: by default, and at most
DEFAULT_PAGE = 50
MAX_PAGE = 500
#: the years a record can be asked for
MIN_YEAR = 1970
MAX_YEAR = 9999
#: the last time a cursor may name, in unix microseconds (datetime.max)
LAST_MICROS = ledger_history.micros(datetime.max)
#: the largest row id a cursor may name: the largest the ledger's id columns hold (a
#: signed 64-bit integer); a larger one cannot be bound as a query parameter
MAX_ROW_ID = 2**63 - 1
#: finished packets given their best-luck row per transaction; seconds between rounds
INDEX_BATCH = 1_000
INDEX_INTERVAL = 5.0

log = logging.getLogger("hongbao.history")


class History:
    """Reads of the record and the statements; `Hongbao.history` is one."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger

    async def received(
        self,
        user_id: str,
        year: int | None = None,
        *,
        after: Keyset | None = None,
        limit: int = DEFAULT_PAGE,
    ) -> ReceivedPage:
        """The packets `user_id` grabbed in `year` (UTC; default this year), newest
        first, `limit` from after `after` (a page's `next_after`), and the year's totals."""
        require_user_id(user_id)
        year = _year(year)
        start, end = _year_range(year)
        return await ledger_history.received(
            self.ledger.engine,
            user_id,
            start,
            end,
            year=year,
            after=_keyset(after, int),
            limit=_limit(limit),
        )

    async def sent(
        self,
        user_id: str,
        year: int | None = None,
        *,
        after: Keyset | None = None,
        limit: int = DEFAULT_PAGE,
    ) -> SentPage:
        """The packets `user_id` sent in `year` (UTC; default this year), newest first,
        `limit` from after `after`, and the year's totals."""
        require_user_id(user_id)
        year = _year(year)
        start, end = _year_range(year)
        return await ledger_history.sent(
            self.ledger.engine,
            user_id,
            start,
            end,
            year=year,
            after=_keyset(after, str),
            limit=_limit(limit),
        )

    async def entries(
        self,
        user_id: str,
        *,
        kind: str | None = None,
        after: int | None = None,
        limit: int = DEFAULT_PAGE,
    ) -> EntriesPage:
        """The wallet's ledger entries (of one `kind`, or all), newest first, `limit` with
        ids below `after` (a page's `next_after`), each with the balance after it."""
        require_user_id(user_id)
        if kind is not None and kind not in ENTRY_KINDS:
            raise InvalidRequest(f"kind must be one of {', '.join(ENTRY_KINDS)}", "kind")
        if after is not None and not valid_row_id(after):
            raise InvalidRequest("cursor is not one this API returned", "cursor")
        return await ledger_history.wallet_entries(
            self.ledger.engine, user_id, kind=kind, after=after, limit=_limit(limit)
        )

    async def statement(self, day: date) -> Statement:
        """Every ledger entry of the UTC `day`, per-kind totals, and the check that the
        wallets' balances at its start plus its entries make those at its end."""
        if not isinstance(day, date) or isinstance(day, datetime):
            raise InvalidRequest("date must be a day, YYYY-MM-DD", "date")
        return await ledger_history.statement(self.ledger.engine, day)


class BestLuckIndexer:
    """Writes the best luck of finished packets into hb_best_luck, so that a year's
    best-luck count reads one index range instead of checking each claim.

    The record is exact whether or not this runs (what it has not indexed yet is checked
    claim by claim); it only makes the totals of a long record fast. `hongbao serve` and
    `hongbao worker` run it next to the persister. Several may run at once."""

    def __init__(
        self, ledger: SqlLedger, *, batch: int = INDEX_BATCH, interval: float = INDEX_INTERVAL
    ) -> None:
        self.ledger = ledger
        self.batch = batch
        self.interval = interval
        self.indexed = 0

    async def step(self) -> int:
        """Index up to `batch` finished packets; how many."""
        batch = self.batch
        done, _ = await self.ledger.transaction(
            lambda conn: ledger_history.index_best_luck(conn, batch)
        )
        self.indexed += done
        return done

    async def catch_up(self) -> int:
        """Index every finished packet not indexed yet; how many."""
        total = 0
        while (done := await self.step()) == self.batch:
            total += done
        return total + done

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.catch_up()
            except StorageError as exc:
                log.warning("best-luck indexer: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)


def _year(year: int | None) -> int:
    if year is None:
        return datetime.now(UTC).year
    if type(year) is not int or not MIN_YEAR <= year <= MAX_YEAR:
        raise InvalidRequest(f"year must be a whole number from {MIN_YEAR} to {MAX_YEAR}", "year")
    return year


def _year_range(year: int) -> tuple[datetime, datetime]:
    """[start, end) of a UTC year as the ledger stores times (naive UTC)."""
    end = datetime(year + 1, 1, 1) if year < MAX_YEAR else datetime.max
    return datetime(year, 1, 1), end


def _limit(limit: int) -> int:
    if type(limit) is not int or not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be a whole number from 1 to {MAX_PAGE}", "limit")
    return limit


def valid_row_id(row_id: object) -> bool:
    """Whether `row_id` can be a ledger row's id: an int from 1 to `MAX_ROW_ID`."""
    return type(row_id) is int and 1 <= row_id <= MAX_ROW_ID


def _keyset(after: Keyset | None, id_type: type) -> Keyset | None:
    """`after` if it is a position of this kind of row; InvalidRequest naming the cursor."""
    if after is None:
        return None
    ok = (
        isinstance(after, tuple)
        and len(after) == 2
        and type(after[0]) is int
        and 0 <= after[0] <= LAST_MICROS
        and type(after[1]) is id_type
        and (valid_packet_id(after[1]) if isinstance(after[1], str) else valid_row_id(after[1]))
    )
    if not ok:
        raise InvalidRequest("cursor is not one this API returned", "cursor")
    return Keyset(*after)

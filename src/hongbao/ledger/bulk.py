"""Set-based statements of a persister batch, one implementation per database.

A batch of any size is the same few statements: look up the claimed shares, insert the
claims with their ledger entries (and the refunds' entries), credit the wallets (an
upsert creates missing ones), update the packets' counters. Data comes in as columns:
one list per column, all of one length, in the order the docstrings give.

- PostgreSQL: SQLAlchemy Core over `unnest` of one array per column, so the statement
  text never changes with the batch size and asyncpg keeps it prepared.
- MySQL/MariaDB and SQLite: multi-row VALUES lists, chunked under the server's limit of
  bind parameters. Core could build them too, but its per-row parameter handling costs
  about three times the CPU of the driver call for a 1,000-row statement, so their SQL is
  written here and run with `exec_driver_sql`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from itertools import chain
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.records import CLAIM_REFERENCE_PREFIX, claim_reference, map_distinct
from hongbao.ledger.schema import (
    CLAIM_KIND,
    Timestamp,
    claims,
    entries,
    packets,
    shares,
    wallets,
)

#: one list per column, all of one length
Columns = Sequence[Sequence[Any]]
#: a claim key (packet_id, share_idx, user_id), then the share's amount (None: no such
#: share), the user holding that share and the share this user holds (None: nobody, none)
ClaimState = tuple[str, int, str, int | None, str | None, int | None]
#: the SQL of a statement for n rows
SqlFor = Callable[[int], str]

CLAIM_COLUMNS = ("packet_id", "share_idx", "user_id", "amount", "claimed_at")
#: a claim, and the actor of its entry (who grabbed for the user, or None)
CLAIMED_COLUMNS = (*CLAIM_COLUMNS, "actor")
ENTRY_COLUMNS = ("reference", "user_id", "kind", "amount", "packet_id", "actor", "created_at")
#: claims, fen claimed and fen refunded are added to the packet; status and closed_at set
#: (closed_at only when not None)
PACKET_CHANGE_COLUMNS = (
    "id",
    "claimed_count",
    "claimed_amount",
    "refunded_amount",
    "status",
    "closed_at",
)
#: a claim event's packet_id, share_idx, user_id and amount
LOOKUP_COLUMNS = ("packet_id", "share_idx", "user_id", "amount")
#: a claim event's packet_id, share_idx and amount
SHARE_COLUMNS = ("packet_id", "share_idx", "amount")


class Bulk(Protocol):
    """The batch's statements on one connection."""

    async def lookup(self, keys: Columns) -> list[ClaimState]:
        """The ledger's state of the claims in `keys` (LOOKUP_COLUMNS) that are not plainly
        new: the share is missing or of another amount, or the share or the user has a
        claim already. Any other key names a free share of the amount claimed."""
        ...

    async def insert_claims(self, rows: Columns, now: datetime) -> None:
        """The claims (CLAIMED_COLUMNS) and their ledger entries."""
        ...

    async def insert_new_claims(self, rows: Columns, now: datetime) -> bool:
        """As `insert_claims`, for claims not looked up: only if each names a share of
        the amount it claims. If one does not, nothing is inserted, and either False is
        returned or IntegrityError raised (PostgreSQL: one statement checks and inserts).
        A unique key refusing a claim raises IntegrityError. Run it in a savepoint."""
        ...

    async def insert_entries(self, rows: Columns) -> None:
        """Ledger entries (ENTRY_COLUMNS)."""
        ...

    async def credit(self, users: Sequence[str], amounts: Sequence[int], now: datetime) -> None:
        """Add to balances, creating missing wallets. One row per user, in user order, so
        that concurrent batches lock wallet rows in the same order."""
        ...

    async def update_packets(self, rows: Columns) -> None:
        """PACKET_CHANGE_COLUMNS, one row per packet"""
        ...


def bulk_for(conn: AsyncConnection) -> Bulk:
    dialect = conn.dialect
    if dialect.name == "postgresql":
        return PostgresBulk(conn)
    if dialect.name in ("mysql", "mariadb"):
        return MariaDbBulk(conn) if getattr(dialect, "is_mariadb", False) else MySqlBulk(conn)
    return SqliteBulk(conn)


# -- PostgreSQL ----------------------------------------------------------------------


def _unnest(name: str, *columns: sa.Column[Any]) -> Any:
    """`unnest(:name_a, :name_b, ...) AS name(a, b, ...)`: one array bind parameter per
    column (not named as the column: INSERT and UPDATE keep those names for themselves)."""
    arrays = [sa.bindparam(f"{name}_{c.name}", type_=ARRAY(c.type)) for c in columns]
    names = [c.name for c in columns]
    return sa.func.unnest(*arrays).table_valued(*names).render_derived(name=name)


def _pg_share_amount(e: Any) -> sa.ScalarSelect[Any]:
    """The amount of the share `e` names (NULL: no such share), a correlated subquery."""
    return (
        sa.select(shares.c.amount)
        .where(shares.c.packet_id == e.c.packet_id, shares.c.idx == e.c.share_idx)
        .scalar_subquery()
    )


def _pg_lookup() -> sa.Select[Any]:
    """Bulk.lookup: per key the share's amount, who holds that share and which share the
    user holds, as correlated scalar subqueries, so each is an index lookup per key (as
    joins, the planner hashes whole tables while they look small next to a batch)."""
    e = _unnest("e", *(claims.c[name] for name in LOOKUP_COLUMNS))
    holder = sa.select(claims.c.user_id).where(
        claims.c.packet_id == e.c.packet_id, claims.c.share_idx == e.c.share_idx
    )
    held = sa.select(claims.c.share_idx).where(
        claims.c.packet_id == e.c.packet_id, claims.c.user_id == e.c.user_id
    )
    x = sa.select(
        e,
        _pg_share_amount(e).label("share_amount"),
        holder.scalar_subquery().label("holder"),
        held.scalar_subquery().label("held"),
    ).subquery("x")
    return sa.select(
        x.c.packet_id, x.c.share_idx, x.c.user_id, x.c.share_amount, x.c.holder, x.c.held
    ).where(
        sa.or_(
            x.c.share_amount.is_distinct_from(x.c.amount),
            x.c.holder.is_not(None),
            x.c.held.is_not(None),
        )
    )


def _pg_insert_entries() -> sa.Insert:
    rows = _unnest("r", *(entries.c[name] for name in ENTRY_COLUMNS))
    return entries.insert().from_select(list(ENTRY_COLUMNS), sa.select(rows))


def _pg_insert_claims(checked: bool) -> sa.Insert:
    """The claims and, from the same arrays, their ledger entries: one statement. Each
    entry's reference is `claim_reference` of its claim, written out in SQL.

    Unless the claims were `checked`, each claim's amount is NULL where its share is
    missing or of another amount, so that the claims' NOT NULL amount refuses the
    statement: the share check costs no statement of its own."""
    rows = sa.select(
        _unnest("r", *(claims.c[name] for name in CLAIM_COLUMNS), entries.c.actor)
    ).cte("claimed")
    amount: Any = rows.c.amount
    if not checked:
        amount = sa.case((_pg_share_amount(rows) == rows.c.amount, rows.c.amount))
    add_claims = claims.insert().from_select(
        list(CLAIM_COLUMNS),
        sa.select(rows.c.packet_id, rows.c.share_idx, rows.c.user_id, amount, rows.c.claimed_at),
    )
    reference = sa.func.concat(
        CLAIM_REFERENCE_PREFIX, rows.c.packet_id, ":", sa.cast(rows.c.share_idx, sa.Text)
    )
    add_entries = entries.insert().from_select(
        list(ENTRY_COLUMNS),
        sa.select(
            reference,
            rows.c.user_id,
            sa.literal(CLAIM_KIND, entries.c.kind.type),
            rows.c.amount,
            rows.c.packet_id,
            rows.c.actor,
            sa.bindparam("now", type_=entries.c.created_at.type),
        ),
    )
    # a data-modifying CTE runs to completion whether or not the statement reads it
    return add_entries.add_cte(add_claims.cte("add_claims"))


def _pg_credit() -> sa.Insert:
    rows = _unnest("r", wallets.c.user_id, wallets.c.balance)
    now = sa.bindparam("now", type_=wallets.c.updated_at.type)
    insert = pg_insert(wallets).from_select(
        ["user_id", "balance", "updated_at"],
        sa.select(rows.c.user_id, rows.c.balance, now).order_by(rows.c.user_id),
    )
    return insert.on_conflict_do_update(
        index_elements=[wallets.c.user_id],
        set_={
            "balance": wallets.c.balance + insert.excluded.balance,
            "updated_at": insert.excluded.updated_at,
        },
    )


def _pg_update_packets() -> sa.Update:
    d = _unnest(
        "d",
        packets.c.id,
        packets.c.claimed_count,
        packets.c.claimed_amount,
        packets.c.refunded_amount,
        packets.c.status,
        packets.c.closed_at,
    )
    return (
        packets.update()
        .where(packets.c.id == d.c.id)
        .values(
            claimed_count=packets.c.claimed_count + d.c.claimed_count,
            claimed_amount=packets.c.claimed_amount + d.c.claimed_amount,
            refunded_amount=packets.c.refunded_amount + d.c.refunded_amount,
            status=d.c.status,
            closed_at=sa.func.coalesce(d.c.closed_at, packets.c.closed_at),
        )
    )


_PG_LOOKUP = _pg_lookup()
_PG_INSERT_CLAIMS = _pg_insert_claims(checked=True)
_PG_INSERT_NEW_CLAIMS = _pg_insert_claims(checked=False)
_PG_INSERT_ENTRIES = _pg_insert_entries()
_PG_CREDIT = _pg_credit()
_PG_UPDATE_PACKETS = _pg_update_packets()


def _arrays(name: str, names: Sequence[str], columns: Columns) -> dict[str, Sequence[Any]]:
    """The array parameters of `_unnest(name, *names)`."""
    return {f"{name}_{c}": values for c, values in zip(names, columns, strict=True)}


class PostgresBulk:
    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def lookup(self, keys: Columns) -> list[ClaimState]:
        rows = await self.conn.execute(_PG_LOOKUP, _arrays("e", LOOKUP_COLUMNS, keys))
        return [tuple(r) for r in rows]

    async def insert_claims(self, rows: Columns, now: datetime) -> None:
        params: dict[str, Any] = _arrays("r", CLAIMED_COLUMNS, rows)
        await self.conn.execute(_PG_INSERT_CLAIMS, {**params, "now": now})

    async def insert_new_claims(self, rows: Columns, now: datetime) -> bool:
        params: dict[str, Any] = _arrays("r", CLAIMED_COLUMNS, rows)
        await self.conn.execute(_PG_INSERT_NEW_CLAIMS, {**params, "now": now})
        return True

    async def insert_entries(self, rows: Columns) -> None:
        await self.conn.execute(_PG_INSERT_ENTRIES, _arrays("r", ENTRY_COLUMNS, rows))

    async def credit(self, users: Sequence[str], amounts: Sequence[int], now: datetime) -> None:
        await self.conn.execute(_PG_CREDIT, {"r_user_id": users, "r_balance": amounts, "now": now})

    async def update_packets(self, rows: Columns) -> None:
        await self.conn.execute(_PG_UPDATE_PACKETS, _arrays("d", PACKET_CHANGE_COLUMNS, rows))


# -- MySQL / MariaDB and SQLite ----------------------------------------------------------


#: the amount of the share a row `e` names (NULL: no such share), a correlated subquery
SHARE_AMOUNT_SQL = (
    "(SELECT s.amount FROM hb_shares AS s WHERE s.packet_id = e.packet_id AND s.idx = e.share_idx)"
)


class ValuesBulk:
    """Multi-row VALUES statements with positional parameters, run at the driver level.

    A subclass gives its placeholder, its limit of bind parameters per statement, and the
    dialect's wording of the wallet upsert and of an UPDATE joined to a row source.
    """

    mark = "?"
    max_params = 32_766
    #: what a row of a table value constructor starts with (MySQL 8: ROW)
    row_constructor = ""
    upsert_wallets = ""
    update_packets_sql = ""
    #: `{0} IS DISTINCT FROM {1}` in the dialect's words
    distinct = "{0} IS NOT {1}"

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        to_db = Timestamp.dialect_impl(conn.dialect).bind_processor(conn.dialect)
        #: a time as the driver takes it (each distinct time converted once a batch)
        self.time: Callable[[Any], Any] = to_db or self.time_text

    @staticmethod
    def time_text(moment: datetime) -> Any:
        """A time as a parameter of the dialect that has no bind processor of its own."""
        return moment

    def values(self, width: int, n: int, constructor: str = "") -> str:
        one = constructor + "(" + ", ".join([self.mark] * width) + ")"
        return ", ".join([one] * n)

    def source(self, name: str, columns: Sequence[str], n: int) -> str:
        """A derived table `name` of n parameter rows. The CTE gives the columns their
        names (a bare VALUES list is named after its first row on MariaDB)."""
        rows = self.values(len(columns), n, self.row_constructor)
        return f"(WITH {name} ({', '.join(columns)}) AS (VALUES {rows}) SELECT * FROM {name})"

    def insert(self, table: sa.Table, columns: Sequence[str], suffix: str = "") -> SqlFor:
        head = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES "
        return lambda n: head + self.values(len(columns), n) + suffix

    async def run(self, sql: SqlFor, columns: Columns) -> list[Any]:
        """`sql(n)` over chunks of n rows within the parameter limit; the rows it returns."""
        total = len(columns[0])
        step = self.max_params // len(columns)
        found: list[Any] = []
        for start in range(0, total, step):
            part = [c[start : start + step] for c in columns]
            params = tuple(chain.from_iterable(zip(*part, strict=True)))
            result = await self.conn.exec_driver_sql(sql(len(part[0])), params)
            if result.returns_rows:
                found.extend(tuple(r) for r in result)
        return found

    async def lookup(self, keys: Columns) -> list[ClaimState]:
        def sql(n: int) -> str:
            e = self.source("e", LOOKUP_COLUMNS, n)
            return (
                "SELECT packet_id, share_idx, user_id, share_amount, holder, held FROM ("
                "SELECT e.packet_id, e.share_idx, e.user_id, e.amount,"
                f" {SHARE_AMOUNT_SQL} AS share_amount,"
                " (SELECT c.user_id FROM hb_claims AS c"
                " WHERE c.packet_id = e.packet_id AND c.share_idx = e.share_idx) AS holder,"
                " (SELECT c.share_idx FROM hb_claims AS c"
                " WHERE c.packet_id = e.packet_id AND c.user_id = e.user_id) AS held"
                f" FROM {e} AS e) AS x"
                f" WHERE {self.distinct.format('share_amount', 'amount')}"
                " OR holder IS NOT NULL OR held IS NOT NULL"
            )

        return await self.run(sql, keys)

    async def shares_differ(self, keys: Columns) -> bool:
        """Whether some claim in `keys` (SHARE_COLUMNS) names a share that is missing or
        of another amount."""

        def sql(n: int) -> str:
            e = self.source("e", SHARE_COLUMNS, n)
            where = self.distinct.format(SHARE_AMOUNT_SQL, "e.amount")
            return f"SELECT 1 FROM {e} AS e WHERE {where} LIMIT 1"

        return bool(await self.run(sql, keys))

    async def insert_claims(self, rows: Columns, now: datetime) -> None:
        packet_ids, share_idxs, user_ids, amounts, claimed_at, actors = rows
        at = map_distinct(self.time, claimed_at)
        await self.run(
            self.insert(claims, CLAIM_COLUMNS), [packet_ids, share_idxs, user_ids, amounts, at]
        )
        references = list(map(claim_reference, packet_ids, share_idxs))
        n = len(references)
        await self.insert_entries(
            [references, user_ids, [CLAIM_KIND] * n, amounts, packet_ids, actors, [now] * n]
        )

    async def insert_new_claims(self, rows: Columns, now: datetime) -> bool:
        packet_ids, share_idxs, _, amounts, *_ = rows
        if await self.shares_differ((packet_ids, share_idxs, amounts)):
            return False
        await self.insert_claims(rows, now)
        return True

    async def insert_entries(self, rows: Columns) -> None:
        *first, created_at = rows
        at = map_distinct(self.time, created_at)
        await self.run(self.insert(entries, ENTRY_COLUMNS), [*first, at])

    async def credit(self, users: Sequence[str], amounts: Sequence[int], now: datetime) -> None:
        columns = ("user_id", "balance", "updated_at")
        at = [self.time(now)] * len(users)
        await self.run(self.insert(wallets, columns, self.upsert_wallets), [users, amounts, at])

    async def update_packets(self, rows: Columns) -> None:
        def sql(n: int) -> str:
            return self.update_packets_sql.format(d=self.source("d", PACKET_CHANGE_COLUMNS, n))

        *first, closed_at = rows
        at = [None if t is None else self.time(t) for t in closed_at]
        await self.run(sql, [*first, at])


class SqliteBulk(ValuesBulk):
    """SQLite 3.33 or newer: UPDATE ... FROM."""

    mark = "?"
    #: SQLITE_MAX_VARIABLE_NUMBER: 32,766 since SQLite 3.32, 999 before
    max_params = 32_766 if sqlite3.sqlite_version_info >= (3, 32) else 999
    upsert_wallets = (
        " ON CONFLICT (user_id) DO UPDATE SET"
        " balance = hb_wallets.balance + excluded.balance, updated_at = excluded.updated_at"
    )
    update_packets_sql = (
        "UPDATE hb_packets SET"
        " claimed_count = hb_packets.claimed_count + d.claimed_count,"
        " claimed_amount = hb_packets.claimed_amount + d.claimed_amount,"
        " refunded_amount = hb_packets.refunded_amount + d.refunded_amount,"
        " status = d.status,"
        " closed_at = COALESCE(d.closed_at, hb_packets.closed_at)"
        " FROM {d} AS d WHERE hb_packets.id = d.id"
    )


class MariaDbBulk(ValuesBulk):
    mark = "%s"
    distinct = "NOT ({0} <=> {1})"
    max_params = 65_535  # placeholders in one MySQL/MariaDB statement
    upsert_wallets = (
        " ON DUPLICATE KEY UPDATE"
        " balance = balance + VALUES(balance), updated_at = VALUES(updated_at)"
    )
    #: STRAIGHT_JOIN: the changes drive, each packet row found by its key. With the
    #: packets table first, InnoDB may scan it and lock packets another batch holds,
    #: while that batch waits for a wallet this one holds: a deadlock. A multi-table
    #: UPDATE assigns in no promised order: each assignment reads only its own column.
    update_packets_sql = (
        "UPDATE {d} AS d STRAIGHT_JOIN hb_packets AS p ON p.id = d.id SET"
        " p.claimed_count = p.claimed_count + d.claimed_count,"
        " p.claimed_amount = p.claimed_amount + d.claimed_amount,"
        " p.refunded_amount = p.refunded_amount + d.refunded_amount,"
        " p.status = d.status,"
        " p.closed_at = COALESCE(d.closed_at, p.closed_at)"
    )

    @staticmethod
    def time_text(moment: datetime) -> Any:
        """DATETIME(6) text of a naive UTC time: the driver quotes a string for the
        statement, where it formats a datetime field by field for every row that holds
        it (a third of the persister's CPU on MariaDB, py-spy)."""
        return moment.isoformat(" ", "microseconds")


class MySqlBulk(MariaDbBulk):
    row_constructor = "ROW"  # MySQL 8 writes a table value constructor's rows ROW(...)

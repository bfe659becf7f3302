"""Reads of the red-packet record, a wallet's entries and the daily statement.

Each read runs in one transaction on one snapshot (REPEATABLE READ on PostgreSQL and
MySQL/MariaDB, a deferred read transaction in SQLite's WAL), so totals, pages and
balances of one answer agree with each other. Pages are keyset pages, newest first:
a page starts strictly after the last row of the one before, so rows committed
meanwhile neither shift nor repeat the rows a client has not seen yet.
"""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from hongbao.domain.history import (
    EntriesPage,
    Entry,
    Keyset,
    KindTotal,
    Received,
    ReceivedPage,
    ReceivedTotals,
    Sent,
    SentPage,
    SentTotals,
    Statement,
    StatementLine,
    WalletMismatch,
)
from hongbao.errors import StorageError
from hongbao.ledger.records import among, chunks, from_db
from hongbao.ledger.schema import best_luck, claims, entries, history_marks, packets, wallets

#: the hb_history_marks row of hb_best_luck
BEST_LUCK_MARK = "best_luck"
#: how far behind the oldest open packet (and the clock) the best-luck mark stays: longer
#: than a send takes to commit after its packet's time was taken, and than the clocks of
#: the API processes (packet times) and of Redis (claim times) drift apart
MARK_MARGIN = timedelta(minutes=10)
_EPOCH = datetime(1970, 1, 1)
_MICROSECOND = timedelta(microseconds=1)


def micros(moment: datetime) -> int:
    """Unix microseconds of a naive UTC datetime as the ledger stores it."""
    return (moment - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """The naive UTC datetime of unix microseconds."""
    return _EPOCH + value * _MICROSECOND


@contextlib.asynccontextmanager
async def snapshot(engine: AsyncEngine) -> AsyncIterator[tuple[AsyncConnection, datetime]]:
    """A read-only transaction on one snapshot, and the ledger's clock at its start.

    The clock is read first: everything committed before it is visible in the snapshot
    (PostgreSQL takes the snapshot at the transaction's first statement, InnoDB and
    SQLite at its first read of a table)."""
    try:
        async with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                await conn.execution_options(
                    isolation_level="REPEATABLE READ", postgresql_readonly=True
                )
            elif engine.dialect.name != "sqlite":
                await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                yield conn, await _ledger_now(conn, reads=True)
    except (DBAPIError, OSError, PoolTimeout) as exc:  # PoolTimeout: no connection came free
        raise StorageError(f"database: {exc}") from exc


async def _ledger_now(conn: AsyncConnection, *, reads: bool = False) -> datetime:
    """The database server's clock, aware UTC.

    With `reads` on PostgreSQL, also sets two planner settings for the transaction: no
    JIT compilation (these reads are short; compiling one, for a plan whose estimate
    crosses jit_above_cost, costs more than running it), and generic plans allowed for
    the prepared statements (the engine plans every run anew, `SqlLedger.from_url`, which
    costs these statements more than they take to run; one user's range of an index is
    the plan whatever the values)."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        settings = (
            ", set_config('jit', 'off', true), set_config('plan_cache_mode', 'auto', true)"
            if reads
            else ""
        )
        value: Any = await conn.scalar(sa.text(f"SELECT now(){settings}"))
    elif dialect == "sqlite":
        text = await conn.scalar(sa.text("SELECT strftime('%Y-%m-%d %H:%M:%f', 'now')"))
        value = datetime.fromisoformat(str(text))
    else:
        value = await conn.scalar(sa.text("SELECT UTC_TIMESTAMP(6)"))
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]
    return value.astimezone(UTC)  # type: ignore[no-any-return]


def _newest_first(time_column: Any, id_column: Any, after: Keyset | None) -> Any:
    """Rows strictly after `after` in (time, id) descending order (all rows: None).

    Spelled as a range on the time column and a tie-break, which every database turns
    into an index range (MariaDB does not for a row-value comparison)."""
    if after is None:
        return sa.true()
    at = from_micros(after.at_us)
    return sa.and_(time_column <= at, sa.or_(time_column < at, id_column < after.row_id))


def _after_bound(time_column: Any, id_column: Any) -> Any:
    """`_newest_first` with bind parameters ``after_at`` and ``after_id``."""
    at = sa.bindparam("after_at", type_=time_column.type)
    row_id = sa.bindparam("after_id", type_=id_column.type)
    return sa.and_(time_column <= at, sa.or_(time_column < at, id_column < row_id))


# -- received ---------------------------------------------------------------------------------


def _is_best_luck() -> Any:
    """True for a claim that is the best luck of its packet (hb_packets joined): the
    packet is lucky and finished (exhausted, or expired and closed), no claim of it is
    larger, and no claim as large was grabbed earlier (by time, then share index, as
    `Hongbao.claims` orders them). Three index probes on (packet_id, amount) per claim."""
    other = claims.alias("other")
    same_packet = other.c.packet_id == claims.c.packet_id
    beaten = sa.or_(
        sa.exists().where(same_packet, other.c.amount > claims.c.amount),
        sa.exists().where(
            same_packet,
            other.c.amount == claims.c.amount,
            other.c.claimed_at < claims.c.claimed_at,
        ),
        sa.exists().where(
            same_packet,
            other.c.amount == claims.c.amount,
            other.c.claimed_at == claims.c.claimed_at,
            other.c.share_idx < claims.c.share_idx,
        ),
    )
    return sa.and_(packets.c.mode == "lucky", packets.c.status != "active", sa.not_(beaten))


def _best_luck() -> Any:
    """1 for a claim that is its packet's best luck, else 0."""
    return sa.case((_is_best_luck(), 1), else_=0)


@functools.cache
def _received_page(after: bool) -> Any:
    """A page of a user's claims in [start, end), newest first, with their packets and
    whether each is its packet's best luck; `after`: below ``after_at``/``after_id``.
    Built once (with bind parameters): these statements take longer to build than to run.
    """
    in_range = sa.and_(
        claims.c.user_id == sa.bindparam("user_id", type_=claims.c.user_id.type),
        claims.c.claimed_at >= sa.bindparam("start", type_=claims.c.claimed_at.type),
        claims.c.claimed_at < sa.bindparam("end", type_=claims.c.claimed_at.type),
    )
    query = (
        sa.select(
            claims.c.id,
            claims.c.packet_id,
            claims.c.amount,
            claims.c.claimed_at,
            packets.c.sender_id,
            packets.c.greeting,
            packets.c.mode,
            _best_luck().label("best"),
        )
        .select_from(claims.join(packets, packets.c.id == claims.c.packet_id))
        .where(in_range)
        .order_by(claims.c.claimed_at.desc(), claims.c.id.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
    if after:
        query = query.where(_after_bound(claims.c.claimed_at, claims.c.id))
    return query


@functools.cache
def _received_totals() -> Any:
    """One row: the user's claims in [start, end), their sum, and how many are their
    packet's best luck, in two parts.

    Up to the best-luck mark, best luck is read from hb_best_luck (one index range); after
    it, claim by claim (`_is_best_luck`). A packet counts in the first part when its best
    claim is before the mark, in the second when it is not; every finished packet with a
    claim before the mark has its hb_best_luck row (see `index_best_luck`), so each packet
    counts once. Count and sum come from the (user_id, claimed_at, id, amount) index.
    Bind parameters ``user_id``, ``start`` and ``end``; built once."""
    user_id = sa.bindparam("user_id", type_=claims.c.user_id.type)
    start = sa.bindparam("start", type_=claims.c.claimed_at.type)
    end = sa.bindparam("end", type_=claims.c.claimed_at.type)
    mark = (
        sa.select(history_marks.c.at)
        .where(history_marks.c.name == BEST_LUCK_MARK)
        .scalar_subquery()
    )
    cut = sa.func.coalesce(mark, start)
    sums = (
        sa.select(
            sa.func.count().label("n"),
            sa.func.coalesce(sa.func.sum(claims.c.amount), 0).label("amount"),
        )
        .where(claims.c.user_id == user_id, claims.c.claimed_at >= start, claims.c.claimed_at < end)
        .subquery()
    )
    indexed = (
        sa.select(sa.func.count())
        .where(
            best_luck.c.user_id == user_id,
            best_luck.c.claimed_at >= start,
            best_luck.c.claimed_at < end,
            best_luck.c.claimed_at < cut,
        )
        .scalar_subquery()
    )
    recent = (
        sa.select(sa.func.count())
        .select_from(claims.join(packets, packets.c.id == claims.c.packet_id))
        .where(
            claims.c.user_id == user_id,
            claims.c.claimed_at >= start,
            claims.c.claimed_at < end,
            claims.c.claimed_at >= cut,
            _is_best_luck(),
        )
        .scalar_subquery()
    )
    return sa.select(sums.c.n, sums.c.amount, indexed, recent)


async def received(
    engine: AsyncEngine,
    user_id: str,
    start: datetime,
    end: datetime,
    *,
    year: int,
    after: Keyset | None,
    limit: int,
) -> ReceivedPage:
    """The user's claims with `start <= claimed_at < end` (naive UTC), newest first,
    `limit` from after `after`; totals over the whole range."""
    values: dict[str, Any] = {"user_id": user_id, "start": start, "end": end}
    page_values = {**values, "limit": limit + 1}
    if after is not None:
        page_values.update(after_at=from_micros(after.at_us), after_id=after.row_id)
    async with snapshot(engine) as (conn, as_of):
        rows = (await conn.execute(_received_page(after is not None), page_values)).all()
        count, amount, indexed, recent = (await conn.execute(_received_totals(), values)).one()
    items = [
        Received(
            packet_id=r.packet_id,
            sender_id=r.sender_id,
            greeting=r.greeting,
            mode=r.mode,
            amount=int(r.amount),
            claimed_at=from_db(r.claimed_at),
            best_luck=bool(r.best),
            position=Keyset(micros(r.claimed_at), int(r.id)),
        )
        for r in rows[:limit]
    ]
    return ReceivedPage(
        user_id=user_id,
        year=year,
        items=items,
        totals=ReceivedTotals(int(count), int(amount), int(indexed or 0) + int(recent or 0)),
        as_of=as_of,
        next_after=items[-1].position if len(rows) > limit else None,
    )


# -- sent -------------------------------------------------------------------------------------


async def sent(
    engine: AsyncEngine,
    user_id: str,
    start: datetime,
    end: datetime,
    *,
    year: int,
    after: Keyset | None,
    limit: int,
) -> SentPage:
    """The user's packets with `start <= created_at < end`, newest first; totals of all."""
    in_range = sa.and_(
        packets.c.sender_id == user_id, packets.c.created_at >= start, packets.c.created_at < end
    )
    page_query = (
        sa.select(
            packets.c.id,
            packets.c.greeting,
            packets.c.mode,
            packets.c.total_amount,
            packets.c.count.label("share_count"),
            packets.c.claimed_count,
            packets.c.claimed_amount,
            packets.c.refunded_amount,
            packets.c.status,
            packets.c.created_at,
            packets.c.expires_at,
        )
        .where(in_range, _newest_first(packets.c.created_at, packets.c.id, after))
        .order_by(packets.c.created_at.desc(), packets.c.id.desc())
        .limit(limit + 1)
    )
    totals_query = sa.select(
        sa.func.count(),
        sa.func.coalesce(sa.func.sum(packets.c.total_amount), 0),
        sa.func.coalesce(sa.func.sum(packets.c.refunded_amount), 0),
    ).where(in_range)
    async with snapshot(engine) as (conn, as_of):
        rows = (await conn.execute(page_query)).all()
        count, amount, refunded = (await conn.execute(totals_query)).one()
    items = [
        Sent(
            packet_id=r.id,
            greeting=r.greeting,
            mode=r.mode,
            total_amount=int(r.total_amount),
            count=int(r.share_count),
            claimed_count=int(r.claimed_count),
            claimed_amount=int(r.claimed_amount),
            refunded_amount=int(r.refunded_amount),
            status=r.status,
            created_at=from_db(r.created_at),
            expires_at=from_db(r.expires_at),
            position=Keyset(micros(r.created_at), r.id),
        )
        for r in rows[:limit]
    ]
    return SentPage(
        user_id=user_id,
        year=year,
        items=items,
        totals=SentTotals(int(count), int(amount), int(refunded)),
        as_of=as_of,
        next_after=items[-1].position if len(rows) > limit else None,
    )


# -- a wallet's entries -----------------------------------------------------------------------


async def wallet_entries(
    engine: AsyncEngine, user_id: str, *, kind: str | None, after: int | None, limit: int
) -> EntriesPage:
    """The wallet's entries, newest (highest id) first, `limit` with ids below `after`,
    optionally of one kind, each with the balance right after it.

    The balance after an entry is the wallet's balance minus every entry of the wallet
    with a higher id, all read on one snapshot: nothing a client sends enters it."""
    mine = entries.c.user_id == user_id
    query = sa.select(
        entries.c.id,
        entries.c.reference,
        entries.c.kind,
        entries.c.amount,
        entries.c.packet_id,
        entries.c.created_at,
    ).where(mine)
    if kind is not None:
        query = query.where(entries.c.kind == kind)
    if after is not None:
        query = query.where(entries.c.id < after)
    query = query.order_by(entries.c.id.desc()).limit(limit + 1)
    async with snapshot(engine) as (conn, as_of):
        balance = int(
            await conn.scalar(sa.select(wallets.c.balance).where(wallets.c.user_id == user_id)) or 0
        )
        rows = (await conn.execute(query)).all()
        page = rows[:limit]
        steps: list[tuple[int, int]] = [(int(r.id), int(r.amount)) for r in page]
        newer = 0
        if page:
            top, bottom = int(page[0].id), int(page[-1].id)
            newer = int(
                await conn.scalar(
                    sa.select(sa.func.coalesce(sa.func.sum(entries.c.amount), 0)).where(
                        mine, entries.c.id > top
                    )
                )
                or 0
            )
            if kind is not None:  # the entries of other kinds between the page's rows
                between = await conn.execute(
                    sa.select(entries.c.id, entries.c.amount)
                    .where(mine, entries.c.id <= top, entries.c.id >= bottom)
                    .order_by(entries.c.id.desc())
                )
                steps = [(int(i), int(a)) for i, a in between]
    after_each: dict[int, int] = {}
    running = balance - newer
    for entry_id, amount in steps:
        after_each[entry_id] = running
        running -= amount
    items = [
        Entry(
            id=int(r.id),
            reference=r.reference,
            kind=r.kind,
            amount=int(r.amount),
            packet_id=r.packet_id,
            created_at=from_db(r.created_at),
            balance_after=after_each[int(r.id)],
        )
        for r in page
    ]
    return EntriesPage(
        user_id=user_id,
        balance=balance,
        items=items,
        as_of=as_of,
        next_after=items[-1].id if len(rows) > limit else None,
    )


# -- the daily statement ----------------------------------------------------------------------


async def statement(engine: AsyncEngine, day: date) -> Statement:
    """Every entry whose time falls in the UTC `day`, and the check that the day adds up,
    per wallet and in total (see `Statement`)."""
    start = datetime(day.year, day.month, day.day)
    end = start + timedelta(days=1)
    created = entries.c.created_at

    def per_wallet(condition: Any) -> Any:
        return (
            sa.select(entries.c.user_id, sa.func.sum(entries.c.amount))
            .where(condition)
            .group_by(entries.c.user_id)
        )

    lines_query = (
        sa.select(
            entries.c.reference,
            entries.c.user_id,
            entries.c.kind,
            entries.c.amount,
            entries.c.packet_id,
            entries.c.created_at,
        )
        .where(created >= start, created < end)
        .order_by(created, entries.c.id)
    )
    async with snapshot(engine) as (conn, as_of):
        rows = (await conn.execute(lines_query)).all()
        before = {u: int(s) for u, s in await conn.execute(per_wallet(created < start))}
        later = {u: int(s) for u, s in await conn.execute(per_wallet(created >= end))}
        balances = {
            u: int(b)
            for u, b in await conn.execute(sa.select(wallets.c.user_id, wallets.c.balance))
        }
    lines = [
        StatementLine(
            r.reference, r.user_id, r.kind, int(r.amount), r.packet_id, from_db(r.created_at)
        )
        for r in rows
    ]
    day_sum: dict[str, int] = defaultdict(int)
    kinds: dict[str, list[int]] = {}
    for line in lines:
        day_sum[line.user_id] += line.amount
        count_amount = kinds.setdefault(line.kind, [0, 0])
        count_amount[0] += 1
        count_amount[1] += line.amount
    off = []
    for user in sorted(set(before) | set(day_sum) | set(later) | set(balances)):
        at_start = before.get(user, 0)
        at_end = balances.get(user, 0) - later.get(user, 0)
        if at_start + day_sum.get(user, 0) != at_end:
            off.append(WalletMismatch(user, at_start, day_sum.get(user, 0), at_end))
    return Statement(
        day=day,
        lines=lines,
        by_kind=[KindTotal(k, n, a) for k, (n, a) in sorted(kinds.items())],
        start=sum(before.values()),
        entries=sum(day_sum.values()),
        end=sum(balances.values()) - sum(later.values()),
        as_of=as_of,
        wallets_off=off,
    )


# -- the best-luck index ----------------------------------------------------------------------


async def index_best_luck(conn: AsyncConnection, batch: int) -> tuple[int, datetime]:
    """Give up to `batch` finished packets without one their hb_best_luck row, oldest
    first, and move the best-luck mark; how many were given one, and the mark.

    The mark stays `MARK_MARGIN` before the oldest packet that is open or finished without
    a row, and before the clock: every finished packet created before it has its row, and
    so has every packet with a claim before it. A packet finished later cannot have one:
    its claims are after its time, which is after the mark. Run in a write transaction;
    the rows of a finished packet never change, so a row is written once."""
    mark = await conn.scalar(
        sa.select(history_marks.c.at).where(history_marks.c.name == BEST_LUCK_MARK)
    )
    indexed = sa.exists().where(best_luck.c.packet_id == packets.c.id)
    query = sa.select(packets.c.id, packets.c.created_at).where(
        packets.c.status.in_(("exhausted", "expired")), sa.not_(indexed)
    )
    if mark is not None:
        query = query.where(packets.c.created_at >= mark)
    found = (await conn.execute(query.order_by(packets.c.created_at).limit(batch + 1))).all()
    todo = [packet_id for packet_id, _ in found[:batch]]
    if todo:
        best: dict[str, tuple[str, datetime]] = {}
        for chunk in chunks(todo):  # within every database's count of bind parameters
            winners = await conn.execute(
                sa.select(claims.c.packet_id, claims.c.user_id, claims.c.claimed_at)
                .select_from(claims.join(packets, packets.c.id == claims.c.packet_id))
                .where(among(conn, claims.c.packet_id, chunk), _is_best_luck())
            )
            best.update((p, (u, t)) for p, u, t in winners)
        rows = [
            {
                "packet_id": p,
                "user_id": best.get(p, (None, None))[0],
                "claimed_at": best.get(p, (None, None))[1],
            }
            for p in todo
        ]
        await conn.execute(best_luck.insert(), rows)
    oldest_open = await conn.scalar(
        sa.select(sa.func.min(packets.c.created_at)).where(packets.c.status == "active")
    )
    now = (await _ledger_now(conn)).replace(tzinfo=None)
    bounds = [now, oldest_open, found[batch].created_at if len(found) > batch else None]
    new_mark = min(b for b in bounds if b is not None) - MARK_MARGIN
    if mark is None:
        await conn.execute(history_marks.insert().values(name=BEST_LUCK_MARK, at=new_mark))
    elif new_mark != mark:
        await conn.execute(
            history_marks.update().where(history_marks.c.name == BEST_LUCK_MARK).values(at=new_mark)
        )
    return len(todo), new_mark

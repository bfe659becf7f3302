"""Pruning the webhook tables: delivered deliveries older than a cutoff, and then the
events older than it that no delivery refers to any more.

A pending or parked delivery is never pruned, nor its events: it may still be sent. Each
batch is a transaction of its own that reads the ids to delete without locking and then
deletes those rows by primary key, so a prune of millions of rows holds its locks for
one batch at a time and never takes the rows the dispatchers lease (pending ones).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.records import among, chunks, utcnow
from hongbao.ledger.schema import events, webhook_deliveries
from hongbao.ledger.sql import SqlLedger

_D = webhook_deliveries


async def prune(ledger: SqlLedger, older_than: timedelta, batch: int) -> tuple[int, int]:
    """Delete the deliveries delivered more than `older_than` ago, then the events
    created more than `older_than` ago that have no delivery left, at most `batch` rows
    per transaction; returns (deliveries, events) deleted. ValueError, and nothing
    deleted, for an `older_than` that is not positive or a `batch` below 1."""
    if older_than <= timedelta(0):
        raise ValueError(f"older_than must be positive, not {older_than}")
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    cutoff = utcnow() - older_than
    deliveries = 0
    while True:
        found, deleted = await ledger.transaction(
            partial(_delete_deliveries, cutoff=cutoff, batch=batch)
        )
        deliveries += deleted
        if found < batch:
            break
    deleted_events, after = 0, 0
    while True:
        found, deleted, after = await ledger.transaction(
            partial(_delete_events, cutoff=cutoff, after=after, batch=batch)
        )
        deleted_events += deleted
        if found < batch:
            break
    return deliveries, deleted_events


async def _delete_deliveries(
    conn: AsyncConnection, cutoff: datetime, batch: int
) -> tuple[int, int]:
    """Find up to `batch` deliveries delivered before `cutoff` and delete them; returns
    (found, deleted): fewer are deleted when another prune deleted some first."""
    query = (
        sa.select(_D.c.id)
        .where(
            _D.c.status == "delivered",
            # implied by the next condition (a delivery is leased, so sent, only once it
            # is due), and what lets ix_deliveries_due (status, next_attempt_at) find the rows
            _D.c.next_attempt_at < cutoff,
            _D.c.delivered_at < cutoff,
        )
        .limit(batch)
    )
    ids = [int(i) for i in await conn.scalars(query)]
    deleted = 0
    for part in chunks(ids):
        done = await conn.execute(_D.delete().where(among(conn, _D.c.id, part)))
        deleted += int(done.rowcount)
    return len(ids), deleted


async def _delete_events(
    conn: AsyncConnection, cutoff: datetime, after: int, batch: int
) -> tuple[int, int, int]:
    """Find the next `batch` events after seq `after` that were created before `cutoff`
    and have no delivery, and delete them; returns (found, deleted, the last seq found).
    The next batch starts after that seq, so the old events that keep a delivery are
    read once, not in every batch."""
    no_delivery = sa.and_(
        ~sa.exists().where(_D.c.event_id == events.c.id),
        # a delivery names its further events only in `more_event_ids`: none of a subject
        # with a pending or parked delivery that carries several is deleted
        ~sa.exists().where(
            _D.c.status.in_(("pending", "parked")),
            _D.c.subject == events.c.subject,
            _D.c.event_count > 1,
        ),
    )
    query = (
        sa.select(events.c.seq, events.c.id)
        .where(events.c.seq > after, events.c.created_at < cutoff, no_delivery)
        .order_by(events.c.seq)
        .limit(batch)
    )
    rows = (await conn.execute(query)).all()
    deleted = 0
    for part in chunks([r.id for r in rows]):
        done = await conn.execute(
            events.delete().where(among(conn, events.c.id, part), no_delivery)
        )
        deleted += int(done.rowcount)
    return len(rows), deleted, int(rows[-1].seq) if rows else after

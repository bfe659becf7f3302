"""The webhook queue's leases: how dispatchers take deliveries and record what became of
them, inside the caller's transaction (see hongbao.ledger.webhook_store).

Leasing. Deliveries of one (endpoint, subject) go out in id order, one at a time. A
dispatcher takes work in one short transaction: it picks the due *heads*, pending
deliveries with no earlier pending delivery of their (endpoint, subject) and no live
lease, locking them with ``SELECT … FOR UPDATE SKIP LOCKED`` (PostgreSQL, MariaDB;
SQLite's writers are serialized by BEGIN IMMEDIATE, which has the same effect), and
leases each head with the next pending deliveries of its (endpoint, subject), up to a
batch, by writing `leased_until` and `leased_by`. A delivery behind a pending one is
never a head, so no other dispatcher can take a later delivery of a subject while an
earlier one is leased or waiting for its retry. Settling (delivered, retry later,
parked, released) only touches rows the dispatcher still holds (`leased_by`), so one
whose lease ran out and was taken over changes nothing.

A queue whose batch was delivered leases its next deliveries in the transaction that
settles it (`settle_and_lease_next`), under the same rules: only from its first pending
delivery, and only while that one is due and nobody holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.records import among, from_db, to_db, utcnow
from hongbao.ledger.schema import events, webhook_deliveries, webhook_endpoints
from hongbao.ledger.webhook_records import Failure, LeasedDelivery, endpoint_from_row

_D = webhook_deliveries
_E = webhook_endpoints


async def lease(
    conn: AsyncConnection, owner: str, heads: int, batch: int, lease_for: timedelta
) -> list[list[LeasedDelivery]]:
    """Lease up to `heads` (endpoint, subject) queues, up to `batch` deliveries of each,
    in order; one list per queue."""
    now = utcnow()
    chosen = await _due_heads(conn, now, heads)
    return await _lease(conn, owner, now, chosen, batch, lease_for)


async def settle_and_lease_next(
    conn: AsyncConnection,
    owner: str,
    finished: Sequence[tuple[Sequence[tuple[int, int]], LeasedDelivery]],
    batch: int,
    lease_for: timedelta,
) -> list[list[LeasedDelivery]]:
    """Record leased batches as delivered and lease the next deliveries of each one's
    (endpoint, subject), up to `batch`, if they are due and nobody holds them.
    `finished` holds, per queue, its delivered (id, HTTP status) and its last delivery;
    returns the next batch of each, in that order ([] for a queue with none)."""
    delivered = [d for done, _ in finished for d in done]
    await settle(conn, owner, delivered, (), ())
    now = utcnow()
    heads = []
    for _, last in finished:
        head = await _subject_head(conn, now, last.endpoint.id, last.subject)
        if head is not None:
            heads.append(head)
    queues = await _lease(conn, owner, now, sorted(heads), batch, lease_for)
    by_subject = {(q[0].endpoint.id, q[0].subject): q for q in queues}
    return [by_subject.get((last.endpoint.id, last.subject), []) for _, last in finished]


async def _lease(
    conn: AsyncConnection,
    owner: str,
    now: datetime,
    heads: list[int],
    batch: int,
    lease_for: timedelta,
) -> list[list[LeasedDelivery]]:
    """Lease the queues that start at `heads` (see `_queues`) to `owner`."""
    if not heads:
        return []
    queues = await _queues(conn, now, heads, batch)
    ids = [d for queue in queues for d, _ in queue]
    if ids:
        await conn.execute(
            _D.update()
            .where(among(conn, _D.c.id, ids))
            .values(leased_until=now + lease_for, leased_by=owner)
        )
    return await _with_events(conn, queues)


async def settle(
    conn: AsyncConnection,
    owner: str,
    delivered: Sequence[tuple[int, int]],
    failures: Sequence[Failure],
    released: Sequence[int],
) -> None:
    """Record what `owner` did with deliveries it leased: `delivered` (id, HTTP status),
    failed attempts, and deliveries it gives back unsent (rows it no longer holds stay as
    they are)."""
    now = utcnow()
    mine = _D.c.leased_by == owner
    by_status: dict[int, list[int]] = {}
    for delivery_id, status in delivered:
        by_status.setdefault(status, []).append(delivery_id)
    for status, ids in sorted(by_status.items()):
        await conn.execute(
            _D.update()
            .where(among(conn, _D.c.id, ids), mine)
            .values(
                status="delivered",
                delivered_at=now,
                attempts=_D.c.attempts + 1,
                last_status=status,
                last_error=None,
                leased_until=None,
                leased_by=None,
            )
        )
    for failure in failures:
        retry = failure.next_attempt_at
        await conn.execute(
            _D.update()
            .where(_D.c.id == failure.delivery_id, mine)
            .values(
                status="pending" if retry is not None else "parked",
                attempts=_D.c.attempts + 1,
                next_attempt_at=to_db(retry) if retry is not None else _D.c.next_attempt_at,
                last_status=failure.status,
                last_error=failure.error[:300],
                leased_until=None,
                leased_by=None,
            )
        )
    if released:
        await conn.execute(
            _D.update()
            .where(among(conn, _D.c.id, list(released)), mine)
            .values(leased_until=None, leased_by=None)
        )


async def _subject_head(
    conn: AsyncConnection, now: datetime, endpoint_id: str, subject: str
) -> int | None:
    """The id of the first due, unleased pending delivery of (endpoint, subject), locked
    (None if another dispatcher locks it); `_queues` checks that no earlier one waits."""
    query = (
        sa.select(_D.c.id)
        .where(
            _D.c.endpoint_id == endpoint_id,
            _D.c.subject == subject,
            _D.c.status == "pending",
            _D.c.next_attempt_at <= now,
            sa.or_(_D.c.leased_until.is_(None), _D.c.leased_until < now),
        )
        .order_by(_D.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    )
    head = await conn.scalar(query)
    return None if head is None else int(head)


async def _due_heads(conn: AsyncConnection, now: datetime, limit: int) -> list[int]:
    """The ids of due, unleased deliveries with no earlier pending delivery of their
    (endpoint, subject), oldest first, locked (skipping those another dispatcher locks)."""
    earlier = _D.alias("earlier")
    query = (
        sa.select(_D.c.id)
        .where(
            _D.c.status == "pending",
            _D.c.next_attempt_at <= now,
            sa.or_(_D.c.leased_until.is_(None), _D.c.leased_until < now),
            ~sa.exists().where(
                earlier.c.endpoint_id == _D.c.endpoint_id,
                earlier.c.subject == _D.c.subject,
                earlier.c.status == "pending",
                earlier.c.id < _D.c.id,
            ),
        )
        .order_by(_D.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [int(i) for i in await conn.scalars(query)]


async def _queues(
    conn: AsyncConnection, now: datetime, heads: list[int], batch: int
) -> list[list[tuple[int, str]]]:
    """For each head, it and the pending deliveries after it of its (endpoint, subject),
    while they are due and unleased, at most `batch`: [(delivery id, event id)] each. A
    head that is not its queue's first pending delivery leases nothing. One short read
    per head (an index range of `ix_deliveries_subject`), whatever the backlog."""
    pairs = (
        await conn.execute(
            sa.select(_D.c.id, _D.c.endpoint_id, _D.c.subject).where(among(conn, _D.c.id, heads))
        )
    ).all()
    out: list[list[tuple[int, str]]] = []
    for head in sorted(pairs, key=lambda r: int(r.id)):
        rows = await conn.execute(
            sa.select(_D.c.id, _D.c.event_id, _D.c.next_attempt_at, _D.c.leased_until)
            .where(
                _D.c.endpoint_id == head.endpoint_id,
                _D.c.subject == head.subject,
                _D.c.status == "pending",
            )
            .order_by(_D.c.id)
            .limit(batch)
        )
        queue: list[tuple[int, str]] = []
        for r in rows:
            leased = r.leased_until is not None and r.leased_until >= now
            if (not queue and int(r.id) != int(head.id)) or r.next_attempt_at > now or leased:
                break
            queue.append((int(r.id), r.event_id))
        if queue:
            out.append(queue)
    return out


async def _with_events(
    conn: AsyncConnection, queues: list[list[tuple[int, str]]]
) -> list[list[LeasedDelivery]]:
    ids = [d for queue in queues for d, _ in queue]
    rows = {
        int(r.id): r
        for r in await conn.execute(
            sa.select(
                _D.c.id,
                _D.c.endpoint_id,
                _D.c.subject,
                _D.c.attempts,
                _D.c.created_at,
                _D.c.requeued_at,
                events.c.id.label("event_id"),
                events.c.type,
                events.c.payload,
                events.c.created_at.label("event_created_at"),
            )
            .join(events, events.c.id == _D.c.event_id)
            .where(among(conn, _D.c.id, ids))
        )
    }
    endpoint_ids = sorted({r.endpoint_id for r in rows.values()})
    endpoints = {
        r.id: endpoint_from_row(r)
        for r in await conn.execute(sa.select(_E).where(_E.c.id.in_(endpoint_ids)))
    }
    out: list[list[LeasedDelivery]] = []
    for queue in queues:
        leased = []
        for delivery_id, _ in queue:
            r = rows[delivery_id]
            leased.append(
                LeasedDelivery(
                    id=r.event_id,
                    delivery_id=delivery_id,
                    endpoint=endpoints[r.endpoint_id],
                    subject=r.subject,
                    attempts=int(r.attempts),
                    retry_from=from_db(r.requeued_at or r.created_at),
                    event_type=r.type,
                    payload=r.payload,
                    event_created_at=from_db(r.event_created_at),
                )
            )
        out.append(leased)
    return out

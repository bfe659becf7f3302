"""The webhook queue's leases: how dispatchers take deliveries and record what became of
them, inside the caller's transaction (see hongbao.ledger.webhook_store).

Leasing. Deliveries of one (endpoint, subject) go out in id order, one at a time. A
dispatcher takes work in one short transaction: it picks the due *heads*, pending
deliveries with no earlier pending delivery of their (endpoint, subject) and no live
lease, locking them with ``SELECT … FOR UPDATE SKIP LOCKED`` (PostgreSQL, MariaDB;
SQLite's writers are serialized by BEGIN IMMEDIATE, which has the same effect), and
leases each head with the next pending deliveries of its (endpoint, subject), up to a
batch of events, by writing `leased_until` and `leased_by`. A delivery carries one
event, or several for an endpoint that takes batches (see hongbao.ledger.outbox); it is
leased, sent and settled whole. A delivery behind a pending one is
never a head, so no other dispatcher can take a later delivery of a subject while an
earlier one is leased or waiting for its retry. Settling (delivered, retry later,
parked, released) only touches rows the dispatcher still holds (`leased_by`), so one
whose lease ran out and was taken over changes nothing.

A queue whose batch was delivered leases its next deliveries in the transaction that
settles it (`settle_and_lease_next`), under the same rules: only from its first pending
delivery, and only while that one is due, nobody holds it and no other transaction
locks it (a dispatcher choosing its heads may be about to lease it).

A delivery of more events than its endpoint's `batch_size` (lowered since it was queued)
goes out in several messages; when a dispatcher stops part way through one (its lease
running short, a failure), settling splits the events that got through off into a
delivered delivery of their own, and the delivery keeps the rest, its place in its
queue and its retry window (`Progress`).

Lists of delivery ids go to the database `IN_LIST` at a time (`_parts`): SQLite binds at
most 32,766 variables a statement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.records import among, chunks, from_db, to_db, utcnow
from hongbao.ledger.schema import events, webhook_deliveries, webhook_endpoints
from hongbao.ledger.webhook_records import (
    EndpointRecord,
    Failure,
    LeasedDelivery,
    Progress,
    QueuedEvent,
    endpoint_from_row,
)

_D = webhook_deliveries
_E = webhook_endpoints
#: delivery ids per IN (...) list (see `_parts`)
IN_LIST = 10_000


async def lease(
    conn: AsyncConnection,
    owner: str,
    heads: int,
    batch: int,
    lease_for: timedelta,
    messages: int = 1,
) -> list[list[LeasedDelivery]]:
    """Lease up to `heads` (endpoint, subject) queues, deliveries of each in order until
    they carry `batch` events, or `messages` full messages of their endpoint if that is
    more; one list of deliveries per queue, in order."""
    now = utcnow()
    chosen = await _due_heads(conn, now, heads)
    return await _lease(conn, owner, now, chosen, (batch, messages), lease_for)


async def settle_and_lease_next(
    conn: AsyncConnection,
    owner: str,
    finished: Sequence[tuple[Sequence[tuple[int, int]], LeasedDelivery]],
    batch: int,
    lease_for: timedelta,
    messages: int = 1,
) -> list[list[LeasedDelivery]]:
    """Record leased batches as delivered and lease the next deliveries of each one's
    (endpoint, subject), as `lease` does, if they are due and nobody holds them.
    `finished` holds, per queue, its delivered (id, HTTP status) and its last delivery;
    returns the next batch of each, in that order ([] for a queue with none)."""
    delivered = [d for done, _ in finished for d in done]
    await settle(conn, owner, delivered, (), ())
    now = utcnow()
    heads = []
    for _, last in finished:
        head = await _subject_head(conn, last.endpoint.id, last.subject)
        if head is not None:
            heads.append(head)
    queues = await _lease(conn, owner, now, sorted(heads), (batch, messages), lease_for)
    by_subject = {(q[0].endpoint.id, q[0].subject): q for q in queues}
    return [by_subject.get((last.endpoint.id, last.subject), []) for _, last in finished]


async def _lease(
    conn: AsyncConnection,
    owner: str,
    now: datetime,
    heads: list[int],
    size: tuple[int, int],
    lease_for: timedelta,
) -> list[list[LeasedDelivery]]:
    """Lease the queues that start at `heads` (see `_queues`) to `owner`."""
    if not heads:
        return []
    queues = await _queues(conn, now, heads, size)
    ids = [d.delivery_id for queue in queues for d in queue]
    for part in _parts(conn, ids):
        await conn.execute(
            _D.update()
            .where(among(conn, _D.c.id, part))
            .values(leased_until=now + lease_for, leased_by=owner)
        )
    return queues


async def settle(
    conn: AsyncConnection,
    owner: str,
    delivered: Sequence[tuple[int, int]],
    failures: Sequence[Failure],
    released: Sequence[int],
    progress: Sequence[Progress] = (),
) -> None:
    """Record what `owner` did with deliveries it leased: `delivered` (id, HTTP status),
    failed attempts, deliveries it gives back unsent, and the events a delivery sent in
    part got through (`progress`; the delivery is also among the failed or given back).
    Rows it no longer holds stay as they are."""
    now = utcnow()
    mine = _D.c.leased_by == owner
    for part_sent in progress:
        await _split(conn, owner, now, part_sent)
    by_status: dict[int, list[int]] = {}
    for delivery_id, status in delivered:
        by_status.setdefault(status, []).append(delivery_id)
    for status, ids in sorted(by_status.items()):
        for part in _parts(conn, ids):
            await conn.execute(
                _D.update()
                .where(among(conn, _D.c.id, part), mine)
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
    # the deliveries of a failed message share its outcome: one UPDATE per outcome
    by_outcome: dict[tuple[datetime | None, int | None, str], list[int]] = {}
    for failure in failures:
        outcome = (failure.next_attempt_at, failure.status, failure.error[:300])
        by_outcome.setdefault(outcome, []).append(failure.delivery_id)
    for (retry, answer, error), ids in by_outcome.items():
        for part in _parts(conn, ids):
            await conn.execute(
                _D.update()
                .where(among(conn, _D.c.id, part), mine)
                .values(
                    status="pending" if retry is not None else "parked",
                    attempts=_D.c.attempts + 1,
                    next_attempt_at=to_db(retry) if retry is not None else _D.c.next_attempt_at,
                    last_status=answer,
                    last_error=error,
                    leased_until=None,
                    leased_by=None,
                )
            )
    for part in _parts(conn, list(released)):
        await conn.execute(
            _D.update()
            .where(among(conn, _D.c.id, part), mine)
            .values(leased_until=None, leased_by=None)
        )


async def _split(conn: AsyncConnection, owner: str, now: datetime, progress: Progress) -> None:
    """Split the events a delivery got through off into a new delivered delivery; the
    delivery keeps the others, and its place in its queue, retry window and lease (the
    caller settles it as failed or given back). Nothing if `owner` no longer holds it
    or it no longer starts with those events."""
    rest, sent = progress.rest, progress.delivered
    kept = await conn.execute(
        _D.update()
        .where(_D.c.id == progress.delivery_id, _D.c.leased_by == owner, _D.c.event_id == sent[0])
        .values(event_id=rest[0], more_event_ids=",".join(rest[1:]) or None, event_count=len(rest))
    )
    if kept.rowcount != 1:
        return
    row = (
        await conn.execute(
            sa.select(
                _D.c.endpoint_id,
                _D.c.subject,
                _D.c.attempts,
                _D.c.next_attempt_at,
                _D.c.created_at,
                _D.c.requeued_at,
            ).where(_D.c.id == progress.delivery_id)
        )
    ).one()
    await conn.execute(
        _D.insert().values(
            endpoint_id=row.endpoint_id,
            event_id=sent[0],
            more_event_ids=",".join(sent[1:]) or None,
            event_count=len(sent),
            subject=row.subject,
            status="delivered",
            attempts=row.attempts + 1,
            next_attempt_at=row.next_attempt_at,
            last_status=progress.status,
            delivered_at=now,
            created_at=row.created_at,
            requeued_at=row.requeued_at,
        )
    )


def _parts(conn: AsyncConnection, ids: Sequence[int]) -> Iterable[Sequence[int]]:
    """`ids` in lists for `among`, each bound within one statement's limit: all at once
    on PostgreSQL, which binds them as one array, else `IN_LIST` at a time (SQLite
    binds at most 32,766 variables a statement as built upstream, and a lease of a long
    backlog, or a settle of many queues together, names more deliveries than that)."""
    if conn.dialect.name == "postgresql":
        return [ids] if ids else []
    return chunks(ids, IN_LIST)


async def _subject_head(conn: AsyncConnection, endpoint_id: str, subject: str) -> int | None:
    """The id of the first pending delivery of (endpoint, subject), locked; None if
    there is none, or if another transaction locks it (a dispatcher choosing its heads
    may lease it): the queue then waits for a poll, never flows on from a later
    delivery past it. `_queues` leases from it only if it is due and unleased. Two index
    probes (one on SQLite, whose writers hold the whole database): the first unlocked
    pending delivery, then whether an earlier one waits; the due and lease conditions
    are left out, since SQLite would rather walk every due delivery in
    `ix_deliveries_due` to apply them."""
    queue = (_D.c.status == "pending", _D.c.endpoint_id == endpoint_id, _D.c.subject == subject)
    query = sa.select(_D.c.id).where(*queue).order_by(_D.c.id).limit(1)
    head = await conn.scalar(query.with_for_update(skip_locked=True))
    if head is None or conn.dialect.name == "sqlite":
        return None if head is None else int(head)  # SQLite locks no row: head is first
    # SKIP LOCKED passed over any earlier pending delivery that another transaction
    # locks; this read does not lock, so it sees that one still pending
    earlier = await conn.scalar(sa.select(_D.c.id).where(*queue, _D.c.id < head).limit(1))
    return int(head) if earlier is None else None


def _queue_heads() -> sa.CTE:
    """The first pending delivery of each (endpoint, subject) that has one: (id,
    endpoint_id, subject). A recursive walk of `ix_deliveries_queue` that steps from one
    subject's first pending delivery to the next subject's, one index probe a subject,
    however many deliveries wait behind each."""
    pending = _D.c.status == "pending"
    first = (
        sa.select(_D.c.id, _D.c.endpoint_id, _D.c.subject)
        .where(pending)
        .order_by(_D.c.endpoint_id, _D.c.subject, _D.c.id)
        .limit(1)
        .subquery("first")
    )
    heads = sa.select(first.c.id, first.c.endpoint_id, first.c.subject).cte("heads", recursive=True)
    h = heads.alias("h")
    n = _D.alias("n")
    # the next subject: a later one of the same endpoint, or the first of a later
    # endpoint (two probes, where one row comparison would not use the index on SQLite)
    same_endpoint = (
        sa.select(n.c.id)
        .where(
            n.c.status == "pending", n.c.endpoint_id == h.c.endpoint_id, n.c.subject > h.c.subject
        )
        .order_by(n.c.subject, n.c.id)
        .limit(1)
        .correlate(h)
        .scalar_subquery()
    )
    later_endpoint = (
        sa.select(n.c.id)
        .where(n.c.status == "pending", n.c.endpoint_id > h.c.endpoint_id)
        .order_by(n.c.endpoint_id, n.c.subject, n.c.id)
        .limit(1)
        .correlate(h)
        .scalar_subquery()
    )
    d = _D.alias("d")
    step = sa.select(d.c.id, d.c.endpoint_id, d.c.subject).select_from(
        h.join(d, d.c.id == sa.func.coalesce(same_endpoint, later_endpoint))
    )
    return heads.union_all(step)


def _due(now: Any) -> tuple[sa.ColumnElement[bool], ...]:
    """A delivery is due at `now` and nobody holds it."""
    return (
        _D.c.next_attempt_at <= now,
        sa.or_(_D.c.leased_until.is_(None), _D.c.leased_until < now),
    )


def _due_queue_heads() -> sa.Select[Any]:
    """`_queue_heads` that are due at :now and unleased, oldest first, at most :limit.
    Built once: the dispatcher asks at every poll."""
    heads = _queue_heads()
    return (
        sa.select(_D.c.id)
        .join(heads, heads.c.id == _D.c.id)
        .where(*_due(sa.bindparam("now", type_=_D.c.next_attempt_at.type)))
        .order_by(_D.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )


_DUE_QUEUE_HEADS = _due_queue_heads()


async def _due_heads(conn: AsyncConnection, now: datetime, limit: int) -> list[int]:
    """The ids of due, unleased deliveries with no earlier pending delivery of their
    (endpoint, subject), oldest first, locked (skipping those another dispatcher locks)."""
    candidates = [
        int(i) for i in await conn.scalars(_DUE_QUEUE_HEADS, {"now": now, "limit": limit})
    ]
    if not candidates:
        return []
    locked = (
        sa.select(_D.c.id)
        .where(among(conn, _D.c.id, candidates), _D.c.status == "pending", *_due(now))
        .order_by(_D.c.id)
        .with_for_update(skip_locked=True)
    )
    return [int(i) for i in await conn.scalars(locked)]


async def _queues(
    conn: AsyncConnection, now: datetime, heads: list[int], size: tuple[int, int]
) -> list[list[LeasedDelivery]]:
    """For each head, it and the pending deliveries after it of its (endpoint, subject),
    while they are due and unleased, until they carry `batch` events or `messages` full
    messages of their endpoint (`size` is (batch, messages)), each with its events in
    order. A head that is not its queue's first pending delivery leases nothing. A
    short read or two per head (an index range of `ix_deliveries_queue`, each row joined
    to its first event by key), and one read of the further events of all of them."""
    pairs = (
        await conn.execute(
            sa.select(_D.c.id, _D.c.endpoint_id, _D.c.subject).where(among(conn, _D.c.id, heads))
        )
    ).all()
    endpoint_ids = sorted({r.endpoint_id for r in pairs})
    endpoints = {
        r.id: endpoint_from_row(r)
        for r in await conn.execute(sa.select(_E).where(_E.c.id.in_(endpoint_ids)))
    }
    taken: list[tuple[Any, list[Any]]] = []
    for head in sorted(pairs, key=lambda r: int(r.id)):
        batch_size = endpoints[head.endpoint_id].batch_size
        batch, messages = size
        queue = await _due_rows(conn, now, head, batch_size, max(batch, messages * batch_size))
        if queue:
            taken.append((head, queue))
    further = [r.more_event_ids for _, queue in taken for r in queue if r.more_event_ids]
    more = await _more_events(conn, [i for ids in further for i in ids.split(",")])
    times: dict[datetime, datetime] = {}
    return [
        [_leased(r, endpoints[head.endpoint_id], head.subject, more, times) for r in queue]
        for head, queue in taken
    ]


async def _due_rows(
    conn: AsyncConnection, now: datetime, head: Any, batch_size: int, batch: int
) -> list[Any]:
    """The rows of `head`'s queue from it on while they are due and unleased, until they
    carry `batch` events or more. Read in steps sized for full deliveries (`batch_size`
    events each), so a queue of full deliveries reads no row it does not lease, and one
    of smaller ones reads on while there is room."""
    taken: list[Any] = []
    events_taken, from_id = 0, int(head.id)
    limit = max(1, batch // batch_size)
    while events_taken < batch:
        params = {
            "endpoint_id": head.endpoint_id,
            "subject": head.subject,
            "from_id": from_id,
            "batch": limit,
        }
        rows = (await conn.execute(_QUEUE_WITH_EVENTS, params)).all()
        for r in rows:
            leased = r.leased_until is not None and r.leased_until >= now
            first = not taken and int(r.id) != int(head.id)
            if first or r.next_attempt_at > now or leased or events_taken >= batch:
                return taken
            taken.append(r)
            events_taken += int(r.event_count)
        if len(rows) < limit:
            return taken
        from_id, limit = int(rows[-1].id) + 1, batch - events_taken
    return taken


def _leased(
    row: Any,
    endpoint: EndpointRecord,
    subject: str,
    more: dict[str, Any],
    times: dict[datetime, datetime],
) -> LeasedDelivery:
    """A leased delivery row with its events in order: the first read with the row, the
    others from `more` (event id -> row). `times` converts each commit time once: a
    delivery's events share theirs."""
    carried = [(row.event_id, row.type, row.payload, row.event_created_at)]
    if row.more_event_ids:
        carried.extend(more[i] for i in row.more_event_ids.split(","))
    return LeasedDelivery(
        delivery_id=int(row.id),
        endpoint=endpoint,
        subject=subject,
        attempts=int(row.attempts),
        retry_from=from_db(row.requeued_at or row.created_at),
        events=tuple(
            QueuedEvent(
                event_id,
                event_type,
                payload,
                times[at] if at in times else times.setdefault(at, from_db(at)),
            )
            for event_id, event_type, payload, at in carried
        ),
    )


async def _more_events(conn: AsyncConnection, ids: list[str]) -> dict[str, Any]:
    """Event id -> (id, type, payload, created_at), of the events `ids`."""
    found: dict[str, Any] = {}
    for part in chunks(ids):
        rows = await conn.execute(
            sa.select(events.c.id, events.c.type, events.c.payload, events.c.created_at).where(
                among(conn, events.c.id, part)
            )
        )
        found.update((r[0], r) for r in rows)
    return found


def _queue_with_events() -> sa.Select[Any]:
    """The pending deliveries of :endpoint_id and :subject from :from_id on, in id order,
    at most :batch, each with its first event. Built once: every lease asks it for every queue."""
    return (
        sa.select(
            _D.c.id,
            _D.c.next_attempt_at,
            _D.c.leased_until,
            _D.c.attempts,
            _D.c.created_at,
            _D.c.requeued_at,
            _D.c.more_event_ids,
            _D.c.event_count,
            events.c.id.label("event_id"),
            events.c.type,
            events.c.payload,
            events.c.created_at.label("event_created_at"),
        )
        .join(events, events.c.id == _D.c.event_id)
        .where(
            _D.c.endpoint_id == sa.bindparam("endpoint_id", type_=_D.c.endpoint_id.type),
            _D.c.subject == sa.bindparam("subject", type_=_D.c.subject.type),
            _D.c.status == "pending",
            _D.c.id >= sa.bindparam("from_id", type_=_D.c.id.type),
        )
        .order_by(_D.c.id)
        .limit(sa.bindparam("batch", type_=sa.Integer))
    )


_QUEUE_WITH_EVENTS = _queue_with_events()

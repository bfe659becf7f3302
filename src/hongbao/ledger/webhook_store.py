"""Webhook endpoints and the delivery queue in SQL: what the dispatcher (hongbao.webhooks)
and the operator's commands read and change.

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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.records import among, from_db, to_db, utcnow
from hongbao.ledger.schema import events, webhook_deliveries, webhook_endpoints
from hongbao.ledger.sql import SqlLedger
from hongbao.ledger.webhook_prune import prune

_D = webhook_deliveries
_E = webhook_endpoints
#: the deliveries an operator sees as failed: parked, or pending after a failed attempt
_FAILED = sa.or_(_D.c.status == "parked", sa.and_(_D.c.status == "pending", _D.c.attempts > 0))


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    id: str
    url: str
    event_types: tuple[str, ...]
    secret: str
    previous_secret: str | None
    previous_secret_until: datetime | None
    enabled: bool
    disabled_reason: str | None
    created_at: datetime

    def signing_secrets(self, now: datetime) -> tuple[str, ...]:
        """The secrets that sign a message sent at `now`: the current one, and the one
        before the last rotation until it expires."""
        if self.previous_secret and self.previous_secret_until and now < self.previous_secret_until:
            return (self.secret, self.previous_secret)
        return (self.secret,)


@dataclass(frozen=True, slots=True)
class LeasedDelivery:
    """A delivery a dispatcher holds, with its event and where it goes."""

    id: str
    delivery_id: int
    endpoint: EndpointRecord
    subject: str
    attempts: int
    #: when the retry window started: the event's commit, or an operator's requeue
    retry_from: datetime
    event_type: str
    #: the event's JSON payload, as stored
    payload: str
    event_created_at: datetime


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: retry at `next_attempt_at`, or park (None)."""

    delivery_id: int
    status: int | None
    error: str
    next_attempt_at: datetime | None


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """A delivery as the operator's commands show it."""

    id: int
    endpoint_id: str
    url: str
    event_id: str
    event_type: str
    subject: str
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class QueueStats:
    pending: int
    delivered: int
    parked: int
    #: pending deliveries whose last attempt failed
    failing: int
    #: when the oldest pending delivery was created (None: nothing pending)
    oldest_pending: datetime | None


def _endpoint(row: sa.Row[tuple[object, ...]]) -> EndpointRecord:
    m = row._mapping
    until = m["previous_secret_until"]
    return EndpointRecord(
        id=m["id"],
        url=m["url"],
        event_types=tuple(json.loads(m["event_types"])),
        secret=m["secret"],
        previous_secret=m["previous_secret"],
        previous_secret_until=from_db(until) if until is not None else None,
        enabled=bool(m["enabled"]),
        disabled_reason=m["disabled_reason"],
        created_at=from_db(m["created_at"]),
    )


class WebhookStore:
    """The webhook tables of one ledger."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger

    # -- endpoints ---------------------------------------------------------------------------

    async def create_endpoint(
        self, endpoint_id: str, url: str, event_types: Sequence[str], secret: str
    ) -> EndpointRecord:
        now = utcnow()

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                _E.insert().values(
                    id=endpoint_id,
                    url=url,
                    event_types=json.dumps(list(event_types)),
                    secret=secret,
                    enabled=True,
                    created_at=now,
                )
            )

        await self.ledger.transaction(work)
        found = await self.endpoint(endpoint_id)
        assert found is not None
        return found

    async def endpoints(self) -> list[EndpointRecord]:
        async def work(conn: AsyncConnection) -> list[EndpointRecord]:
            rows = await conn.execute(sa.select(_E).order_by(_E.c.created_at, _E.c.id))
            return [_endpoint(r) for r in rows]

        return await self.ledger.read(work)

    async def endpoint(self, endpoint_id: str) -> EndpointRecord | None:
        async def work(conn: AsyncConnection) -> EndpointRecord | None:
            row = (await conn.execute(sa.select(_E).where(_E.c.id == endpoint_id))).first()
            return None if row is None else _endpoint(row)

        return await self.ledger.read(work)

    async def delete_endpoint(self, endpoint_id: str) -> bool:
        """Remove an endpoint and its deliveries (the events stay); False if unknown."""

        async def work(conn: AsyncConnection) -> bool:
            await conn.execute(_D.delete().where(_D.c.endpoint_id == endpoint_id))
            gone = await conn.execute(_E.delete().where(_E.c.id == endpoint_id))
            return gone.rowcount == 1

        return await self.ledger.transaction(work)

    async def rotate_secret(
        self, endpoint_id: str, secret: str, previous_valid_for: timedelta
    ) -> EndpointRecord | None:
        """Sign with `secret` from now on, and with the current secret too for
        `previous_valid_for`; None if there is no such endpoint."""

        async def work(conn: AsyncConnection) -> int:
            # read first: MySQL evaluates SET left to right, so `previous_secret = secret`
            # could see the new secret
            current = await conn.scalar(
                sa.select(_E.c.secret).where(_E.c.id == endpoint_id).with_for_update()
            )
            if current is None:
                return 0
            await conn.execute(
                _E.update()
                .where(_E.c.id == endpoint_id)
                .values(
                    previous_secret=current,
                    previous_secret_until=utcnow() + previous_valid_for,
                    secret=secret,
                )
            )
            return 1

        if not await self.ledger.transaction(work):
            return None
        return await self.endpoint(endpoint_id)

    async def disable_endpoint(self, endpoint_id: str, reason: str) -> None:
        """Stop an endpoint: it receives no new event, and its pending deliveries are
        parked (an operator may retry them once it is enabled again)."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                _E.update()
                .where(_E.c.id == endpoint_id)
                .values(enabled=False, disabled_reason=reason[:200])
            )
            await conn.execute(
                _D.update()
                .where(_D.c.endpoint_id == endpoint_id, _D.c.status == "pending")
                .values(
                    status="parked",
                    leased_until=None,
                    leased_by=None,
                    last_error=f"endpoint disabled: {reason}"[:300],
                )
            )

        await self.ledger.transaction(work)

    async def enable_endpoint(self, endpoint_id: str) -> EndpointRecord | None:
        """Let a disabled endpoint receive events again (an enabled one stays as it is);
        None if there is no such endpoint. Its parked deliveries stay parked: an operator
        sends them again with `retry`, once the receiver takes them."""

        async def work(conn: AsyncConnection) -> None:
            await conn.execute(
                _E.update().where(_E.c.id == endpoint_id).values(enabled=True, disabled_reason=None)
            )

        await self.ledger.transaction(work)
        return await self.endpoint(endpoint_id)

    # -- the dispatcher ----------------------------------------------------------------------

    async def lease(
        self, owner: str, *, heads: int, batch: int, lease_for: timedelta
    ) -> list[list[LeasedDelivery]]:
        """Lease up to `heads` (endpoint, subject) queues, up to `batch` deliveries of
        each, in order; one list per queue."""

        async def work(conn: AsyncConnection) -> list[list[LeasedDelivery]]:
            now = utcnow()
            chosen = await _due_heads(conn, now, heads)
            return await _lease(conn, owner, now, chosen, batch, lease_for)

        return await self.ledger.transaction(work)

    async def settle(
        self,
        owner: str,
        delivered: Sequence[tuple[int, int]],
        failures: Sequence[Failure],
        released: Sequence[int],
    ) -> None:
        """Record what a dispatcher did with deliveries it leased: `delivered` (id, HTTP
        status), failed attempts, and deliveries it gives back unsent."""

        async def work(conn: AsyncConnection) -> None:
            await _settle(conn, owner, delivered, failures, released)

        await self.ledger.transaction(work)

    async def settle_and_lease_next(
        self,
        owner: str,
        finished: Sequence[tuple[Sequence[tuple[int, int]], LeasedDelivery]],
        *,
        batch: int,
        lease_for: timedelta,
    ) -> list[list[LeasedDelivery]]:
        """Record leased batches as delivered and, in the same transaction, lease the
        next deliveries of each one's (endpoint, subject), up to `batch`, if they are due
        and nobody holds them. `finished` holds, per queue, its delivered (id, HTTP
        status) and its last delivery; returns the next batch of each, in that order
        ([] for a queue with none)."""

        async def work(conn: AsyncConnection) -> list[list[LeasedDelivery]]:
            delivered = [d for done, _ in finished for d in done]
            await _settle(conn, owner, delivered, (), ())
            now = utcnow()
            heads = []
            for _, last in finished:
                head = await _subject_head(conn, now, last.endpoint.id, last.subject)
                if head is not None:
                    heads.append(head)
            queues = await _lease(conn, owner, now, sorted(heads), batch, lease_for)
            by_subject = {(q[0].endpoint.id, q[0].subject): q for q in queues}
            return [by_subject.get((last.endpoint.id, last.subject), []) for _, last in finished]

        return await self.ledger.transaction(work)

    # -- operators and metrics ---------------------------------------------------------------

    async def stats(self) -> QueueStats:
        async def work(conn: AsyncConnection) -> QueueStats:
            counts = dict.fromkeys(("pending", "delivered", "parked"), 0)
            rows = await conn.execute(sa.select(_D.c.status, sa.func.count()).group_by(_D.c.status))
            for status, count in rows:
                counts[status] = int(count)
            failing, oldest = (
                await conn.execute(
                    sa.select(
                        sa.func.sum(sa.case((_D.c.attempts > 0, 1), else_=0)),
                        sa.func.min(_D.c.created_at),
                    ).where(_D.c.status == "pending")
                )
            ).one()
            return QueueStats(
                counts["pending"],
                counts["delivered"],
                counts["parked"],
                int(failing or 0),
                from_db(oldest) if oldest is not None else None,
            )

        return await self.ledger.read(work)

    async def failed(self, limit: int = 100) -> list[DeliveryRow]:
        """Parked deliveries and pending ones whose last attempt failed, oldest first."""

        async def work(conn: AsyncConnection) -> list[DeliveryRow]:
            query = (
                sa.select(
                    _D.c.id,
                    _D.c.endpoint_id,
                    _E.c.url,
                    _D.c.event_id,
                    events.c.type,
                    _D.c.subject,
                    _D.c.status,
                    _D.c.attempts,
                    _D.c.next_attempt_at,
                    _D.c.last_status,
                    _D.c.last_error,
                    _D.c.created_at,
                )
                .join(_E, _E.c.id == _D.c.endpoint_id)
                .join(events, events.c.id == _D.c.event_id)
                .where(_FAILED)
                .order_by(_D.c.id)
                .limit(limit)
            )
            return [
                DeliveryRow(
                    int(r.id),
                    r.endpoint_id,
                    r.url,
                    r.event_id,
                    r.type,
                    r.subject,
                    r.status,
                    int(r.attempts),
                    from_db(r.next_attempt_at),
                    r.last_status,
                    r.last_error,
                    from_db(r.created_at),
                )
                for r in await conn.execute(query)
            ]

        return await self.ledger.read(work)

    async def retry(self, delivery_id: int | None = None) -> int:
        """Put a parked or failing delivery (None: every one) back in the queue, due now,
        with a fresh retry window; returns how many. A delivery of a disabled endpoint
        stays parked until the endpoint is enabled again."""

        async def work(conn: AsyncConnection) -> int:
            now = utcnow()
            enabled = sa.select(_E.c.id).where(_E.c.enabled.is_(True))
            query = _D.update().where(
                _FAILED,
                _D.c.endpoint_id.in_(enabled.scalar_subquery()),
            )
            if delivery_id is not None:
                query = query.where(_D.c.id == delivery_id)
            done = await conn.execute(
                query.values(
                    status="pending",
                    next_attempt_at=now,
                    requeued_at=now,
                    leased_until=None,
                    leased_by=None,
                )
            )
            return int(done.rowcount)

        return await self.ledger.transaction(work)

    async def prune(self, older_than: timedelta, batch: int = 5_000) -> tuple[int, int]:
        """Delete the deliveries delivered more than `older_than` ago, then the events as
        old that no delivery refers to (never one with a pending or parked delivery),
        `batch` rows per transaction; returns (deliveries, events) deleted. ValueError,
        and nothing deleted, for an `older_than` that is not positive or a `batch` below
        1. See hongbao.ledger.webhook_prune."""
        return await prune(self.ledger, older_than, batch)


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


async def _settle(
    conn: AsyncConnection,
    owner: str,
    delivered: Sequence[tuple[int, int]],
    failures: Sequence[Failure],
    released: Sequence[int],
) -> None:
    """Record the outcome of deliveries `owner` holds (rows it no longer holds stay as
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
        r.id: _endpoint(r)
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

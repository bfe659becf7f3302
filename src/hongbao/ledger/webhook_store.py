"""Webhook endpoints and the delivery queue in SQL: what the dispatcher (hongbao.webhooks)
and the operator's commands read and change.

The dispatcher's leases are in hongbao.ledger.webhook_leases, the rows' shapes in
hongbao.ledger.webhook_records, pruning in hongbao.ledger.webhook_prune.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from functools import partial

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger import webhook_leases as leases
from hongbao.ledger.records import from_db, utcnow
from hongbao.ledger.schema import events, webhook_deliveries, webhook_endpoints
from hongbao.ledger.sql import SqlLedger
from hongbao.ledger.webhook_prune import prune
from hongbao.ledger.webhook_records import (
    DeliveryRow,
    EndpointRecord,
    Failure,
    LeasedDelivery,
    Progress,
    QueueStats,
    endpoint_from_row,
)

_D = webhook_deliveries
_E = webhook_endpoints
#: the deliveries an operator sees as failed: parked, or pending after a failed attempt
_FAILED = sa.or_(_D.c.status == "parked", sa.and_(_D.c.status == "pending", _D.c.attempts > 0))


class WebhookStore:
    """The webhook tables of one ledger."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger

    # -- endpoints ---------------------------------------------------------------------------

    async def create_endpoint(
        self,
        endpoint_id: str,
        url: str,
        event_types: Sequence[str],
        secret: str,
        batch_size: int = 1,
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
                    batch_size=batch_size,
                )
            )

        await self.ledger.transaction(work)
        found = await self.endpoint(endpoint_id)
        assert found is not None
        return found

    async def endpoints(self) -> list[EndpointRecord]:
        async def work(conn: AsyncConnection) -> list[EndpointRecord]:
            rows = await conn.execute(sa.select(_E).order_by(_E.c.created_at, _E.c.id))
            return [endpoint_from_row(r) for r in rows]

        return await self.ledger.read(work)

    async def endpoint(self, endpoint_id: str) -> EndpointRecord | None:
        async def work(conn: AsyncConnection) -> EndpointRecord | None:
            row = (await conn.execute(sa.select(_E).where(_E.c.id == endpoint_id))).first()
            return None if row is None else endpoint_from_row(row)

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

    async def update_endpoint(
        self,
        endpoint_id: str,
        *,
        url: str | None = None,
        event_types: Sequence[str] | None = None,
        batch_size: int | None = None,
    ) -> EndpointRecord | None:
        """Change what is given of an endpoint's URL, event types and batch size; None if
        there is no such endpoint. Deliveries already queued keep their events and go to
        the endpoint as it is when they are sent."""
        values: dict[str, object] = {}
        if url is not None:
            values["url"] = url
        if event_types is not None:
            values["event_types"] = json.dumps(list(event_types))
        if batch_size is not None:
            values["batch_size"] = batch_size

        async def work(conn: AsyncConnection) -> bool:
            found = await conn.scalar(
                sa.select(_E.c.id).where(_E.c.id == endpoint_id).with_for_update()
            )
            if found is None:
                return False
            if values:
                await conn.execute(_E.update().where(_E.c.id == endpoint_id).values(**values))
            return True

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
        self, owner: str, *, heads: int, batch: int, lease_for: timedelta, messages: int = 1
    ) -> list[list[LeasedDelivery]]:
        """Lease up to `heads` (endpoint, subject) queues, each until it carries `batch`
        events or `messages` full messages of its endpoint; one list of deliveries per
        queue, in order (see hongbao.ledger.webhook_leases)."""
        return await self.ledger.transaction(
            partial(
                leases.lease,
                owner=owner,
                heads=heads,
                batch=batch,
                lease_for=lease_for,
                messages=messages,
            )
        )

    async def settle(
        self,
        owner: str,
        delivered: Sequence[tuple[int, int]],
        failures: Sequence[Failure],
        released: Sequence[int],
        progress: Sequence[Progress] = (),
    ) -> None:
        """Record what a dispatcher did with deliveries it leased: `delivered` (id, HTTP
        status), failed attempts, deliveries it gives back unsent, and the events that
        got through of a delivery sent in part (see
        hongbao.ledger.webhook_leases.settle)."""
        await self.ledger.transaction(
            partial(
                leases.settle,
                owner=owner,
                delivered=delivered,
                failures=failures,
                released=released,
                progress=progress,
            )
        )

    async def settle_and_lease_next(
        self,
        owner: str,
        finished: Sequence[tuple[Sequence[tuple[int, int]], LeasedDelivery]],
        *,
        batch: int,
        lease_for: timedelta,
        messages: int = 1,
    ) -> list[list[LeasedDelivery]]:
        """Record leased batches as delivered and, in the same transaction, lease the
        next deliveries of each one's (endpoint, subject); see
        hongbao.ledger.webhook_leases.settle_and_lease_next."""
        return await self.ledger.transaction(
            partial(
                leases.settle_and_lease_next,
                owner=owner,
                finished=finished,
                batch=batch,
                lease_for=lease_for,
                messages=messages,
            )
        )

    # -- operators and metrics ---------------------------------------------------------------

    async def stats(self) -> QueueStats:
        async def work(conn: AsyncConnection) -> QueueStats:
            counts = dict.fromkeys(("pending", "delivered", "parked"), 0)
            rows = await conn.execute(
                sa.select(_D.c.status, sa.func.sum(_D.c.event_count)).group_by(_D.c.status)
            )
            for status, count in rows:
                counts[status] = int(count)
            failing, oldest = (
                await conn.execute(
                    sa.select(
                        sa.func.sum(sa.case((_D.c.attempts > 0, _D.c.event_count), else_=0)),
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
                    _D.c.event_count,
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
                    int(r.event_count),
                )
                for r in await conn.execute(query)
            ]

        return await self.ledger.read(work)

    async def retry(self, delivery_id: int | None = None) -> int:
        """Put a parked or failing delivery (None: every one) back in the queue, due now,
        with a fresh retry window; returns how many. A delivery of a disabled endpoint
        stays parked until the endpoint is enabled again, and one a dispatcher holds (a
        failing delivery it leased again and may be sending) is left to it: clearing
        that lease would let another dispatcher send the same delivery at once."""

        async def work(conn: AsyncConnection) -> int:
            now = utcnow()
            enabled = sa.select(_E.c.id).where(_E.c.enabled.is_(True))
            query = _D.update().where(
                _FAILED,
                _D.c.endpoint_id.in_(enabled.scalar_subquery()),
                sa.or_(_D.c.leased_until.is_(None), _D.c.leased_until < now),
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

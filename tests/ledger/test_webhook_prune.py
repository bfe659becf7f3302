"""Pruning the webhook tables: old delivered deliveries go, and then the old events no
delivery refers to; pending and parked deliveries, recent ones and their events stay,
whatever the batch size."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger import SqlLedger
from hongbao.ledger.outbox import OutboxEvent, packet_subject, record_events
from hongbao.ledger.records import utcnow
from hongbao.ledger.schema import events, webhook_deliveries
from hongbao.ledger.webhook_store import WebhookStore
from tests.ledger.test_outbox import add_endpoint
from tests.ledger.test_webhook_leases import emit

MONTH = timedelta(days=30)
OLD = timedelta(days=31)
RECENT = timedelta(days=29)


async def set_deliveries(
    ledger: SqlLedger, packet_id: str, status: str, age: timedelta, endpoint: str | None = None
) -> None:
    """Give the deliveries of a packet (to `endpoint`, or to all) `status`, as if they
    were made, due and (if delivered) delivered `age` ago."""
    then = utcnow() - age
    query = webhook_deliveries.update().where(
        webhook_deliveries.c.subject == packet_subject(packet_id)
    )
    if endpoint is not None:
        query = query.where(webhook_deliveries.c.endpoint_id == endpoint)
    delivered_at = then if status == "delivered" else None
    async with ledger.engine.begin() as conn:
        await conn.execute(
            query.values(
                status=status, created_at=then, next_attempt_at=then, delivered_at=delivered_at
            )
        )


async def set_events_age(ledger: SqlLedger, packet_id: str, age: timedelta) -> None:
    async with ledger.engine.begin() as conn:
        await conn.execute(
            events.update()
            .where(events.c.subject == packet_subject(packet_id))
            .values(created_at=utcnow() - age)
        )


async def age(
    ledger: SqlLedger, packet_id: str, status: str, when: timedelta, endpoint: str | None = None
) -> None:
    """A packet's events made `OLD` ago, and its deliveries as `set_deliveries` says."""
    await set_events_age(ledger, packet_id, OLD)
    await set_deliveries(ledger, packet_id, status, when, endpoint)


async def left(ledger: SqlLedger) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(subject, endpoint, status) of each delivery, and the subject of each event."""
    async with ledger.engine.connect() as conn:
        d = webhook_deliveries.c
        deliveries = await conn.execute(
            sa.select(d.subject, d.endpoint_id, d.status).order_by(d.subject, d.endpoint_id)
        )
        subjects = await conn.scalars(sa.select(events.c.subject).order_by(events.c.seq))
        return [(r.subject, r.endpoint_id, r.status) for r in deliveries], list(subjects)


async def test_prune_deletes_old_delivered_deliveries_and_the_events_left_without_any(
    ledger: SqlLedger,
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    await add_endpoint(ledger, "we_b", ["claim.settled"])
    await add_endpoint(ledger, "we_c", ["packet.exhausted"])
    for packet_id in ("old", "mixed", "parked", "recent", "new"):
        await emit(ledger, packet_id, 1, 1)
    await age(ledger, "old", "delivered", OLD)
    await age(ledger, "mixed", "delivered", OLD, "we_a")
    await set_deliveries(ledger, "mixed", "pending", OLD, "we_b")
    await age(ledger, "parked", "parked", OLD)
    await age(ledger, "recent", "delivered", RECENT)
    await set_deliveries(ledger, "new", "delivered", timedelta(minutes=5))
    # events whose endpoint was removed, and so every delivery with it
    for packet_id in ("orphan-old", "orphan-new"):
        exhausted = OutboxEvent("packet.exhausted", packet_subject(packet_id), {})

        async def work(conn: AsyncConnection, event: OutboxEvent = exhausted) -> int:
            return await record_events(conn, [event])

        await ledger.transaction(work)
    store = WebhookStore(ledger)
    assert await store.delete_endpoint("we_c")
    await set_events_age(ledger, "orphan-old", OLD)

    assert await store.prune(MONTH) == (3, 2)
    deliveries, subjects = await left(ledger)
    assert deliveries == [
        ("packet:mixed", "we_b", "pending"),
        ("packet:new", "we_a", "delivered"),
        ("packet:new", "we_b", "delivered"),
        ("packet:parked", "we_a", "parked"),
        ("packet:parked", "we_b", "parked"),
        ("packet:recent", "we_a", "delivered"),
        ("packet:recent", "we_b", "delivered"),
    ]
    assert subjects == [
        "packet:mixed",
        "packet:parked",
        "packet:recent",
        "packet:new",
        "packet:orphan-new",
    ]
    assert await store.prune(MONTH) == (0, 0)
    stats = await store.stats()
    assert (stats.pending, stats.delivered, stats.parked) == (1, 4, 2)


@pytest.mark.parametrize("batch", [1, 4, 7])
async def test_batches_smaller_than_the_rows_due_delete_all_of_them(
    ledger: SqlLedger, batch: int
) -> None:
    """Old events that keep a delivery lie between those that go, in every batch."""
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    await add_endpoint(ledger, "we_b", ["claim.settled"])
    for n in range(5):
        await emit(ledger, f"done{n}", 1, 3)
        await emit(ledger, f"waiting{n}", 1, 1)
        await age(ledger, f"done{n}", "delivered", OLD)
        await age(ledger, f"waiting{n}", "parked" if n % 2 else "pending", OLD)

    assert await WebhookStore(ledger).prune(MONTH, batch=batch) == (30, 15)
    deliveries, subjects = await left(ledger)
    assert len(deliveries) == 10 and all(d[0].startswith("packet:waiting") for d in deliveries)
    assert subjects == [f"packet:waiting{n}" for n in range(5)]


@pytest.mark.parametrize(
    ("older_than", "batch"),
    [(timedelta(0), 10), (-MONTH, 10), (MONTH, 0), (MONTH, -1)],
)
async def test_a_bad_age_or_batch_deletes_nothing(
    ledger: SqlLedger, older_than: timedelta, batch: int
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    await emit(ledger, "old", 1, 2)
    await age(ledger, "old", "delivered", OLD)
    with pytest.raises(ValueError, match=r"older_than|batch"):
        await WebhookStore(ledger).prune(older_than, batch=batch)
    deliveries, subjects = await left(ledger)
    assert len(deliveries) == 2 and len(subjects) == 2


async def test_the_further_events_of_a_pending_delivery_stay(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"], batch_size=10)
    await emit(ledger, "waiting", 1, 3)  # one delivery of three events
    await emit(ledger, "done", 1, 3)
    await age(ledger, "waiting", "parked", OLD)
    await age(ledger, "done", "delivered", OLD)

    assert await WebhookStore(ledger).prune(MONTH) == (1, 3)
    deliveries, subjects = await left(ledger)
    assert deliveries == [("packet:waiting", "we_a", "parked")]
    assert subjects == ["packet:waiting"] * 3

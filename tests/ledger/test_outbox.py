"""The outbox records an event, and a delivery per subscribed endpoint, in the caller's
transaction, and only for the types some enabled endpoint receives."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger import SqlLedger
from hongbao.ledger.outbox import OutboxEvent, new_event_id, packet_subject, record_events
from hongbao.ledger.records import utcnow
from hongbao.ledger.schema import events, webhook_deliveries, webhook_endpoints


async def add_endpoint(
    ledger: SqlLedger,
    endpoint_id: str,
    types: list[str],
    *,
    enabled: bool = True,
    batch_size: int = 1,
) -> None:
    async with ledger.engine.begin() as conn:
        await conn.execute(
            webhook_endpoints.insert().values(
                id=endpoint_id,
                url="http://127.0.0.1:9/hook",
                event_types=json.dumps(types),
                secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                enabled=enabled,
                created_at=utcnow(),
                batch_size=batch_size,
            )
        )


def settled(packet_id: str, n: int) -> OutboxEvent:
    return OutboxEvent("claim.settled", packet_subject(packet_id), {"packet_id": packet_id, "n": n})


async def counts(ledger: SqlLedger) -> tuple[int, int]:
    async with ledger.engine.connect() as conn:
        n_events = await conn.scalar(sa.select(sa.func.count()).select_from(events))
        n_deliveries = await conn.scalar(sa.select(sa.func.count()).select_from(webhook_deliveries))
    return int(n_events or 0), int(n_deliveries or 0)


def test_event_ids_sort_by_time_and_fit_the_column() -> None:
    first, second = new_event_id(), new_event_id()
    assert first.startswith("evt_") and len(first) == 30
    assert first[:14] <= second[:14]
    assert first != second


async def test_nothing_is_written_without_a_subscriber(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_off", ["claim.settled"], enabled=False)
    await add_endpoint(ledger, "we_other", ["wallet.deposited"])

    async def work(conn: AsyncConnection) -> int:
        return await record_events(conn, [settled("p1", 1)])

    assert await ledger.transaction(work) == 0
    assert await counts(ledger) == (0, 0)


async def test_one_delivery_per_subscribed_endpoint(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled", "packet.exhausted"])
    await add_endpoint(ledger, "we_b", ["claim.settled"])
    batch = [settled("p1", 1), OutboxEvent("packet.exhausted", packet_subject("p1"), {})]

    async def work(conn: AsyncConnection) -> int:
        return await record_events(conn, batch)

    assert await ledger.transaction(work) == 2
    async with ledger.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(webhook_deliveries.c.endpoint_id, webhook_deliveries.c.event_id)
                .where(webhook_deliveries.c.status == "pending")
                .order_by(webhook_deliveries.c.id)
            )
        ).all()
        payload = await conn.scalar(sa.select(events.c.payload).where(events.c.id == batch[0].id))
    assert sorted(rows) == sorted(
        [("we_a", batch[0].id), ("we_b", batch[0].id), ("we_a", batch[1].id)]
    )
    assert json.loads(payload or "") == {"packet_id": "p1", "n": 1}


async def test_a_rolled_back_change_leaves_no_event(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])

    async def work(conn: AsyncConnection) -> int:
        await record_events(conn, [settled("p1", 1)])
        raise RuntimeError("the ledger change failed")

    with pytest.raises(RuntimeError):
        await ledger.transaction(work)
    assert await counts(ledger) == (0, 0)


async def test_an_endpoint_that_takes_batches_gets_a_delivery_per_subject_and_batch(
    ledger: SqlLedger,
) -> None:
    await add_endpoint(ledger, "we_batch", ["claim.settled"], batch_size=3)
    await add_endpoint(ledger, "we_one", ["claim.settled"])
    batch = [settled("p1", n) for n in range(1, 6)]
    batch[1:1] = [settled("p2", 1), settled("p2", 2)]  # subjects interleave in a commit

    async def work(conn: AsyncConnection) -> int:
        return await record_events(conn, batch)

    assert await ledger.transaction(work) == 7
    d = webhook_deliveries.c
    async with ledger.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(
                    d.endpoint_id, d.subject, d.event_id, d.more_event_ids, d.event_count
                ).order_by(d.id)
            )
        ).all()
    by_id = {e.id: (e.subject, e.payload["n"]) for e in batch}

    def carried(row: sa.Row[tuple[str, str, str, str | None, int]]) -> list[tuple[str, int]]:
        ids = [row.event_id, *(row.more_event_ids.split(",") if row.more_event_ids else [])]
        assert row.event_count == len(ids)
        assert {by_id[i][0] for i in ids} == {row.subject}
        return [by_id[i] for i in ids]

    batched = [carried(r) for r in rows if r.endpoint_id == "we_batch"]
    assert batched == [
        [("packet:p1", 1), ("packet:p1", 2), ("packet:p1", 3)],
        [("packet:p1", 4), ("packet:p1", 5)],
        [("packet:p2", 1), ("packet:p2", 2)],
    ]
    singles = [carried(r) for r in rows if r.endpoint_id == "we_one"]
    assert sorted(s for (s,) in singles) == sorted(by_id.values())

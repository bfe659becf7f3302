"""Leases of the webhook queue: a dispatcher holds an (endpoint, subject) queue alone,
in order, and a queue it finished flows on to its next deliveries in the settling
transaction, never past a delivery someone else holds or that is waiting for a retry."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger import SqlLedger
from hongbao.ledger.outbox import record_events
from hongbao.ledger.schema import webhook_deliveries
from hongbao.ledger.webhook_records import Failure, LeasedDelivery, Progress
from hongbao.ledger.webhook_store import WebhookStore
from tests.ledger.test_outbox import add_endpoint, settled

LEASE = timedelta(seconds=30)


async def emit(ledger: SqlLedger, packet_id: str, first: int, count: int) -> None:
    batch = [settled(packet_id, n) for n in range(first, first + count)]

    async def work(conn: AsyncConnection) -> int:
        return await record_events(conn, batch)

    await ledger.transaction(work)


async def go_on(
    store: WebhookStore,
    owner: str,
    delivered: list[tuple[int, int]],
    last: LeasedDelivery,
    batch: int = 3,
) -> list[LeasedDelivery]:
    """Settle one queue's batch and lease its next one."""
    (queue,) = await store.settle_and_lease_next(
        owner, [(delivered, last)], batch=batch, lease_for=LEASE
    )
    return queue


def numbers(queue: list[LeasedDelivery]) -> list[int]:
    """The events' numbers (see `settled`), in order, of a queue's deliveries."""
    return [int(e.payload.split('"n":')[1].rstrip("}")) for d in queue for e in d.events]


async def test_a_queue_is_held_by_one_dispatcher_and_flows_on_in_order(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, 5)
    await emit(ledger, "p2", 1, 2)

    held = await store.lease("a", heads=1, batch=3, lease_for=LEASE)
    assert [numbers(q) for q in held] == [[1, 2, 3]]
    assert held[0][0].subject == "packet:p1"
    # the other dispatcher finds only the other packet's queue
    other = await store.lease("b", heads=10, batch=10, lease_for=LEASE)
    assert [(q[0].subject, numbers(q)) for q in other] == [("packet:p2", [1, 2])]

    await emit(ledger, "p1", 6, 2)
    delivered = [(d.delivery_id, 204) for d in held[0]]
    after = await go_on(store, "a", delivered, held[0][-1])
    assert numbers(after) == [4, 5, 6]
    assert await store.lease("b", heads=10, batch=10, lease_for=LEASE) == []

    # b settles nothing of a's, and a settles the rest
    rest = [(d.delivery_id, 200) for d in after]
    assert await go_on(store, "b", rest, after[-1]) == []
    last = await go_on(store, "a", rest, after[-1])
    assert numbers(last) == [7]
    assert await go_on(store, "a", [(last[0].delivery_id, 200)], last[-1]) == []
    stats = await store.stats()
    assert (stats.pending, stats.delivered) == (2, 7)  # p2's two, still leased by b


async def test_a_queue_does_not_flow_past_a_delivery_waiting_for_its_retry(
    ledger: SqlLedger,
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, 4)
    held = (await store.lease("a", heads=1, batch=2, lease_for=LEASE))[0]
    # the first is delivered, the second fails and waits; the rest stays behind it
    later = datetime.now(UTC) + timedelta(hours=1)
    await store.settle(
        "a",
        [(held[0].delivery_id, 204)],
        [Failure(held[1].delivery_id, 500, "HTTP 500", later)],
        [],
    )
    assert await store.lease("b", heads=10, batch=10, lease_for=LEASE) == []
    assert await go_on(store, "a", [], held[-1], batch=10) == []
    stats = await store.stats()
    assert (stats.pending, stats.delivered, stats.failing) == (3, 1, 1)


async def test_several_queues_flow_on_in_one_transaction(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    store = WebhookStore(ledger)
    for packet_id in ("p1", "p2", "p3"):
        await emit(ledger, packet_id, 1, 3)
    held = await store.lease("a", heads=3, batch=2, lease_for=LEASE)
    assert [(q[0].subject, numbers(q)) for q in held] == [
        ("packet:p1", [1, 2]),
        ("packet:p2", [1, 2]),
        ("packet:p3", [1, 2]),
    ]
    # p2's batch failed and stays held; p3's and p1's are delivered (in that order)
    finished = [([(d.delivery_id, 204) for d in q], q[-1]) for q in (held[2], held[0])]
    nexts = await store.settle_and_lease_next("a", finished, batch=5, lease_for=LEASE)
    assert [(q[0].subject, numbers(q)) for q in nexts] == [("packet:p3", [3]), ("packet:p1", [3])]
    stats = await store.stats()
    assert (stats.pending, stats.delivered) == (5, 4)


async def test_the_heads_of_every_endpoint_and_subject_are_found_oldest_first(
    ledger: SqlLedger,
) -> None:
    for endpoint in ("we_b", "we_a"):
        await add_endpoint(ledger, endpoint, ["claim.settled"])
    store = WebhookStore(ledger)
    for packet_id, count in (("p3", 3), ("p1", 2), ("p2", 4)):
        await emit(ledger, packet_id, 1, count)

    def seen(queues: list[list[LeasedDelivery]]) -> list[tuple[str, str, list[int]]]:
        return [(q[0].endpoint.id, q[0].subject, numbers(q)) for q in queues]

    # p3's events came first: its two queues' heads are the oldest
    first = await store.lease("x", heads=2, batch=1, lease_for=LEASE)
    assert sorted(seen(first)) == [("we_a", "packet:p3", [1]), ("we_b", "packet:p3", [1])]
    # the rest, oldest head first; p3's queues are held, the deliveries behind them no heads
    rest = await store.lease("y", heads=10, batch=10, lease_for=LEASE)
    heads = [q[0].delivery_id for q in [*first, *rest]]
    assert heads == sorted(heads)
    assert sorted(seen(rest)) == [
        ("we_a", "packet:p1", [1, 2]),
        ("we_a", "packet:p2", [1, 2, 3, 4]),
        ("we_b", "packet:p1", [1, 2]),
        ("we_b", "packet:p2", [1, 2, 3, 4]),
    ]
    assert await store.lease("z", heads=10, batch=10, lease_for=LEASE) == []
    # a queue given back is found again, from its head
    await store.settle("x", [], [], [first[0][0].delivery_id])
    again = await store.lease("z", heads=10, batch=10, lease_for=LEASE)
    assert seen(again) == [(first[0][0].endpoint.id, "packet:p3", [1, 2, 3])]


async def test_deliveries_that_carry_several_events_are_leased_whole_up_to_a_batch(
    ledger: SqlLedger,
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"], batch_size=3)
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, 5)  # deliveries [1, 2, 3] and [4, 5]
    for n in (6, 7, 8):  # one event each
        await emit(ledger, "p1", n, 1)
    assert (await store.stats()).pending == 8

    (queue,) = await store.lease("a", heads=1, batch=3, lease_for=LEASE)
    assert numbers(queue) == [1, 2, 3] and len(queue) == 1
    # a delivery that does not fill the batch leaves room for the ones after it
    queue = await go_on(store, "a", [(queue[0].delivery_id, 200)], queue[-1])
    assert numbers(queue) == [4, 5, 6]
    delivered = [(d.delivery_id, 200) for d in queue]
    queue = await go_on(store, "a", delivered, queue[-1], batch=10)
    assert numbers(queue) == [7, 8]
    stats = await store.stats()
    assert (stats.pending, stats.delivered) == (2, 6)


async def test_a_lease_takes_several_full_messages_when_asked(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"], batch_size=3)
    store = WebhookStore(ledger)
    for first in (1, 4, 7):
        await emit(ledger, "p1", first, 3)

    (queue,) = await store.lease("a", heads=1, batch=3, messages=2, lease_for=LEASE)
    assert numbers(queue) == [1, 2, 3, 4, 5, 6]
    (queue,) = await store.settle_and_lease_next(
        "a",
        [([(d.delivery_id, 200) for d in queue], queue[-1])],
        batch=3,
        messages=2,
        lease_for=LEASE,
    )
    assert numbers(queue) == [7, 8, 9]


async def test_an_operators_retry_leaves_a_delivery_a_dispatcher_holds(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, 1)
    await emit(ledger, "p2", 1, 1)
    (first, other) = await store.lease("a", heads=2, batch=1, lease_for=LEASE)
    # both fail once and are due again at once; a leases p1's again and is sending it
    due = datetime.now(UTC) - timedelta(seconds=1)
    await store.settle(
        "a", [], [Failure(q[0].delivery_id, 500, "HTTP 500", due) for q in (first, other)], []
    )
    (held,) = await store.lease("a", heads=1, batch=1, lease_for=LEASE)
    assert held[0].delivery_id == first[0].delivery_id and held[0].attempts == 1
    # only the one nobody holds is put back; the held one is not handed to b
    assert await store.retry() == 1
    assert await store.retry(first[0].delivery_id) == 0
    (taken,) = await store.lease("b", heads=10, batch=10, lease_for=LEASE)
    assert [d.delivery_id for d in taken] == [other[0].delivery_id]
    assert await store.lease("b", heads=10, batch=10, lease_for=LEASE) == []


# SQLite serializes writers: no other transaction can hold one row of it
@pytest.mark.parametrize("sql_url", ["postgres", "mysql"], indirect=True)
async def test_a_queue_flows_on_only_from_its_first_pending_delivery(
    ledger: SqlLedger, sql_url: str
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, 4)
    held = (await store.lease("a", heads=1, batch=2, lease_for=LEASE))[0]
    assert numbers(held) == [1, 2]
    # another transaction (a dispatcher's poll choosing its heads) holds the third
    other = SqlLedger.from_url(sql_url)
    try:
        async with other.engine.connect() as conn:
            await conn.begin()
            third = await conn.scalar(
                sa.select(webhook_deliveries.c.id)
                .where(webhook_deliveries.c.status == "pending")
                .order_by(webhook_deliveries.c.id)
                .offset(2)
                .limit(1)
            )
            locked = await conn.scalar(
                sa.select(webhook_deliveries.c.id)
                .where(webhook_deliveries.c.id == third)
                .with_for_update()
            )
            assert locked == third is not None
            # a flows on from the third or not at all, never from the fourth past it
            delivered = [(d.delivery_id, 204) for d in held]
            assert await go_on(store, "a", delivered, held[-1], batch=10) == []
            await conn.rollback()
    finally:
        await other.aclose()
    (queue,) = await store.lease("b", heads=10, batch=10, lease_for=LEASE)
    assert numbers(queue) == [3, 4]


async def test_the_events_a_delivery_got_through_are_split_off_delivered(
    ledger: SqlLedger,
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"], batch_size=6)
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, 6)  # one delivery of six events
    await emit(ledger, "p1", 7, 1)
    (queue,) = await store.lease("a", heads=1, batch=10, lease_for=LEASE)
    assert numbers(queue) == [1, 2, 3, 4, 5, 6, 7]
    first, last = queue
    ids = [e.id for e in first.events]
    # sent a message at a time (the batch size was lowered to 2): two got through
    # before the lease ran short; b, which does not hold it, changes nothing
    split = Progress(first.delivery_id, 200, tuple(ids[:4]), tuple(ids[4:]))
    await store.settle("b", [], [], [first.delivery_id], [split])
    await store.settle("a", [], [], [first.delivery_id, last.delivery_id], [split])
    stats = await store.stats()
    assert (stats.pending, stats.delivered, stats.failing) == (3, 4, 0)
    (queue,) = await store.lease("b", heads=1, batch=10, lease_for=LEASE)
    assert numbers(queue) == [5, 6, 7]
    assert queue[0].delivery_id == first.delivery_id and queue[0].attempts == 0
    assert queue[0].retry_from == first.retry_from
    # the next message fails after one more got through: the rest waits for its retry
    rest = queue[0]
    later = datetime.now(UTC) + timedelta(hours=1)
    split = Progress(rest.delivery_id, 204, (ids[4],), (ids[5],))
    await store.settle("b", [], [Failure(rest.delivery_id, 500, "HTTP 500", later)], [], [split])
    stats = await store.stats()
    assert (stats.pending, stats.delivered, stats.failing) == (2, 5, 1)
    async with ledger.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(
                    webhook_deliveries.c.status,
                    webhook_deliveries.c.event_id,
                    webhook_deliveries.c.more_event_ids,
                    webhook_deliveries.c.event_count,
                    webhook_deliveries.c.attempts,
                    webhook_deliveries.c.last_status,
                )
                .where(webhook_deliveries.c.event_id.in_(ids))
                .order_by(webhook_deliveries.c.id)
            )
        ).all()
    assert [tuple(r) for r in rows] == [
        ("pending", ids[5], None, 1, 1, 500),
        ("delivered", ids[0], ",".join(ids[1:4]), 4, 1, 200),
        ("delivered", ids[4], None, 1, 1, 204),
    ]

"""Webhooks end to end on each SQL database: the ledger's changes become events in their
own transactions, and the dispatcher delivers them, signed, to a real local receiver
that checks every signature with the `standardwebhooks` library."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import pytest
import sqlalchemy as sa

from hongbao.errors import PacketExhausted
from hongbao.ledger.records import ClaimEvent
from hongbao.ledger.schema import events, webhook_deliveries
from hongbao.ledger.webhook_store import WebhookStore
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.sweeper import Sweeper
from hongbao.webhooks import Dispatcher
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.redis, pytest.mark.integration]

PACKET_TYPES = ["packet.created", "claim.settled", "packet.exhausted"]


@pytest.fixture
def fast_settings(settings: Settings) -> Settings:
    return replace(settings, webhook_poll_interval=0.02, webhook_max_backoff=0.5)


@pytest.fixture
async def workers(
    service: Hongbao, persister: Persister, fast_settings: Settings
) -> AsyncIterator[Dispatcher]:
    """The persister and a dispatcher running until the test ends."""
    stop = asyncio.Event()
    dispatcher = Dispatcher(service.ledger, fast_settings)
    tasks = [asyncio.create_task(persister.run(stop)), asyncio.create_task(dispatcher.run(stop))]
    yield dispatcher
    stop.set()
    await asyncio.gather(*tasks)


async def until(check: Callable[[], Awaitable[bool] | bool], within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while True:
        result = check()
        done = await result if not isinstance(result, bool) else result
        if done:
            return
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.05)


async def delivered_all(store: WebhookStore, count: int) -> bool:
    return (await store.stats()).delivered >= count


async def storm(service: Hongbao, packets: list[str], users: int) -> int:
    """Every user grabs every packet at once (256 at a time); returns the grants."""
    gate = asyncio.Semaphore(256)

    async def one(packet_id: str, user: str) -> int:
        async with gate:
            try:
                return int((await service.grab(packet_id, user)).first)
            except PacketExhausted:
                return 0

    got = await asyncio.gather(*(one(p, f"u{i}") for p in packets for i in range(users)))
    return sum(got)


@pytest.mark.parametrize("batch_size", [1, 50])
async def test_a_storm_arrives_once_per_claim_in_order(
    service: Hongbao, receiver: Receiver, workers: Dispatcher, batch_size: int
) -> None:
    endpoint = await service.webhooks.create(receiver.url, PACKET_TYPES, batch_size=batch_size)
    receiver.secrets = [endpoint.secret]
    await service.deposit("sender", 10 * 20_000)
    packets = [(await service.send("sender", 20_000, 200)).id for _ in range(10)]
    assert await storm(service, packets, 220) == 2_000

    await until(lambda: len(receiver.distinct("claim.settled")) == 2_000)
    await until(lambda: len(receiver.distinct("packet.exhausted")) == 10)
    assert receiver.refused == []
    settled = receiver.distinct("claim.settled")
    # one event per claim, each with what the ledger holds
    ledger_claims = {
        (p, c.user_id, c.share_idx + 1, c.amount)
        for p in packets
        for c in await service.ledger.claims_of(p)
    }
    assert {
        (r.data["packet_id"], r.data["user_id"], r.data["seq"], r.data["amount"])
        for r in settled.values()
    } == ledger_claims
    # a repeat (at least once) carries the same webhook-id and the same event
    for r in receiver.got:
        assert (r.type, r.data) == (receiver.distinct()[r.id].type, receiver.distinct()[r.id].data)
    # per packet, in order: created, the claims by seq, exhausted
    for packet_id in packets:
        order: list[str] = []
        seen: set[str] = set()
        for r in receiver.got:
            if r.data["packet_id"] == packet_id and r.id not in seen:
                seen.add(r.id)
                order.append(r.type if r.type != "claim.settled" else f"seq:{r.data['seq']}")
        assert order == [
            "packet.created",
            *(f"seq:{n}" for n in range(1, 201)),
            "packet.exhausted",
        ]
    assert len(receiver.distinct("packet.created")) == 10
    ids = {message_id for message_id, _ in receiver.messages}
    if batch_size == 1:  # each message is one event, under its own id
        assert ids == set(receiver.distinct())
    else:  # fewer messages, each of several events, none above the endpoint's batch size
        assert all(i.startswith("msg_") for i in ids) and len(ids) < 2_020 / 2
        assert max(n for _, n in receiver.messages) <= batch_size
    # the receiver's 2xx lands before the dispatcher records the delivery
    store = WebhookStore(service.ledger)
    await until(lambda: delivered_all(store, 2_020))
    stats = await store.stats()
    assert (stats.pending, stats.delivered, stats.parked) == (0, 2_020, 0)


async def test_replays_and_ledger_acks_emit_no_second_event(
    service: Hongbao, persister: Persister
) -> None:
    await service.webhooks.create("http://127.0.0.1:9/hook", ["claim.settled", "packet.exhausted"])
    await service.deposit("sender", 300)
    packet = await service.send("sender", 300, 3)
    for user in ("a", "b", "c"):
        await service.grab(packet.id, user)
    await persister.drain()
    async with service.ledger.engine.connect() as conn:
        kinds = list(await conn.scalars(sa.select(events.c.type).order_by(events.c.seq)))
    assert kinds == ["claim.settled"] * 3 + ["packet.exhausted"]
    # the same grants applied again (a persister that died before acknowledging them)
    claims = await service.ledger.claims_of(packet.id)
    again = [ClaimEvent(packet.id, c.share_idx, c.user_id, c.amount, c.claimed_at) for c in claims]
    assert await service.ledger.apply(again) == [None] * 3
    async with service.ledger.engine.connect() as conn:
        assert await conn.scalar(sa.select(sa.func.count()).select_from(events)) == 4


async def test_deposit_send_expiry_and_cancel_report_events(
    service: Hongbao, persister: Persister
) -> None:
    await service.webhooks.create(
        "http://127.0.0.1:9/hook",
        ["wallet.deposited", "packet.created", "packet.expired", "packet.cancelled"],
    )
    await service.deposit("sender", 1_000, reference="d1")
    await service.deposit("sender", 1_000, reference="d1")  # a repeat deposits nothing
    cancelled = await service.send("sender", 300, 3)
    claim = await service.grab(cancelled.id, "a")
    await service.cancel(cancelled.id, "sender")
    expiring = await service.send("sender", 200, 2, expires_in=1)
    await asyncio.sleep(1.1)
    await Sweeper(service).sweep_once()
    await persister.drain()
    async with service.ledger.engine.connect() as conn:
        rows = (
            await conn.execute(sa.select(events.c.type, events.c.payload).order_by(events.c.seq))
        ).all()
        n_deliveries = await conn.scalar(sa.select(sa.func.count()).select_from(webhook_deliveries))
    got = [(t, json.loads(p)) for t, p in rows]
    # the two refunds come from two buckets' streams, in either order
    assert [t for t, _ in got[:3]] == ["wallet.deposited", "packet.created", "packet.created"]
    closed = {t: data for t, data in got[3:]}
    assert got[0][1] == {"user_id": "sender", "amount": 1_000, "balance": 1_000, "actor": None}
    assert got[1][1]["packet_id"] == cancelled.id and got[1][1]["total_amount"] == 300
    assert closed["packet.cancelled"]["packet_id"] == cancelled.id
    assert closed["packet.cancelled"]["refunded_amount"] == 300 - claim.amount
    assert closed["packet.expired"]["packet_id"] == expiring.id
    assert closed["packet.expired"]["refunded_amount"] == 200
    assert closed["packet.expired"]["shares_left"] == 2
    assert n_deliveries == 5

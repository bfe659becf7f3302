"""Four persisters over the same bucket streams, on PostgreSQL and MariaDB.

A batch locks its packets in id order and its wallets in user order, so persisters whose
batches share packets and wallets wait for each other but never deadlock; and every
claim is applied once, even while the same entries are applied again beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import event as sa_event

from hongbao.errors import PacketExhausted
from hongbao.ledger import SqlLedger
from hongbao.ledger.sql import ClaimEvent
from hongbao.persister import Persister, parse_event
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage.redis import Event
from tests.ledger.test_ledger import record

pytestmark = [
    pytest.mark.redis,
    pytest.mark.integration,
    pytest.mark.parametrize(
        "sql_url",
        [
            pytest.param("postgres", marks=pytest.mark.postgres),
            pytest.param("mysql", marks=pytest.mark.mysql),
        ],
        indirect=True,
    ),
]

PACKETS, SHARES, USERS = 6, 150, 250


class Deadlocks:
    """Counts the deadlocks the database reports to the ledger's engine (they are retried,
    so they would otherwise go unseen)."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.seen = 0
        self.engine = ledger.engine.sync_engine
        sa_event.listen(self.engine, "handle_error", self._on_error)

    def _on_error(self, context: Any) -> None:
        if "deadlock" in str(context.original_exception).lower():
            self.seen += 1

    def close(self) -> None:
        sa_event.remove(self.engine, "handle_error", self._on_error)


async def storm(service: Hongbao, packet_ids: list[str]) -> None:
    """Every user grabs every packet, in a shuffled order: users win shares of several
    packets, so batches of different persisters credit the same wallets."""
    attempts = [(p, f"user{u:03d}") for p in packet_ids for u in range(USERS)]
    random.Random(30).shuffle(attempts)
    gate = asyncio.Semaphore(64)

    async def one(packet_id: str, user: str) -> None:
        async with gate:
            with contextlib.suppress(PacketExhausted):
                await service.grab(packet_id, user)

    await asyncio.gather(*(one(p, u) for p, u in attempts))


async def apply_again(service: Hongbao, stop: asyncio.Event) -> int:
    """Apply whatever the streams hold, again and again, beside the persisters (as a
    consumer that took over entries still being applied would): each time, every event
    applies or is a replay."""
    applied = 0
    while not stop.is_set():
        for stream in service.store.streams():
            rows = await service.store.client.xrange(stream, count=60)
            events = [e for i, f in rows for e in parse_event(Event(stream, str(i), dict(f)))]
            if events:
                assert await service.ledger.apply(events) == [None] * len(events)
                applied += len(events)
        await asyncio.sleep(0.01)
    return applied


async def drained(service: Hongbao, seconds: float) -> None:
    """Wait until the persisters have applied and acknowledged every stream entry."""
    for _ in range(int(seconds / 0.05)):
        if not await service.store.backlog():
            return
        await asyncio.sleep(0.05)
    pytest.fail(f"{await service.store.backlog()} stream entries left after {seconds}s")


async def test_four_persisters_apply_every_claim_once(service: Hongbao, settings: Settings) -> None:
    deadlocks = Deadlocks(service.ledger)
    settings = replace(settings, persister_batch=40)
    await service.deposit("sender", PACKETS * SHARES * 100)
    packet_ids = [(await service.send("sender", SHARES * 60, SHARES)).id for _ in range(PACKETS)]
    stop = asyncio.Event()
    persisters = [
        Persister(service.store, service.ledger, settings, consumer=f"persister-{i}")
        for i in range(4)
    ]
    workers = [asyncio.create_task(p.run(stop)) for p in persisters]
    again = asyncio.create_task(apply_again(service, stop))
    await storm(service, packet_ids)
    await drained(service, 120)
    stop.set()
    await asyncio.gather(*workers)
    assert await again > 0
    deadlocks.close()

    assert sum(1 for p in persisters if p.stats.batches) >= 2  # they did share the work
    assert [p.stats.dead_lettered for p in persisters] == [0] * 4
    won: dict[str, int] = defaultdict(int)
    for packet_id in packet_ids:
        in_redis = await service.store.claims(service.store.keys(packet_id))
        in_sql = await service.ledger.claims_of(packet_id)
        assert len(in_sql) == SHARES
        assert {(c.user_id, c.share_idx + 1, c.amount) for c in in_sql} == {
            (u, c.seq, c.amount) for u, c in in_redis.items()
        }
        for user, claim in in_redis.items():
            won[user] += claim.amount
        record = await service.ledger.get_packet(packet_id)
        assert record is not None and record.status == "exhausted"
        assert (record.claimed_count, record.claimed_amount) == (SHARES, SHARES * 60)
    for user, amount in won.items():
        assert await service.ledger.balance(user) == amount
    assert await service.ledger.audit() == []
    assert deadlocks.seen == 0


async def test_batches_on_other_packets_credit_shared_wallets_in_one_order(
    ledger: SqlLedger,
) -> None:
    """Batches that share no packet do not wait on packet locks; they still share
    wallets, which each locks in user order."""
    deadlocks = Deadlocks(ledger)
    users, per_packet, batch = 40, 40, 20
    await ledger.deposit("sender", 8 * per_packet * 10, "fund")
    packet_ids = []
    for _ in range(8):
        made, _ = await ledger.create_packet(
            record("sender", per_packet * 10, per_packet), [10] * per_packet, None
        )
        packet_ids.append(made.id)
    at = datetime.now(UTC)

    async def settle(worker: int) -> None:
        rng = random.Random(worker)
        for n, packet_id in enumerate(packet_ids[worker::4]):
            events = [
                ClaimEvent(packet_id, i, f"user{(i + 7 * n + worker) % users:02d}", 10, at)
                for i in range(per_packet)
            ]
            rng.shuffle(events)
            for start in range(0, per_packet, batch):
                assert await ledger.apply(events[start : start + batch]) == [None] * batch

    await asyncio.gather(*(settle(w) for w in range(4)))
    deadlocks.close()
    assert sum([await ledger.balance(f"user{u:02d}") for u in range(users)]) == 8 * per_packet * 10
    assert await ledger.audit() == []
    assert deadlocks.seen == 0

"""Many grabbers at once: exactly N winners, and SQL ends up equal to Redis.

Runs on each SQL database. The persister is also killed in the middle of its
batches (task cancelled, and a real process SIGKILLed) and restarted.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from collections import Counter
from collections.abc import Sequence

import pytest

from hongbao.domain.models import GrabResult
from hongbao.errors import PacketExhausted
from hongbao.persister import Persister, parse_event
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage.redis import Event

pytestmark = [pytest.mark.redis, pytest.mark.integration]

SHARES, USERS, REPEATS, TOTAL = 1_000, 5_000, 1_000, 100_000


async def storm(service: Hongbao, packet_id: str, seed: int) -> list[GrabResult]:
    """5,000 distinct users plus 1,000 repeated attempts, all at once."""
    rng = random.Random(seed)
    users = [f"user{i}" for i in range(USERS)]
    attempts = users + [rng.choice(users) for _ in range(REPEATS)]
    rng.shuffle(attempts)
    gate = asyncio.Semaphore(256)

    async def one(user: str) -> GrabResult | None:
        async with gate:
            try:
                return await service.grab(packet_id, user)
            except PacketExhausted:
                return None

    answers = await asyncio.gather(*(one(u) for u in attempts))
    return [a for a in answers if a is not None]


async def check_outcome(service: Hongbao, packet_id: str, answers: list[GrabResult]) -> None:
    winners = [a for a in answers if a.first]
    assert len(winners) == SHARES
    assert len({w.user_id for w in winners}) == SHARES
    assert sorted(w.seq for w in winners) == list(range(1, SHARES + 1))
    assert sum(w.amount for w in winners) == TOTAL
    by_user = {w.user_id: w for w in winners}
    for again in (a for a in answers if not a.first):
        assert (again.amount, again.seq) == (
            by_user[again.user_id].amount,
            by_user[again.user_id].seq,
        )
    # the ledger, after the persister drained, equals Redis one for one
    redis_claims = await service.store.claims(service.store.keys(packet_id))
    sql_claims = await service.ledger.claims_of(packet_id)
    assert {(c.user_id, c.share_idx + 1, c.amount) for c in sql_claims} == {
        (u, c.seq, c.amount) for u, c in redis_claims.items()
    }
    assert len(sql_claims) == SHARES
    for w in rng_sample(winners):
        assert (await service.wallet(w.user_id)).balance == w.amount
    assert (await service.wallet("sender")).balance == 0
    record = await service.ledger.get_packet(packet_id)
    assert record is not None and record.status == "exhausted"
    assert (record.claimed_count, record.claimed_amount) == (SHARES, TOTAL)
    assert await service.ledger.audit() == []


def rng_sample(items: list[GrabResult]) -> list[GrabResult]:
    return random.Random(1).sample(items, 100)


async def open_packet(service: Hongbao) -> str:
    await service.deposit("sender", TOTAL)
    packet = await service.send("sender", TOTAL, SHARES)
    return packet.id


async def storm_while_persisting(service: Hongbao, persister: Persister) -> None:
    """The storm with the persister running beside it, then the drain and every check."""
    packet_id = await open_packet(service)
    stop = asyncio.Event()
    worker = asyncio.create_task(persister.run(stop))
    answers = await storm(service, packet_id, seed=1)
    await asyncio.wait_for(persister.drain(), 60)
    stop.set()
    await worker
    await check_outcome(service, packet_id, answers)
    assert persister.stats.dead_lettered == 0


async def test_exactly_n_winners_and_sql_equals_redis(
    service: Hongbao, persister: Persister
) -> None:
    await storm_while_persisting(service, persister)


class Killed(Exception):
    """Stands for the persister dying at a chosen point of a batch."""


class DiesMidBatch(Persister):
    """Reads a batch, then dies before the commit or between the commit and the ack."""

    def __init__(self, *args: object, commit_first: bool, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.commit_first = commit_first

    async def handle(self, events: Sequence[Event]) -> int:
        if not events:
            return 0
        if self.commit_first:
            await self.ledger.apply([le for e in events for le in parse_event(e)])
        raise Killed


@pytest.mark.parametrize("commit_first", [False, True], ids=["before-commit", "before-ack"])
async def test_persister_dies_mid_batch_and_is_replaced(
    service: Hongbao, commit_first: bool
) -> None:
    settings = service.settings
    packet_id = await open_packet(service)
    grabs = asyncio.create_task(storm(service, packet_id, seed=2))
    for kill in range(4):
        await asyncio.sleep(random.Random(kill).uniform(0.05, 0.3))
        doomed = DiesMidBatch(
            service.store,
            service.ledger,
            settings,
            consumer=f"doomed-{kill}",
            commit_first=commit_first,
        )
        with pytest.raises(Killed):
            while True:
                await doomed.step()
    answers = await grabs
    survivor = Persister(service.store, service.ledger, settings, consumer="survivor")
    await asyncio.sleep(settings.persister_claim_idle_ms / 1000)
    await asyncio.wait_for(survivor.drain(), 60)
    assert survivor.stats.reclaimed > 0  # the dead consumers' entries were taken over
    await check_outcome(service, packet_id, answers)


PERSISTER_PROCESS = """
import asyncio, os, sys
from hongbao.ledger import SqlLedger
from hongbao.persister import Persister, parse_event
from hongbao.settings import Settings
from hongbao.storage.redis import Event
from hongbao.storage import store_from_url

async def main():
    settings = Settings(redis_url=sys.argv[1], database_url=sys.argv[2], buckets=4,
                        persister_batch=int(sys.argv[4]), persister_block_ms=20)
    store = store_from_url(settings.redis_url, settings.buckets)
    ledger = SqlLedger.from_url(settings.database_url)
    await Persister(store, ledger, settings, consumer=sys.argv[3]).run(asyncio.Event())

asyncio.run(main())
"""


async def test_persister_process_killed_mid_batch(service: Hongbao, settings: Settings) -> None:
    packet_id = await open_packet(service)
    grabs = asyncio.create_task(storm(service, packet_id, seed=3))
    for round_ in range(4):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PERSISTER_PROCESS,
            settings.redis_url,
            settings.database_url,
            f"proc-{round_}",
            "50",
            stderr=asyncio.subprocess.DEVNULL,
        )
        await asyncio.sleep(0.8 + round_ * 0.3)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    answers = await grabs
    survivor = Persister(service.store, service.ledger, settings, consumer="survivor")
    await asyncio.sleep(settings.persister_claim_idle_ms / 1000)
    await asyncio.wait_for(survivor.drain(), 90)
    await check_outcome(service, packet_id, answers)
    counts = Counter(c.user_id for c in await service.ledger.claims_of(packet_id))
    assert max(counts.values()) == 1

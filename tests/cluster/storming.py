"""A grab storm that keeps going through faults, and the checks that follow it.

Unlike tests/integration/test_concurrency.py's storm (all grabs at once, no
errors expected), this one runs for a while at a steady pace while the test kills
or moves Redis nodes underneath. A grab that fails with StorageError (the service
surfaces the failover window) is retried by its client after a short sleep, as a
real app would. Every answer a client received is an *acknowledged* grab; after
the storm the survivors in Redis and in SQL are compared with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from hongbao.errors import PacketExhausted, StorageError
from hongbao.persister import Persister
from hongbao.service import Hongbao

#: the durability modes every cluster test runs in (`aof` needs WAITAOF: Redis >= 7.2)
ACK_MODES: tuple[str, ...] = ("redis", "ledger")


PACKETS, SHARES, TOTAL = 8, 4_000, 400_000


async def open_packets(service: Hongbao, n: int = PACKETS) -> list[str]:
    """`n` packets of SHARES shares; their ids fall in several buckets."""
    await service.deposit("sender", TOTAL * n)
    return [(await service.send("sender", TOTAL, SHARES)).id for _ in range(n)]


@dataclass
class Acked:
    packet_id: str
    user_id: str
    seq: int
    amount: int
    first: bool
    at: float


@dataclass
class Storm:
    """Grabbers cycling over `packets`; each user grabs each packet once (retrying errors)."""

    service: Hongbao
    packets: list[str]
    workers: int = 32
    pause: float = 0.002
    retry_sleep: float = 0.05
    acked: dict[tuple[str, str], Acked] = field(default_factory=dict)
    exhausted: int = 0
    errors: list[tuple[float, str]] = field(default_factory=list)
    started: float = 0.0
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _next_user: int = 0

    def start(self) -> Storm:
        self.started = time.monotonic()
        self._tasks = [asyncio.create_task(self._worker(i)) for i in range(self.workers)]
        return self

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _worker(self, n: int) -> None:
        while not self._stop.is_set():
            user = f"s{self._next_user}"
            self._next_user += 1
            packet_id = self.packets[self._next_user % len(self.packets)]
            await self._grab_until_answered(packet_id, user)
            await asyncio.sleep(self.pause)

    async def _grab_until_answered(self, packet_id: str, user: str) -> None:
        while True:
            try:
                got = await self.service.grab(packet_id, user)
            except PacketExhausted:
                self.exhausted += 1
                return
            except StorageError as exc:
                self.errors.append((time.monotonic(), str(exc)[:120]))
                if self._stop.is_set():
                    return  # the storm ends: this grab stays unanswered (not acknowledged)
                await asyncio.sleep(self.retry_sleep)
                continue
            self.acked[(packet_id, user)] = Acked(
                packet_id, user, got.seq, got.amount, got.first, time.monotonic()
            )
            return

    def acked_after(self, moment: float) -> int:
        return sum(1 for a in self.acked.values() if a.at > moment)

    def error_window(self) -> float:
        """Seconds between the first and the last StorageError the clients saw."""
        if not self.errors:
            return 0.0
        return self.errors[-1][0] - self.errors[0][0]


@dataclass
class Outcome:
    acked: int
    lost_in_redis: list[Acked]
    lost_in_sql: list[Acked]
    shares_acked_twice: int
    redis_vs_sql: set[tuple[str, str, int, int]]
    problems: list[str]

    @property
    def lost(self) -> int:
        """Acknowledged grabs missing from Redis or from SQL after the failover and drain."""
        return len({(a.packet_id, a.user_id) for a in self.lost_in_redis + self.lost_in_sql})


async def drain(persister: Persister, within: float = 60) -> None:
    """Drain the streams, retrying while the cluster still settles."""
    deadline = time.monotonic() + within
    while True:
        try:
            await asyncio.wait_for(persister.drain(), max(1.0, deadline - time.monotonic()))
            return
        except StorageError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def verify(service: Hongbao, storm: Storm) -> Outcome:
    """Compare what clients were told with Redis and SQL; hard invariants go to `problems`."""
    problems: list[str] = []
    lost_redis: list[Acked] = []
    lost_sql: list[Acked] = []
    twice = 0
    diff: set[tuple[str, str, int, int]] = set()
    for packet_id in storm.packets:
        keys = service.store.keys(packet_id)
        redis_claims = await service.store.claims(keys)
        sql_claims = await service.ledger.claims_of(packet_id)
        shares = dict(await service.ledger.shares_of(packet_id))
        record = await service.ledger.get_packet(packet_id)
        assert record is not None
        # Redis: one user per share, the share's true amount, and the money adds up
        seqs = Counter(c.seq for c in redis_claims.values())
        if dup := [s for s, n in seqs.items() if n > 1]:
            problems.append(f"{packet_id}: Redis gave shares {dup} to several users")
        for user, c in redis_claims.items():
            if shares.get(c.seq - 1) != c.amount:
                problems.append(f"{packet_id}: Redis claim {user} {c} is not share {c.seq}")
        live = await service.store.status(keys)
        if live is None:
            problems.append(f"{packet_id}: gone from Redis")
        elif live.amount_left + sum(c.amount for c in redis_claims.values()) != sum(
            shares.values()
        ):
            problems.append(f"{packet_id}: Redis amount_left + claims != total")
        # SQL: unique (packet, share) and (packet, user)
        if len({c.share_idx for c in sql_claims}) != len(sql_claims):
            problems.append(f"{packet_id}: SQL has a share claimed twice")
        if len({c.user_id for c in sql_claims}) != len(sql_claims):
            problems.append(f"{packet_id}: SQL has a user with two claims")
        sql_set = {(packet_id, c.user_id, c.share_idx + 1, c.amount) for c in sql_claims}
        redis_set = {(packet_id, u, c.seq, c.amount) for u, c in redis_claims.items()}
        diff |= sql_set ^ redis_set
        # what the clients were told
        told: dict[int, set[str]] = defaultdict(set)
        for a in storm.acked.values():
            if a.packet_id != packet_id:
                continue
            told[a.seq].add(a.user_id)
            if (packet_id, a.user_id, a.seq, a.amount) not in redis_set:
                lost_redis.append(a)
            if (packet_id, a.user_id, a.seq, a.amount) not in sql_set:
                lost_sql.append(a)
        twice += sum(1 for users in told.values() if len(users) > 1)
    problems.extend(await service.ledger.audit())
    return Outcome(len(storm.acked), lost_redis, lost_sql, twice, diff, problems)


@contextlib.asynccontextmanager
async def running(persister: Persister) -> AsyncIterator[Persister]:
    stop = asyncio.Event()
    task = asyncio.create_task(persister.run(stop))
    try:
        yield persister
    finally:
        stop.set()
        await task

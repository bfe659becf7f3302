"""Seed 003, design 6 (with seed 002's grab): Redis queue, asynchronous persistence.

Setup writes the small packets to ``seed_redpack`` and LPUSHes them as JSON
``{"id", "money"}`` onto a Redis list. A grab is one EVALSHA of seed 002's script (dedupe
hash, RPOP, LPUSH to the consumed list) and never touches SQL. A persister task (the
seed's UserRedpackPersistConsumer) moves consumed entries with BLMOVE into a backup list
(BRPOPLPUSH semantics), writes a batch in one SQL transaction (detail rows, packet
status, activity surplus), then LREMs them from the backup. Recovery (the seed's
CrashRecoveryThread) runs before the persister starts and after a failed batch: every entry
left in the backup list is checked against the database, written if missing, and removed.
`verify` first drains the consumed queue, then reads the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, cast

import redis.asyncio as aioredis
from sqlalchemy import insert, select, update

from hongbao_bench.designs.base import (
    ACTIVITY_ID,
    DEFAULT_REDIS_URL,
    TAKEN,
    DesignBase,
    SqlStore,
    UsesRedis,
    as_text,
    delete_namespace,
    new_namespace,
    warm_redis,
)
from hongbao_bench.harness import seed002_script


class RedisQueueAsyncDesign(DesignBase, UsesRedis):
    name = "redis_queue_async"

    def __init__(
        self,
        database_url: str,
        redis_url: str = DEFAULT_REDIS_URL,
        *,
        batch: int = 200,
        block_seconds: float = 0.1,
        private_db: bool = True,
        pool_size: int = 4,
    ) -> None:
        super().__init__()
        self.store = SqlStore(database_url, private_db=private_db, pool_size=pool_size)
        self.backend = f"{self.store.dialect}+redis"
        self.redis_url = redis_url
        self.batch = batch
        self.block_seconds = block_seconds
        ns = new_namespace(self.name)
        self._ns = ns
        self._keys = [ns + "hongBaoList", ns + "hongBaoConsumedList", ns + "hongBaoConsumedMap"]
        self._backup = ns + "hongBaoBackupList"
        self._redis: aioredis.Redis | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self.persisted = 0
        self.recovered = 0
        self.persist_errors = 0
        self.first_persist_error: str | None = None
        self.drain_seconds = 0.0

    async def setup(self, shares: list[int]) -> None:
        await self.store.open()
        await self.store.insert_activity(list(shares))
        await self.store.insert_redpacks(list(shares))
        self._redis = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        self._grab = self._redis.register_script(seed002_script())
        packets = [
            json.dumps({"id": i, "money": a}, separators=(",", ":"))
            for i, a in enumerate(shares, start=1)
        ]
        for low in range(0, len(packets), 1_000):
            await self._redis.lpush(self._keys[0], *packets[low : low + 1_000])
        await self.start_persister()
        await warm_redis(self.redis)

    async def grab(self, user_id: int) -> int | None:
        reply = await self._grab(keys=[*self._keys, str(user_id)])
        if reply is None:
            return None
        return int(json.loads(reply)["money"])

    # ------------------------------------------------------------------ persister

    async def start_persister(self) -> None:
        """Recover whatever a crashed persister left in the backup list, then consume."""
        await self.recover()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._consume(), name="seed-persist-consumer")

    async def stop_persister(self, *, drain: bool = True) -> None:
        """drain=True: persist everything queued, then stop; False: stop now (a crash)."""
        if self._task is None:
            return
        task, self._task = self._task, None
        if drain:
            self._stop.set()
            await task
        else:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def recover(self) -> None:
        left = [as_text(x) for x in await self.redis.lrange(self._backup, 0, -1)]
        if left:
            await self._persist(left)
            await self._unbackup(left)
            self.recovered += len(left)

    async def _consume(self) -> None:
        r, consumed = self.redis, self._keys[1]
        while True:
            if self._stop.is_set():
                first = await r.lmove(consumed, self._backup, "RIGHT", "LEFT")
                if first is None:
                    return
            else:
                # Redis >= 6 takes a fractional timeout; redis-py only types it int
                timeout = cast(int, self.block_seconds)
                first = await r.blmove(consumed, self._backup, timeout, "RIGHT", "LEFT")
                if first is None:
                    continue
            items = [as_text(first)]
            while len(items) < self.batch:
                more = await r.lmove(consumed, self._backup, "RIGHT", "LEFT")
                if more is None:
                    break
                items.append(as_text(more))
            try:
                await self._persist(items)
                await self._unbackup(items)
            except Exception as exc:  # stays in the backup list; recovery retries it
                self.persist_errors += 1
                self.first_persist_error = self.first_persist_error or repr(exc)
                await asyncio.sleep(0.1)
                with contextlib.suppress(Exception):
                    await self.recover()

    async def _persist(self, items: list[str]) -> None:
        t = self.store.tables
        packets = {int(p["id"]): p for p in map(json.loads, items)}
        async with self.store.engine.begin() as conn:
            done = set(
                (
                    await conn.execute(
                        select(t.detail.c.redpack_id).where(
                            t.detail.c.activity_id == ACTIVITY_ID,
                            t.detail.c.redpack_id.in_(list(packets)),
                        )
                    )
                ).scalars()
            )
            todo = [p for i, p in packets.items() if i not in done]
            if not todo:
                return
            await conn.execute(
                insert(t.detail),
                [
                    {
                        "activity_id": ACTIVITY_ID,
                        "amount": int(p["money"]),
                        "user_id": int(p["userId"]),
                        "redpack_id": int(p["id"]),
                    }
                    for p in todo
                ],
            )
            await conn.execute(
                update(t.redpack)
                .where(t.redpack.c.id.in_([int(p["id"]) for p in todo]))
                .values(status=TAKEN, version=t.redpack.c.version + 1)
            )
            await conn.execute(
                update(t.activity)
                .where(t.activity.c.id == ACTIVITY_ID)
                .values(
                    surplus_total=t.activity.c.surplus_total - len(todo),
                    surplus_amount=t.activity.c.surplus_amount - sum(int(p["money"]) for p in todo),
                )
            )
        self.persisted += len(todo)

    async def _unbackup(self, items: list[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for item in items:
            pipe.lrem(self._backup, 1, item)
        await pipe.execute()

    # ------------------------------------------------------------------ audit

    async def verify(self) -> dict[int, list[int]]:
        # drain time: until nothing is queued or in flight (LREM follows the SQL commit)
        started = time.perf_counter()
        while self._task is not None and not self._task.done():
            if not await self.redis.llen(self._keys[1]) and not await self.redis.llen(self._backup):
                break
            await asyncio.sleep(0.005)
        self.drain_seconds = time.perf_counter() - started
        await self.stop_persister(drain=True)
        return await self.store.claims()

    async def leftover(self) -> tuple[int, int]:
        return await self.store.activity_left()

    async def stats(self) -> dict[str, Any]:
        rows_left = await self.store.redpacks_left()
        return {
            **await super().stats(),
            "persisted": self.persisted,
            "recovered": self.recovered,
            "persist_errors": self.persist_errors,
            "first_persist_error": self.first_persist_error,
            "drain_seconds": round(self.drain_seconds, 3),
            "redis_left": await self.redis.llen(self._keys[0]),
            "redpack_rows_left": rows_left[0],
            "consumed_queue": await self.redis.llen(self._keys[1]),
            "backup_queue": await self.redis.llen(self._backup),
        }

    async def teardown(self) -> None:
        try:
            await self.stop_persister(drain=False)
            await self.store.close()
        finally:
            if self._redis is not None:
                await delete_namespace(self._redis, self._ns)
                await self._redis.aclose()
                self._redis = None

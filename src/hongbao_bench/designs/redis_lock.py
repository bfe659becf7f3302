"""Seed 003, design 1: a distributed lock per activity, then a plain SQL transaction.

As the seed's spring-integration RedisLockRegistry: a process-local lock per key first
(so one grabber per process talks to Redis), then ``SET key token NX PX ttl`` retried with
backoff until `wait_timeout`, released by a compare-and-delete script so a grabber never
frees a lock that expired and was taken by someone else. Inside the lock: read the
activity row, take share number ``total - surplus_total``, decrement the surplus, insert the
detail row. Everything for one activity runs one grab at a time (so a small SQL pool).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy.exc import IntegrityError

from hongbao_bench.designs.base import (
    ACTIVITY_ID,
    DEFAULT_REDIS_URL,
    SqlDesign,
    SqlStore,
    UsesRedis,
    delete_namespace,
    new_namespace,
    warm_redis,
)

#: KEYS[1] lock key, ARGV[1] owner token; returns 1 when released, 0 when not ours
RELEASE_LUA = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"""


class RedisLockDesign(SqlDesign, UsesRedis):
    name = "redis_lock"

    def __init__(
        self,
        database_url: str,
        redis_url: str = DEFAULT_REDIS_URL,
        *,
        lock_ttl_ms: int = 30_000,
        wait_timeout: float = 10.0,
        local_lock: bool = True,
        backoff_start: float = 0.001,
        backoff_max: float = 0.1,
        private_db: bool = True,
        pool_size: int = 2,
    ) -> None:
        super().__init__()
        self.store = SqlStore(database_url, private_db=private_db, pool_size=pool_size)
        self.backend = f"{self.store.dialect}+redis"
        self.redis_url = redis_url
        self.lock_ttl_ms = lock_ttl_ms
        self.wait_timeout = wait_timeout
        self.backoff = (backoff_start, backoff_max)
        self._local: asyncio.Lock | None = asyncio.Lock() if local_lock else None
        self._redis: aioredis.Redis | None = None
        self._ns = new_namespace(self.name)
        self._lock_key = f"{self._ns}lock:{ACTIVITY_ID}"
        self._shares: list[int] = []
        self.lock_lost = 0

    async def setup(self, shares: list[int]) -> None:
        self._shares = list(shares)
        self._redis = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        self._release = self._redis.register_script(RELEASE_LUA)
        await self.store.open()
        await self.store.insert_activity(self._shares)
        await warm_redis(self.redis)

    async def grab(self, user_id: int) -> int | None:
        deadline = time.monotonic() + self.wait_timeout
        if self._local is None:
            return await self._locked_grab(user_id, deadline)
        try:
            await asyncio.wait_for(self._local.acquire(), self.wait_timeout)
        except TimeoutError:
            self.turned_away += 1
            return None
        try:
            return await self._locked_grab(user_id, deadline)
        finally:
            self._local.release()

    async def _locked_grab(self, user_id: int, deadline: float) -> int | None:
        token = await self._acquire(deadline)
        if token is None:
            self.turned_away += 1
            return None
        try:
            return await self._take(user_id)
        finally:
            if await self._release(keys=[self._lock_key], args=[token]) != 1:
                self.lock_lost += 1

    async def _acquire(self, deadline: float) -> str | None:
        token = uuid.uuid4().hex
        delay = self.backoff[0]
        while True:
            if await self.redis.set(self._lock_key, token, nx=True, px=self.lock_ttl_ms):
                return token
            self.retries_or_conflicts += 1
            if time.monotonic() + delay > deadline:
                return None
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self.backoff[1])

    async def _take(self, user_id: int) -> int | None:
        try:
            async with self.store.engine.begin() as conn:
                return await self.store.take_share(conn, self._shares, user_id)
        except IntegrityError:
            self.unique_violations += 1
            return None

    async def stats(self) -> dict[str, Any]:
        local = self._local is not None
        return {**await super().stats(), "lock_lost": self.lock_lost, "local_lock": local}

    async def teardown(self) -> None:
        try:
            await super().teardown()
        finally:
            if self._redis is not None:
                await delete_namespace(self._redis, self._ns)
                await self._redis.aclose()
                self._redis = None

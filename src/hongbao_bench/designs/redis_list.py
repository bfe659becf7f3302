"""Seed 000: Redis list pop plus an "already grabbed" key, no Lua; flawed on purpose.

The seed's grab, command for command, each a separate round trip:
``GET rob<redId><userId>`` (answered before: return that amount), ``GET totalNum<redId>``
(<= 0: sold out), ``SET <userId> <redId> NX PX`` (its per-user lock; refused when taken),
``RPOP <redId>``, ``DECR totalNum<redId>``, record the grab (the seed's "异步记录" queue:
here an LPUSH to a records list, which `verify` reads), ``SET rob<redId><userId>``,
``DEL <userId>``. The check and the set are not atomic: a user's second click that passes
the GET before the first click's SET, and takes the lock after the first click's DEL, pops
a second share. The harness counts it (duplicates); nothing is hidden.

Fixes of obvious slips in the seed's listing: it sets the count on the list's own key
(``set(redId, size)``) and DECRs ``redId``; here both use ``totalNum<redId>`` as its
reading code does. All keys carry a per-run prefix.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import redis.asyncio as aioredis

from hongbao_bench.designs.base import (
    DEFAULT_REDIS_URL,
    DesignBase,
    UsesRedis,
    as_text,
    delete_namespace,
    new_namespace,
    warm_redis,
)


class RedisListDesign(DesignBase, UsesRedis):
    name = "redis_list"
    backend = "redis"
    supported_backends = frozenset({"redis"})

    def __init__(self, redis_url: str = DEFAULT_REDIS_URL, *, lock_timeout_ms: int = 3_000):
        super().__init__()
        self.redis_url = redis_url
        self.lock_timeout_ms = lock_timeout_ms
        self._ns = new_namespace(self.name)
        self.red_id = "r" + uuid.uuid4().hex[:10]
        self._list = self._ns + self.red_id
        self._count = f"{self._ns}totalNum{self.red_id}"
        self._records = f"{self._ns}records{self.red_id}"
        self._redis: aioredis.Redis | None = None
        self.lock_refused = 0
        self.repeat_answers = 0

    async def setup(self, shares: list[int]) -> None:
        self._redis = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        for low in range(0, len(shares), 1_000):
            await self.redis.lpush(self._list, *shares[low : low + 1_000])
        await self.redis.set(self._count, len(shares))
        await warm_redis(self.redis)

    async def grab(self, user_id: int) -> int | None:
        r = self.redis
        rob_key = f"{self._ns}rob{self.red_id}{user_id}"
        before = await r.get(rob_key)
        if before is not None:
            self.repeat_answers += 1
            return int(before)
        total = await r.get(self._count)
        if total is None or int(total) <= 0:
            return None
        lock_key = f"{self._ns}{user_id}"
        if not await r.set(lock_key, self.red_id, nx=True, px=self.lock_timeout_ms):
            self.lock_refused += 1
            return None
        try:
            popped = await r.rpop(self._list)
            if popped is not None:
                money = as_text(popped)
                await r.decr(self._count)
                await r.lpush(self._records, json.dumps({"userId": user_id, "money": int(money)}))
                await r.set(rob_key, money)
                return int(money)
        finally:
            await r.delete(lock_key)
        return None

    async def verify(self) -> dict[int, list[int]]:
        claims: dict[int, list[int]] = {}
        for raw in await self.redis.lrange(self._records, 0, -1):
            record = json.loads(raw)
            claims.setdefault(int(record["userId"]), []).append(int(record["money"]))
        return claims

    async def leftover(self) -> tuple[int, int]:
        left = [int(x) for x in await self.redis.lrange(self._list, 0, -1)]
        return len(left), sum(left)

    async def stats(self) -> dict[str, Any]:
        count = await self.redis.get(self._count)
        return {
            **await super().stats(),
            "lock_refused": self.lock_refused,
            "repeat_answers": self.repeat_answers,
            "count_key": None if count is None else int(count),
            "list_length": await self.redis.llen(self._list),
        }

    async def teardown(self) -> None:
        if self._redis is not None:
            await delete_namespace(self._redis, self._ns)
            await self._redis.aclose()
            self._redis = None

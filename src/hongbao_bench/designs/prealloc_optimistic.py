"""Seed 003, design 4: pre-allocated small packets, optimistic lock per packet.

Setup writes every share as a ``seed_redpack`` row (status 1 = available, version 0).
A grab reads all available rows of the activity (as the seed: "获取该活动下所有可用的红包
明细"), picks one at random and claims it with
``UPDATE ... SET status = 2, version = version + 1 WHERE id = ? AND version = ?``; zero
rows means a conflict, retried at most `max_retries` times after the first try. The
activity row is not touched, so grabbers only collide when they pick the same packet.
"""

from __future__ import annotations

import random

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from hongbao_bench.designs.base import ACTIVITY_ID, AVAILABLE, TAKEN, SqlDesign, SqlStore


class PreallocOptimisticDesign(SqlDesign):
    name = "prealloc_optimistic"

    def __init__(
        self,
        database_url: str,
        *,
        max_retries: int = 3,
        seed: int | None = None,
        private_db: bool = True,
        pool_size: int = 20,
    ) -> None:
        super().__init__()
        self.store = SqlStore(database_url, private_db=private_db, pool_size=pool_size)
        self.backend = self.store.dialect
        self.max_retries = max_retries
        self.rng = random.Random(seed)

    async def setup(self, shares: list[int]) -> None:
        await self.store.open()
        await self.store.insert_activity(list(shares))
        await self.store.insert_redpacks(list(shares))

    async def grab(self, user_id: int) -> int | None:
        r, d = self.store.tables.redpack, self.store.tables.detail
        for attempt in range(1 + self.max_retries):
            if attempt:
                self.retries_or_conflicts += 1
            try:
                async with self.store.engine.begin() as conn:
                    available = (
                        await conn.execute(
                            select(r.c.id, r.c.amount, r.c.version).where(
                                r.c.activity_id == ACTIVITY_ID, r.c.status == AVAILABLE
                            )
                        )
                    ).all()
                    if not available:
                        return None
                    pick = self.rng.choice(available)
                    updated = await conn.execute(
                        update(r)
                        .where(r.c.id == pick.id, r.c.version == pick.version)
                        .values(status=TAKEN, version=r.c.version + 1)
                    )
                    if updated.rowcount != 1:
                        continue
                    await conn.execute(
                        insert(d).values(
                            activity_id=ACTIVITY_ID,
                            amount=pick.amount,
                            user_id=user_id,
                            redpack_id=pick.id,
                        )
                    )
                    return int(pick.amount)
            except IntegrityError:
                self.unique_violations += 1
                return None
        self.turned_away += 1
        return None

    async def leftover(self) -> tuple[int, int]:
        return await self.store.redpacks_left()

"""Seed 003, design 2: optimistic lock (version column) on the activity row.

Read the row and its version, take share number ``total - surplus_total``, then
``UPDATE ... SET version = version + 1 WHERE id = ? AND version = ?``; zero rows updated
means another grabber won the race: retry, at most `max_retries` times after the first
try. As the seed warns, every grab contends on the one row, so when retries run out a
grabber is turned away although shares are left; those refusals are counted.
"""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from hongbao.bench.designs._common import ACTIVITY_ID, DesignBase, SqlStore


class OptimisticDesign(DesignBase):
    name = "optimistic"

    def __init__(
        self,
        database_url: str,
        *,
        max_retries: int = 3,
        private_db: bool = True,
        pool_size: int = 20,
    ) -> None:
        super().__init__()
        self.store = SqlStore(database_url, private_db=private_db, pool_size=pool_size)
        self.backend = self.store.dialect
        self.max_retries = max_retries
        self._shares: list[int] = []

    async def setup(self, shares: list[int]) -> None:
        self._shares = list(shares)
        await self.store.open()
        await self.store.insert_activity(self._shares)

    async def grab(self, user_id: int) -> int | None:
        a, d = self.store.tables.activity, self.store.tables.detail
        for attempt in range(1 + self.max_retries):
            if attempt:
                self.retries_or_conflicts += 1
            try:
                async with self.store.engine.begin() as conn:
                    row = (
                        await conn.execute(
                            select(a.c.total, a.c.surplus_total, a.c.version).where(
                                a.c.id == ACTIVITY_ID
                            )
                        )
                    ).one()
                    if row.surplus_total <= 0:
                        return None
                    index = int(row.total - row.surplus_total)
                    amount = self._shares[index]
                    updated = await conn.execute(
                        update(a)
                        .where(a.c.id == ACTIVITY_ID, a.c.version == row.version)
                        .values(
                            surplus_total=a.c.surplus_total - 1,
                            surplus_amount=a.c.surplus_amount - amount,
                            version=a.c.version + 1,
                        )
                    )
                    if updated.rowcount != 1:
                        continue
                    await conn.execute(
                        insert(d).values(
                            activity_id=ACTIVITY_ID,
                            amount=amount,
                            user_id=user_id,
                            redpack_id=index,
                        )
                    )
                    return amount
            except IntegrityError:
                self.unique_violations += 1
                return None
        self.turned_away += 1
        return None

    async def verify(self) -> dict[int, list[int]]:
        return await self.store.claims()

    async def leftover(self) -> tuple[int, int]:
        return await self.store.activity_left()

    async def teardown(self) -> None:
        await self.store.close()

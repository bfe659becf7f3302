"""Seed 003, design 2: optimistic lock (version column) on the activity row.

Read the row and its version, take share number ``total - surplus_total``, then
``UPDATE ... SET version = version + 1 WHERE id = ? AND version = ?``; zero rows updated
means another grabber won the race: retry, at most `max_retries` times after the first
try. As the seed warns, every grab contends on the one row, so when retries run out a
grabber is turned away although shares are left; those refusals are counted.
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from hongbao_bench.designs.base import CONFLICT, SqlDesign, SqlStore


class OptimisticDesign(SqlDesign):
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
        for attempt in range(1 + self.max_retries):
            if attempt:
                self.retries_or_conflicts += 1
            try:
                async with self.store.engine.begin() as conn:
                    amount = await self.store.take_share(
                        conn, self._shares, user_id, check_version=True
                    )
            except IntegrityError:
                self.unique_violations += 1
                return None
            if amount != CONFLICT:
                return amount
        self.turned_away += 1
        return None

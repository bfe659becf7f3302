"""Seed 003, design 3: pessimistic lock, ``SELECT ... FOR UPDATE`` on the activity row.

Inside one transaction: lock the activity row, take share number
``total - surplus_total``, decrement the surplus, insert the detail row, commit. Every
grab of the activity runs one at a time, queued on the row lock in the database.

SQLite has no FOR UPDATE (SQLAlchemy drops the clause). There each transaction opens
with BEGIN IMMEDIATE instead, taking SQLite's single write lock up front: grabs are still
serialized and correct, so correctness tests run it, but it locks the whole database, not
a row, so `supported_backends` (the benchmark matrix) leaves SQLite out.
"""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError

from hongbao_bench.designs.base import SqlDesign, SqlStore

#: benchmark matrix: SQLite runs (see above) but is not this design
SUPPORTED_BACKENDS = frozenset({"postgresql", "mysql"})


class PessimisticDesign(SqlDesign):
    name = "pessimistic"
    supported_backends = SUPPORTED_BACKENDS

    def __init__(self, database_url: str, *, private_db: bool = True, pool_size: int = 20) -> None:
        super().__init__()
        self.store = SqlStore(
            database_url,
            private_db=private_db,
            pool_size=pool_size,
            sqlite_begin="BEGIN IMMEDIATE",
        )
        self.backend = self.store.dialect
        self._shares: list[int] = []

    async def setup(self, shares: list[int]) -> None:
        self._shares = list(shares)
        await self.store.open()
        await self.store.insert_activity(self._shares)

    async def grab(self, user_id: int) -> int | None:
        try:
            async with self.store.engine.begin() as conn:
                return await self.store.take_share(conn, self._shares, user_id, lock_row=True)
        except IntegrityError:
            self.unique_violations += 1
            return None

"""Shared plumbing for the seed designs: seed 003's three tables, a private database per
run, and Redis key namespaces.

Tables follow seed 003's DDL (t_redpack_activity, t_redpack, t_redpack_detail) with a
``seed_`` prefix; money is BIGINT fen instead of DECIMAL(10,2) yuan. Additions, all
needed to audit the run: the detail row carries ``activity_id`` and is UNIQUE on
(activity_id, user_id) (one claim per user) and on (activity_id, redpack_id) (one claim per
share; for the activity-row designs redpack_id is the index of the share taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    Table,
    UniqueConstraint,
    event,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/9"
#: the one activity (big packet) every design hands out
ACTIVITY_ID = 1
AVAILABLE, TAKEN = 1, 2
_ID = BigInteger().with_variant(Integer, "sqlite")


@dataclass(frozen=True)
class SeedTables:
    metadata: MetaData
    activity: Table
    redpack: Table
    detail: Table


def seed_tables(prefix: str = "seed_") -> SeedTables:
    md = MetaData()
    activity = Table(
        f"{prefix}redpack_activity",
        md,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("total_amount", BigInteger, nullable=False, default=0),
        Column("surplus_amount", BigInteger, nullable=False, default=0),
        Column("total", BigInteger, nullable=False, default=0),
        Column("surplus_total", BigInteger, nullable=False, default=0),
        Column("user_id", BigInteger, nullable=False, default=0),
        Column("version", BigInteger, nullable=False, default=0),
    )
    redpack = Table(
        f"{prefix}redpack",
        md,
        Column("id", BigInteger, primary_key=True, autoincrement=False),
        Column("activity_id", BigInteger, nullable=False, default=0),
        Column("amount", BigInteger, nullable=False, default=0),
        Column("status", SmallInteger, nullable=False, default=AVAILABLE),
        Column("version", BigInteger, nullable=False, default=0),
        Index(f"ix_{prefix}redpack_activity_status", "activity_id", "status"),
    )
    detail = Table(
        f"{prefix}redpack_detail",
        md,
        Column("id", _ID, primary_key=True, autoincrement=True),
        Column("activity_id", BigInteger, nullable=False),
        Column("amount", BigInteger, nullable=False, default=0),
        Column("user_id", BigInteger, nullable=False, default=0),
        Column("redpack_id", BigInteger, nullable=False, default=0),
        Column("create_time", DateTime, nullable=False, server_default=func.now()),
        Column("update_time", DateTime, nullable=False, server_default=func.now()),
        UniqueConstraint("activity_id", "user_id", name=f"uq_{prefix}detail_user"),
        UniqueConstraint("activity_id", "redpack_id", name=f"uq_{prefix}detail_redpack"),
    )
    return SeedTables(md, activity, redpack, detail)


class DesignBase:
    """Counters every design keeps; the harness reads them after the run."""

    name = "design"
    backend = "?"
    #: SQLAlchemy backend names (or "redis") a benchmark matrix may run this design on
    supported_backends: frozenset[str] = frozenset({"postgresql", "mysql", "sqlite"})

    def __init__(self) -> None:
        self.retries_or_conflicts = 0
        self.turned_away = 0
        #: grabs rolled back by a UNIQUE constraint on the detail table: the user already
        #: holds a claim (a double click), or the share was taken by a racing grab
        self.unique_violations = 0

    async def stats(self) -> dict[str, Any]:
        return {"unique_violations": self.unique_violations}


#: take_share's answer when an optimistic update lost the race for the activity row
CONFLICT = -1


class SqlStore:
    """Seed 003's tables in a database of their own.

    With ``private_db`` (default) `url` is only an admin connection: ``open`` creates
    ``hb_bench_<hex>`` on that server (a temporary file for SQLite) and ``close`` drops it,
    so runs never meet other users of the same server."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "seed_",
        private_db: bool = True,
        pool_size: int = 20,
        sqlite_begin: str | None = None,
    ) -> None:
        self.admin_url = make_url(url)
        #: SQLite only: the statement opening every transaction (e.g. "BEGIN IMMEDIATE");
        #: None keeps the driver's default (BEGIN deferred until the first write)
        self.sqlite_begin = sqlite_begin
        self.dialect = self.admin_url.get_backend_name()
        self.private_db = private_db
        self.pool_size = pool_size
        self.tables = seed_tables(prefix)
        self.db_name: str | None = None
        self._engine: AsyncEngine | None = None

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("SqlStore.open() first")
        return self._engine

    async def open(self) -> None:
        url = self.admin_url
        if self.private_db:
            name = f"hb_bench_{uuid.uuid4().hex[:12]}"
            if self.dialect == "sqlite":
                url = url.set(database=self._sqlite_path(name))
            else:
                await self._admin(f"CREATE DATABASE {name}")
                url = url.set(database=name)
            self.db_name = name
        options: dict[str, Any] = {}
        if self.dialect != "sqlite":
            options.update(pool_size=self.pool_size, max_overflow=0, pool_timeout=120)
        self._engine = create_async_engine(url, **options)
        if self.dialect == "sqlite" and self.sqlite_begin is not None:
            _sqlite_explicit_begin(self._engine, self.sqlite_begin)
        async with self._engine.begin() as conn:
            await conn.run_sync(self.tables.metadata.create_all)
        if self.dialect != "sqlite":  # open the whole pool now, not during the timed grabs
            async with contextlib.AsyncExitStack() as stack:
                engine = self._engine
                await asyncio.gather(
                    *(stack.enter_async_context(engine.connect()) for _ in range(self.pool_size))
                )

    async def close(self) -> None:
        try:
            if self._engine is not None:
                try:
                    async with self._engine.begin() as conn:
                        await conn.run_sync(self.tables.metadata.drop_all)
                finally:
                    await self._engine.dispose()
                    self._engine = None
        finally:
            await self._drop_private_db()

    async def _drop_private_db(self) -> None:
        if self.private_db and self.db_name is not None:
            name, self.db_name = self.db_name, None
            if self.dialect == "sqlite":
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._sqlite_path(name))
            elif self.dialect == "postgresql":
                await self._admin(f"DROP DATABASE {name} WITH (FORCE)")
            else:
                await self._admin(f"DROP DATABASE {name}")

    @staticmethod
    def _sqlite_path(name: str) -> str:
        return str(pathlib.Path(tempfile.gettempdir()) / f"{name}.sqlite3")

    async def _admin(self, statement: str) -> None:
        engine = create_async_engine(self.admin_url, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text(statement))
        finally:
            await engine.dispose()

    async def insert_activity(self, shares: list[int]) -> None:
        t = self.tables
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(t.activity).values(
                    id=ACTIVITY_ID,
                    total_amount=sum(shares),
                    surplus_amount=sum(shares),
                    total=len(shares),
                    surplus_total=len(shares),
                )
            )

    async def insert_redpacks(self, shares: list[int]) -> None:
        """Seed 003's pre-allocated small packets, ids 1..n, all available."""
        rows = [
            {"id": i, "activity_id": ACTIVITY_ID, "amount": a, "status": AVAILABLE, "version": 0}
            for i, a in enumerate(shares, start=1)
        ]
        async with self.engine.begin() as conn:
            for low in range(0, len(rows), 1_000):
                await conn.execute(insert(self.tables.redpack), rows[low : low + 1_000])

    async def claims(self) -> dict[int, list[int]]:
        d = self.tables.detail
        found: dict[int, list[int]] = {}
        async with self.engine.connect() as conn:
            result = await conn.execute(
                select(d.c.user_id, d.c.amount).where(d.c.activity_id == ACTIVITY_ID)
            )
            for user_id, amount in result:
                found.setdefault(int(user_id), []).append(int(amount))
        return found

    async def activity_left(self) -> tuple[int, int]:
        a = self.tables.activity
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(a.c.surplus_total, a.c.surplus_amount).where(a.c.id == ACTIVITY_ID)
                )
            ).one()
        return int(row[0]), int(row[1])

    async def take_share(
        self,
        conn: AsyncConnection,
        shares: list[int],
        user_id: int,
        *,
        lock_row: bool = False,
        check_version: bool = False,
    ) -> int | None:
        """Take share number ``total - surplus_total`` from the activity row, in `conn`'s
        transaction: None when no share is left, CONFLICT when `check_version` and another
        grab changed the row first. A double claim raises IntegrityError (UNIQUE detail)."""
        a, d = self.tables.activity, self.tables.detail
        query = select(a.c.total, a.c.surplus_total, a.c.version).where(a.c.id == ACTIVITY_ID)
        row = (await conn.execute(query.with_for_update() if lock_row else query)).one()
        if row.surplus_total <= 0:
            return None
        index = int(row.total - row.surplus_total)
        amount = shares[index]
        same_row = [a.c.id == ACTIVITY_ID]
        if check_version:
            same_row.append(a.c.version == row.version)
        updated = await conn.execute(
            update(a)
            .where(*same_row)
            .values(
                surplus_total=a.c.surplus_total - 1,
                surplus_amount=a.c.surplus_amount - amount,
                version=a.c.version + 1,
            )
        )
        if updated.rowcount != 1:
            return CONFLICT
        await conn.execute(
            insert(d).values(
                activity_id=ACTIVITY_ID, amount=amount, user_id=user_id, redpack_id=index
            )
        )
        return amount

    async def redpacks_left(self) -> tuple[int, int]:
        r = self.tables.redpack
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(func.count(), func.coalesce(func.sum(r.c.amount), 0)).where(
                        r.c.activity_id == ACTIVITY_ID, r.c.status == AVAILABLE
                    )
                )
            ).one()
        return int(row[0]), int(row[1])


def _sqlite_explicit_begin(engine: AsyncEngine, begin: str) -> None:
    """SQLAlchemy's recipe: stop the driver's implicit BEGIN, emit our own."""

    @event.listens_for(engine.sync_engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine.sync_engine, "begin")
    def _begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)


def as_text(value: object) -> str:
    """A single Redis reply as str (clients here use decode_responses=True)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise TypeError(f"expected one string reply, got {type(value).__name__}")


async def warm_redis(client: aioredis.Redis, connections: int = 20) -> None:
    """Open `connections` pooled connections now, not during the timed grabs."""
    await asyncio.gather(*(client.ping() for _ in range(connections)))


def new_namespace(design: str) -> str:
    return f"hb:bench:{design}:{uuid.uuid4().hex[:12]}:"


async def delete_namespace(client: aioredis.Redis, namespace: str) -> None:
    """Delete this run's keys only (never FLUSHDB: the database may be shared)."""
    batch: list[str] = []
    async for key in client.scan_iter(match=namespace + "*", count=1_000):
        batch.append(key)
        if len(batch) >= 500:
            await client.unlink(*batch)
            batch.clear()
    if batch:
        await client.unlink(*batch)


class SqlDesign(DesignBase):
    """A design whose claims live in seed 003's tables (`self.store`)."""

    store: SqlStore

    async def verify(self) -> dict[int, list[int]]:
        return await self.store.claims()

    async def leftover(self) -> tuple[int, int]:
        return await self.store.activity_left()

    async def teardown(self) -> None:
        await self.store.close()


class UsesRedis:
    """A design's Redis client, connected by its setup()."""

    _redis: aioredis.Redis | None = None

    @property
    def redis(self) -> aioredis.Redis:
        if self._redis is None:
            raise RuntimeError("setup() first")
        return self._redis

"""Shared fixtures: real Redis, real PostgreSQL / MariaDB / SQLite. No mocks.

Outside CI a missing server skips its tests; with CI=true it fails them.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import metadata
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import RedisStore, store_from_url
from tests.webhook_receiver import Receiver

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REDIS_URL = os.environ.get("HONGBAO_TEST_REDIS_URL", "redis://127.0.0.1:6379/1")
POSTGRES_ADMIN = os.environ.get(
    "HONGBAO_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
MYSQL_ADMIN = os.environ.get("HONGBAO_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")


def need(what: str, error: BaseException | None) -> None:
    """A missing service fails the test in CI and skips it elsewhere."""
    if error is None:
        return
    message = f"{what} is not reachable: {error}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


# -- Redis ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        need(f"Redis at {REDIS_URL}", exc)
    return REDIS_URL


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    s = store_from_url(redis_url, buckets=4)
    await s.client.flushdb()
    await s.ensure_groups()
    yield s
    await s.client.flushdb()
    await s.aclose()


# -- SQL databases --------------------------------------------------------------------

DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]


def _server_database(admin_url: str, name: str) -> Iterator[str]:
    """Create a private database on a shared server for this test session."""
    url = sa.engine.make_url(admin_url)
    engine = None
    try:
        if url.get_backend_name() == "mysql":
            engine = sa.create_engine(
                url.set(drivername="mysql+pymysql"), isolation_level="AUTOCOMMIT"
            )
            with engine.connect() as conn:
                conn.execute(sa.text(f"CREATE DATABASE {name}"))
        else:
            _pg_admin(url, f"CREATE DATABASE {name}")
    except Exception as exc:
        need(f"database server {url.render_as_string()}", exc)
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        if engine is not None:
            with engine.connect() as conn:
                conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name}"))
            engine.dispose()
        else:
            _pg_admin(url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _pg_admin(url: sa.engine.URL, statement: str) -> None:
    import asyncpg

    async def run() -> None:
        conn = await asyncpg.connect(
            host=url.host,
            port=url.port or 5432,
            user=url.username or "postgres",
            database=url.database or "postgres",
            timeout=5,
        )
        try:
            await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


@pytest.fixture(scope="session")
def database_urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Lazily created per-session databases, keyed by backend name."""
    made: dict[str, object] = {}
    yield made
    for gen in made.values():
        if hasattr(gen, "close"):
            gen.close()


@pytest.fixture(params=DATABASES)
def sql_url(
    request: pytest.FixtureRequest,
    database_urls: dict[str, object],
    tmp_path: Path,
) -> str:
    backend: str = request.param
    if backend == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'ledger.sqlite3'}"
    key = f"{backend}-url"
    if key not in database_urls:
        name = f"hb_test_{uuid.uuid4().hex[:10]}"
        admin = POSTGRES_ADMIN if backend == "postgres" else MYSQL_ADMIN
        gen = _server_database(admin, name)
        database_urls[backend] = gen
        database_urls[key] = next(gen)
    return str(database_urls[key])


@pytest.fixture
async def ledger(sql_url: str) -> AsyncIterator[SqlLedger]:
    led = SqlLedger.from_url(sql_url)
    await led.migrate()
    async with led.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            await conn.execute(table.delete())
    yield led
    await led.aclose()


# -- the service ------------------------------------------------------------------------


@pytest.fixture
def settings(redis_url: str, sql_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        database_url=sql_url,
        buckets=4,
        persister_claim_idle_ms=500,
        persister_block_ms=20,
        sweep_interval=0.2,
        # the tests load the service from one address as one user at a time
        rate_limit_user=0.0,
        rate_limit_ip=0.0,
    )


@pytest.fixture
async def service(store: RedisStore, ledger: SqlLedger, settings: Settings) -> Hongbao:
    return Hongbao(store, ledger, settings, rng=random.Random(2026))


@pytest.fixture
def persister(service: Hongbao) -> Persister:
    return Persister(service.store, service.ledger, service.settings, consumer="test-persister")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver on a loopback port that checks every signature it gets.

    Request it before a fixture that runs the app, so that it stops after the app."""
    r = Receiver().start()
    yield r
    r.stop()

"""Fixtures for the scale-out tests: a real Redis Cluster and a real Sentinel setup.

The session cluster (3 primaries + 3 replicas, ``--cluster create``) and the
Sentinel setup (1 primary, 1 replica, 3 sentinels) run on free loopback ports from
the Redis or Valkey binary on the machine (see tests/servers.py) and are torn down
after the run. Tests that kill or reshard nodes get a cluster of their own
(``fresh_cluster``), so the session cluster keeps its original topology.

Outside CI a missing server binary skips these tests; with CI=true it fails them.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hongbao.ledger import SqlLedger
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import RedisStore, store_from_url
from hongbao.storage.redis_cluster import RedisClusterStore
from tests.conftest import need
from tests.servers import RedisCluster, RedisSentinel, ServerStartError

#: 16 buckets spread over the 3 primaries (4, 6 and 6 bucket streams)
BUCKETS = 16


def _start_cluster(base: Path) -> RedisCluster:
    try:
        return RedisCluster().start(base, n_primaries=3, replicas=1, node_timeout_ms=2000)
    except (FileNotFoundError, ServerStartError, OSError) as exc:
        need("a Redis Cluster on loopback (redis-server / valkey-server)", exc)
        raise  # unreachable: need() skips or fails


def _start_sentinel(base: Path) -> RedisSentinel:
    try:
        return RedisSentinel().start(base)
    except (FileNotFoundError, ServerStartError, OSError) as exc:
        need("a Redis Sentinel setup on loopback (redis-server --sentinel)", exc)
        raise


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    with _start_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    """A cluster of this test's own, for failover and resharding (about 3 s to start)."""
    with _start_cluster(tmp_path / "cluster") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinel]:
    with _start_sentinel(tmp_path_factory.mktemp("sentinel")) as setup:
        yield setup


def cluster_settings(redis_url: str, sql_url: str) -> Settings:
    return Settings(
        redis_url=redis_url,
        database_url=sql_url,
        buckets=BUCKETS,
        persister_claim_idle_ms=500,
        persister_block_ms=20,
        sweep_interval=0.2,
    )


async def flush(store: RedisStore) -> None:
    """Empty every primary (FLUSHDB goes to all primaries on a cluster)."""
    await store.client.flushdb()


@contextlib.asynccontextmanager
async def opened_store(url: str) -> AsyncIterator[RedisStore]:
    store = store_from_url(url, buckets=BUCKETS)
    try:
        await flush(store)
        await store.ensure_groups()
        yield store
    finally:
        with contextlib.suppress(Exception):
            await flush(store)
        await store.aclose()


@pytest.fixture
async def cluster_store(redis_cluster: RedisCluster) -> AsyncIterator[RedisClusterStore]:
    async with opened_store(redis_cluster.url) as store:
        assert isinstance(store, RedisClusterStore)
        yield store


@pytest.fixture
def cluster_settings_(redis_cluster: RedisCluster, sql_url: str) -> Settings:
    return cluster_settings(redis_cluster.url, sql_url)


@pytest.fixture
async def cluster_service(
    cluster_store: RedisClusterStore, ledger: SqlLedger, cluster_settings_: Settings
) -> Hongbao:
    """The service on the session cluster; parametrized over the SQL databases (`ledger`)."""
    return Hongbao(cluster_store, ledger, cluster_settings_, rng=random.Random(2026))


@pytest.fixture
def cluster_persister(cluster_service: Hongbao) -> Persister:
    return Persister(
        cluster_service.store,
        cluster_service.ledger,
        cluster_service.settings,
        consumer="cluster-persister",
    )


@pytest.fixture
async def fault_service(
    fresh_cluster: RedisCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Hongbao]:
    """The service on a cluster of its own, SQLite ledger; `ack_mode` from the test's param."""
    ack_mode = getattr(request, "param", "redis")
    sql_url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.sqlite3'}"
    service = await make_service(fresh_cluster.url, sql_url, ack_mode)
    try:
        yield service
    finally:
        await service.aclose()


@pytest.fixture
def fresh_sentinel(tmp_path: Path) -> Iterator[RedisSentinel]:
    """A Sentinel setup of this test's own, for failover (about 2 s to start)."""
    with _start_sentinel(tmp_path / "sentinel") as setup:
        yield setup


async def make_service(
    redis_url: str, sql_url: str, ack_mode: str = "redis", ledger: SqlLedger | None = None
) -> Hongbao:
    """A service on a flushed Redis (any URL) and a migrated ledger (`ledger`, or a new one)."""
    settings = cluster_settings(redis_url, sql_url)
    if ack_mode != "redis":
        settings = replace(settings, ack_mode=ack_mode)
    store = store_from_url(settings.redis_url, settings.buckets)
    await flush(store)
    await store.ensure_groups()
    if ledger is None:
        ledger = SqlLedger.from_url(settings.database_url)
        await ledger.migrate()
    return Hongbao(store, ledger, settings, rng=random.Random(7))

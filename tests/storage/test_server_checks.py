"""What the store checks of a Redis URL and of the server behind it, before anything runs:
the URL's form, the server's version and its maxmemory-policy (on every cluster node)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from redis.asyncio.connection import UnixDomainSocketConnection

from hongbao.domain.models import GrabStatus
from hongbao.errors import ConfigurationError
from hongbao.serving.embedded import EmbeddedServer
from hongbao.storage import check_url, store_from_url
from hongbao.storage.redis import NO_EVICTION


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("garbage", "unsupported Redis URL scheme ''"),
        ("memcached://x", "unsupported Redis URL scheme 'memcached'"),
        ("redis://h:port/0", "bad Redis URL"),
        ("unix://", "socket's path"),
        ("redis+sentinel://h:26379", "service name"),
        ("redis+sentinel://h:26379/mymaster/x", "bad database number"),
        ("redis+cluster://h:x", "bad host:port"),
    ],
)
def test_bad_urls_are_refused_without_contacting_anything(url: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^[^\n]+$") as caught:
        check_url(url)
    assert words in str(caught.value)
    with pytest.raises(ConfigurationError):
        store_from_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0",
        "rediss://u:p@host:6380/2",
        "unix:///run/valkey.sock?db=0",
        "redis+sentinel://a:26379,b:26379/mymaster/1",
        "redis+cluster://a:7000,b:7001",
    ],
)
def test_good_urls_pass(url: str) -> None:
    assert check_url(url) == url.split("://")[0]


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[EmbeddedServer]:
    """A private server (its settings may be changed) on a Unix socket."""
    server = EmbeddedServer(tmp_path / "data")
    server.start()  # this thread outlives the test: the server dies with its starter
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


async def test_store_on_a_unix_socket_runs_scripts_on_its_kept_connections(
    embedded: EmbeddedServer,
) -> None:
    store = store_from_url(embedded.url, 4)
    try:
        await store.ensure_groups()
        keys = store.keys("01UNIXSOCKET000000000000000")
        now = int(time.time() * 1000)
        assert await store.load_packet(
            keys, expires_at_ms=now + 60_000, keep_until_ms=now + 120_000, shares=[(0, 5), (1, 7)]
        )
        answers = await store.grab_batch([(keys, ["ann", "bob", "cat"])])
        assert [a[0] for a in answers] == [  # type: ignore[index]
            GrabStatus.GRANTED,
            GrabStatus.GRANTED,
            GrabStatus.EXHAUSTED,
        ]
        assert store._kept is not None and store._kept._idle  # the fast path was used
        assert all(isinstance(c, UnixDomainSocketConnection) for c in store._kept._idle)
        assert await store.backlog() == 1  # one grants entry for the batch
    finally:
        await store.aclose()


async def test_a_server_that_may_evict_is_refused_unless_allowed(
    embedded: EmbeddedServer, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(embedded.url)
    store = store_from_url(embedded.url, 4)
    lenient = store_from_url(embedded.url, 4, allow_eviction=True)
    try:
        assert admin.config_get("maxmemory-policy") == {"maxmemory-policy": NO_EVICTION}
        await store.check_server()
        admin.config_set("maxmemory-policy", "allkeys-lru")
        assert await store.eviction_policy() == "allkeys-lru"
        with pytest.raises(ConfigurationError, match=r"^[^\n]+$") as caught:
            await store.ensure_groups()
        assert "maxmemory-policy is allkeys-lru" in str(caught.value)
        assert "--allow-eviction" in str(caught.value)
        with caplog.at_level(logging.WARNING, "hongbao.storage"):
            await lenient.check_server()
            await lenient.check_server()
        warnings = [r for r in caplog.records if "ALLKEYS-LRU" in r.getMessage().upper()]
        assert len(warnings) == 1  # loud, once
    finally:
        admin.config_set("maxmemory-policy", NO_EVICTION)
        admin.close()
        await store.aclose()
        await lenient.aclose()

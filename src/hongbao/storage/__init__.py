"""Redis stores, built from a URL.

``redis://`` and ``rediss://`` (one server), ``unix:///path/to/socket?db=N`` (one server
on a Unix socket: the embedded one), ``redis+sentinel://h:p,h:p/service[/db]`` (the
primary a Sentinel group names) and ``redis+cluster://h:p,h:p`` (Redis Cluster).
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff

from hongbao.errors import ConfigurationError
from hongbao.storage.redis import RedisStore
from hongbao.storage.redis_cluster import RedisClusterStore

#: no single Redis reply may take longer (blocking reads ask for far less); a stuck
#: connection then fails instead of hanging its caller forever
SOCKET_TIMEOUT = 5.0
SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster")


class _BlockingSentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The Sentinel-managed pool, but a burst waits for a connection instead of failing."""


def parse_hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    hosts = []
    for part in netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host:
            host, port = port, str(default_port)
        try:
            hosts.append((host.strip("[]"), int(port)))
        except ValueError:
            raise ConfigurationError(f"bad host:port {part!r} in Redis URL") from None
    return hosts


def check_url(url: str) -> str:
    """The scheme of a Redis URL hongbao can use; ConfigurationError saying what is wrong
    otherwise. Nothing is contacted."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"unsupported Redis URL scheme {scheme!r}; use one of {', '.join(SCHEMES)}"
        )
    if scheme in ("redis+cluster", "redis+sentinel"):
        parse_hosts(parts.netloc, 6379)
        path = [p for p in parts.path.split("/") if p]
        if scheme == "redis+sentinel" and not path:
            raise ConfigurationError("redis+sentinel:// URL needs the service name as its path")
        if scheme == "redis+sentinel" and len(path) > 1 and not path[1].isdigit():
            raise ConfigurationError(f"bad database number {path[1]!r} in the Redis URL")
        return scheme
    try:
        parsed = parse_url(url)
    except ValueError as exc:
        raise ConfigurationError(f"bad Redis URL: {exc}") from None
    if scheme == "unix" and not parsed.get("path"):
        raise ConfigurationError("a unix:// Redis URL needs the socket's path: unix:///path?db=0")
    return scheme


def store_from_url(
    url: str, buckets: int = 16, max_connections: int = 64, *, allow_eviction: bool = False
) -> RedisStore:
    """Build the store for a Redis URL (see `check_url`); `allow_eviction` lets it run on a
    server whose maxmemory-policy may evict keys (see `RedisStore.check_server`)."""
    scheme = check_url(url)
    parts = urlsplit(url)
    if scheme == "redis+cluster":
        nodes = [ClusterNode(h, p) for h, p in parse_hosts(parts.netloc, 6379)]
        # MOVED / ASK / TRYAGAIN are followed inside redis-py whatever the retry
        # policy; connection errors and CLUSTERDOWN (a failover window) surface at
        # once as StorageError, like on one server: hongbao's callers retry themselves
        cluster = RedisCluster(
            startup_nodes=nodes,
            max_connections=max_connections,
            decode_responses=True,
            password=parts.password,
            username=parts.username,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=SOCKET_TIMEOUT,
        )
        return RedisClusterStore(
            cluster, buckets, max_connections=max_connections, allow_eviction=allow_eviction
        )
    if scheme == "redis+sentinel":
        path = [p for p in parts.path.split("/") if p]
        db = int(path[1]) if len(path) > 1 else 0
        query = parse_qs(parts.query)
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            parse_hosts(parts.netloc, 26379),
            sentinel_kwargs={
                "password": query.get("sentinel_password", [None])[0],
                "socket_timeout": SOCKET_TIMEOUT,
                "socket_connect_timeout": SOCKET_TIMEOUT,
            },
            decode_responses=True,
            password=parts.password,
            username=parts.username,
            db=db,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=SOCKET_TIMEOUT,
        )
        client = sentinel.master_for(
            path[0],
            connection_pool_class=_BlockingSentinelPool,
            max_connections=max_connections,
            timeout=10,
        )
        return RedisStore(client, buckets, allow_eviction=allow_eviction)
    # a blocking pool makes a burst of grabs queue for a connection instead of failing
    # no silent retries inside redis-py: a retried command can swallow a task's
    # cancellation (seen with blocking XREADGROUP); hongbao's callers retry themselves
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=max_connections,
        timeout=10,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=SOCKET_TIMEOUT,
    )
    return RedisStore(aioredis.Redis(connection_pool=pool), buckets, allow_eviction=allow_eviction)


__all__ = ["RedisClusterStore", "RedisStore", "check_url", "store_from_url"]

"""Tests for the tests.servers library: real redis-server processes on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, ResponseError
from redis.retry import Retry

from tests.servers import (
    CLUSTER_BUS_OFFSET,
    HOST,
    RedisCluster,
    RedisNode,
    ServerStartError,
    alive,
    find_cli_binary,
    find_server_binary,
    free_port,
    free_ports,
)

try:
    find_server_binary()
    find_cli_binary()
except FileNotFoundError as exc:  # pragma: no cover - environment without binaries
    pytest.skip(f"no redis/valkey binaries: {exc}", allow_module_level=True)

# redis-py's default Retry (3 attempts, exponential backoff) makes an expected
# connection failure take seconds.
NO_RETRY = Retry(NoBackoff(), 0)


# --------------------------------------------------------------------------- ports / binaries


def test_binaries_exist() -> None:
    assert find_server_binary().is_file()
    assert find_cli_binary().is_file()


def test_free_ports_are_distinct_and_bus_ports_fit() -> None:
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(p + CLUSTER_BUS_OFFSET <= 65535 for p in ports)
    assert free_port() not in ports


# --------------------------------------------------------------------------- standalone


@pytest.mark.redis
def test_standalone_set_get(tmp_path: Path) -> None:
    with RedisNode().start(free_port(), tmp_path / "r") as node:
        assert node.url == f"redis://{HOST}:{node.port}/0"
        assert node.pid is not None and alive(node.pid)
        with node.client() as c:
            assert c.set("k", "v")
            assert c.get("k") == "v"
            assert c.config_get("bind")["bind"] == HOST
        pid = node.pid
    assert node.pid is None
    assert not alive(pid)


@pytest.mark.redis
def test_standalone_restart_with_aof_keeps_data(tmp_path: Path) -> None:
    with RedisNode().start(free_port(), tmp_path / "r", appendonly=True) as node:
        port, old_pid = node.port, node.pid
        with node.client() as c:
            c.set("k", "v")
            c.hset("h", mapping={"a": "1", "b": "2"})
        node.restart()
        assert node.port == port
        assert node.pid != old_pid
        with node.client() as c:
            assert c.get("k") == "v"
            assert c.hgetall("h") == {"a": "1", "b": "2"}


@pytest.mark.redis
def test_standalone_kill9_kills_and_restart_recovers_fsynced_aof(tmp_path: Path) -> None:
    node = RedisNode().start(free_port(), tmp_path / "r", appendonly=True, appendfsync="always")
    try:
        with node.client() as c:
            c.set("k", "v")
        pid = node.pid
        assert pid is not None
        node.kill9()
        assert not node.running
        assert node.pid is None
        assert not alive(pid)
        with (
            pytest.raises(redis.ConnectionError),
            node.client(socket_timeout=1, retry=NO_RETRY) as c,
        ):
            c.ping()
        node.restart()
        with node.client() as c:
            assert c.get("k") == "v"
    finally:
        node.stop()


@pytest.mark.redis
def test_standalone_without_aof_loses_data_on_restart(tmp_path: Path) -> None:
    with RedisNode().start(None, tmp_path / "r") as node:
        with node.client() as c:
            c.set("k", "v")
        node.restart()
        with node.client() as c:
            assert c.get("k") is None


@pytest.mark.redis
def test_start_failure_raises_with_log_tail(tmp_path: Path) -> None:
    node = RedisNode()
    with pytest.raises(ServerStartError) as ei:
        node.start(free_port(), tmp_path / "r", extra_args=["--no-such-directive", "1"])
    assert "no-such-directive" in str(ei.value)
    assert not node.running


@pytest.mark.redis
def test_port_taken_by_foreign_server_is_detected(tmp_path: Path) -> None:
    with RedisNode().start(free_port(), tmp_path / "a") as first:
        with pytest.raises(ServerStartError, match=r"(?i)address already in use|foreign pid"):
            RedisNode().start(first.port, tmp_path / "b", timeout=5)
        with first.client() as c:
            assert c.ping()


@pytest.mark.redis
def test_stop_is_idempotent(tmp_path: Path) -> None:
    node = RedisNode().start(None, tmp_path / "r")
    node.stop()
    node.stop()
    node.kill9()
    RedisNode().stop()


# --------------------------------------------------------------------------- cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    t0 = time.monotonic()
    with RedisCluster().start(tmp_path_factory.mktemp("cluster")) as c:
        elapsed = time.monotonic() - t0
        print(
            f"\n[servers] cluster of {len(c.nodes)} nodes ready in {elapsed:.2f}s "
            f"(binary {c.binary}, url {c.url})"
        )
        yield c
    assert not any(n.running for n in c.nodes)


@pytest.mark.redis_cluster
def test_cluster_topology(cluster: RedisCluster) -> None:
    primaries, replicas = cluster.primaries(), cluster.replicas()
    assert len(primaries) == 3
    assert len(replicas) == 3
    assert {n.port for n in primaries} | {n.port for n in replicas} == {
        n.port for n in cluster.nodes
    }
    for p in primaries:
        assert len(cluster.replicas_of(p.port)) == 1
    for node in cluster.nodes:
        info = node.execute("CLUSTER", "INFO")
        assert "cluster_state:ok" in info
        assert "cluster_slots_assigned:16384" in info
        assert "cluster_known_nodes:6" in info
    assert cluster.url == "redis+cluster://" + ",".join(f"{HOST}:{p.port}" for p in primaries)
    assert len(cluster.startup_nodes) == 6
    assert cluster.node_for_port(primaries[0].port) is primaries[0]


@pytest.mark.redis_cluster
def test_cluster_set_get_across_slots(cluster: RedisCluster) -> None:
    keys = [f"key:{i}" for i in range(300)]
    with cluster.cluster_client() as rc:
        for k in keys:
            rc.set(k, k.upper())
        assert [rc.get(k) for k in keys] == [k.upper() for k in keys]
    # The keys really are spread over all primaries, each stored on its owner.
    owners = {k: cluster.primary_for_key(k) for k in keys}
    assert {n.port for n in owners.values()} == {n.port for n in cluster.primaries()}
    for k in keys[:30]:
        with owners[k].client() as c:
            assert c.get(k) == k.upper()


@pytest.mark.redis_cluster
def test_cluster_evalsha_with_hash_tag(cluster: RedisCluster) -> None:
    script = (
        "redis.call('SET', KEYS[1], ARGV[1]); "
        "redis.call('SET', KEYS[2], ARGV[2]); "
        "return {redis.call('GET', KEYS[1]), redis.call('GET', KEYS[2])}"
    )
    with cluster.cluster_client() as rc:
        sha = rc.script_load(script)
        assert rc.evalsha(sha, 2, "{b1}:a", "{b1}:b", "x", "y") == ["x", "y"]
        assert rc.mget("{b1}:a", "{b1}:b") == ["x", "y"]
        # Keys in different slots are refused (by redis-py or the server).
        with pytest.raises((RedisClusterException, ResponseError)):
            rc.evalsha(sha, 2, "{b1}:a", "{b2}:b", "x", "y")


@pytest.mark.redis_cluster
def test_cluster_failover_after_kill9_and_rejoin(cluster: RedisCluster) -> None:
    """Kill a primary, its replica takes over; restart it, it rejoins as a replica."""
    victim = cluster.primary_for_key("{b1}:a")
    with cluster.cluster_client() as rc:
        rc.set("{b1}:a", "before")
        # Make sure the replica has the write before the primary dies.
        victim.execute("WAIT", 1, 2000)
    t0 = time.monotonic()
    cluster.kill9(victim.port)
    cluster.wait_until_ok(timeout=30)
    new_owner = cluster.primary_for_key("{b1}:a")
    print(f"\n[servers] failover took {time.monotonic() - t0:.2f}s")
    assert new_owner.port != victim.port
    with cluster.cluster_client() as rc:
        assert rc.get("{b1}:a") == "before"
    cluster.restart_node(victim.port)
    cluster.wait_until_ok(timeout=30, full=True)
    assert victim in cluster.replicas()
    assert len(cluster.primaries()) == 3


@pytest.mark.redis
def test_stop_handles_paused_server(tmp_path: Path) -> None:
    node = RedisNode().start(None, tmp_path / "r")
    pid = node.pid
    assert pid is not None
    node.pause()
    with pytest.raises(redis.TimeoutError), node.client(socket_timeout=0.3, retry=NO_RETRY) as c:
        c.ping()
    node.stop()
    assert not node.running
    assert not alive(pid)

"""Redis Cluster for `hongbao bench`: an admin client, per-primary CPU, slot placement.

A ``redis+cluster://h:p,h:p`` URL gets a sync `redis.cluster.RedisCluster` as the bench's
admin client: keyed commands (MEMORY USAGE, HGET...) follow the key's slot, and INFO cpu
is read from every primary. A packet's primary is the owner of its bucket's hash slot
(`hongbao.keys`), so a bucket -> primary map says where a packet's grabs will run.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster

from hongbao.keys import events_key
from hongbao.storage import parse_hosts
from hongbao_bench.harness import stop_process

#: what the bench talks to for metering and checks: one server, or a cluster
Admin = redis.Redis | RedisCluster

CLUSTER_SCHEME = "redis+cluster"


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() == CLUSTER_SCHEME


def cluster_admin(url: str) -> RedisCluster:
    parts = urlsplit(url)
    return RedisCluster(
        startup_nodes=[
            ClusterNode(h, p)  # type: ignore[no-untyped-call]
            for h, p in parse_hosts(parts.netloc, 6379)
        ],
        decode_responses=True,
        password=parts.password,
        username=parts.username,
    )


def admin_for(url: str) -> Admin:
    if is_cluster_url(url):
        return cluster_admin(url)
    return redis.Redis.from_url(url, decode_responses=True)


def _cpu(info: dict[str, object]) -> float:
    return float(str(info["used_cpu_sys"])) + float(str(info["used_cpu_user"]))


def cpu_by_node(client: Admin) -> dict[str, float]:
    """CPU seconds (user + system) each server has used: every primary of a cluster
    (replicas are left out: they serve no grabs), or the one server (key "")."""
    if isinstance(client, RedisCluster):
        primaries = client.get_primaries()  # type: ignore[no-untyped-call]
        return {n.name: _cpu(client.info("cpu", target_nodes=n)) for n in primaries}
    return {"": _cpu(client.info("cpu"))}


def primaries_in_slot_order(client: RedisCluster) -> list[str]:
    """Primary names (host:port), the owner of slot 0 first, then by their lowest slot."""
    slots = cast(dict[tuple[int, int], dict[str, Any]], client.cluster_slots())
    ranges = sorted(slots.items())
    order: list[str] = []
    for _, owners in ranges:
        host, port = owners["primary"]
        name = f"{host}:{port}"
        if name not in order:
            order.append(name)
    return order


def buckets_by_primary(client: RedisCluster, buckets: int) -> dict[str, list[int]]:
    """The buckets whose hash slot each primary serves now."""
    out: dict[str, list[int]] = {}
    for bucket in range(buckets):
        node = client.get_node_from_key(events_key(bucket))  # type: ignore[no-untyped-call]
        out.setdefault(node.name, []).append(bucket)
    return out


def node_setup(client: RedisCluster, name: str) -> tuple[str | None, str]:
    """The server executable a primary runs (None if it is not on this machine) and its
    ``appendonly`` setting, to start a like single server for comparison."""
    node = client.get_node(node_name=name)  # type: ignore[no-untyped-call]
    executable = str(client.info("server", target_nodes=node).get("executable") or "")
    appendonly = str(client.config_get("appendonly", target_nodes=node).get("appendonly", "no"))
    host = name.rsplit(":", 1)[0]
    local = host in ("127.0.0.1", "localhost", "::1") and Path(executable).is_file()
    return (executable if local else None), appendonly


@contextlib.contextmanager
def single_server(executable: str, appendonly: str, work: Path, port: int) -> Iterator[str]:
    """A plain (non-cluster) server of the same binary and AOF setting on loopback."""
    work.mkdir(parents=True, exist_ok=True)
    args = [executable, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(work)]
    args += ["--save", "", "--appendonly", appendonly, "--daemonize", "no"]
    with (work / "server.log").open("wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    client = redis.Redis(port=port, socket_connect_timeout=1)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{executable} did not start: {(work / 'server.log').read_text()[-300:]}"
                    ) from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        stop_process(proc, 15)


#: scenarios that need one server: shown as skipped on a cluster, with the reason
ONE_SERVER_ONLY = {
    "seed-baseline": "seed 002's script takes the user id as a key (KEYS[4]): its keys "
    "span slots, which a cluster refuses (CROSSSLOT); run it against one server",
    "redis-benchmark": "redis-benchmark drives seed 002's script, whose keys span slots "
    "(CROSSSLOT on a cluster); run it against one server",
}
#: seed 003's designs that connect to Redis with a one-server client
ONE_SERVER_DESIGN = "seed 003's Redis designs use a one-server client; SQL designs still run"

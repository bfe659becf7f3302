"""Every store operation on a real Redis Cluster: single-slot scripts, per-bucket streams."""

from __future__ import annotations

import time

import pytest

from hongbao.domain.models import GrabStatus
from hongbao.errors import ConfigurationError, StorageError
from hongbao.keys import PacketKeys, dead_letter_key, events_key
from hongbao.storage import RedisStore, store_from_url
from hongbao.storage.codec import ClaimValue
from hongbao.storage.redis import Event
from hongbao.storage.redis_cluster import RedisClusterStore
from tests.cluster.conftest import BUCKETS
from tests.servers import RedisCluster, RedisSentinel

pytestmark = [pytest.mark.redis_cluster]


def packets_in_distinct_buckets(store: RedisStore, n: int) -> list[PacketKeys]:
    """Packet ids (made up) landing in `n` different buckets."""
    found: dict[int, PacketKeys] = {}
    i = 0
    while len(found) < n:
        keys = store.keys(f"01PACKET{i:018d}")
        found.setdefault(keys.bucket, keys)
        i += 1
    return list(found.values())


async def load(
    store: RedisStore, keys: PacketKeys, amounts: list[int], expires_in_ms: int = 60_000
) -> None:
    now = int(time.time() * 1000)
    assert await store.load_packet(
        keys,
        expires_at_ms=now + expires_in_ms,
        keep_until_ms=now + 120_000,
        shares=list(enumerate(amounts)),
    )


async def test_url_schemes_build_the_right_store(
    redis_cluster: RedisCluster, redis_sentinel: RedisSentinel
) -> None:
    cluster = store_from_url(redis_cluster.url, BUCKETS)
    sentinel = store_from_url(redis_sentinel.url, BUCKETS)
    try:
        assert isinstance(cluster, RedisClusterStore) and cluster.cluster
        assert type(sentinel) is RedisStore and not sentinel.cluster
        assert await cluster.ping() and await sentinel.ping()
    finally:
        await cluster.aclose()
        await sentinel.aclose()


async def test_bucket_streams_spread_over_every_primary(
    redis_cluster: RedisCluster, cluster_store: RedisClusterStore
) -> None:
    primaries = redis_cluster.primaries()
    assert len(primaries) == 3
    held: dict[int, list[str]] = {p.port: [] for p in primaries}  # type: ignore[misc]
    for stream in cluster_store.streams():
        owner = redis_cluster.primary_for_key(stream)
        with owner.client() as c:
            assert c.exists(stream) == 1  # ensure_groups created it on its own node
            assert c.xinfo_groups(stream)[0]["name"] == "persister"
        assert owner.port is not None
        held[owner.port].append(stream)
    assert all(len(streams) >= 1 for streams in held.values()), held
    assert sum(len(s) for s in held.values()) == BUCKETS


async def test_every_operation_is_single_slot(cluster_store: RedisClusterStore) -> None:
    store = cluster_store
    packets = packets_in_distinct_buckets(store, 6)
    for keys in packets:
        await load(store, keys, [100, 200, 300])
        assert not await store.load_packet(  # a second load changes nothing
            keys, expires_at_ms=1, keep_until_ms=1, shares=[(0, 1)]
        )

    # single grabs, a repeat, and a coalesced batch of two packets of one bucket
    first = packets[0]
    status, *claim = await store.grab(first, "alice")
    assert status is GrabStatus.GRANTED and claim[0] == 1
    again, *same = await store.grab(first, "alice")
    assert again is GrabStatus.ALREADY_CLAIMED and same == claim
    twin = next(
        k
        for i in range(10_000)
        if (k := store.keys(f"01TWIN{i:020d}")).bucket == first.bucket
        and k.packet_id != first.packet_id
    )
    await load(store, twin, [7, 8])
    answers = await store.grab_batch([(first, ["bob", "bob"]), (twin, ["bob", "carol", "dave"])])
    assert [a if isinstance(a, StorageError) else a[0] for a in answers] == [
        GrabStatus.GRANTED,
        GrabStatus.ALREADY_CLAIMED,
        GrabStatus.GRANTED,
        GrabStatus.GRANTED,
        GrabStatus.EXHAUSTED,
    ]
    with pytest.raises(ValueError, match="one bucket"):
        await store.grab_batch([(packets[0], ["x"]), (packets[1], ["y"])])
    for keys in packets[1:]:
        assert (await store.grab(keys, "erin"))[0] is GrabStatus.GRANTED

    live = await store.status(first)
    assert live is not None and (live.shares_left, live.amount_left) == (1, 300)
    assert set(await store.claims(first)) == {"alice", "bob"}
    assert (await store.close_packet(first, "sender", 60_000))[0] == 3  # not expired yet
    old = store.keys("01EXPIREDPACKET00000000000")
    await load(store, old, [5, 6], expires_in_ms=-1000)
    assert await store.close_packet(old, "sender", 60_000) == (1, 11, 2)
    live = await store.status(old)
    assert live is not None and live.closed_at_ms > 0

    # the event streams, read bucket by bucket
    assert await store.backlog() > 0
    events = await store.read_events("c1", 1000, 10)
    by_kind = {(e.fields["k"], e.fields["p"]) for e in events}
    assert ("g", twin.packet_id) in by_kind and ("r", old.packet_id) in by_kind
    assert {e.stream for e in events} == {k.events for k in [*packets, old]}
    assert await store.read_events("c1", 1000, 10) == []
    pending = await store.pending(first.bucket, 0, 100)
    assert pending and {p.consumer for p in pending} == {"c1"}
    taken = await store.claim_entries(first.bucket, "c2", 0, [p.id for p in pending])
    assert {e.id for e in taken} == {p.id for p in pending}
    bad = taken[0]
    await store.dead_letter(Event(bad.stream, bad.id, bad.fields), "test: cannot apply")
    letters = await store.dead_letters()
    assert [(e.stream, e.fields["id"], e.fields["reason"]) for e in letters] == [
        (dead_letter_key(first.bucket), bad.id, "test: cannot apply")
    ]
    back = await store.retry_dead_letter(first.bucket, letters[0].id)
    assert back is not None and await store.dead_letters() == []
    (retried,) = await store.read_events("c1", 1000, 10)
    assert (retried.stream, retried.id, retried.fields) == (bad.stream, back, bad.fields)
    await store.ack(retried.stream, [back])
    for stream in {e.stream for e in events}:
        ids = [e.id for e in events if e.stream == stream and e.id != bad.id]
        await store.ack(stream, ids)
    assert await store.backlog() == 0

    await store.forget_packet(first)
    assert await store.status(first) is None
    assert (await store.grab(first, "frank"))[0] is GrabStatus.UNKNOWN
    assert await store.ping()


async def test_noscript_on_a_node_that_never_saw_the_script(
    redis_cluster: RedisCluster, cluster_store: RedisClusterStore
) -> None:
    """SCRIPT FLUSH on one primary (as after a failover or a restart): EVAL takes over there."""
    store = cluster_store
    packets = packets_in_distinct_buckets(store, BUCKETS)
    for keys in packets:
        await load(store, keys, [50, 50])
        assert (await store.grab(keys, "warm"))[0] is GrabStatus.GRANTED  # scripts cached
    assert store.noscript_fallbacks == 0
    victim = redis_cluster.primary_for_key(packets[0].meta)
    victim.execute("SCRIPT", "FLUSH")
    on_victim = [k for k in packets if redis_cluster.primary_for_key(k.meta) is victim]
    elsewhere = [k for k in packets if k not in on_victim]
    assert on_victim and elsewhere
    for keys in elsewhere:
        assert (await store.grab(keys, "u"))[0] is GrabStatus.GRANTED
    assert store.noscript_fallbacks == 0  # the other primaries still have the scripts
    for keys in on_victim:
        assert (await store.grab(keys, "u"))[0] is GrabStatus.GRANTED
    # EVAL cached it on the victim: one fallback per script, not one per call
    assert store.noscript_fallbacks == 1
    claim = await store.claims(on_victim[0])
    assert claim["u"] == ClaimValue(2, 50, claim["u"].claimed_at_ms)
    # a batch of grabs runs the same script, cached there now
    answers = await store.grab_batch([(on_victim[0], ["v"])])
    assert answers == [(GrabStatus.EXHAUSTED, 0, 0, 0)]
    assert store.noscript_fallbacks == 1
    # another script, on the victim
    status = await store.status(on_victim[0])
    assert status is not None and status.shares_left == 0
    assert store.noscript_fallbacks == 2
    sha = store.lua_grab.sha
    assert victim.execute("SCRIPT", "EXISTS", sha) == [1]


async def test_stream_keys_follow_the_bucket_hash_tag(cluster_store: RedisClusterStore) -> None:
    for bucket in range(BUCKETS):
        assert events_key(bucket).split(":")[1] == dead_letter_key(bucket).split(":")[1]
    keys = cluster_store.keys("01SOMEPACKETID00000000000")
    tag = keys.events.split(":")[1]
    assert all(k.split(":")[1] == tag for k in (keys.meta, keys.shares, keys.claims))


async def test_write_then_wait_runs_on_the_slot_primary(
    redis_cluster: RedisCluster, cluster_store: RedisClusterStore
) -> None:
    """WAIT counts from its connection's last write: INCR and WAIT share one connection."""
    for bucket in (0, 1, 2, 3):
        probe = f"hb:{{b{bucket}}}:durable"
        assert await cluster_store.write_then_wait(probe, "WAIT", 1, 2000) == 1
        assert await cluster_store.write_then_wait(probe, "WAIT", 2, 50) == 1  # one replica each
        with redis_cluster.primary_for_key(probe).client() as c:
            assert c.get(probe) == "2"


async def test_every_primary_must_not_evict(cluster_store: RedisClusterStore) -> None:
    """Not just the node INFO goes to by default: each primary the client knows."""
    import redis

    await cluster_store.check_server()
    default = cluster_store.client.get_default_node()
    other = next(n for n in cluster_store.client.get_nodes() if n.name != default.name)
    node = redis.Redis(host=other.host, port=other.port)
    try:
        node.config_set("maxmemory-policy", "volatile-lru")
        assert await cluster_store.eviction_policy() == "volatile-lru"
        with pytest.raises(ConfigurationError, match="maxmemory-policy is volatile-lru"):
            await cluster_store.check_server()
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.close()
    await cluster_store.check_server()

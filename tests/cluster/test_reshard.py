"""`redis-cli --cluster reshard` during a grab storm: MOVED/ASK followed, nothing lost."""

from __future__ import annotations

import asyncio
import subprocess
import time

import pytest
from redis.crc import key_slot

from hongbao.keys import events_key
from hongbao.persister import Persister
from hongbao.service import Hongbao
from tests.cluster.storming import Storm, drain, open_packets, running, verify
from tests.servers import HOST, RedisCluster

pytestmark = [pytest.mark.redis_cluster, pytest.mark.slow, pytest.mark.faults]


def slot_ranges(cluster: RedisCluster) -> dict[int, list[tuple[int, int]]]:
    out: dict[int, list[tuple[int, int]]] = {}
    for info in cluster.nodes_info():
        if info.is_primary and not info.failed:
            ranges = []
            for rng in info.slots:
                if rng.startswith("["):
                    continue
                lo, _, hi = rng.partition("-")
                ranges.append((int(lo), int(hi or lo)))
            out[info.port] = ranges
    return out


def reshard(cluster: RedisCluster, source: int, target: int, slots: int) -> str:
    """Move the first `slots` slots of `source` to `target` with redis-cli (blocking)."""
    ids = {i.port: i.node_id for i in cluster.nodes_info()}
    cmd = [
        str(cluster.cli), "--cluster", "reshard", f"{HOST}:{source}",
        "--cluster-from", ids[source],
        "--cluster-to", ids[target],
        "--cluster-slots", str(slots),
        "--cluster-yes",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.timeout(120)
async def test_slots_move_between_primaries_during_a_storm(
    fresh_cluster: RedisCluster, fault_service: Hongbao
) -> None:
    service = fault_service
    store = service.store
    packets = await open_packets(service)
    # the primary owning slot 0 gives away its first slots, which hold bucket streams
    ranges = slot_ranges(fresh_cluster)
    source = next(port for port, rs in ranges.items() if any(lo == 0 for lo, _ in rs))
    target = next(port for port in ranges if port != source)
    start, end = next(r for r in ranges[source] if r[0] == 0)
    # the bucket with the lowest slot on the source: its packets move first, soon
    bucket_slots = {b: key_slot(events_key(b).encode()) for b in range(store.buckets)}
    bucket = min(
        (b for b, slot in bucket_slots.items() if start <= slot <= end),
        key=lambda b: bucket_slots[b],
    )
    n_slots = bucket_slots[bucket] + 1
    moving: list[str] = []
    while len(moving) < 2:
        extra = await open_packets(service, 8)
        moving += [p for p in extra if store.keys(p).bucket == bucket]
    packets += moving

    persister = Persister(store, service.ledger, service.settings, consumer="p1")
    async with running(persister):
        storm = Storm(service, packets).start()
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await asyncio.to_thread(reshard, fresh_cluster, source, target, n_slots)
        moved_at = time.monotonic()
        await asyncio.to_thread(fresh_cluster.wait_until_ok, 30)
        await asyncio.sleep(0.5)
        await storm.stop()
    for p in moving:
        assert fresh_cluster.primary_for_key(store.keys(p).meta).port == target
    during = [a for a in storm.acked.values() if t0 < a.at < moved_at]
    assert any(a.packet_id in moving for a in during), "no grab on a moving slot meanwhile"
    # the client's slot map was stale after the move: these grabs followed MOVED
    assert any(a.packet_id in moving and a.at > moved_at for a in storm.acked.values())
    await drain(persister)
    outcome = await verify(service, storm)
    print(
        f"\nreshard: {n_slots} slots moved in {moved_at - t0:.1f}s during the storm; "
        f"{outcome.acked} grabs acknowledged ({len(during)} while moving), "
        f"client errors {len(storm.errors)} {sorted({e for _, e in storm.errors})[:3]}, "
        f"lost {outcome.lost}, "
        f"shares acknowledged twice {outcome.shares_acked_twice}"
    )
    assert outcome.problems == []
    assert outcome.lost == 0 and outcome.shares_acked_twice == 0
    assert outcome.redis_vs_sql == set()
    assert persister.stats.dead_lettered == 0

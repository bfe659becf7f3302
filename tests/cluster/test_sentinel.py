"""A Sentinel-managed primary: the service works through it and survives its failover."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from hongbao.ledger import SqlLedger
from hongbao.persister import Persister
from tests.cluster.conftest import make_service
from tests.cluster.storming import ACK_MODES, Storm, drain, open_packets, running, verify
from tests.integration.test_concurrency import check_outcome, storm
from tests.integration.test_concurrency import open_packet as open_big_packet
from tests.servers import HOST, RedisNode, RedisSentinel

pytestmark = [pytest.mark.redis_cluster]

#: `replica` (WAIT 1) works on a Sentinel-managed primary, not on a cluster
SENTINEL_ACK_MODES = (*ACK_MODES, "replica") if "ledger" in ACK_MODES else ACK_MODES


async def test_exactly_n_winners_through_sentinel(
    redis_sentinel: RedisSentinel, ledger: SqlLedger, sql_url: str
) -> None:
    """The core concurrency storm and checks, unchanged, on `redis+sentinel://`."""
    service = await make_service(redis_sentinel.url, sql_url, ledger=ledger)
    try:
        persister = Persister(service.store, ledger, service.settings, consumer="sentinel-p")
        packet_id = await open_big_packet(service)
        async with running(persister):
            answers = await storm(service, packet_id, seed=5)
            await asyncio.wait_for(persister.drain(), 60)
        await check_outcome(service, packet_id, answers)
        assert persister.stats.dead_lettered == 0
    finally:
        await service.store.aclose()


def wait_replica_of(primary: RedisNode, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with primary.client() as c:
            info = c.info("replication")
        if int(info.get("connected_slaves", 0)) >= 1 and info["slave0"]["state"] == "online":
            return
        time.sleep(0.1)
    raise AssertionError(f"no replica came back to {primary!r}")


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(120)
@pytest.mark.parametrize("ack_mode", SENTINEL_ACK_MODES)
async def test_sentinel_failover_during_a_grab_storm(
    fresh_sentinel: RedisSentinel, tmp_path: Path, ack_mode: str
) -> None:
    service = await make_service(
        fresh_sentinel.url, f"sqlite+aiosqlite:///{tmp_path / 'ledger.sqlite3'}", ack_mode
    )
    try:
        await service.durability.check()
        packets = await open_packets(service)
        persister = Persister(service.store, service.ledger, service.settings, consumer="p1")
        async with running(persister):
            grabs = Storm(service, packets).start()
            await asyncio.sleep(1.0)
            before = len(grabs.acked)
            killed_at = time.monotonic()
            old = fresh_sentinel.kill9_primary()
            assert old.port is not None
            new = await asyncio.to_thread(fresh_sentinel.wait_failover, old.port, 30)
            healed_at = time.monotonic()
            if ack_mode == "replica":
                # WAIT 1 needs a replica again: the old primary comes back as one (Sentinel
                # would convert it by itself, but only ~8 s after it reappears)
                await asyncio.to_thread(old.restart)
                old.execute("REPLICAOF", HOST, str(new.port))
                await asyncio.to_thread(wait_replica_of, new, 30)
                healed_at = time.monotonic()
            await asyncio.sleep(1.5)
            await grabs.stop()
        assert before > 0 and new.port != old.port
        assert grabs.acked_after(healed_at + 0.2) > 0, "no grab after the failover"
        await drain(persister)
        outcome = await verify(service, grabs)
        print(
            f"\nsentinel failover[ack={ack_mode}]: {outcome.lost} acknowledged grabs lost of "
            f"{outcome.acked} (missing in Redis {len(outcome.lost_in_redis)}, in SQL "
            f"{len(outcome.lost_in_sql)}); shares acknowledged to two users: "
            f"{outcome.shares_acked_twice}; failover {healed_at - killed_at:.1f}s, "
            f"client errors {len(grabs.errors)} over {grabs.error_window():.1f}s"
        )
        assert outcome.problems == []
        assert outcome.shares_acked_twice <= outcome.lost
        if ack_mode in ("replica", "ledger"):
            assert outcome.shares_acked_twice == 0
        if ack_mode == "replica":
            assert outcome.lost == 0
        if ack_mode == "ledger":
            assert outcome.lost_in_sql == []
        if outcome.lost == 0:
            assert outcome.redis_vs_sql == set()
    finally:
        await service.aclose()

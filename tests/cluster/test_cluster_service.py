"""The core concurrency test, persisters sharing the buckets, and HTTP end to end, on a cluster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.storage.redis import Event
from tests.api.serving import Serve, audit, clean_env, run_cli, separate_worker
from tests.api.test_e2e import _send_grab_expire as send_grab_expire
from tests.api.test_e2e import drive, stop_cleanly
from tests.cluster.conftest import BUCKETS
from tests.integration.test_concurrency import (
    check_outcome,
    open_packet,
    storm,
    storm_while_persisting,
)
from tests.servers import RedisCluster

#: API processes on a configured Redis share their secret
SHARED = clean_env(HONGBAO_SECRET="cluster-tests-shared-secret-0123456789")

pytestmark = [pytest.mark.redis_cluster, pytest.mark.integration]


async def test_exactly_n_winners_and_sql_equals_redis_on_a_cluster(
    cluster_service: Hongbao, cluster_persister: Persister
) -> None:
    """tests/integration/test_concurrency.py's storm and checks, unchanged."""
    service = cluster_service
    await storm_while_persisting(service, cluster_persister)
    coalescer = service.coalescer
    assert coalescer is not None and coalescer.calls < coalescer.grabs  # batches rode along


class HangsAfterRead(Persister):
    """Applies its first `healthy_batches` batches, then hangs holding what it read."""

    def __init__(self, *args: object, healthy_batches: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.healthy_batches = healthy_batches
        self.holding = asyncio.Event()
        self.held: list[Event] = []

    async def handle(self, events: Sequence[Event]) -> int:
        if events and self.stats.batches >= self.healthy_batches:
            self.held.extend(events)
            self.holding.set()
            await asyncio.Event().wait()  # stuck until cancelled, entries unacknowledged
        return await super().handle(events)


class Pausable(Persister):
    """Reads and applies only while `running` is set."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.running = asyncio.Event()
        self.running.set()

    async def step(self) -> int:
        await self.running.wait()
        return await super().step()


async def test_two_persisters_divide_the_buckets_and_one_takes_over(
    cluster_service: Hongbao,
) -> None:
    service = cluster_service
    # small reads (10 entries per bucket), so that both consumers get work as it arrives
    settings = replace(service.settings, persister_batch=160)
    # many small stream entries (a coalesced call writes one per packet), so that the
    # consumers read batch after batch while the storm lasts
    assert service.coalescer is not None
    service.coalescer.max_batch = 2
    packet_id = await open_packet(service)
    # other packets with users of their own, so that several buckets are at work
    await service.deposit("other-sender", 10_000 * 7)
    others = [(await service.send("other-sender", 10_000, 200)).id for _ in range(6)]
    spare = (await service.send("other-sender", 10_000, 400, mode="equal")).id
    assert len({service.store.keys(p).bucket for p in [packet_id, *others]}) > 2
    doomed = HangsAfterRead(
        service.store, service.ledger, settings, consumer="persister-a", healthy_batches=3
    )
    survivor = Pausable(service.store, service.ledger, settings, consumer="persister-b")
    stop = asyncio.Event()
    workers = [asyncio.create_task(p.run(stop)) for p in (doomed, survivor)]

    async def side_storm(j: int, pid: str) -> int:
        got = await asyncio.gather(
            *(service.grab(pid, f"side{j}-u{i}") for i in range(200)), return_exceptions=True
        )
        assert not [g for g in got if isinstance(g, BaseException)]
        return len(got)

    main = asyncio.create_task(storm(service, packet_id, seed=1))
    await asyncio.gather(*(side_storm(j, p) for j, p in enumerate(others)))
    answers = await main
    spare_grabs = 0
    if not doomed.holding.is_set():
        # the storm ended before persister A read a batch to hang on (B, polling in the
        # same event loop, can win every read): more work, with B paused until A has it
        survivor.running.clear()
        while not doomed.holding.is_set():
            assert spare_grabs < 400, (doomed.stats, workers[0].done() and workers[0])
            await asyncio.gather(
                *(service.grab(spare, f"spare-u{spare_grabs + i}") for i in range(20))
            )
            spare_grabs += 20
            await asyncio.sleep(0.05)
        survivor.running.set()
    # both consumers of the group got a share of the work
    assert doomed.stats.applied > 0
    deadline = time.monotonic() + 10
    while survivor.stats.applied == 0 and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert survivor.stats.applied > 0
    workers[0].cancel()  # persister A dies with entries delivered to it, not acknowledged
    with pytest.raises(asyncio.CancelledError):
        await workers[0]
    held = {(e.stream, e.id) for e in doomed.held}
    assert held
    await asyncio.sleep(settings.persister_claim_idle_ms / 1000)
    await asyncio.wait_for(survivor.drain(), 60)
    stop.set()
    await workers[1]
    # A never acknowledges what it holds, so B took each of those entries over: some
    # already while A hung, once they had been idle long enough, the rest after it died
    assert survivor.stats.reclaimed >= len(held)
    for bucket in range(BUCKETS):
        assert await service.store.pending(bucket, 0, 10) == []
    await check_outcome(service, packet_id, answers)
    for pid in others:
        record = await service.ledger.get_packet(pid)
        assert record is not None and (record.claimed_count, record.claimed_amount) == (200, 10_000)
    record = await service.ledger.get_packet(spare)
    assert record is not None and (record.claimed_count, record.claimed_amount) == (
        spare_grabs,
        25 * spare_grabs,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_serve_end_to_end_on_a_cluster(
    tmp_path: Path, redis_cluster: RedisCluster, cluster_store: object
) -> None:
    """tests/api/test_e2e.py's HTTP walk-through against `serve --redis-url redis+cluster://`."""
    data_dir = tmp_path / "data"
    server = Serve(data_dir, None, "--redis-url", redis_cluster.url, env=SHARED)
    with server:
        await drive(server)
        await asyncio.to_thread(stop_cleanly, server)
    assert await asyncio.to_thread(audit, data_dir) == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_serve_and_a_separate_worker_on_a_cluster(
    tmp_path: Path, redis_cluster: RedisCluster
) -> None:
    """`serve --no-persister`, `hongbao worker`, then `audit` and `recover`, on the cluster."""
    with redis_cluster.cluster_client() as rc:
        rc.flushdb()
    data_dir = tmp_path / "data"
    server = Serve(data_dir, None, "--redis-url", redis_cluster.url, "--no-persister", env=SHARED)
    with server:
        with separate_worker(redis_cluster.url, data_dir):
            send_grab_expire(server)
        stop_cleanly(server)
    assert audit(data_dir) == []
    for command_name in ("audit", "recover"):  # the tools, on the cluster too
        done = run_cli(command_name, "--redis-url", redis_cluster.url, "--data-dir", str(data_dir))
        assert done.returncode == 0, done.stdout + done.stderr
    with redis_cluster.cluster_client() as rc:
        rc.flushdb()

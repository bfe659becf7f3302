"""tests/integration/test_rules_storms.py's storms on the Redis Cluster, and the rules
surviving a FLUSHALL of every primary followed by `recover`."""

from __future__ import annotations

import asyncio
import random

import pytest

from hongbao.audit import recover
from hongbao.errors import NotInAudience, WrongPassphrase
from hongbao.ledger import SqlLedger
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage.redis_cluster import RedisClusterStore
from tests.integration.test_rules_storms import KEY, PHRASE, STORMS

pytestmark = [pytest.mark.redis_cluster, pytest.mark.integration]


@pytest.fixture
async def rules_service(
    cluster_store: RedisClusterStore, ledger: SqlLedger, cluster_settings_: Settings
) -> Hongbao:
    return Hongbao(
        cluster_store, ledger, cluster_settings_, rng=random.Random(41), passphrase_keys=[KEY]
    )


@pytest.fixture
def rules_persister(rules_service: Hongbao) -> Persister:
    s = rules_service
    return Persister(s.store, s.ledger, s.settings, consumer="cluster-rules-persister")


@pytest.mark.parametrize("name", list(STORMS))
async def test_storm_on_a_cluster(
    rules_service: Hongbao, rules_persister: Persister, name: str
) -> None:
    stop = asyncio.Event()
    worker = asyncio.create_task(rules_persister.run(stop))
    try:
        await STORMS[name](rules_service, rules_persister)
    finally:
        stop.set()
        await worker
    assert rules_persister.stats.dead_lettered == 0


async def test_rules_hold_after_flushall_and_recover_on_a_cluster(
    rules_service: Hongbao,
) -> None:
    service = rules_service
    await service.deposit("sender", 2_000)
    packets = [await service.send("sender", 100, 1, audience=["ann"]) for _ in range(10)]
    phrased = await service.send("sender", 1_000, 2, passphrase=PHRASE)
    await service.store.client.flushall()  # every primary: the cluster is this session's own
    report = await recover(service)
    assert report.rebuilt == 11
    buckets = {service.store.keys(p.id).bucket for p in packets}
    assert len(buckets) > 2  # several slots, on several primaries
    for packet in packets:
        with pytest.raises(NotInAudience):
            await service.grab(packet.id, "eve")
        assert (await service.grab(packet.id, "ann")).first
    with pytest.raises(WrongPassphrase):
        await service.grab(phrased.id, "eve")
    assert (await service.grab(phrased.id, "eve", passphrase=PHRASE)).first

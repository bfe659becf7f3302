"""tests/integration/test_rules_storms.py's storms on the Redis Cluster, and the rules
surviving a FLUSHALL of every primary followed by `recover`."""

from __future__ import annotations

import asyncio
import random

import pytest

from hongbao.audit import recover
from hongbao.domain.models import GrabStatus
from hongbao.errors import NotInAudience, WrongPassphrase
from hongbao.ledger import SqlLedger
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import store_from_url
from hongbao.storage.redis_cluster import RedisClusterStore
from tests.cluster.conftest import BUCKETS
from tests.integration.test_rules_storms import KEY, PHRASE, STORMS
from tests.servers import RedisCluster
from tests.storage.test_scripts import answered

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


async def test_a_host_that_did_not_send_a_packet_grabs_it_under_its_rules(
    rules_service: Hongbao, redis_cluster: RedisCluster
) -> None:
    """Another API host's store learns each packet's rules from grab.lua and grabs again
    with its rules keys, on the primary of the packet's slot."""
    service = rules_service
    await service.deposit("sender", 1_000)
    packets = [await service.send("sender", 100, 2, audience=["ann", "bob"]) for _ in range(6)]
    other = store_from_url(redis_cluster.url, BUCKETS)
    try:
        for packet in packets:
            keys = other.keys(packet.id)
            got = answered(await other.grab_batch([(keys, ["eve", "ann", "ann"])]))
            assert [a[0] for a in got] == [
                GrabStatus.NOT_IN_AUDIENCE,
                GrabStatus.GRANTED,
                GrabStatus.ALREADY_CLAIMED,
            ]
            (bob,) = answered(await other.grab_batch([(keys, ["bob"])]))
            assert bob[0] is GrabStatus.GRANTED
    finally:
        await other.aclose()
    assert len({other.keys(p.id).bucket for p in packets}) > 1

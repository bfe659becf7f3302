"""How long a packet's Redis keys live, and that money is settled whatever they do:
every key of a packet expires, a remainder is refunded even when the keys expired before
the sweeper came, and a cancelled packet is not reopened by a rebuild from a ledger that
has not yet applied its refund."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from hongbao.audit import audit, recover
from hongbao.domain.models import PacketStatus
from hongbao.errors import PacketCancelled, PacketExhausted, PacketExpired
from hongbao.ledger import SqlLedger
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from hongbao.storage.codec import pack_share
from hongbao.sweeper import Sweeper

pytestmark = [pytest.mark.redis, pytest.mark.integration]


def _with(store: RedisStore, ledger: SqlLedger, settings: Settings, **changes: int) -> Hongbao:
    return Hongbao(store, ledger, replace(settings, **changes), rng=random.Random(7))


async def _ttls_ms(service: Hongbao, packet_id: str) -> dict[str, int]:
    keys = service.keys_of(packet_id)
    client = service.store.client
    return {
        "meta": await client.pttl(keys.meta),
        "claims": await client.pttl(keys.claims),
    }


async def test_the_claims_of_a_packet_whose_last_share_went_expire_with_its_meta(
    service: Hongbao,
) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 300, 3, expires_in=3600)
    await service.grab(packet.id, "a")
    middle = await _ttls_ms(service, packet.id)
    assert middle["meta"] > 0
    assert middle["claims"] == -1  # created by the first grant; the packet is still open
    await service.grab(packet.id, "b")
    await service.grab(packet.id, "c")
    ttls = await _ttls_ms(service, packet.id)
    assert 0 < ttls["meta"] - 5_000 <= ttls["claims"] <= ttls["meta"]


async def test_a_batch_that_takes_the_last_shares_gives_the_claims_a_lifetime(
    service: Hongbao,
) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 300, 3, expires_in=3600)
    grabs = await asyncio.gather(*(service.grab(packet.id, f"u{i}") for i in range(3)))
    assert sum(g.amount for g in grabs) == 300
    ttls = await _ttls_ms(service, packet.id)
    assert 0 < ttls["claims"] <= ttls["meta"]


@pytest.mark.parametrize("retention", [0, 1])
async def test_a_remainder_is_refunded_when_the_keys_are_gone_before_the_sweeper(
    store: RedisStore, ledger: SqlLedger, settings: Settings, retention: int
) -> None:
    """Keys that expired with their retention, or that Redis lost, before the sweeper
    closed the packet: the sweeper rebuilds it from the ledger, closes it and refunds."""
    service = _with(store, ledger, settings, retention_seconds=retention)
    persister = Persister(store, ledger, service.settings, consumer="lifetimes")
    await service.deposit("s", 1000)
    packet = await service.send("s", 600, 3, expires_in=1)
    mine = await service.grab(packet.id, "u1")
    await asyncio.wait_for(persister.drain(), 20)
    assert (await _ttls_ms(service, packet.id))["meta"] > 0
    await asyncio.sleep(1.1 + retention)
    keys = service.keys_of(packet.id)
    await store.client.delete(keys.meta, keys.shares, keys.claims, keys.audience)
    assert await Sweeper(service).sweep_once() == 1
    await asyncio.wait_for(persister.drain(), 20)
    assert (await service.wallet("s")).balance == 1000 - mine.amount
    assert (await service.packet(packet.id)).status is PacketStatus.EXPIRED
    assert (await service.grab(packet.id, "u1")).amount == mine.amount
    assert await Sweeper(service).sweep_once() == 0
    assert await ledger.audit() == []


async def test_a_packet_expiring_at_once_keeps_its_keys_until_the_sweeper_closes_it(
    store: RedisStore, ledger: SqlLedger, settings: Settings
) -> None:
    service = _with(store, ledger, settings, retention_seconds=0)
    await service.deposit("s", 1000)
    packet = await service.send("s", 600, 3, expires_in=1)
    assert (await _ttls_ms(service, packet.id))["meta"] > 590_000
    await asyncio.sleep(1.1)
    assert await Sweeper(service).sweep_once() == 1
    assert await store.client.exists(service.keys_of(packet.id).meta) == 0  # retention 0


async def test_a_cancelled_packet_is_not_reopened_before_the_ledger_has_its_refund(
    store: RedisStore, ledger: SqlLedger, settings: Settings
) -> None:
    service = _with(store, ledger, settings, retention_seconds=0)
    await service.deposit("s", 1000)
    packet = await service.send("s", 300, 3, expires_in=60)
    first = await service.grab(packet.id, "u1")
    await service.cancel(packet.id, "s")
    # no persister ran: the ledger still holds the packet as open
    record = await ledger.get_packet(packet.id)
    assert record is not None and record.status == PacketStatus.ACTIVE
    with pytest.raises(PacketCancelled):
        await service.grab(packet.id, "u2")
    assert (await service.grab(packet.id, "u1")).amount == first.amount
    persister = Persister(store, ledger, service.settings, consumer="lifetimes")
    await asyncio.wait_for(persister.drain(), 20)
    assert (await service.wallet("s")).balance == 1000 - first.amount
    assert (await service.wallet("u2")).balance == 0
    assert await ledger.audit() == []


async def test_cancelling_a_packet_closed_at_its_expiry_says_how_it_closed(
    service: Hongbao, persister: Persister
) -> None:
    await service.deposit("s", 1000)
    with_remainder = await service.send("s", 300, 3, expires_in=1)
    spent = await service.send("s", 200, 2, expires_in=1)
    await service.grab(with_remainder.id, "a")
    await service.grab(spent.id, "a")
    await service.grab(spent.id, "b")
    await asyncio.sleep(1.1)
    await Sweeper(service).sweep_once()
    with pytest.raises(PacketExpired):
        await service.cancel(with_remainder.id, "s")
    with pytest.raises(PacketExhausted):
        await service.cancel(spent.id, "s")
    await asyncio.wait_for(persister.drain(), 20)
    assert await service.ledger.audit() == []


async def test_recover_puts_back_the_last_claims_of_a_spent_packet(
    service: Hongbao, persister: Persister
) -> None:
    """Redis lost the last claim of a packet after the ledger had it (a rolled-back AOF
    tail): the ledger holds the packet as spent, and Redis would offer the share again."""
    await service.deposit("s", 1000)
    packet = await service.send("s", 300, 2)
    first = await service.grab(packet.id, "a")
    last = await service.grab(packet.id, "b")
    await asyncio.wait_for(persister.drain(), 20)
    record = await service.ledger.get_packet(packet.id)
    assert record is not None and record.status == PacketStatus.EXHAUSTED
    keys = service.keys_of(packet.id)
    client = service.store.client
    await client.hdel(keys.claims, "b")
    await client.rpush(keys.shares, pack_share(last.seq - 1, last.amount))
    await client.hincrby(keys.meta, "left", last.amount)
    fixed = await recover(service)
    assert (fixed.repaired_claims, fixed.conflicts) == (1, [])
    with pytest.raises(PacketExhausted):
        await service.grab(packet.id, "c")
    again = await service.grab(packet.id, "b")
    assert (again.first, again.amount) == (False, last.amount)
    assert (await service.grab(packet.id, "a")).amount == first.amount
    assert (await audit(service, settle=0)).clean


async def test_recover_gives_spent_packets_claims_a_lifetime(
    store: RedisStore, ledger: SqlLedger, settings: Settings
) -> None:
    service = _with(store, ledger, settings, retention_seconds=1)
    persister = Persister(store, ledger, service.settings, consumer="lifetimes")
    await service.deposit("s", 1000)
    live = await service.send("s", 100, 1, expires_in=3600)
    gone = await service.send("s", 100, 1, expires_in=1)
    await service.grab(live.id, "a")
    await service.grab(gone.id, "a")
    await asyncio.wait_for(persister.drain(), 20)
    for packet in (live, gone):  # claims hashes left without a lifetime
        await store.client.persist(service.keys_of(packet.id).claims)
    await asyncio.sleep(2.2)  # `gone`'s expiry plus retention passed
    await store.client.delete(service.keys_of(gone.id).meta)  # as its lifetime ended
    assert (await recover(service)).claims_lifetimes == 2
    ttls = await _ttls_ms(service, live.id)
    assert 0 < ttls["claims"] <= ttls["meta"]
    assert not await store.client.exists(service.keys_of(gone.id).claims)
    assert (await recover(service)).claims_lifetimes == 0

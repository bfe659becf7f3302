"""`hongbao.audit` (audit, recover) and the `--ack` modes, on real Redis and SQLite."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

import pytest

from hongbao.audit import audit, recover
from hongbao.errors import ConfigurationError, StorageError
from hongbao.keys import PERSISTER_GROUP
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import store_from_url
from hongbao.sweeper import Sweeper
from tests.servers import RedisNode, find_server_binary

pytestmark = [
    pytest.mark.redis,
    pytest.mark.integration,
    pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True),
]


async def _packet(service: Hongbao, total: int = 1000, count: int = 10) -> str:
    await service.deposit("sender", 100_000)
    return (await service.send("sender", total, count)).id


async def test_clean_with_pending_and_after_drain(service: Hongbao, persister: Persister) -> None:
    pid = await _packet(service)
    for i in range(6):
        await service.grab(pid, f"u{i}")
    pending = await audit(service, settle=0)  # nothing persisted yet: all pending, still clean
    assert pending.clean, pending.violations
    assert pending.pending_claims == 6 and pending.backlog == 6
    await asyncio.wait_for(persister.drain(), 20)
    report = await audit(service, settle=0)
    assert report.clean, report.violations
    assert (report.backlog, report.open_packets) == (0, 1)


async def test_a_claim_neither_persisted_nor_pending_is_named(service: Hongbao) -> None:
    pid = await _packet(service)
    await service.grab(pid, "alice")
    keys = service.store.keys(pid)
    await service.store.client.delete(keys.events)  # the event is lost
    await service.store.ensure_groups()
    report = await audit(service, settle=0)
    assert not report.clean
    assert any(pid in v and "alice" in v and "neither" in v for v in report.violations)


async def test_recover_after_redis_wiped(service: Hongbao, persister: Persister) -> None:
    pid = await _packet(service, 1000, 10)
    first = {u: await service.grab(pid, u) for u in ("a", "b", "c")}
    await asyncio.wait_for(persister.drain(), 20)
    await service.store.client.flushdb()
    report = await audit(service, settle=0)
    assert any(pid in v and "missing from Redis" in v for v in report.violations)
    fixed = await recover(service)
    assert fixed.rebuilt == 1 and not fixed.conflicts
    again = await recover(service)  # idempotent
    assert again.rebuilt == 0 and again.repaired_claims == 0
    assert (await audit(service, settle=0)).clean
    for user, grab in first.items():  # earlier owners keep their answer
        repeat = await service.grab(pid, user)
        assert (repeat.seq, repeat.amount, repeat.first) == (grab.seq, grab.amount, False)
    rest = [await service.grab(pid, f"n{i}") for i in range(7)]
    seqs = [g.seq for g in rest] + [g.seq for g in first.values()]
    assert sorted(seqs) == list(range(1, 11))  # no share issued twice
    await asyncio.wait_for(persister.drain(), 20)
    assert (await audit(service, settle=0)).clean
    assert await service.store.dead_letters() == []


async def test_recover_repairs_claims_redis_forgot(service: Hongbao, persister: Persister) -> None:
    """Redis rolled back (an AOF tail lost) while the ledger kept the claims."""
    pid = await _packet(service, 1000, 10)
    keys = service.store.keys(pid)
    client = service.store.client
    await service.grab(pid, "early")
    saved = {k: await client.dump(k) for k in (keys.meta, keys.shares, keys.claims)}
    late = {u: await service.grab(pid, u) for u in ("x", "y")}
    await asyncio.wait_for(persister.drain(), 20)
    for k, blob in saved.items():  # Redis forgets x and y
        await client.restore(k, 0, blob, replace=True)
    report = await audit(service, settle=0)
    assert any("x" in v and "missing from Redis" in v for v in report.violations)
    fixed = await recover(service)
    assert fixed.repaired_claims == 2 and not fixed.conflicts
    assert (await recover(service)).repaired_claims == 0
    assert (await audit(service, settle=0)).clean, (await audit(service, settle=0)).violations
    for user, grab in late.items():
        repeat = await service.grab(pid, user)
        assert (repeat.seq, repeat.first) == (grab.seq, False)
    others = [await service.grab(pid, f"o{i}") for i in range(7)]
    assert len({g.seq for g in others} | {g.seq for g in late.values()} | {1}) == 10
    await asyncio.wait_for(persister.drain(), 20)
    assert (await audit(service, settle=0)).clean


async def test_recover_repairs_a_packet_closed_after_redis_forgot_claims(
    service: Hongbao, persister: Persister
) -> None:
    """Redis rolled back, then closed the packet before `recover` ran: its refund counts
    the forgotten claims' money again, and the ledger refuses it (dead letter)."""
    await service.deposit("sender", 100_000)
    pid = (await service.send("sender", 1000, 10, expires_in=1)).id
    keys = service.store.keys(pid)
    client = service.store.client
    early = await service.grab(pid, "early")
    saved = {k: await client.dump(k) for k in (keys.meta, keys.shares, keys.claims)}
    late = {u: await service.grab(pid, u) for u in ("x", "y")}
    await asyncio.wait_for(persister.drain(), 20)
    for k, blob in saved.items():  # Redis forgets x and y
        await client.restore(k, 0, blob, replace=True)
    await asyncio.sleep(1.1)
    assert await Sweeper(service).sweep_once() == 1
    await asyncio.wait_for(persister.drain(), 20)
    assert len(await service.store.dead_letters()) == 1  # the refund that was too large
    assert not (await audit(service, settle=0)).clean

    fixed = await recover(service)
    assert (fixed.repaired_claims, fixed.conflicts) == (2, [])
    await asyncio.wait_for(persister.drain(), 20)
    record = await service.ledger.get_packet(pid)
    assert record is not None and record.closed_at is not None
    assert record.claimed_amount == early.amount + sum(g.amount for g in late.values())
    assert record.claimed_amount + record.refunded_amount == 1000
    assert (await service.wallet("sender")).balance == 100_000 - 1000 + record.refunded_amount
    for user, grab in late.items():  # their claims are answered again
        repeat = await service.grab(pid, user)
        assert (repeat.seq, repeat.amount, repeat.first) == (grab.seq, grab.amount, False)
    assert (await recover(service)).repaired_claims == 0
    report = await audit(service, settle=0)
    assert report.clean, report.violations
    assert await service.ledger.audit() == []


async def test_dead_letters_are_listed(service: Hongbao, persister: Persister) -> None:
    pid = await _packet(service)
    keys = service.store.keys(pid)
    await service.store.client.xadd(keys.events, {"k": "c", "p": pid, "u": "z", "c": "bad"})
    await service.grab(pid, "ok")
    await asyncio.wait_for(persister.drain(), 20)
    report = await audit(service, settle=0)
    assert report.clean and len(report.dead_letters) == 1
    assert any("dead letter" in line for line in report.lines())


# -- ack modes ------------------------------------------------------------------------------


async def test_ledger_ack_commits_before_answering(service: Hongbao) -> None:
    svc = Hongbao(
        service.store,
        service.ledger,
        replace(service.settings, ack_mode="ledger"),
        random.Random(1),
    )
    pid = await _packet(svc, 1000, 50)
    grabs = await asyncio.gather(*(svc.grab(pid, f"u{i}") for i in range(50)))
    rows = {r.user_id: r for r in await svc.ledger.claims_of(pid)}  # no persister ran
    assert len(rows) == 50
    for g in grabs:
        assert rows[g.user_id].share_idx + 1 == g.seq
    durability = svc.durability
    assert durability.mode == "ledger"
    assert getattr(durability, "calls", 0) < 50  # group commit
    assert await svc.ledger.audit() == []
    # the persister's replay of the same events is harmless
    persister = Persister(svc.store, svc.ledger, svc.settings, consumer="replay")
    await asyncio.wait_for(persister.drain(), 20)
    assert await svc.store.dead_letters() == []
    assert (await audit(svc, settle=0)).clean


async def test_replica_ack_without_replica_fails_the_grab(service: Hongbao) -> None:
    settings = replace(service.settings, ack_mode="replica", ack_timeout_ms=100)
    svc = Hongbao(service.store, service.ledger, settings, random.Random(1))
    pid = await _packet(svc)
    with pytest.raises(StorageError, match="replica"):
        await svc.grab(pid, "alice")


async def test_aof_ack(tmp_path: Path, sql_url: str) -> None:
    """WAITAOF on a server that has it; a clear ConfigurationError on one that does not."""
    node = RedisNode().start(None, tmp_path / "r", appendonly=True)
    try:
        version = str(node.client().info("server").get("redis_version", "0"))
        settings = Settings(redis_url=node.url, database_url=sql_url, buckets=4, ack_mode="aof")
        has_waitaof = "valkey" in str(find_server_binary()) or tuple(
            int(x) for x in version.split(".")[:2]
        ) >= (7, 2)
        if not has_waitaof:
            with pytest.raises(ConfigurationError, match="WAITAOF"):
                await Hongbao.connect(settings, migrate=True)
            return
        svc = await Hongbao.connect(settings, migrate=True)
        try:
            pid = await _packet(svc)
            grabs = await asyncio.gather(*(svc.grab(pid, f"u{i}") for i in range(10)))
            assert len({g.seq for g in grabs}) == 10
        finally:
            await svc.aclose()
    finally:
        node.stop()


async def test_aof_ack_refused_without_appendonly(tmp_path: Path, sql_url: str) -> None:
    node = RedisNode().start(None, tmp_path / "r", appendonly=False)
    try:
        settings = Settings(redis_url=node.url, database_url=sql_url, buckets=4, ack_mode="aof")
        with pytest.raises(ConfigurationError):
            await Hongbao.connect(settings, migrate=True)
    finally:
        node.stop()


def test_unknown_ack_mode_is_a_configuration_error(redis_url: str, sql_url: str) -> None:
    store = store_from_url(redis_url, 4)
    with pytest.raises(ConfigurationError, match="ack mode"):
        from hongbao.durability import make_durability

        make_durability(Settings(ack_mode="fsync"), store, None)  # type: ignore[arg-type]
    assert PERSISTER_GROUP


async def test_replica_ack_with_a_replica(tmp_path: Path, sql_url: str) -> None:
    primary = RedisNode().start(None, tmp_path / "p")
    replica = RedisNode().start(
        None, tmp_path / "r", extra_args=["--replicaof", "127.0.0.1", str(primary.port)]
    )
    try:
        for _ in range(100):
            if primary.client().info("replication").get("connected_slaves") == 1:
                break
            await asyncio.sleep(0.1)
        settings = Settings(
            redis_url=primary.url, database_url=sql_url, buckets=4, ack_mode="replica"
        )
        svc = await Hongbao.connect(settings, migrate=True)
        try:
            pid = await _packet(svc, 1000, 20)
            grabs = await asyncio.gather(*(svc.grab(pid, f"u{i}") for i in range(20)))
            assert len({g.seq for g in grabs}) == 20
            mirrored = replica.client().hgetall(svc.store.keys(pid).claims)
            assert len(mirrored) == 20  # acknowledged means the replica has it
            assert getattr(svc.durability, "calls", 99) < 20
        finally:
            await svc.aclose()
    finally:
        replica.stop()
        primary.stop()

"""The service end to end on real Redis and each SQL database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hongbao import service as service_module
from hongbao.domain.models import GrabResult, GrabStatus, PacketStatus, SplitMode
from hongbao.errors import (
    IdempotencyConflict,
    InsufficientBalance,
    InvalidRequest,
    PacketExhausted,
    PacketExpired,
    PacketNotFound,
)
from hongbao.keys import PacketKeys
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.storage.codec import Grants, decode_entries
from hongbao.sweeper import Sweeper

pytestmark = [pytest.mark.redis, pytest.mark.integration]


async def test_send_grab_claims_and_wallets(service: Hongbao, persister: Persister) -> None:
    await service.deposit("sender", 10_000)
    packet = await service.send("sender", 1000, 3, greeting="新年快乐")
    assert packet.status is PacketStatus.ACTIVE
    assert (packet.remaining_count, packet.remaining_amount) == (3, 1000)
    assert (await service.wallet("sender")).balance == 9000
    got = [await service.grab(packet.id, u) for u in ("a", "b", "c")]
    assert sum(g.amount for g in got) == 1000 and all(g.first for g in got)
    assert sorted(g.seq for g in got) == [1, 2, 3]
    repeat = await service.grab(packet.id, "b")
    assert not repeat.first and (repeat.amount, repeat.seq) == (got[1].amount, got[1].seq)
    with pytest.raises(PacketExhausted):
        await service.grab(packet.id, "d")
    claims = await service.claims(packet.id)
    assert [c.user_id for c in claims.claims] == ["a", "b", "c"]
    best = max(got, key=lambda g: g.amount)
    assert claims.best_luck == best.user_id
    assert (await service.packet(packet.id)).status is PacketStatus.EXHAUSTED
    await asyncio.wait_for(persister.drain(), 20)
    for g in got:
        assert (await service.wallet(g.user_id)).balance == g.amount
    assert await service.ledger.audit() == []


async def test_best_luck_only_once_exhausted_and_ties_go_to_earliest(service: Hongbao) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 300, 3, mode=SplitMode.EQUAL)
    await service.grab(packet.id, "first")
    assert (await service.claims(packet.id)).best_luck is None
    await service.grab(packet.id, "second")
    await service.grab(packet.id, "third")
    assert (await service.claims(packet.id)).best_luck == "first"


async def test_bad_requests_change_nothing(service: Hongbao) -> None:
    await service.deposit("s", 100)
    for kwargs, field in [
        ({"total_amount": 0, "count": 1}, "total_amount"),
        ({"total_amount": 10, "count": 0}, "count"),
        ({"total_amount": 10, "count": 11}, "total_amount"),
        ({"total_amount": 10.0, "count": 1}, "total_amount"),
        ({"total_amount": 10, "count": 1, "mode": "weird"}, "mode"),
        ({"total_amount": 10, "count": 1, "expires_in": 0}, "expires_in"),
        ({"total_amount": 10, "count": 1, "greeting": "x" * 201}, "greeting"),
    ]:
        with pytest.raises(InvalidRequest) as err:
            await service.send("s", **kwargs)  # type: ignore[arg-type]
        assert err.value.field == field
    with pytest.raises(InsufficientBalance):
        await service.send("s", 101, 1)
    with pytest.raises(InvalidRequest):
        await service.deposit("bad user!", 5)
    with pytest.raises(PacketNotFound):
        await service.grab("0" * 26, "u")
    with pytest.raises(PacketNotFound):
        await service.packet("../etc")
    assert (await service.wallet("s")).balance == 100
    assert await service.ledger.audit() == []


async def test_grab_key_cache_stays_bounded_and_checks_every_new_id(
    service: Hongbao, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "_KEYS_CACHE", 2)
    await service.deposit("s", 300)
    packets = [await service.send("s", 100, 2) for _ in range(3)]
    for round_ in range(2):  # the second round finds some keys cached, some not
        for packet in packets:
            got = await service.grab(packet.id, f"u{round_}")
            assert (got.packet_id, got.first) == (packet.id, True)
            assert len(service._keys) <= 2
    for bad in ("../etc", "0" * 25, "Z" * 26, 7, ["x"]):
        for _ in range(2):  # a refused id is not remembered as valid
            with pytest.raises(PacketNotFound):
                await service.grab(bad, "u9")  # type: ignore[arg-type]
    assert set(service._keys) <= {p.id for p in packets}


async def test_send_idempotency_key(service: Hongbao) -> None:
    await service.deposit("s", 1000)
    first = await service.send("s", 500, 5, idempotency_key="k1")
    again = await service.send("s", 500, 5, idempotency_key="k1")
    assert again.id == first.id
    assert (await service.wallet("s")).balance == 500
    with pytest.raises(IdempotencyConflict):
        await service.send("s", 400, 5, idempotency_key="k1")


async def test_expiry_refunds_the_remainder(service: Hongbao, persister: Persister) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 600, 3, expires_in=1)
    mine = await service.grab(packet.id, "u1")
    await asyncio.sleep(1.1)
    with pytest.raises(PacketExpired):
        await service.grab(packet.id, "u2")
    assert (await service.grab(packet.id, "u1")).amount == mine.amount  # repeat still answered
    assert await Sweeper(service).sweep_once() == 1
    assert await Sweeper(service).sweep_once() == 0
    await asyncio.wait_for(persister.drain(), 20)
    assert (await service.wallet("s")).balance == 400 + 600 - mine.amount
    assert (await service.wallet("u1")).balance == mine.amount
    after = await service.packet(packet.id)
    assert after.status is PacketStatus.EXPIRED
    record = await service.ledger.get_packet(packet.id)
    assert record is not None
    assert record.claimed_amount + record.refunded_amount == record.total_amount
    assert await service.ledger.audit() == []


async def test_redis_loss_is_rebuilt_from_the_ledger(
    service: Hongbao, persister: Persister
) -> None:
    await service.deposit("s", 10_000)
    packet = await service.send("s", 1000, 10)
    before = {u: await service.grab(packet.id, u) for u in ("a", "b", "c")}
    await asyncio.wait_for(persister.drain(), 20)
    await service.store.client.flushdb()  # Redis lost everything
    await service.store.ensure_groups()
    assert await service.recover() == 1
    assert await service.recover() == 0  # safe to run twice
    again = await service.grab(packet.id, "a")
    assert not again.first and again.amount == before["a"].amount
    rest = [await service.grab(packet.id, f"n{i}") for i in range(7)]
    with pytest.raises(PacketExhausted):
        await service.grab(packet.id, "late")
    seqs = {g.seq for g in [*before.values(), *rest]}
    assert seqs == set(range(1, 11))  # no share issued twice
    await asyncio.wait_for(persister.drain(), 20)
    assert await service.ledger.audit() == []
    winners = [*before, *(f"n{i}" for i in range(7))]
    assert sum([(await service.wallet(u)).balance for u in winners]) == 1000


async def test_packet_written_but_not_loaded_heals_on_grab(service: Hongbao) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 100, 2)
    await service.store.forget_packet(service.store.keys(packet.id))  # crash before the load
    got = await service.grab(packet.id, "u")
    assert got.first and got.amount > 0
    assert (await service.packet(packet.id)).remaining_count == 1


async def test_a_storm_on_a_lost_packet_loads_it_from_the_ledger_once(
    service: Hongbao, persister: Persister
) -> None:
    await service.deposit("s", 10_000)
    packet = await service.send("s", 1_000, 50)
    early = [await service.grab(packet.id, f"early{i}") for i in range(10)]
    await asyncio.wait_for(persister.drain(), 20)
    await service.store.forget_packet(service.store.keys(packet.id))  # Redis lost it
    loads = 0
    real_load = service._load

    async def counted_load(*args: Any) -> bool:
        nonlocal loads
        loads += 1
        return await real_load(*args)

    service._load = counted_load  # type: ignore[method-assign]
    late = await asyncio.gather(
        *(service.grab(packet.id, f"late{i}") for i in range(60)),
        *(service.grab(packet.id, f"early{i}") for i in range(10)),
        return_exceptions=True,
    )
    assert loads == 1
    winners = [g for g in late[:60] if isinstance(g, GrabResult)]
    assert len(winners) == 40  # 50 shares, 10 taken before the loss
    assert all(isinstance(g, PacketExhausted) for g in late[:60] if not isinstance(g, GrabResult))
    # the early grabbers get their first claim back, not a new share
    assert [(g.seq, g.amount) for g in late[60:]] == [(g.seq, g.amount) for g in early]  # type: ignore[union-attr]
    assert not service._loading


async def test_grant_entry_with_a_bad_line_parks_only_with_its_reason(
    service: Hongbao, persister: Persister
) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 100, 3)
    got = await service.grab(packet.id, "u1")
    keys = service.store.keys(packet.id)
    replay = f"u1 {got.seq}:{got.amount}:{got.claimed_at_ms}"
    await service.store.client.xadd(
        keys.events, {"k": "g", "p": packet.id, "c": f"{replay}\nu8 9:5:1"}
    )
    await service.store.client.xadd(keys.events, {"k": "g", "p": packet.id, "c": "u7 nonsense"})
    await asyncio.wait_for(persister.drain(), 20)
    parked = sorted(await service.store.dead_letters(), key=lambda e: e.fields["id"])
    assert len(parked) == 2
    assert "u1" not in parked[0].fields["reason"] and parked[0].fields["reason"]
    assert "malformed" in parked[1].fields["reason"]
    # the replayed line changed nothing, the bad share paid nothing
    assert (await service.wallet("u1")).balance == got.amount
    assert (await service.wallet("u8")).balance == 0
    assert await service.ledger.audit() == []


async def test_poison_entry_goes_to_dead_letter(service: Hongbao, persister: Persister) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 100, 2)
    await service.grab(packet.id, "u1")
    keys = service.store.keys(packet.id)
    await service.store.client.xadd(keys.events, {"k": "c", "p": packet.id, "u": "x", "c": "zz"})
    await service.store.client.xadd(keys.events, {"k": "c", "p": "nope", "u": "x", "c": "1:5:1"})
    await service.grab(packet.id, "u2")
    await asyncio.wait_for(persister.drain(), 20)
    parked = await service.store.dead_letters()
    assert len(parked) == 2 and persister.stats.dead_lettered == 2
    assert {("malformed" in p.fields["reason"]) for p in parked} == {True, False}
    assert (await service.wallet("u1")).balance + (await service.wallet("u2")).balance == 100
    assert await service.ledger.audit() == []


async def test_a_call_of_many_packets_groups_their_grants_by_stream_and_settles(
    service: Hongbao, persister: Persister
) -> None:
    """A call of 40 packets (the script groups from 32) over the service's 4 buckets: one
    entry per stream holds its packets' grants, plain, for an actor and several to a
    packet; the persister applies every claim once, to the right packet."""
    await service.deposit("s", 40 * 300)
    packets = [await service.send("s", 300, 3) for _ in range(40)]
    keys = [service.store.keys(p.id) for p in packets]
    groups: list[tuple[PacketKeys, list[str]]] = [(k, [f"u{i}"]) for i, k in enumerate(keys)]
    groups[1] = (keys[1], ["a=svc"])
    groups[2] = (keys[2], ["b1", "b2", "b1"])
    answers = await service.store.grab_batch(groups)
    statuses = [a[0] for a in answers if not isinstance(a, Exception)]
    granted, repeat = GrabStatus.GRANTED, GrabStatus.ALREADY_CLAIMED
    assert statuses == [granted] * 4 + [repeat] + [granted] * 37
    entries = [e async for e in service.store.stream_entries()]
    assert sorted(e.stream for e in entries) == sorted({k.events for k in keys})
    assert {e.fields["k"] for e in entries} == {"m"}
    grants = {g.packet_id: g for e in entries for g in decode_entries(e.fields)}
    assert isinstance(acted := grants[keys[1].packet_id], Grants) and acted.actors == {"a": "svc"}
    assert isinstance(several := grants[keys[2].packet_id], Grants)
    assert [u for u, _ in several.claims] == ["b1", "b2"]
    await asyncio.wait_for(persister.drain(), 20)
    assert persister.stats.dead_lettered == 0
    for k, (_, users) in zip(keys, groups, strict=True):
        claims = await service.ledger.claims_of(k.packet_id)
        in_sql = {(c.user_id, c.share_idx + 1, c.amount) for c in claims}
        in_redis = {(u, c.seq, c.amount) for u, c in (await service.store.claims(k)).items()}
        assert in_sql == in_redis
        assert {u for u, *_ in in_sql} == {u.split("=")[0] for u in users}
    assert await service.ledger.audit() == []


async def test_a_grouped_entry_with_a_bad_packet_parks_whole(
    service: Hongbao, persister: Persister
) -> None:
    await service.deposit("s", 1000)
    packet = await service.send("s", 100, 3)
    keys = service.store.keys(packet.id)
    await service.store.client.xadd(
        keys.events, {"k": "m", packet.id: "u1 1:5:1", "other": "u2 nonsense"}
    )
    await service.store.client.xadd(keys.events, {"k": "m"})
    await asyncio.wait_for(persister.drain(), 20)
    parked = await service.store.dead_letters()
    assert len(parked) == 2 and all("malformed" in p.fields["reason"] for p in parked)
    assert (await service.wallet("u1")).balance == 0
    assert await service.ledger.audit() == []

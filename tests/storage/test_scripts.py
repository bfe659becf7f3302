"""Every Lua script through the public store API, on the machine's real Redis."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.crc import key_slot

from hongbao.domain.ids import new_packet_id
from hongbao.domain.models import GrabStatus
from hongbao.domain.splitting import MAX_SHARE_AMOUNT
from hongbao.errors import StorageError
from hongbao.keys import PacketKeys
from hongbao.storage import RedisStore
from hongbao.storage.codec import ClaimValue, decode_entries
from hongbao.storage.redis import Answer, claim_of, too_old

pytestmark = pytest.mark.redis


def now_ms() -> int:
    return int(time.time() * 1000)


async def load(store: RedisStore, amounts: list[int], *, expires_in_ms: int = 60_000) -> PacketKeys:
    keys = store.keys(new_packet_id())
    loaded = await store.load_packet(
        keys,
        expires_at_ms=now_ms() + expires_in_ms,
        keep_until_ms=now_ms() + expires_in_ms + 60_000,
        shares=list(enumerate(amounts)),
    )
    assert loaded
    return keys


def answered(answers: list[Answer | StorageError]) -> list[Answer]:
    """A batch's answers, none of them a failure."""
    assert not any(isinstance(a, StorageError) for a in answers), answers
    return [a for a in answers if not isinstance(a, StorageError)]


def test_every_script_keys_share_one_slot() -> None:
    for _ in range(200):
        keys = PacketKeys.of(new_packet_id(), buckets=16)
        slots = {key_slot(k.encode()) for k in (keys.meta, keys.shares, keys.claims, keys.events)}
        assert len(slots) == 1, keys


async def test_load_is_idempotent(store: RedisStore) -> None:
    keys = await load(store, [10, 20, 30])
    again = await store.load_packet(
        keys, expires_at_ms=now_ms() + 1000, keep_until_ms=now_ms() + 2000, shares=[(0, 999)]
    )
    assert again is False
    status = await store.status(keys)
    assert status is not None
    assert (status.amount_left, status.shares_left) == (60, 3)


async def test_load_many_shares_beyond_lua_stack(store: RedisStore) -> None:
    keys = await load(store, [1] * 10_000)
    status = await store.status(keys)
    assert status is not None and status.shares_left == 10_000 and status.amount_left == 10_000


async def test_grab_outcomes(store: RedisStore) -> None:
    keys = await load(store, [10, 20])
    status, seq, amount, at = await store.grab(keys, "alice")
    assert (status, seq, amount) == (GrabStatus.GRANTED, 1, 10) and at > 0
    assert await store.grab(keys, "alice") == (GrabStatus.ALREADY_CLAIMED, seq, amount, at)
    bob = await store.grab(keys, "bob")
    assert claim_of(bob) == ClaimValue(2, 20, (await store.claims(keys))["bob"].claimed_at_ms)
    # no share: the claim's three numbers are 0
    assert await store.grab(keys, "carol") == (GrabStatus.EXHAUSTED, 0, 0, 0)
    assert await store.grab(store.keys(new_packet_id()), "dan") == (GrabStatus.UNKNOWN, 0, 0, 0)
    assert claim_of((GrabStatus.EXHAUSTED, 0, 0, 0)) is None
    events = await store.client.xrange(keys.events)
    assert [[u for u, _ in decode_entries(e[1])[0].claims] for e in events] == [["alice"], ["bob"]]
    assert all(e[1]["k"] == "g" and e[1]["p"] == keys.packet_id for e in events)


async def test_the_largest_share_keeps_its_amount_and_index(store: RedisStore) -> None:
    keys = await load(store, [MAX_SHARE_AMOUNT, MAX_SHARE_AMOUNT - 1])
    first, second = await store.grab(keys, "alice"), await store.grab(keys, "bob")
    assert first[:3] == (GrabStatus.GRANTED, 1, MAX_SHARE_AMOUNT)
    assert second[:3] == (GrabStatus.GRANTED, 2, MAX_SHARE_AMOUNT - 1)
    claims = await store.claims(keys)
    assert (claims["alice"].share_index, claims["bob"].amount) == (0, MAX_SHARE_AMOUNT - 1)
    assert (await store.status(keys)).amount_left == 0  # type: ignore[union-attr]


async def test_grab_after_expiry_by_server_clock(store: RedisStore) -> None:
    keys = await load(store, [10, 20], expires_in_ms=-1)
    assert (await store.grab(keys, "alice")) == (GrabStatus.EXPIRED, 0, 0, 0)


async def test_grab_batch_dedupes_and_spans_packets(store: RedisStore) -> None:
    bucket_mates: list[PacketKeys] = []
    while len(bucket_mates) < 2:
        keys = store.keys(new_packet_id())
        if not bucket_mates or keys.bucket == bucket_mates[0].bucket:
            bucket_mates.append(keys)
    for keys in bucket_mates:
        await store.load_packet(
            keys,
            expires_at_ms=now_ms() + 60_000,
            keep_until_ms=now_ms() + 120_000,
            shares=[(0, 5), (1, 7)],
        )
    first, second = bucket_mates
    answers = answered(
        await store.grab_batch([(first, ["u1", "u1", "u2", "u3"]), (second, ["u1", "u2"])])
    )
    statuses = [s for s, *_ in answers]
    assert statuses == [
        GrabStatus.GRANTED,
        GrabStatus.ALREADY_CLAIMED,
        GrabStatus.GRANTED,
        GrabStatus.EXHAUSTED,
        GrabStatus.GRANTED,
        GrabStatus.GRANTED,
    ]
    assert answers[0][1:] == answers[1][1:]
    assert [seq for _, seq, _, _ in answers] == [1, 1, 2, 0, 1, 2]
    # one stream entry per packet and call, holding that packet's grants in order
    entries = [fields for _, fields in await store.client.xrange(first.events)]
    assert [(f["p"], [u for u, _ in decode_entries(f)[0].claims]) for f in entries] == [
        (first.packet_id, ["u1", "u2"]),
        (second.packet_id, ["u1", "u2"]),
    ]
    assert [c for f in entries for _, c in decode_entries(f)[0].claims] == [
        claim_of(a) for a in answers if a[0] is GrabStatus.GRANTED
    ]


async def test_grab_batch_in_bulk_beyond_lua_stack(store: RedisStore) -> None:
    """More users than one command's slice: earlier claimers, repeats, and the rest."""
    amounts = [1 + i % 7 for i in range(2_000)]
    keys = await load(store, amounts)
    early = answered(await store.grab_batch([(keys, [f"e{i}" for i in range(300)])]))
    early_claims = {f"e{i}": claim_of(a) for i, a in enumerate(early)}
    users = [f"u{i}" for i in range(2_000)]
    batch = users[:900] + [f"e{i}" for i in range(300)] + users[:50] + users[900:]
    answers = answered(await store.grab_batch([(keys, batch)]))
    by_status: dict[GrabStatus, int] = {}
    for status, *_ in answers:
        by_status[status] = by_status.get(status, 0) + 1
    assert by_status == {
        GrabStatus.GRANTED: 1_700,
        GrabStatus.ALREADY_CLAIMED: 350,
        GrabStatus.EXHAUSTED: 300,
    }
    granted = {
        u: claim_of(a) for u, a in zip(batch, answers, strict=True) if a[0] is GrabStatus.GRANTED
    }
    assert list(granted) == users[:1_700]  # shares go in order of arrival
    for user, answer in zip(batch, answers, strict=True):
        if answer[0] is GrabStatus.ALREADY_CLAIMED:
            assert claim_of(answer) == early_claims.get(user, granted.get(user))
    seqs = sorted(c.seq for c in [*early_claims.values(), *granted.values()] if c)
    assert seqs == list(range(1, 2_001))
    stored = await store.claims(keys)
    assert stored == {**early_claims, **granted}
    entries = [fields for _, fields in await store.client.xrange(keys.events)]
    assert [u for f in entries for u, _ in decode_entries(f)[0].claims] == [*early_claims, *granted]
    status = await store.status(keys)
    assert status is not None and (status.shares_left, status.amount_left) == (0, 0)


async def test_grab_batch_repeats_after_close_get_their_claim(store: RedisStore) -> None:
    keys = await load(store, [5, 6, 7], expires_in_ms=300)
    ((_, *first),) = answered(await store.grab_batch([(keys, ["a"])]))
    await asyncio.sleep(0.4)
    assert (await store.close_packet(keys, "sender", 60_000))[0] == 1
    answers = await store.grab_batch([(keys, ["b", "a", "b"])])
    assert answers == [
        (GrabStatus.EXPIRED, 0, 0, 0),
        (GrabStatus.ALREADY_CLAIMED, *first),
        (GrabStatus.EXPIRED, 0, 0, 0),
    ]
    # a packet with a single grab in the call takes the one-grab path: same answers
    unknown = store.keys(new_packet_id())
    singles = await store.grab_batch([(keys, ["a"]), (keys, ["b"]), (unknown, ["a"])])
    assert singles == [
        (GrabStatus.ALREADY_CLAIMED, *first),
        (GrabStatus.EXPIRED, 0, 0, 0),
        (GrabStatus.UNKNOWN, 0, 0, 0),
    ]


async def test_a_spent_packet_answers_exhausted_before_and_after_closing(
    store: RedisStore,
) -> None:
    spent, left = (
        await load(store, [5], expires_in_ms=300),
        await load(store, [5], expires_in_ms=300),
    )
    assert answered([await store.grab(spent, "a")])[0][0] is GrabStatus.GRANTED
    await asyncio.sleep(0.4)
    for closing in (False, True):
        if closing:
            assert (await store.close_packet(spent, "sender", 60_000))[0] == 1
            assert (await store.close_packet(left, "sender", 60_000))[0] == 1
        for users in (["b"], ["b", "c"]):  # the one-grab path and the bulk one
            got = answered(await store.grab_batch([(spent, users), (left, users)]))
            n = len(users)
            assert [a[0] for a in got] == [GrabStatus.EXHAUSTED] * n + [GrabStatus.EXPIRED] * n


async def test_grab_batch_spans_buckets_on_one_server(store: RedisStore) -> None:
    first = await load(store, [5])
    other = next(
        k for k in (store.keys(new_packet_id()) for _ in range(100)) if k.bucket != first.bucket
    )
    await store.load_packet(
        other, expires_at_ms=now_ms() + 60_000, keep_until_ms=now_ms() + 120_000, shares=[(0, 7)]
    )
    answers = answered(await store.grab_batch([(first, ["u"]), (other, ["u"])]))
    assert [(s, amount) for s, _, amount, _ in answers] == [
        (GrabStatus.GRANTED, 5),
        (GrabStatus.GRANTED, 7),
    ]
    # each grant went to its own bucket's stream
    for keys in (first, other):
        entries = await store.client.xrange(keys.events)
        assert [f["p"] for _, f in entries] == [keys.packet_id]


async def test_a_packet_named_twice_in_a_grouped_call_keeps_every_grant(
    store: RedisStore,
) -> None:
    """A call of 40 packets writes grouped entries; a packet named in two groups has
    the lines of both under its one field."""
    keys = [await load(store, [5, 6]) for _ in range(20)]
    groups = [(k, ["x"]) for k in keys] + [(k, ["y", "x"]) for k in keys]
    answers = answered(await store.grab_batch(groups))
    assert [s for s, *_ in answers] == [GrabStatus.GRANTED] * 20 + [
        GrabStatus.GRANTED,
        GrabStatus.ALREADY_CLAIMED,
    ] * 20
    grants = [
        g for e in [e async for e in store.stream_entries()] for g in decode_entries(e.fields)
    ]
    assert sorted(g.packet_id for g in grants) == sorted(k.packet_id for k in keys)
    assert all([u for u, _ in g.claims] == ["x", "y"] for g in grants)  # type: ignore[union-attr]


async def test_a_grouped_call_beyond_lua_stack_writes_further_entries(store: RedisStore) -> None:
    """512 packets of one stream: more fields than one XADD's slice."""
    keys = []
    for _ in range(512):
        packet = PacketKeys.of(new_packet_id(), 1)
        await store.load_packet(
            packet,
            expires_at_ms=now_ms() + 60_000,
            keep_until_ms=now_ms() + 120_000,
            shares=[(0, 3)],
        )
        keys.append(packet)
    answered(await store.grab_batch([(k, [f"u{i}"]) for i, k in enumerate(keys)]))
    entries = await store.client.xrange(keys[0].events)
    assert [len(fields) for _, fields in entries] == [500, 14]  # k and 499 packets, then 13
    grants = [g for _, fields in entries for g in decode_entries(fields)]
    assert [g.packet_id for g in grants] == [k.packet_id for k in keys]


async def test_close_refunds_once_and_remembers(store: RedisStore) -> None:
    keys = await load(store, [10, 20, 30], expires_in_ms=300)
    await store.grab(keys, "alice")
    assert (await store.close_packet(keys, "sender", 60_000))[0] == 3  # not yet expired
    await asyncio.sleep(0.35)
    assert await store.close_packet(keys, "sender", 60_000) == (1, 50, 2)
    assert (await store.close_packet(keys, "sender", 60_000))[0] == 2
    status = await store.status(keys)
    assert status is not None and status.closed_at_ms and status.shares_left == 2
    refunds = [f for _, f in await store.client.xrange(keys.events) if f["k"] == "r"]
    assert len(refunds) == 1 and refunds[0]["a"] == "50" and refunds[0]["s"] == "sender"
    assert (await store.grab(keys, "alice"))[0] is GrabStatus.ALREADY_CLAIMED
    assert (await store.grab(keys, "bob")) == (GrabStatus.EXPIRED, 0, 0, 0)


async def test_noscript_fallback(store: RedisStore) -> None:
    keys = await load(store, [10])
    await store.client.script_flush()
    status, _, amount, _ = await store.grab(keys, "alice")
    assert status is GrabStatus.GRANTED and amount == 10


async def test_ack_and_dead_letter(store: RedisStore) -> None:
    keys = await load(store, [10, 20])
    await store.grab(keys, "a")
    await store.grab(keys, "b")
    events = await store.read_events("c1", 10, 0)
    assert len(events) == 2
    assert await store.ack(events[0].stream, [events[0].id]) == 1
    await store.dead_letter(events[1], "bad thing")
    parked = await store.dead_letters()
    assert len(parked) == 1 and parked[0].fields["reason"] == "bad thing"
    assert [u for u, _ in decode_entries(parked[0].fields)[0].claims] == ["b"]
    assert await store.backlog() == 0


async def test_ack_of_more_entries_than_lua_can_unpack(store: RedisStore) -> None:
    """A persister's read of one stream can bring more entries than unpack() takes."""
    stream = store.keys(new_packet_id()).events
    pipe = store.client.pipeline(transaction=False)
    for i in range(9_000):
        pipe.xadd(stream, {"k": "x", "i": str(i)})
    await pipe.execute()
    events = await store.read_events("c1", 20_000, 0)
    ids = [e.id for e in events if e.stream == stream]
    assert len(ids) == 9_000
    assert await store.ack(stream, ids) == 9_000
    assert await store.client.xlen(stream) == 0
    assert await store.backlog() == 0


@pytest.mark.parametrize(
    ("version", "old"),
    [("5.0.14", True), ("6.0.9", True), ("6.2.0", False), ("7.0.15", False), ("", False)],
)
def test_servers_before_6_2_are_refused(version: str, old: bool) -> None:
    assert too_old(version) is old


async def test_the_test_server_is_new_enough(store: RedisStore) -> None:
    await store.check_server()

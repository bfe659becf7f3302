"""Packet rules in grab.lua, cancel.lua and load.lua, through the store's API on a real Redis."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.commands.core import AsyncScript
from redis.crc import key_slot

from hongbao.domain.ids import new_packet_id
from hongbao.domain.models import GrabStatus as S
from hongbao.domain.rules import LOCKOUT_SECONDS, WRONG_TRIES, PacketRules
from hongbao.errors import StorageError
from hongbao.keys import PacketKeys
from hongbao.storage import RedisStore, store_from_url
from hongbao.storage.codec import Refund, decode_entries, grabber
from tests.storage.test_scripts import answered, now_ms

pytestmark = pytest.mark.redis

RIGHT, WRONG = "a" * 64, "b" * 64


async def load(store: RedisStore, amounts: list[int], rules: PacketRules) -> PacketKeys:
    keys = store.keys(new_packet_id())
    assert await store.load_packet(
        keys,
        expires_at_ms=now_ms() + 600_000,
        keep_until_ms=now_ms() + 700_000,
        shares=list(enumerate(amounts)),
        rules=rules,
    )
    return keys


def statuses(answers: list[object]) -> list[S]:
    return [a[0] for a in answered(answers)]  # type: ignore[arg-type,index]


def test_rule_keys_share_the_packets_slot() -> None:
    for _ in range(100):
        keys = PacketKeys.of(new_packet_id(), buckets=16)
        names = (keys.meta, keys.audience, keys.tries, keys.events)
        assert len({key_slot(k.encode()) for k in names}) == 1


async def test_audience_only_its_users_win(store: RedisStore) -> None:
    keys = await load(store, [10, 20, 30], PacketRules(("ann", "bob"), 2))
    got = await store.grab_batch([(keys, ["ann", "eve", "bob", "ann", "eve", "cat"])])
    assert statuses(got) == [
        S.GRANTED,
        S.NOT_IN_AUDIENCE,
        S.GRANTED,
        S.ALREADY_CLAIMED,
        S.NOT_IN_AUDIENCE,
        S.NOT_IN_AUDIENCE,
    ]
    (single,) = answered([await store.grab(keys, "eve")])
    assert single[0] is S.NOT_IN_AUDIENCE
    live = await store.status(keys)
    assert live is not None and (live.shares_left, live.amount_left) == (1, 30)


async def test_passphrase_wrong_tries_lock_the_user_out(store: RedisStore) -> None:
    keys = await load(store, [5] * 4, PacketRules(passphrase_hash=RIGHT))
    # no passphrase: refused, not counted; a wrong one, then a right one, in one call
    got = await store.grab_batch(
        [(keys, ["ann", grabber("bob", None, WRONG), grabber("bob", None, RIGHT)])]
    )
    assert statuses(got) == [S.WRONG_PASSPHRASE, S.WRONG_PASSPHRASE, S.GRANTED]
    # a digest among several (keys before a rotation) matches too
    (ok,) = answered([await store.grab(keys, "dan", digests=f"{WRONG},{RIGHT}")])
    assert ok[0] is S.GRANTED
    wrong = [grabber("eve", None, WRONG)] * (WRONG_TRIES + 1) + [grabber("eve", None, RIGHT)]
    got = answered(await store.grab_batch([(keys, wrong)]))
    assert [a[0] for a in got] == [S.WRONG_PASSPHRASE] * (WRONG_TRIES - 1) + [
        S.TOO_MANY_ATTEMPTS
    ] * 3
    assert got[WRONG_TRIES - 1][3] == LOCKOUT_SECONDS * 1000
    assert 0 < got[-1][3] <= LOCKOUT_SECONDS * 1000
    assert await store.client.pttl(keys.tries) > 0
    # the lockout ended: a right passphrase wins
    await store.client.hset(keys.tries, "eve", f"0:{now_ms() - 1}")
    (won,) = answered([await store.grab(keys, "eve", digests=RIGHT)])
    assert won[0] is S.GRANTED


async def test_start_time_refuses_until_then(store: RedisStore) -> None:
    start = datetime.now(UTC) + timedelta(seconds=30)
    keys = await load(store, [7, 7], PacketRules(starts_at=start))
    got = answered(await store.grab_batch([(keys, ["a", "b"])]))
    assert [a[0] for a in got] == [S.NOT_STARTED, S.NOT_STARTED]
    assert 25_000 < got[0][3] <= 30_000
    await store.client.hset(keys.meta, "st", now_ms() - 1)
    assert statuses(await store.grab_batch([(keys, ["a", "b", "c"])])) == [
        S.GRANTED,
        S.GRANTED,
        S.EXHAUSTED,
    ]


async def test_one_call_mixes_packets_with_and_without_rules(store: RedisStore) -> None:
    plain = await load(store, [1, 2], PacketRules())
    ruled = await load(store, [3, 4], PacketRules(("ann",), 1, RIGHT))
    got = await store.grab_batch(
        [
            (plain, ["ann", "bob"]),
            (ruled, [grabber("ann", "svc", RIGHT), "bob"]),
            (plain, ["cat"]),
        ]
    )
    assert statuses(got) == [
        S.GRANTED,
        S.GRANTED,
        S.GRANTED,
        S.NOT_IN_AUDIENCE,
        S.EXHAUSTED,
    ]
    entries = [e async for e in store.stream_entries()]
    actors = [decode_entries(e.fields)[0] for e in entries]
    assert any(getattr(a, "actors", {}).get("ann") == "svc" for a in actors)


def grab_calls(monkeypatch: pytest.MonkeyPatch, store: RedisStore) -> list[int]:
    """The number of packets of each grab.lua call `store` makes from now on (its own
    count: Redis's command statistics are the whole server's)."""
    calls: list[int] = []
    run = store._run

    async def counted(script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        if script is store.lua_grab:
            calls.append((len(args) - 1) // 2)
        return await run(script, keys, args)

    monkeypatch.setattr(store, "_run", counted)
    return calls


async def test_a_host_that_did_not_load_a_packet_learns_its_rules(
    store: RedisStore, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the loading store knows a packet has rules: another host's first call leaves
    the packet as it was, the grabs go again with its audience and tries keys, and the
    host remembers the packet."""
    plain = await load(store, [1, 2, 3], PacketRules())
    audience = await load(store, [10, 20, 30, 40], PacketRules(("ann", "bob", "cat"), 3))
    phrase = await load(store, [5, 6], PacketRules(passphrase_hash=RIGHT))
    loader_calls = grab_calls(monkeypatch, store)
    (ann_first,) = answered([await store.grab(audience, "ann")])
    assert loader_calls == [1]  # the loading store knows the packet's rules
    other = store_from_url(redis_url, buckets=4)
    other_calls = grab_calls(monkeypatch, other)
    try:
        got = answered(
            await other.grab_batch(
                [
                    (plain, ["ann"]),
                    (audience, ["ann", "eve", "bob"]),
                    (phrase, [grabber("dan", None, WRONG)]),
                    (phrase, [grabber("dan", None, RIGHT)]),
                    (plain, ["bob", "ann"]),
                ]
            )
        )
        assert [a[0] for a in got] == [
            S.GRANTED,
            S.ALREADY_CLAIMED,
            S.NOT_IN_AUDIENCE,
            S.GRANTED,
            S.WRONG_PASSPHRASE,
            S.GRANTED,
            S.GRANTED,
            S.ALREADY_CLAIMED,
        ]
        assert got[1][1:] == ann_first[1:] and got[3][1:3] == (2, 20) and got[5][1:3] == (1, 5)
        assert other_calls == [5, 3]  # the packets with rules again, with their keys
        # one wrong try counted, once: the first call changed nothing of the packet
        tries = await store.client.hgetall(store.keys(phrase.packet_id).tries)
        assert tries.keys() == {"dan"} and tries["dan"].startswith("1:")
        (cat,) = answered([await other.grab(audience, "cat")])
        assert cat[:3] == (S.GRANTED, 3, 30)
        assert other_calls == [5, 3, 1]
    finally:
        await other.aclose()
    live = await store.status(audience)
    assert live is not None and (live.shares_left, live.amount_left) == (1, 40)


async def test_a_failed_resend_fails_only_the_grabs_sent_again(
    store: RedisStore, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grabs the first call answered keep their answers when the call that sends
    the packets with rules again fails."""
    plain = await load(store, [1, 2, 3], PacketRules())
    audience = await load(store, [10, 20], PacketRules(("ann", "bob"), 2))
    other = store_from_url(redis_url, buckets=4)
    run = other._run
    calls = 0

    async def second_call_fails(script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        nonlocal calls
        if script is other.lua_grab:
            calls += 1
            if calls == 2:
                raise StorageError("redis: connection lost")
        return await run(script, keys, args)

    monkeypatch.setattr(other, "_run", second_call_fails)
    try:
        got = await other.grab_batch([(plain, ["ann"]), (audience, ["ann", "bob"])])
    finally:
        await other.aclose()
    assert calls == 2
    assert isinstance(got[0], tuple) and got[0][:3] == (S.GRANTED, 1, 1)
    assert all(isinstance(a, StorageError) for a in got[1:])
    live = await store.status(audience)
    assert live is not None and live.shares_left == 2  # nothing of it changed


async def test_cancel_closes_once_and_grabs_after_it_are_refused(store: RedisStore) -> None:
    keys = await load(store, [10, 20, 30], PacketRules())
    assert statuses([await store.grab(keys, "ann")]) == [S.GRANTED]
    assert await store.cancel_packet(keys, "sender", 60_000) == (1, 50, 2)
    assert await store.cancel_packet(keys, "sender", 60_000) == (2, 50, 2)
    assert statuses(await store.grab_batch([(keys, ["bob", "ann"])])) == [
        S.CANCELLED,
        S.ALREADY_CLAIMED,
    ]
    assert (await store.close_packet(keys, "sender", 60_000))[0] == 2  # closed before
    live = await store.status(keys)
    assert live is not None and live.cancelled and live.closed_at_ms
    refunds = [
        r
        async for e in store.stream_entries()
        if isinstance(r := decode_entries(e.fields)[0], Refund)
    ]
    assert [(r.amount, r.shares_left, r.cancelled) for r in refunds] == [(50, 2, True)]


async def test_cancel_leaves_expired_and_exhausted_packets_alone(store: RedisStore) -> None:
    keys = store.keys(new_packet_id())
    await store.load_packet(
        keys, expires_at_ms=now_ms() - 1, keep_until_ms=now_ms() + 60_000, shares=[(0, 5)]
    )
    assert (await store.cancel_packet(keys, "s", 1000))[0] == 4
    assert (await store.close_packet(keys, "s", 1000))[0] == 1
    assert await store.cancel_packet(keys, "s", 1000) == (3, 5, 1)  # as it closed
    empty = await load(store, [5], PacketRules())
    await store.grab(empty, "ann")
    assert (await store.cancel_packet(empty, "s", 1000))[0] == 5
    assert (await store.cancel_packet(store.keys(new_packet_id()), "s", 1000))[0] == 0


async def test_a_reload_takes_the_rules_again(store: RedisStore) -> None:
    start = datetime.now(UTC) + timedelta(hours=1)
    keys = await load(store, [9], PacketRules(("ann",), 1, RIGHT, start))
    await store.forget_packet(keys)
    assert not await store.client.exists(keys.audience)
    await load_again(store, keys, PacketRules(("bob",), 1, RIGHT, start))
    assert await store.client.smembers(keys.audience) == {"bob"}
    meta = await store.client.hgetall(keys.meta)
    assert (meta["r"], meta["an"], meta["ph"]) == ("1", "1", RIGHT)
    assert int(meta["st"]) == int(start.timestamp() * 1000)
    assert time.time() * 1000 < int(meta["st"])


async def load_again(store: RedisStore, keys: PacketKeys, rules: PacketRules) -> None:
    assert await store.load_packet(
        keys,
        expires_at_ms=now_ms() + 600_000,
        keep_until_ms=now_ms() + 700_000,
        shares=[(0, 9)],
        rules=rules,
    )

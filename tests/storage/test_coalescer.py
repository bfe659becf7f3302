"""Coalesced grabs: batching under load, one answer per caller, failures stay local."""

from __future__ import annotations

import asyncio
import time

import pytest

from hongbao.coalescer import GrabCoalescer
from hongbao.domain.ids import new_packet_id
from hongbao.domain.models import GrabStatus
from hongbao.errors import StorageError
from hongbao.keys import PacketKeys
from hongbao.storage import RedisStore

pytestmark = pytest.mark.redis


async def load(store: RedisStore, n: int, bucket: int | None = None) -> PacketKeys:
    while True:
        keys = store.keys(new_packet_id())
        if bucket is None or keys.bucket == bucket:
            break
    now = int(time.time() * 1000)
    await store.load_packet(
        keys,
        expires_at_ms=now + 60_000,
        keep_until_ms=now + 120_000,
        shares=[(i, 10 + i) for i in range(n)],
    )
    return keys


async def test_storm_is_batched_and_every_caller_gets_its_answer(store: RedisStore) -> None:
    coalescer = GrabCoalescer(store, max_batch=32, max_in_flight=2)
    keys = await load(store, 100)
    users = [f"u{i}" for i in range(300)] + [f"u{i}" for i in range(50)]
    answers = await asyncio.gather(*(coalescer.grab(keys, u) for u in users))
    granted = [a for a in answers if a[0] is GrabStatus.GRANTED]
    assert len(granted) == 100
    assert sorted(c.seq for _, c in granted if c) == list(range(1, 101))
    by_user = dict(zip(users[:300], answers[:300], strict=True))
    for user, (status, claim) in zip(users[300:], answers[300:], strict=True):
        first_status, first_claim = by_user[user]
        if first_status is GrabStatus.GRANTED:
            assert status is GrabStatus.ALREADY_CLAIMED and claim == first_claim
    assert coalescer.calls < coalescer.grabs / 4  # the storm rode in shared calls


async def test_light_load_sends_at_once(store: RedisStore) -> None:
    coalescer = GrabCoalescer(store, max_batch=64, max_in_flight=4)
    keys = await load(store, 3)
    for user in ("a", "b", "c"):
        status, _ = await coalescer.grab(keys, user)
        assert status is GrabStatus.GRANTED
    assert (coalescer.calls, coalescer.grabs) == (3, 3)


async def test_a_failed_call_fails_only_its_callers(store: RedisStore) -> None:
    coalescer = GrabCoalescer(store, max_batch=64, max_in_flight=1)
    healthy = await load(store, 10)
    broken = await load(store, 10)
    while broken.bucket == healthy.bucket:
        broken = await load(store, 10)
    await store.client.hset(broken.meta, "exp", "not-a-number")  # the script will raise
    results = await asyncio.gather(
        *(coalescer.grab(healthy, f"h{i}") for i in range(5)),
        *(coalescer.grab(broken, f"b{i}") for i in range(5)),
        return_exceptions=True,
    )
    assert all(r[0] is GrabStatus.GRANTED for r in results[:5])  # type: ignore[index]
    assert all(isinstance(r, StorageError) for r in results[5:])

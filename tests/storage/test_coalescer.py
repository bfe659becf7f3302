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
    answers = await asyncio.gather(*(coalescer.submit(keys, u) for u in users))
    granted = [a for a in answers if a[0] is GrabStatus.GRANTED]
    assert len(granted) == 100
    assert sorted(seq for _, seq, _, _ in granted) == list(range(1, 101))
    by_user = dict(zip(users[:300], answers[:300], strict=True))
    for user, (status, *claim) in zip(users[300:], answers[300:], strict=True):
        first_status, *first_claim = by_user[user]
        if first_status is GrabStatus.GRANTED:
            assert status is GrabStatus.ALREADY_CLAIMED and claim == first_claim
        else:
            assert status is GrabStatus.EXHAUSTED and claim == first_claim == [0, 0, 0]
    assert coalescer.calls < coalescer.grabs / 4  # the storm rode in shared calls


async def test_light_load_sends_at_once(store: RedisStore) -> None:
    coalescer = GrabCoalescer(store, max_batch=64, max_in_flight=4)
    keys = await load(store, 3)
    for user in ("a", "b", "c"):
        status, *_ = await coalescer.submit(keys, user)
        assert status is GrabStatus.GRANTED
    assert (coalescer.calls, coalescer.grabs) == (3, 3)


class CountingStore(RedisStore):
    """The real store, counting the batch calls outstanding at once; `gate` holds them."""

    in_flight = 0
    most_in_flight = 0
    gate: asyncio.Event | None = None
    started: asyncio.Event | None = None

    async def grab_batch(self, groups):  # type: ignore[no-untyped-def]
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if self.started is not None:
            self.started.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            return await super().grab_batch(groups)
        finally:
            self.in_flight -= 1


async def test_grabs_arriving_during_a_call_ride_the_next_one(store: RedisStore) -> None:
    counting = CountingStore(store.client, store.buckets)
    counting.gate, counting.started = asyncio.Event(), asyncio.Event()
    coalescer = GrabCoalescer(counting, max_batch=64, max_in_flight=4, parallel_at=16)
    keys = await load(store, 100)
    first = asyncio.ensure_future(coalescer.submit(keys, "u0"))
    await counting.started.wait()
    later = [asyncio.ensure_future(coalescer.submit(keys, f"u{i}")) for i in range(1, 16)]
    await asyncio.sleep(0.01)
    assert counting.most_in_flight == 1  # 15 waiting grabs do not open a second call
    counting.gate.set()
    answers = await asyncio.gather(first, *later)
    assert all(status is GrabStatus.GRANTED for status, *_ in answers)
    assert (coalescer.calls, counting.most_in_flight) == (2, 1)


async def test_grabs_read_in_the_turns_after_a_call_join_the_waiting_ones(
    store: RedisStore,
) -> None:
    """After a call, a lane with few grabs waiting lets the event loop turn a few times
    before the next call: requests read meanwhile ride along (fewer, fuller calls)."""
    counting = CountingStore(store.client, store.buckets)
    counting.gate, counting.started = asyncio.Event(), asyncio.Event()
    coalescer = GrabCoalescer(counting, max_batch=64, max_in_flight=1)
    keys = await load(store, 100)
    first = asyncio.ensure_future(coalescer.submit(keys, "u0"))
    await counting.started.wait()
    waiting = asyncio.ensure_future(coalescer.submit(keys, "u1"))
    await asyncio.sleep(0)
    late: list[asyncio.Future[object]] = []
    # a request read two turns after the first call's answers: u0's task ends in the
    # first turn, its done-callback runs in the second
    first.add_done_callback(lambda _: late.append(coalescer.submit(keys, "u2")))
    counting.gate.set()
    answers = await asyncio.gather(first, waiting)
    await asyncio.gather(*late)
    assert all(status is GrabStatus.GRANTED for status, *_ in answers)
    assert (coalescer.calls, coalescer.grabs) == (2, 3)


async def test_a_storm_opens_further_calls(store: RedisStore) -> None:
    counting = CountingStore(store.client, store.buckets)
    coalescer = GrabCoalescer(counting, max_batch=32, max_in_flight=4, parallel_at=16)
    keys = await load(store, 200)
    answers = await asyncio.gather(*(coalescer.submit(keys, f"u{i}") for i in range(200)))
    assert all(status is GrabStatus.GRANTED for status, *_ in answers)
    assert counting.most_in_flight == 4  # the second call at 16 waiting, then 32, 48


async def test_a_broken_packet_fails_only_its_grabbers(store: RedisStore) -> None:
    coalescer = GrabCoalescer(store, max_batch=64, max_in_flight=1)
    healthy = await load(store, 10)
    broken = await load(store, 10)
    await store.client.hset(broken.meta, "exp", "not-a-number")  # unreadable packet data
    results = await asyncio.gather(
        *(coalescer.submit(healthy, f"h{i}") for i in range(5)),
        *(coalescer.submit(broken, f"b{i}") for i in range(5)),
        return_exceptions=True,
    )
    assert coalescer.calls < 10  # the two packets shared calls
    assert all(r[0] is GrabStatus.GRANTED for r in results[:5])  # type: ignore[index]
    assert all(isinstance(r, StorageError) for r in results[5:])


@pytest.mark.parametrize("users", [["a", "b", "z", "c"], ["z"]], ids=["bulk", "single"])
async def test_an_unreadable_claim_fails_the_packets_grabs_and_takes_nothing(
    store: RedisStore, users: list[str]
) -> None:
    keys = await load(store, 5)
    await store.client.hset(keys.claims, "z", "garbage")
    answers = await store.grab_batch([(keys, users)])
    assert all(isinstance(a, StorageError) for a in answers)
    assert await store.client.xrange(keys.events) == []
    status = await store.status(keys)
    assert status is not None and status.shares_left == 5
    assert status.amount_left == sum(10 + i for i in range(5))
    assert await store.client.hkeys(keys.claims) == ["z"]


async def test_one_grab_of_each_packet_in_a_call_is_answered_and_recorded_alone(
    store: RedisStore,
) -> None:
    """The spread shape: a call carrying a single grab of many packets (plain, for an
    actor, a repeat, one of a broken packet, one of an exhausted packet)."""
    plain, acted, repeat, broken, empty = [await load(store, 2) for _ in range(5)]
    await store.grab_batch([(repeat, ["r"]), (empty, ["e1"]), (empty, ["e2"])])
    await store.client.lset(broken.shares, 0, "not-a-share")
    answers = await store.grab_batch(
        [
            (plain, ["p"]),
            (broken, ["b"]),
            (acted, ["a=svc"]),
            (repeat, ["r"]),
            (empty, ["e3"]),
        ]
    )
    assert isinstance(answers[1], StorageError)
    statuses = [a[0] for a in answers if not isinstance(a, StorageError)]
    assert statuses == [
        GrabStatus.GRANTED,
        GrabStatus.GRANTED,
        GrabStatus.ALREADY_CLAIMED,
        GrabStatus.EXHAUSTED,
    ]
    assert (await store.status(broken)) is not None
    assert await store.client.llen(broken.shares) == 2
    assert await store.client.hlen(broken.claims) == 0
    lines = {}
    for keys in (plain, acted, repeat, broken):
        entries = [f for _, f in await store.client.xrange(keys.events) if f["p"] == keys.packet_id]
        lines[keys] = [f["c"] for f in entries]
    assert lines[plain] == [f"p 1:10:{answers[0][3]}"]  # type: ignore[index]
    assert lines[acted] == [f"a 1:10:{answers[2][3]} svc"]  # type: ignore[index]
    assert len(lines[repeat]) == 1  # the earlier grant only
    assert lines[broken] == []
    for keys, left in ((plain, 11), (acted, 11), (broken, 21)):
        status = await store.status(keys)
        assert status is not None and status.amount_left == left


@pytest.mark.parametrize(("users", "bad"), [(["a", "b", "c", "d"], 2), (["a"], 0)])
async def test_a_malformed_share_is_put_back_and_fails_the_packets_grabs(
    store: RedisStore, users: list[str], bad: int
) -> None:
    keys = await load(store, 5)
    await store.client.lset(keys.shares, bad, "not-a-share")
    before = await store.client.lrange(keys.shares, 0, -1)
    answers = await store.grab_batch([(keys, users)])
    assert all(isinstance(a, StorageError) for a in answers)
    assert await store.client.lrange(keys.shares, 0, -1) == before
    assert await store.client.hlen(keys.claims) == 0
    assert await store.client.xrange(keys.events) == []


async def test_a_failed_call_fails_its_callers_and_the_lane_goes_on(store: RedisStore) -> None:
    keys = await load(store, 10)
    coalescer = GrabCoalescer(store, max_batch=64, max_in_flight=2)
    real_run = store._run

    async def failing_run(*args: object) -> object:
        raise StorageError("redis: connection lost")

    store._run = failing_run  # type: ignore[method-assign]
    results = await asyncio.gather(
        *(coalescer.submit(keys, f"u{i}") for i in range(6)), return_exceptions=True
    )
    assert all(isinstance(r, StorageError) for r in results)
    store._run = real_run  # type: ignore[method-assign]
    assert (await coalescer.submit(keys, "after"))[0] is GrabStatus.GRANTED
    assert all(lane.in_flight == 0 for lane in coalescer._lanes.values())

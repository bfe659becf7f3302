"""Packet rules under storms: audience, exclusive, passphrase, start time, cancel.

Each storm runs on each SQL database (the `ledger` fixture), with the persister
beside it, and ends with the money checked and `hongbao.audit.audit` clean. The
same storms run on the Redis Cluster (tests/cluster/test_cluster_rules.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from hongbao.audit import audit, recover
from hongbao.domain.models import GrabResult, PacketStatus
from hongbao.domain.moments import ms
from hongbao.domain.rules import LOCKOUT_SECONDS, WRONG_TRIES
from hongbao.errors import (
    HongbaoError,
    NotInAudience,
    NotStarted,
    PacketCancelled,
    PacketExhausted,
    SendLimitReached,
    TooManyAttempts,
    WrongPassphrase,
)
from hongbao.ledger import SqlLedger
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.storage import RedisStore
from hongbao.sweeper import Sweeper

pytestmark = [pytest.mark.redis, pytest.mark.integration]

KEY = b"rules-tests-passphrase-key-0123456789"
PHRASE = "恭喜发财"
GATE = 256


@pytest.fixture
async def rules_service(store: RedisStore, ledger: SqlLedger, settings: Settings) -> Hongbao:
    return Hongbao(store, ledger, settings, rng=random.Random(31), passphrase_keys=[KEY])


@pytest.fixture
def rules_persister(rules_service: Hongbao) -> Persister:
    s = rules_service
    return Persister(s.store, s.ledger, s.settings, consumer="rules-persister")


Outcome = GrabResult | HongbaoError


async def grab_all(
    service: Hongbao, grabs: list[tuple[str, str | None]], packet_id: str
) -> list[Outcome]:
    """Every (user, passphrase) grab at once (at most GATE in flight); answers in order."""
    gate = asyncio.Semaphore(GATE)

    async def one(user: str, phrase: str | None) -> Outcome:
        async with gate:
            try:
                return await service.grab(packet_id, user, passphrase=phrase)
            except HongbaoError as exc:
                return exc

    return list(await asyncio.gather(*(one(u, p) for u, p in grabs)))


async def settle(service: Hongbao, persister: Persister) -> None:
    """Drain the streams, then check every invariant the audit knows."""
    await asyncio.wait_for(persister.drain(), 60)
    report = await audit(service, settle=0)
    assert report.clean, report.violations
    assert not report.dead_letters


async def ledger_matches_redis(service: Hongbao, packet_id: str) -> None:
    redis_claims = await service.store.claims(service.store.keys(packet_id))
    sql_claims = await service.ledger.claims_of(packet_id)
    assert {(c.user_id, c.share_idx + 1, c.amount) for c in sql_claims} == {
        (u, c.seq, c.amount) for u, c in redis_claims.items()
    }


def winners(answers: list[Outcome]) -> list[GrabResult]:
    return [a for a in answers if isinstance(a, GrabResult) and a.first]


# -- the storms (shared with the cluster tests) -------------------------------------------


async def audience_storm(service: Hongbao, persister: Persister) -> None:
    """A 100-share packet for 150 members, grabbed by them and 1,850 strangers at once."""
    members = [f"m{i}" for i in range(150)]
    strangers = [f"x{i}" for i in range(1_850)]
    await service.deposit("sender", 10_000)
    packet = await service.send("sender", 10_000, 100, audience=members)
    assert packet.audience_size == 150
    grabs: list[tuple[str, str | None]] = [(u, None) for u in members + strangers]
    random.Random(1).shuffle(grabs)
    answers = await grab_all(service, grabs, packet.id)
    by_user = dict(zip((u for u, _ in grabs), answers, strict=True))
    won = winners(answers)
    assert len(won) == 100 and {w.user_id for w in won} <= set(members)
    assert sum(w.amount for w in won) == 10_000
    assert all(isinstance(by_user[u], NotInAudience) for u in strangers)
    losers = [by_user[m] for m in members if not isinstance(by_user[m], GrabResult)]
    assert len(losers) == 50 and all(isinstance(a, PacketExhausted) for a in losers)
    await settle(service, persister)
    await ledger_matches_redis(service, packet.id)
    record = await service.ledger.get_packet(packet.id)
    assert record is not None and record.status == "exhausted"


async def exclusive_storm(service: Hongbao, persister: Persister) -> None:
    """An exclusive packet (one user) grabbed by 500 users at once: only that user wins."""
    await service.deposit("sender", 888)
    packet = await service.send("sender", 888, 1, audience=["vip"])
    users = [f"u{i}" for i in range(499)] + ["vip"]
    random.Random(2).shuffle(users)
    answers = await grab_all(service, [(u, None) for u in users], packet.id)
    (won,) = winners(answers)
    assert (won.user_id, won.amount) == ("vip", 888)
    assert sum(isinstance(a, NotInAudience) for a in answers) == 499
    await settle(service, persister)
    assert (await service.wallet("vip")).balance == 888


async def passphrase_storm(service: Hongbao, persister: Persister) -> None:
    """1,000 grabbers: 400 with the passphrase, 550 with a wrong one or none, and 50 who
    guess until locked out; only the right ones win, each guesser is locked out once."""
    await service.deposit("sender", 50_000)
    packet = await service.send("sender", 50_000, 500, passphrase=f"  {PHRASE} ")
    assert packet.passphrase
    right = [(f"r{i}", PHRASE) for i in range(400)]
    wrong: list[tuple[str, str | None]] = [
        (f"w{i}", None if i % 5 == 0 else f"{PHRASE}{i}") for i in range(550)
    ]
    guessers = [f"g{i}" for i in range(50)]
    grabs = right + wrong + [(g, f"guess-{k}") for g in guessers for k in range(WRONG_TRIES)]
    random.Random(3).shuffle(grabs)
    answers = await grab_all(service, grabs, packet.id)
    won = winners(answers)
    assert sorted(w.user_id for w in won) == sorted(u for u, _ in right)
    kinds = Counter(type(a).__name__ for a in answers if not isinstance(a, GrabResult))
    assert kinds == {"WrongPassphrase": 550 + 50 * (WRONG_TRIES - 1), "TooManyAttempts": 50}
    # a guesser who now knows it is still locked out; its lockout says how long
    late = await grab_all(service, [(g, PHRASE) for g in guessers], packet.id)
    assert all(isinstance(a, TooManyAttempts) for a in late)
    assert all(0 < a.retry_after <= LOCKOUT_SECONDS for a in late if isinstance(a, TooManyAttempts))
    tries = await service.store.client.hgetall(service.store.keys(packet.id).tries)
    assert len(tries) == 50 + 440 and sum(1 for v in tries.values() if v.startswith("0:")) == 50
    await settle(service, persister)
    await ledger_matches_redis(service, packet.id)


async def timed_storm(service: Hongbao, persister: Persister) -> None:
    """Grabbers stormed across the packet's start: no share is granted before it."""
    start = datetime.now(UTC) + timedelta(seconds=1.5)
    await service.deposit("sender", 30_000)
    packet = await service.send("sender", 30_000, 300, starts_at=start, expires_in=600)
    assert packet.starts_at is not None
    assert abs(packet.starts_at - start) < timedelta(milliseconds=1)
    assert packet.expires_at - packet.starts_at == timedelta(seconds=600)
    too_early = 0
    wins: list[GrabResult] = []
    gate = asyncio.Semaphore(64)

    async def grabber(user: str) -> None:
        nonlocal too_early
        while True:
            async with gate:
                try:
                    got = await service.grab(packet.id, user)
                except NotStarted as exc:
                    assert 0 < exc.retry_after <= 1.6
                    too_early += 1
                    await asyncio.sleep(0.05)
                    continue
                except PacketExhausted:
                    return
            wins.append(got)
            return

    await asyncio.gather(*(grabber(f"t{i}") for i in range(400)))
    assert too_early > 0 and len(wins) == 300
    assert min(w.claimed_at_ms for w in wins) >= ms(start)
    await settle(service, persister)
    await ledger_matches_redis(service, packet.id)


async def cancel_storm(service: Hongbao, persister: Persister) -> None:
    """A cancel in the middle of a storm: what was granted and what was refunded add up
    to the total, nothing is granted after the cancel's answer, the refund lands once."""
    await service.deposit("sender", 100_000)
    packet = await service.send("sender", 100_000, 1_000)
    cancelled_at: float | None = None
    after: list[Outcome] = []

    async def storm() -> list[Outcome]:
        users = [f"c{i}" for i in range(2_000)]
        gate = asyncio.Semaphore(64)

        async def one(user: str) -> Outcome:
            async with gate:
                asked = time.monotonic()
                try:
                    got: Outcome = await service.grab(packet.id, user)
                except HongbaoError as exc:
                    got = exc
                if cancelled_at is not None and asked > cancelled_at:
                    after.append(got)
                return got

        return list(await asyncio.gather(*(one(u) for u in users)))

    grabs = asyncio.create_task(storm())
    while (await service.packet(packet.id)).remaining_count > 700:  # noqa: ASYNC110
        await asyncio.sleep(0.01)  # polling the packet the storm is grabbing
    # the sender's retries race each other: one refund whoever wins
    answers = await asyncio.gather(*(service.cancel(packet.id, "sender") for _ in range(5)))
    cancelled_at = time.monotonic()
    first = answers[0]
    assert first.status is PacketStatus.CANCELLED
    assert all(a == first for a in answers)
    answers_all = await grabs
    assert after and all(isinstance(a, PacketCancelled) for a in after)
    won = winners(answers_all)
    assert sum(w.amount for w in won) + first.refunded_amount == 100_000
    assert len(won) == 1_000 - first.remaining_count
    await settle(service, persister)
    record = await service.ledger.get_packet(packet.id)
    assert record is not None and record.status == "cancelled"
    assert (record.claimed_amount, record.refunded_amount) == (
        100_000 - first.refunded_amount,
        first.refunded_amount,
    )
    assert (await service.wallet("sender")).balance == first.refunded_amount
    again = await service.cancel(packet.id, "sender")
    assert again.status is PacketStatus.CANCELLED
    assert again.refunded_amount == first.refunded_amount


STORMS: dict[str, Callable[[Hongbao, Persister], Awaitable[None]]] = {
    "audience": audience_storm,
    "exclusive": exclusive_storm,
    "passphrase": passphrase_storm,
    "timed": timed_storm,
    "cancel": cancel_storm,
}


@pytest.mark.parametrize("name", list(STORMS))
async def test_storm(rules_service: Hongbao, rules_persister: Persister, name: str) -> None:
    stop = asyncio.Event()
    worker = asyncio.create_task(rules_persister.run(stop))
    try:
        await STORMS[name](rules_service, rules_persister)
    finally:
        stop.set()
        await worker
    assert rules_persister.stats.dead_lettered == 0


# -- cancel and expiry racing -----------------------------------------------------------------


async def test_cancel_and_the_sweeper_race_and_refund_once(
    rules_service: Hongbao, rules_persister: Persister
) -> None:
    service = rules_service
    sweeper = Sweeper(service)
    outcomes: Counter[str] = Counter()
    for round_ in range(6):
        await service.deposit("sender", 500)
        packet = await service.send("sender", 500, 5, expires_in=1)
        await service.grab(packet.id, "ann")
        expiry = packet.expires_at.timestamp()
        # start both a little before, at and after the expiry, over the rounds
        await asyncio.sleep(max(0.0, expiry - time.time() - 0.05 + round_ * 0.02))

        async def cancel(packet_id: str) -> str:
            try:
                await service.cancel(packet_id, "sender")
                return "cancelled"
            except HongbaoError as exc:
                return exc.code

        async def sweep() -> None:
            for _ in range(20):
                await sweeper.sweep_once()
                await asyncio.sleep(0.01)

        got, _ = await asyncio.gather(cancel(packet.id), sweep())
        outcomes[got] += 1
        await asyncio.wait_for(rules_persister.drain(), 30)
        record = await service.ledger.get_packet(packet.id)
        assert record is not None and record.closed_at is not None
        assert record.status == ("cancelled" if got == "cancelled" else "expired")
        assert record.claimed_amount + record.refunded_amount == 500
    assert set(outcomes) <= {"cancelled", "packet_expired"}
    report = await audit(service, settle=0)
    assert report.clean, report.violations
    async with service.ledger.engine.connect() as conn:
        refunds = await conn.exec_driver_sql(
            "SELECT COUNT(*) FROM hb_ledger_entries WHERE kind = 'refund'"
        )
        assert refunds.scalar_one() == 6


async def test_only_the_sender_or_an_admin_cancels(rules_service: Hongbao) -> None:
    service = rules_service
    await service.deposit("sender", 300)
    packet = await service.send("sender", 300, 3)
    with pytest.raises(HongbaoError) as refused:
        await service.cancel(packet.id, "mallory")
    assert refused.value.code == "forbidden"
    cancelled = await service.cancel(packet.id, "root", admin=True)
    assert cancelled.status is PacketStatus.CANCELLED
    with pytest.raises(PacketCancelled):
        await service.grab(packet.id, "ann")


# -- the rules outlive a Redis that lost its data ------------------------------------------------


async def test_rules_hold_after_redis_loses_its_data(
    rules_service: Hongbao, rules_persister: Persister
) -> None:
    """FLUSHDB (the tests' own database: other suites share the server) stands for
    FLUSHALL; then `recover`, and the first touch, rebuild the packets with their rules."""
    service = rules_service
    await service.deposit("sender", 3_000)
    group = await service.send("sender", 1_000, 2, audience=["ann", "bob", "cat"])
    secret = await service.send("sender", 1_000, 2, passphrase=PHRASE)
    later = await service.send("sender", 1_000, 2, starts_at=datetime.now(UTC) + timedelta(hours=1))
    await service.grab(group.id, "ann")
    await asyncio.wait_for(rules_persister.drain(), 30)
    await service.store.client.flushdb()
    report = await recover(service)
    assert report.rebuilt == 3
    with pytest.raises(NotInAudience):
        await service.grab(group.id, "eve")
    assert (await service.grab(group.id, "ann")).first is False  # the earlier claim is kept
    assert (await service.grab(group.id, "bob")).first
    with pytest.raises(WrongPassphrase):
        await service.grab(secret.id, "eve", passphrase="guess")
    assert (await service.grab(secret.id, "eve", passphrase=PHRASE)).first
    with pytest.raises(NotStarted):
        await service.grab(later.id, "eve")
    # and a packet rebuilt on its first touch, not by recover
    await service.store.client.flushdb()
    with pytest.raises(NotInAudience):
        await service.grab(group.id, "dan")
    assert (await service.packet(group.id)).audience_size == 3


# -- sender limits --------------------------------------------------------------------------------


async def test_racing_sends_cannot_pass_the_daily_limits(rules_service: Hongbao) -> None:
    service = rules_service
    service.settings = replace(service.settings, max_sends_per_day=3, max_sent_per_day=1_000)
    await service.deposit("busy", 10_000)

    async def send(amount: int) -> str:
        try:
            await service.send("busy", amount, 1)
            return "sent"
        except SendLimitReached as exc:
            assert 0 < exc.retry_after <= 86_400
            return "limited"

    got = Counter(await asyncio.gather(*(send(100) for _ in range(10))))
    assert got == {"sent": 3, "limited": 7}
    await service.deposit("rich", 10_000)
    got = Counter(await asyncio.gather(*(send_as(service, "rich", 400) for _ in range(6))))
    assert got == {"sent": 2, "limited": 4}  # 800 of 1,000 fen; a third 400 would pass it
    assert (await service.wallet("rich")).balance == 10_000 - 800


async def send_as(service: Hongbao, sender: str, amount: int) -> str:
    try:
        await service.send(sender, amount, 1)
        return "sent"
    except SendLimitReached:
        return "limited"

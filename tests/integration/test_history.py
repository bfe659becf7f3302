"""The record through the service, on real Redis and each SQL database: best luck as the
packet's claims say it, a grab shown once the persister applied it, the statement after
a storm of grabs and an expiry."""

from __future__ import annotations

import asyncio
import random

import pytest

from hongbao.domain.models import SplitMode
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.sweeper import Sweeper

pytestmark = [pytest.mark.redis, pytest.mark.integration]


async def test_record_agrees_with_the_packets_claims(
    service: Hongbao, persister: Persister
) -> None:
    users = [f"u{i}" for i in range(6)]
    await service.deposit("s", 100_000)
    lucky = [await service.send("s", 600, 3) for _ in range(8)]
    equal = await service.send("s", 300, 3, mode=SplitMode.EQUAL)
    open_one = await service.send("s", 500, 4)
    expiring = await service.send("s", 400, 4, expires_in=1)
    rng = random.Random(1)
    for packet in [*lucky, equal]:
        for user in rng.sample(users, 3):
            await service.grab(packet.id, user)
    await service.grab(open_one.id, "u0")
    await service.grab(expiring.id, "u1")
    await service.grab(expiring.id, "u2")

    # before the persister ran, the ledger holds no grab: the record is empty, and says when
    page = await service.history.received("u0")
    assert page.totals.count == 0 and page.items == []
    await asyncio.wait_for(persister.drain(), 20)
    await asyncio.sleep(1.1)
    assert await Sweeper(service).sweep_once() >= 1
    await asyncio.wait_for(persister.drain(), 20)

    expected_best: dict[str, set[str]] = {u: set() for u in users}
    for packet in [*lucky, expiring]:
        claims = await service.claims(packet.id)
        best = claims.best_luck
        if best is None:  # expired: its best luck is the largest, earliest claim
            top = max(claims.claims, key=lambda c: c.amount)  # the first of the largest
            best = top.user_id
        expected_best[best].add(packet.id)
    total = 0
    for user in users:
        page = await service.history.received(user, limit=500)
        assert page.as_of >= max(r.claimed_at for r in page.items)
        assert {r.packet_id for r in page.items if r.best_luck} == expected_best[user]
        assert page.totals.best_luck_count == len(expected_best[user])
        assert page.totals.amount == sum(r.amount for r in page.items)
        assert page.totals.amount == (await service.wallet(user)).balance
        total += page.totals.count
    assert total == 8 * 3 + 3 + 1 + 2

    sent = await service.history.sent("s", limit=500)
    assert sent.totals.count == 11
    assert sent.totals.refunded == 400 - sum(
        c.amount for c in (await service.claims(expiring.id)).claims
    )
    statuses = {p.packet_id: p.status for p in sent.items}
    assert statuses[expiring.id] == "expired" and statuses[open_one.id] == "active"
    assert statuses[equal.id] == "exhausted"

    st = await service.history.statement(page.as_of.date())
    assert st.balanced, st.wallets_off
    assert await service.ledger.audit() == []

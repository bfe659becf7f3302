"""`--ack ledger`: the claim the grabbing process commits is the one the ledger keeps, so
it carries everything the persister's copy would."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest
import sqlalchemy as sa

from hongbao.ledger.schema import entries
from hongbao.persister import Persister
from hongbao.service import Hongbao

pytestmark = [pytest.mark.redis, pytest.mark.integration]


async def test_a_ledger_acknowledged_grab_keeps_the_actor_who_grabbed(service: Hongbao) -> None:
    svc = Hongbao(
        service.store,
        service.ledger,
        replace(service.settings, ack_mode="ledger"),
        random.Random(3),
    )
    await svc.deposit("s", 1000)
    packet = await svc.send("s", 300, 3)
    await svc.grab(packet.id, "alice", actor="shop-backend")
    await svc.grab(packet.id, "bob")
    await svc.grab(packet.id, "alice", actor="another-service")  # a repeat changes nothing
    persister = Persister(svc.store, svc.ledger, svc.settings, consumer="replay")
    await asyncio.wait_for(persister.drain(), 20)
    async with svc.ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(entries.c.user_id, entries.c.actor)
            .where(entries.c.kind == "claim")
            .order_by(entries.c.user_id)
        )
        assert [tuple(r) for r in rows] == [("alice", "shop-backend"), ("bob", None)]
    assert await svc.ledger.audit() == []

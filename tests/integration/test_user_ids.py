"""The service keeps users apart whose ids differ only in case, on every database."""

from __future__ import annotations

import asyncio

import pytest

from hongbao.errors import InsufficientBalance
from hongbao.persister import Persister
from hongbao.service import Hongbao

pytestmark = [pytest.mark.redis, pytest.mark.integration]


async def test_a_user_cannot_read_or_spend_a_wallet_differing_in_case(
    service: Hongbao, persister: Persister
) -> None:
    await service.deposit("alice", 1000, reference="gift")
    assert (await service.wallet("ALICE")).balance == 0
    with pytest.raises(InsufficientBalance):
        await service.send("ALICE", 500, 1)
    assert (await service.deposit("ALICE", 30, reference="gift")).balance == 30
    packet = await service.send("alice", 400, 2)
    grabs = [await service.grab(packet.id, u) for u in ("bob", "BOB")]
    assert all(g.first for g in grabs)
    await asyncio.wait_for(persister.drain(), 20)
    assert (await service.wallet("alice")).balance == 600
    assert (await service.wallet("ALICE")).balance == 30
    for g in grabs:
        assert (await service.wallet(g.user_id)).balance == g.amount
    assert await service.ledger.audit() == []

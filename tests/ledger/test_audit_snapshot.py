"""The ledger's audit reads one snapshot: money moved by a commit between two of its
statements (the persister applying a claim, a withdrawal requested) while the service
runs shows no false violation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger import SqlLedger
from hongbao.ledger import audit as audit_module
from hongbao.ledger import withdrawals as withdrawals_module
from hongbao.ledger.sql import ClaimEvent
from hongbao.withdrawals import Withdrawals
from tests.ledger.test_ledger import record


def then_commit(
    step: Callable[[AsyncConnection], Awaitable[Any]], change: Callable[[], Awaitable[object]]
) -> tuple[Callable[[AsyncConnection], Awaitable[Any]], list[int]]:
    """`step` of the audit, which commits `change` on another connection after its own
    reads and before it returns; and a list that counts its calls."""
    calls: list[int] = []

    async def step_then_change(conn: AsyncConnection) -> Any:
        calls.append(1)
        found = await step(conn)
        await change()
        return found

    return step_then_change, calls


async def test_a_claim_applied_during_the_audit(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ledger.deposit("s", 1000, "d")
    packet = record("s", 300, 3)
    await ledger.create_packet(packet, [100, 100, 100], None)
    claim = ClaimEvent(packet.id, 0, "u0", 100, datetime.now(UTC))

    async def apply_claim() -> None:
        assert await ledger.apply([claim]) == [None]

    # after the packets' money is summed, before the wallets' is
    step, calls = then_commit(audit_module._claimed_twice, apply_claim)
    monkeypatch.setattr(audit_module, "_claimed_twice", step)
    assert await ledger.audit() == []
    assert calls == [1]
    monkeypatch.undo()
    assert [c.user_id for c in await ledger.claims_of(packet.id)] == ["u0"]
    assert await ledger.balance("u0") == 100
    assert await ledger.audit() == []


async def test_a_withdrawal_requested_during_the_audit(
    ledger: SqlLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    await ledger.deposit("s", 1000, "d")
    book = Withdrawals(ledger)

    async def withdraw() -> None:
        await book.request("s", 400, "w1")

    # after the withdrawals are summed by status, before their entries are counted
    step, calls = then_commit(withdrawals_module.totals, withdraw)
    monkeypatch.setattr(withdrawals_module, "totals", step)
    assert await ledger.audit() == []
    assert calls == [1]
    monkeypatch.undo()
    assert await ledger.balance("s") == 600
    assert await ledger.audit() == []

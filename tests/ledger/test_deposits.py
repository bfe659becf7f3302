"""Deposits are idempotent per (user, key), whatever characters the two hold."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from hongbao.errors import IdempotencyConflict, InvalidRequest
from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import entries
from hongbao.ledger.sql import deposit_reference


async def deposit_rows(ledger: SqlLedger) -> list[tuple[str, str, str, int]]:
    """(reference, user, key, amount) of every deposit entry, in user order."""
    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(
                entries.c.reference, entries.c.user_id, entries.c.deposit_key, entries.c.amount
            )
            .where(entries.c.kind == "deposit")
            .order_by(entries.c.user_id, entries.c.deposit_key)
        )
        return [(r, u, k, int(a)) for r, u, k, a in rows]


async def test_pairs_joining_alike_are_different_deposits(ledger: SqlLedger) -> None:
    assert await ledger.deposit("a:b", 10, "c") == 10
    assert await ledger.deposit("a", 20, "b:c") == 20  # "deposit:a:b:c" either way, once
    assert await ledger.deposit("a:b", 10, "c") == 10
    assert await ledger.deposit("a", 20, "b:c") == 20
    assert await deposit_rows(ledger) == [
        (deposit_reference("a", "b:c"), "a", "b:c", 20),
        (deposit_reference("a:b", "c"), "a:b", "c", 10),
    ]
    assert await ledger.audit() == []


async def test_longest_id_and_key_fit(ledger: SqlLedger) -> None:
    user, key = "u" * 64, "k" * 127 + "K"
    assert await ledger.deposit(user, 7, key) == 7
    assert await ledger.deposit(user, 7, key) == 7
    assert await ledger.deposit(user, 7, key[:-1] + "k") == 14
    with pytest.raises(IdempotencyConflict):
        await ledger.deposit(user, 8, key)
    for bad in ("", "k" * 129):
        with pytest.raises(InvalidRequest):
            await ledger.deposit(user, 7, bad)
    assert await ledger.balance(user) == 14
    assert await ledger.audit() == []


async def test_concurrent_deposits_with_one_key_credit_once(ledger: SqlLedger) -> None:
    got = await asyncio.gather(*(ledger.deposit("alice", 100, "once") for _ in range(8)))
    assert got == [100] * 8
    assert await ledger.balance("alice") == 100
    assert [row[1:] for row in await deposit_rows(ledger)] == [("alice", "once", 100)]
    assert await ledger.audit() == []


async def test_concurrent_deposits_with_one_key_and_two_amounts(ledger: SqlLedger) -> None:
    amounts = [100, 200] * 4
    got = await asyncio.gather(
        *(ledger.deposit("bob", a, "k") for a in amounts), return_exceptions=True
    )
    balance = await ledger.balance("bob")
    assert balance in amounts
    for amount, outcome in zip(amounts, got, strict=True):
        if amount == balance:
            assert outcome == balance
        else:
            assert isinstance(outcome, IdempotencyConflict)
    assert await ledger.audit() == []

"""Deposits are idempotent per (user, key), whatever characters the two hold, and no
deposit takes a balance past what the ledger's BIGINT holds."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from hongbao.domain.money import MAX_FEN
from hongbao.errors import IdempotencyConflict, InvalidRequest
from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import entries, wallets
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


async def wallet_rows(ledger: SqlLedger) -> list[tuple[str, int, str]]:
    """(user, balance, type of the stored balance) of every wallet, in user order: on
    SQLite a balance past int64 would be stored as a REAL."""
    type_of = (
        sa.func.typeof(wallets.c.balance)
        if ledger.dialect == "sqlite"
        else sa.literal("integer", sa.String)
    )
    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(wallets.c.user_id, wallets.c.balance, type_of).order_by(wallets.c.user_id)
        )
        return [(u, int(b), str(t)) for u, b, t in rows]


async def test_a_deposit_past_the_largest_balance_is_refused(ledger: SqlLedger) -> None:
    assert await ledger.deposit("alice", MAX_FEN - 5, "a") == MAX_FEN - 5
    for amount in (6, 2**62, MAX_FEN):  # each would take the balance past MAX_FEN
        with pytest.raises(InvalidRequest) as raised:
            await ledger.deposit("alice", amount, f"k{amount}")
        assert raised.value.field == "amount"
    assert await ledger.deposit("alice", 5, "b") == MAX_FEN  # up to it is fine
    assert await ledger.deposit("alice", MAX_FEN - 5, "a") == MAX_FEN  # a replay credits nothing
    with pytest.raises(InvalidRequest):
        await ledger.deposit("alice", 1, "c")
    assert await wallet_rows(ledger) == [("alice", MAX_FEN, "integer")]
    assert [row[1:] for row in await deposit_rows(ledger)] == [
        ("alice", "a", MAX_FEN - 5),
        ("alice", "b", 5),
    ]
    assert await ledger.audit() == []


@pytest.mark.parametrize("amount", [MAX_FEN + 1, 2**64, 10**30, 0, -1])
async def test_an_amount_no_balance_can_hold_is_refused(ledger: SqlLedger, amount: int) -> None:
    with pytest.raises(InvalidRequest):
        await ledger.deposit("bob", amount, "k")
    assert await wallet_rows(ledger) == []  # not even an empty wallet is left behind
    assert await deposit_rows(ledger) == []
    assert await ledger.deposit("bob", MAX_FEN, "k") == MAX_FEN  # the key is still free
    assert await wallet_rows(ledger) == [("bob", MAX_FEN, "integer")]
    assert await ledger.audit() == []

"""The SQL ledger on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from hongbao.domain.ids import new_packet_id
from hongbao.errors import IdempotencyConflict, InsufficientBalance, StorageError
from hongbao.ledger import SqlLedger
from hongbao.ledger.records import to_db
from hongbao.ledger.schema import claims, entries, wallets
from hongbao.ledger.sql import ClaimEvent, PacketRecord, RefundEvent, database_url


def record(sender: str, total: int, count: int, request_hash: str = "h") -> PacketRecord:
    now = datetime.now(UTC)
    return PacketRecord(
        id=new_packet_id(),
        sender_id=sender,
        total_amount=total,
        count=count,
        mode="lucky",
        greeting="",
        status="active",
        created_at=now,
        expires_at=now + timedelta(hours=1),
        request_hash=request_hash,
    )


async def test_deposit_is_idempotent_per_reference(ledger: SqlLedger) -> None:
    assert await ledger.deposit("alice", 500, "ref-1") == 500
    assert await ledger.deposit("alice", 500, "ref-1") == 500
    assert await ledger.deposit("alice", 250, "ref-2") == 750
    assert await ledger.balance("alice") == 750
    assert await ledger.balance("nobody") == 0
    with pytest.raises(IdempotencyConflict):
        await ledger.deposit("alice", 499, "ref-1")
    assert await ledger.deposit("bob", 5, "ref-1") == 5  # references are per user


async def test_database_refuses_negative_balance(ledger: SqlLedger) -> None:
    await ledger.deposit("alice", 10, "r")
    # PostgreSQL and SQLite raise IntegrityError, MariaDB OperationalError 4025
    with pytest.raises(DBAPIError, match=r"(?i)ck_wallet_balance_not_negative|check"):
        async with ledger.engine.begin() as conn:
            await conn.execute(wallets.update().values(balance=-1))
    assert await ledger.balance("alice") == 10


async def test_send_debits_once_and_refuses_overdraft(ledger: SqlLedger) -> None:
    await ledger.deposit("s", 1000, "r")
    with pytest.raises(InsufficientBalance):
        await ledger.create_packet(record("s", 1001, 2), [500, 501], None)
    assert await ledger.balance("s") == 1000
    first, created = await ledger.create_packet(record("s", 600, 2), [200, 400], "key-1")
    assert created and await ledger.balance("s") == 400
    again, created_again = await ledger.create_packet(record("s", 600, 2), [300, 300], "key-1")
    assert not created_again and again.id == first.id
    assert await ledger.balance("s") == 400
    assert await ledger.shares_of(first.id) == [(0, 200), (1, 400)]
    with pytest.raises(IdempotencyConflict):
        await ledger.create_packet(record("s", 100, 1, request_hash="other"), [100], "key-1")
    assert await ledger.balance("s") == 400
    assert await ledger.audit() == []


async def test_retries_racing_a_send_of_the_whole_balance_get_its_packet(
    ledger: SqlLedger,
) -> None:
    """Each retry waits for the first request's debit of the wallet row and then finds it
    empty: the answer is the packet that request made, not insufficient_balance."""
    await ledger.deposit("s", 600, "r")
    sends = [ledger.create_packet(record("s", 600, 2), [200, 400], "key-all") for _ in range(10)]
    results = await asyncio.gather(*sends)
    assert len({packet.id for packet, _ in results}) == 1
    assert [created for _, created in results].count(True) == 1
    assert await ledger.balance("s") == 0
    assert await ledger.audit() == []


async def test_apply_claims_replay_and_poison(ledger: SqlLedger) -> None:
    await ledger.deposit("s", 1000, "r")
    packet, _ = await ledger.create_packet(record("s", 300, 3), [100, 150, 50], None)
    at = datetime.now(UTC)
    good = [ClaimEvent(packet.id, 0, "u1", 100, at), ClaimEvent(packet.id, 1, "u2", 150, at)]
    assert await ledger.apply(good) == [None, None]
    assert await ledger.apply(good) == [None, None]  # a replay changes nothing
    assert await ledger.balance("u1") == 100 and await ledger.balance("u2") == 150
    outcome = await ledger.apply(
        [
            ClaimEvent(packet.id, 2, "u1", 50, at),  # u1 claimed already
            ClaimEvent(packet.id, 1, "u3", 150, at),  # share 1 taken by u2
            ClaimEvent(packet.id, 2, "u3", 999, at),  # wrong amount
            ClaimEvent(packet.id, 7, "u3", 50, at),  # no such share
            ClaimEvent("nope", 0, "u3", 50, at),  # no such packet
            ClaimEvent(packet.id, 2, "u4", 50, at),  # fine
        ]
    )
    assert outcome[-1] is None and all(outcome[:-1])
    assert "already claimed" in str(outcome[0]) and "claimed by u2" in str(outcome[1])
    after = await ledger.get_packet(packet.id)
    assert after is not None and after.status == "exhausted" and after.claimed_amount == 300
    assert await ledger.audit() == []


async def test_refund_once_conserves_money(ledger: SqlLedger) -> None:
    await ledger.deposit("s", 1000, "r")
    packet, _ = await ledger.create_packet(record("s", 300, 3), [100, 150, 50], None)
    at = datetime.now(UTC)
    assert await ledger.apply([ClaimEvent(packet.id, 0, "u1", 100, at)]) == [None]
    refund = RefundEvent(packet.id, "s", 200, 2, at)
    assert await ledger.apply([refund]) == [None]
    assert await ledger.apply([refund]) == [None]
    assert await ledger.balance("s") == 900
    closed = await ledger.get_packet(packet.id)
    assert closed is not None and closed.status == "expired" and closed.refunded_amount == 200
    too_much = RefundEvent(packet.id, "s", 10_000, 2, at)
    other, _ = await ledger.create_packet(record("s", 100, 1), [100], None)
    assert "exceed" in str((await ledger.apply([too_much.__class__(other.id, "s", 101, 1, at)]))[0])
    assert await ledger.audit() == []


async def test_audit_names_a_broken_wallet(ledger: SqlLedger) -> None:
    await ledger.deposit("alice", 100, "r")
    async with ledger.engine.begin() as conn:
        await conn.execute(sa.update(wallets).values(balance=90))
    problems = await ledger.audit()
    assert any("wallet alice" in p for p in problems)
    assert any(p.startswith("money:") for p in problems)


async def test_audit_names_claims_off_their_share(ledger: SqlLedger) -> None:
    """No foreign key holds a claim to its share; the audit checks what it would have."""
    await ledger.deposit("s", 300, "r")
    packet, _ = await ledger.create_packet(record("s", 300, 2), [100, 200], None)
    at = datetime.now(UTC)
    assert await ledger.apply([ClaimEvent(packet.id, 0, "u0", 100, at)]) == [None]
    assert await ledger.audit() == []
    async with ledger.engine.begin() as conn:
        await conn.execute(
            claims.insert(),
            [
                {"packet_id": packet.id, "share_idx": i, "user_id": f"u{i}", "amount": amount}
                | {"claimed_at": to_db(at)}
                for i, amount in ((7, 1), (1, 150))
            ],
        )
    problems = await ledger.audit()
    assert f"packet {packet.id}: claim of share 7 which it does not have" in problems
    assert f"packet {packet.id}: claim of share 1 is 150 fen, the share 200" in problems


async def test_audit_names_claim_entries_not_one_per_claim(ledger: SqlLedger) -> None:
    """A claim's entry is unique by its claim's share, not by an index of its own on
    PostgreSQL and SQLite (MySQL/MariaDB keep the index whole); the audit checks it."""
    await ledger.deposit("s", 300, "r")
    packet, _ = await ledger.create_packet(record("s", 300, 2), [100, 200], None)
    at = datetime.now(UTC)
    assert await ledger.apply([ClaimEvent(packet.id, 0, "u0", 100, at)]) == [None]
    reference = f"claim:{packet.id}:0"
    again = {"reference": reference, "user_id": "u0", "kind": "claim", "amount": 100}
    again |= {"packet_id": packet.id, "created_at": to_db(at)}

    async def credit_twice(conn: AsyncConnection) -> None:
        await conn.execute(entries.insert(), [again])
        await conn.execute(wallets.update().where(wallets.c.user_id == "u0").values(balance=200))

    if ledger.dialect == "mysql":
        with pytest.raises(sa.exc.IntegrityError):
            async with ledger.engine.begin() as conn:
                await credit_twice(conn)
        assert await ledger.audit() == []
        return
    async with ledger.engine.begin() as conn:
        await credit_twice(conn)
    problems = await ledger.audit()
    assert f"packet {packet.id}: 2 claim entries of 200 fen, 1 claims of 100" in problems
    assert f"claim entry {reference}: 2 times" in problems


async def test_a_pool_with_no_connection_free_is_a_storage_error(sql_url: str) -> None:
    """No connection coming free in time is the database being away for the callers
    (the persister and the dispatchers back off and retry), not an error of their own."""
    engine = create_async_engine(
        database_url(sql_url), pool_size=1, max_overflow=0, pool_timeout=0.2
    )
    ledger = SqlLedger(engine)
    try:
        async with engine.connect():  # the pool's only connection, held
            with pytest.raises(StorageError, match="unreachable"):
                await ledger.transaction(lambda conn: conn.execute(sa.text("SELECT 1")))
            with pytest.raises(StorageError):
                await ledger.read(lambda conn: conn.execute(sa.text("SELECT 1")))
    finally:
        await engine.dispose()

"""Identifiers compare byte for byte on every database: "ALICE" is not alice.

MySQL/MariaDB's default collation is case-insensitive; the ledger's identifier
columns use a binary one, so they behave there as on PostgreSQL and SQLite.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hongbao.domain.ids import new_packet_id
from hongbao.errors import InsufficientBalance
from hongbao.ledger import SqlLedger
from hongbao.ledger.sql import ClaimEvent, PacketRecord


def record(sender: str, total: int, count: int, packet_id: str | None = None) -> PacketRecord:
    now = datetime.now(UTC)
    return PacketRecord(
        id=packet_id or new_packet_id(),
        sender_id=sender,
        total_amount=total,
        count=count,
        mode="lucky",
        greeting="",
        status="active",
        created_at=now,
        expires_at=now + timedelta(hours=1),
        request_hash="h",
    )


async def test_user_ids_differing_in_case_are_different_wallets(ledger: SqlLedger) -> None:
    assert await ledger.deposit("alice", 1000, "ref") == 1000
    assert await ledger.balance("ALICE") == 0
    assert await ledger.deposit("ALICE", 10, "ref") == 10  # its own deposit, not a replay
    assert await ledger.deposit("ALICE", 10, "REF") == 20
    assert await ledger.balance("alice") == 1000
    with pytest.raises(InsufficientBalance):
        await ledger.create_packet(record("ALICE", 500, 1), [500], None)
    assert (await ledger.balance("alice"), await ledger.balance("ALICE")) == (1000, 20)
    assert await ledger.audit() == []


async def test_claims_of_users_differing_in_case_both_apply(ledger: SqlLedger) -> None:
    await ledger.deposit("s", 300, "r")
    packet, _ = await ledger.create_packet(record("s", 300, 2), [100, 200], None)
    at = datetime.now(UTC)
    claims = [ClaimEvent(packet.id, 0, "bob", 100, at), ClaimEvent(packet.id, 1, "BOB", 200, at)]
    assert await ledger.apply(claims) == [None, None]
    assert (await ledger.balance("bob"), await ledger.balance("BOB")) == (100, 200)
    assert await ledger.audit() == []


async def test_idempotency_keys_and_packet_ids_are_exact(ledger: SqlLedger) -> None:
    await ledger.deposit("s", 1000, "r")
    first, created = await ledger.create_packet(record("s", 100, 1), [100], "key")
    second, created_too = await ledger.create_packet(record("s", 200, 1), [200], "KEY")
    assert created and created_too and first.id != second.id
    assert await ledger.balance("s") == 700
    assert await ledger.get_packet(first.id.upper()) is None
    shouted, made = await ledger.create_packet(record("s", 300, 1, first.id.upper()), [300], None)
    assert made and await ledger.shares_of(shouted.id) == [(0, 300)]
    assert await ledger.shares_of(first.id) == [(0, 100)]
    assert await ledger.audit() == []

"""Migrating a ledger written at revision 0001 to the newest schema, on each database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from hongbao.domain.ids import new_packet_id
from hongbao.errors import IdempotencyConflict, InsufficientBalance
from hongbao.ledger import SqlLedger
from hongbao.ledger.records import utcnow
from hongbao.ledger.schema import (
    BINARY_COLLATION,
    BYTE_ORDER_COLLATION,
    claims,
    entries,
    metadata,
    packets,
    shares,
    wallets,
)
from hongbao.ledger.sql import PacketRecord, deposit_reference
from tests.conftest import DATABASES, MYSQL_ADMIN, POSTGRES_ADMIN, _server_database

MANY = 1100
#: (table, column) of every identifier of revision 0001: the binary collation covers them on
#: MySQL/MariaDB, byte order on PostgreSQL
IDENTIFIERS = [
    ("hb_wallets", "user_id"),
    ("hb_ledger_entries", "reference"),
    ("hb_ledger_entries", "user_id"),
    ("hb_ledger_entries", "packet_id"),
    ("hb_ledger_entries", "actor"),
    ("hb_packets", "id"),
    ("hb_packets", "sender_id"),
    ("hb_packets", "idempotency_key"),
    ("hb_shares", "packet_id"),
    ("hb_claims", "packet_id"),
    ("hb_claims", "user_id"),
    ("hb_withdrawals", "id"),
    ("hb_withdrawals", "user_id"),
    ("hb_withdrawals", "idempotency_key"),
    ("hb_withdrawals", "actor"),
]


@pytest.fixture(params=DATABASES)
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of its own, for a test that builds the schema step by step."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'ledger.sqlite3'}"
        return
    admin = POSTGRES_ADMIN if request.param == "postgres" else MYSQL_ADMIN
    yield from _server_database(admin, f"hb_test_{uuid.uuid4().hex[:10]}")


@pytest.fixture
async def old_ledger(fresh_url: str) -> AsyncIterator[SqlLedger]:
    """A ledger at revision 0001 holding deposits, a sent packet and a claim.

    Wallets: alice 1000 - 300 sent = 700, bob 50 + 100 claimed = 150, and "many"
    with 1 fen from each of MANY deposits (more than the migration's batch); 200 held.
    """
    ledger = SqlLedger.from_url(fresh_url)
    await ledger.migrate("0001")
    pid, now = new_packet_id(), utcnow()

    def entry(reference: str, user: str, kind: str, amount: int) -> dict[str, object]:
        return {
            "reference": reference,
            "user_id": user,
            "kind": kind,
            "amount": amount,
            "packet_id": pid if kind in ("send", "claim") else None,
            "created_at": now,
        }

    async with ledger.engine.begin() as conn:
        await conn.execute(
            wallets.insert(),
            [
                {"user_id": "alice", "balance": 700, "updated_at": now},
                {"user_id": "bob", "balance": 150, "updated_at": now},
                {"user_id": "many", "balance": MANY, "updated_at": now},
            ],
        )
        await conn.execute(
            entries.insert(),
            [
                entry("deposit:alice:d-1", "alice", "deposit", 1000),
                entry("deposit:bob:a:b", "bob", "deposit", 50),
                entry(f"send:{pid}", "alice", "send", -300),
                entry(f"claim:{pid}:0", "bob", "claim", 100),
                *(entry(f"deposit:many:m-{i}", "many", "deposit", 1) for i in range(MANY)),
            ],
        )
        await conn.execute(
            packets.insert().values(
                id=pid,
                sender_id="alice",
                total_amount=300,
                count=2,
                mode="lucky",
                status="active",
                created_at=now,
                expires_at=now + timedelta(hours=1),
                claimed_count=1,
                claimed_amount=100,
                idempotency_key="send-1",
                request_hash="h",
            )
        )
        await conn.execute(
            shares.insert(),
            [{"packet_id": pid, "idx": i, "amount": a} for i, a in enumerate([100, 200])],
        )
        await conn.execute(
            claims.insert().values(
                packet_id=pid, share_idx=0, user_id="bob", amount=100, claimed_at=now
            )
        )
    yield ledger
    await ledger.aclose()


async def downgrade(ledger: SqlLedger, revision: str) -> None:
    cfg = Config(str(files("hongbao.ledger").joinpath("alembic.ini")))
    cfg.set_main_option("script_location", str(files("hongbao.ledger").joinpath("migrations")))

    def run(connection: sa.Connection) -> None:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, revision)

    async with ledger.engine.begin() as conn:
        await conn.run_sync(run)


async def collations(ledger: SqlLedger) -> set[str | None]:
    """The collations of the identifier columns (MySQL/MariaDB and PostgreSQL)."""
    schema = "current_schema()" if ledger.dialect == "postgresql" else "DATABASE()"
    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT table_name, column_name, collation_name FROM information_schema.columns"
                f" WHERE table_schema = {schema}"
            )
        )
        return {c for t, n, c in rows if (t, n) in IDENTIFIERS}


async def foreign_keys(ledger: SqlLedger) -> int:
    async with ledger.engine.connect() as conn:
        return await conn.run_sync(
            lambda sync: sum(
                len(sa.inspect(sync).get_foreign_keys(t)) for t in ("hb_shares", "hb_claims")
            )
        )


async def deposit_references(ledger: SqlLedger) -> dict[str, str]:
    """The user of every deposit entry, by its reference."""
    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(entries.c.user_id, entries.c.reference).where(entries.c.kind == "deposit")
        )
        return {reference: user for user, reference in rows}


def record(sender: str, total: int) -> PacketRecord:
    now = datetime.now(UTC)
    return PacketRecord(
        id=new_packet_id(),
        sender_id=sender,
        total_amount=total,
        count=1,
        mode="lucky",
        greeting="",
        status="active",
        created_at=now,
        expires_at=now + timedelta(hours=1),
        request_hash="h",
    )


async def test_old_ledger_migrates_and_keeps_its_money(old_ledger: SqlLedger) -> None:
    ledger = old_ledger
    assert await ledger.audit() == []
    await ledger.migrate()
    assert await ledger.audit() == []
    assert (await ledger.balance("alice"), await ledger.balance("bob")) == (700, 150)
    keys = [("alice", "d-1"), ("bob", "a:b")] + [("many", f"m-{i}") for i in range(MANY)]
    assert await deposit_references(ledger) == {deposit_reference(u, k): u for u, k in keys}
    # deposits made before the migration are recognised when retried
    assert await ledger.deposit("alice", 1000, "d-1") == 700
    assert await ledger.deposit("bob", 50, "a:b") == 150
    assert await ledger.deposit("many", 1, f"m-{MANY - 1}") == MANY
    with pytest.raises(IdempotencyConflict):
        await ledger.deposit("alice", 999, "d-1")
    assert await foreign_keys(ledger) == 1  # shares to packets (revision 0010)
    if ledger.dialect == "mysql":
        assert await collations(ledger) == {BINARY_COLLATION}
    if ledger.dialect == "postgresql":  # byte order (revision 0011)
        assert await collations(ledger) == {BYTE_ORDER_COLLATION}
    # now ids differing in case are different users on every database
    assert await ledger.deposit("ALICE", 5, "d-1") == 5
    assert await ledger.balance("alice") == 700
    with pytest.raises(InsufficientBalance):
        await ledger.create_packet(record("ALICE", 6), [6], None)
    assert await ledger.audit() == []


async def test_downgrade_to_0001_and_up_again(old_ledger: SqlLedger) -> None:
    ledger = old_ledger
    await ledger.migrate()
    await ledger.deposit("carol", 40, "c-1")
    await downgrade(ledger, "0001")
    assert await ledger.audit() == []
    references = await deposit_references(ledger)
    assert references["deposit:carol:c-1"] == "carol" and references["deposit:bob:a:b"] == "bob"
    assert len(references) == MANY + 3
    if ledger.dialect == "mysql":
        assert BINARY_COLLATION not in await collations(ledger)
    if ledger.dialect == "postgresql":
        assert await collations(ledger) == {None}  # the database's default
    await ledger.migrate()
    assert await ledger.deposit("carol", 40, "c-1") == 40
    assert await ledger.deposit("alice", 1000, "d-1") == 700
    assert await foreign_keys(ledger) == 1  # shares to packets (revision 0010)
    assert await ledger.audit() == []


async def test_migrations_build_the_schema_of_the_code(fresh_url: str) -> None:
    ledger = SqlLedger.from_url(fresh_url)
    try:
        await ledger.migrate()
        async with ledger.engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync), metadata)
            )
        assert diff == []
    finally:
        await ledger.aclose()

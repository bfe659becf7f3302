"""Identifiers compare byte for byte on MySQL/MariaDB too.

The server's default collation there is case-insensitive, so "ALICE" and "alice"
were one wallet. User ids, packet ids, references and idempotency keys get the
binary collation. PostgreSQL and SQLite compare bytes already: nothing to do there.

MariaDB refuses to change a column that a foreign key uses, even with
FOREIGN_KEY_CHECKS=0, so the foreign keys are dropped and re-created around it
(under their own names).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BINARY_COLLATION = "utf8mb4_bin"

#: table -> (column, VARCHAR length, nullable)
IDENTIFIERS: dict[str, list[tuple[str, int, bool]]] = {
    "hb_wallets": [("user_id", 64, False)],
    "hb_ledger_entries": [
        ("reference", 160, False),
        ("user_id", 64, False),
        ("packet_id", 32, True),
    ],
    "hb_packets": [
        ("id", 32, False),
        ("sender_id", 64, False),
        ("idempotency_key", 128, True),
    ],
    "hb_shares": [("packet_id", 32, False)],
    "hb_claims": [("packet_id", 32, False), ("user_id", 64, False)],
}


def upgrade() -> None:
    _set_collation(f" COLLATE {BINARY_COLLATION}")


def downgrade() -> None:
    _set_collation("")  # back to the table's default collation


def _set_collation(collate: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return
    inspector = sa.inspect(bind)
    foreign_keys = [
        (table, fk["name"] or "", fk)
        for table in IDENTIFIERS
        for fk in inspector.get_foreign_keys(table)
    ]
    for table, name, _ in foreign_keys:
        op.drop_constraint(name, table, type_="foreignkey")
    for table, columns in IDENTIFIERS.items():
        changes = ", ".join(
            f"MODIFY {column} VARCHAR({length}){collate} {'NULL' if nullable else 'NOT NULL'}"
            for column, length, nullable in columns
        )
        op.execute(f"ALTER TABLE {table} {changes}")
    for table, name, fk in foreign_keys:
        op.create_foreign_key(
            name, table, fk["referred_table"], fk["constrained_columns"], fk["referred_columns"]
        )

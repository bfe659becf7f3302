"""Identifiers sort in byte order on PostgreSQL: COLLATE "C".

Ids are opaque: only equality and a fixed order matter. Under the database's default
collation (a glibc locale such as en_US.UTF-8, or C.UTF-8 before PostgreSQL 17) every
comparison in an index on an id goes through strcoll; under "C" it is a memcmp. A settled
claim adds about seven entries to indexes led by an id, so this is a good part of what a
claim costs the server. Byte order is also the order in which Python sorts the same
strings, the order the persister locks wallets in.

Equality does not change (PostgreSQL's deterministic collations compare equal only
bytes that are equal), so no unique key can start or stop refusing a row. Changing a
column's collation rebuilds the indexes on it, not the table. MySQL/MariaDB (binary
collation since revision 0002) and SQLite (BINARY) compare bytes already.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

#: table -> (column, VARCHAR length) of every identifier column at revision 0010
IDENTIFIERS: dict[str, list[tuple[str, int]]] = {
    "hb_wallets": [("user_id", 64)],
    "hb_ledger_entries": [
        ("reference", 160),
        ("user_id", 64),
        ("packet_id", 32),
        ("deposit_key", 128),
        ("actor", 64),
    ],
    "hb_packets": [("id", 32), ("sender_id", 64), ("idempotency_key", 128)],
    "hb_shares": [("packet_id", 32)],
    "hb_claims": [("packet_id", 32), ("user_id", 64)],
    "hb_best_luck": [("packet_id", 32), ("user_id", 64)],
    "hb_packet_audience": [("packet_id", 32), ("user_id", 64)],
    "hb_packet_rules": [("packet_id", 32)],
    "hb_sender_days": [("sender_id", 64)],
    "hb_withdrawals": [("id", 32), ("user_id", 64), ("idempotency_key", 128), ("actor", 64)],
    "hb_events": [("id", 32), ("subject", 160)],
    "hb_webhook_endpoints": [("id", 32)],
    "hb_webhook_deliveries": [("endpoint_id", 32), ("event_id", 32), ("subject", 160)],
}


def upgrade() -> None:
    _set_collation(' COLLATE "C"')


def downgrade() -> None:
    _set_collation(" COLLATE pg_catalog.default")


def _set_collation(collate: str) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in IDENTIFIERS.items():
        changes = ", ".join(
            f"ALTER COLUMN {column} TYPE VARCHAR({length}){collate}" for column, length in columns
        )
        op.execute(f"ALTER TABLE {table} {changes}")

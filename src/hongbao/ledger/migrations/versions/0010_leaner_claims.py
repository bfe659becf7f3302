"""Fewer index entries and no trigger per settled claim.

A persister batch writes a claim and a ledger entry per grab; what each row costs in
indexes and constraint checks bounds how fast settlement keeps up with a storm.

- The claims' foreign key to their share (fk_claim_share) goes. PostgreSQL checks it
  with a trigger per inserted row, a third of a claim's insert there. The persister
  already looks every claimed share up, under its packet's lock, and refuses a claim
  whose share is missing or of another amount; shares are never deleted or changed; and
  `hongbao audit` checks every claim against its share.
- The deposit keys' unique index covers only the entries that have one, on PostgreSQL
  and SQLite (partial indexes): an entry of any other kind, a claim's among them, adds
  no entry to it. MySQL/MariaDB have no partial indexes and keep the index whole.

SQLite removes the foreign key by rewriting the table's schema text in place, the way
its documentation gives for dropping a constraint (see
hongbao.ledger.migration_ops.rewrite_sqlite_table): rows stay as they are.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from hongbao.ledger.migration_ops import rewrite_sqlite_table

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

#: the clause as revision 0001 created it on SQLite
SQLITE_FOREIGN_KEY = (
    "CONSTRAINT fk_claim_share FOREIGN KEY(packet_id, share_idx)"
    " REFERENCES hb_shares (packet_id, idx), "
)
SQLITE_NEXT = "CONSTRAINT uq_claim_packet_user"
PARTIAL = sa.text("deposit_key IS NOT NULL")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        rewrite_sqlite_table("hb_claims", SQLITE_FOREIGN_KEY, "")
    else:
        op.drop_constraint("fk_claim_share", "hb_claims", type_="foreignkey")
    if dialect in ("postgresql", "sqlite"):
        op.drop_index("uq_entry_deposit_key", "hb_ledger_entries")
        op.create_index(
            "uq_entry_deposit_key",
            "hb_ledger_entries",
            ["user_id", "deposit_key"],
            unique=True,
            postgresql_where=PARTIAL,
            sqlite_where=PARTIAL,
        )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect in ("postgresql", "sqlite"):
        op.drop_index("uq_entry_deposit_key", "hb_ledger_entries")
        op.create_index(
            "uq_entry_deposit_key", "hb_ledger_entries", ["user_id", "deposit_key"], unique=True
        )
    if dialect == "sqlite":
        rewrite_sqlite_table("hb_claims", SQLITE_NEXT, SQLITE_FOREIGN_KEY + SQLITE_NEXT)
    else:
        op.create_foreign_key(
            "fk_claim_share",
            "hb_claims",
            "hb_shares",
            ["packet_id", "share_idx"],
            ["packet_id", "idx"],
        )

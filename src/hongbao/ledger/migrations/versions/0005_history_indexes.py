"""Indexes and a derived table for the red-packet record, wallet entries and statements.

- hb_claims (user_id, claimed_at, id, amount): the packets a user grabbed, newest first,
  and a year's count and sum from the index alone;
- hb_claims (packet_id, amount): whether a claim is its packet's best luck;
- hb_packets (sender_id, created_at, id, total_amount, refunded_amount): the packets a
  user sent, newest first, and a year's totals from the index alone;
- hb_packets (status, created_at): the oldest open packet, finished packets by age;
- hb_ledger_entries (user_id, id, amount): a wallet's entries newest first and the sum of
  those after one; it replaces the index on user_id alone, which it covers;
- hb_ledger_entries (created_at): the entries of one day;
- hb_best_luck: the best luck of each finished packet, and hb_history_marks, up to when
  it is complete (filled by the history indexer; empty here, since it is derived).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _identifier(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, collation="utf8mb4_bin"), "mysql", "mariadb"
    )


Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def upgrade() -> None:
    op.create_index("ix_claims_user_time", "hb_claims", ["user_id", "claimed_at", "id", "amount"])
    op.create_index("ix_claims_packet_amount", "hb_claims", ["packet_id", "amount"])
    op.create_index(
        "ix_packets_sender_time",
        "hb_packets",
        ["sender_id", "created_at", "id", "total_amount", "refunded_amount"],
    )
    op.create_index("ix_packets_status_created", "hb_packets", ["status", "created_at"])
    op.create_index("ix_entries_user_id", "hb_ledger_entries", ["user_id", "id", "amount"])
    op.drop_index("ix_hb_ledger_entries_user_id", "hb_ledger_entries")
    op.create_index("ix_entries_created", "hb_ledger_entries", ["created_at"])
    op.create_table(
        "hb_best_luck",
        sa.Column("packet_id", _identifier(32), sa.ForeignKey("hb_packets.id"), primary_key=True),
        sa.Column("user_id", _identifier(64), nullable=True),
        sa.Column("claimed_at", Timestamp, nullable=True),
    )
    op.create_index("ix_best_luck_user_time", "hb_best_luck", ["user_id", "claimed_at"])
    op.create_table(
        "hb_history_marks",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("at", Timestamp, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hb_history_marks")
    op.drop_index("ix_best_luck_user_time", "hb_best_luck")
    op.drop_table("hb_best_luck")
    op.drop_index("ix_entries_created", "hb_ledger_entries")
    op.create_index("ix_hb_ledger_entries_user_id", "hb_ledger_entries", ["user_id"])
    op.drop_index("ix_entries_user_id", "hb_ledger_entries")
    op.drop_index("ix_packets_status_created", "hb_packets")
    op.drop_index("ix_packets_sender_time", "hb_packets")
    op.drop_index("ix_claims_packet_amount", "hb_claims")
    op.drop_index("ix_claims_user_time", "hb_claims")

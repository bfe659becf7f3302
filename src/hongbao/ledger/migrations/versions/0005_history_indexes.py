"""Indexes for the red-packet record, a wallet's entries and the daily statement.

- hb_claims (user_id, claimed_at, id): the packets a user grabbed, newest first;
- hb_claims (packet_id, amount): whether a claim is its packet's best luck;
- hb_packets (sender_id, created_at, id): the packets a user sent, newest first;
- hb_ledger_entries (user_id, id): a wallet's entries newest first; it replaces the
  index on user_id alone, which it covers;
- hb_ledger_entries (created_at): the entries of one day.

Revision ID: 0005
Revises: 0003
Create Date: 2026-11-26
"""

from alembic import op

revision = "0005"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_claims_user_time", "hb_claims", ["user_id", "claimed_at", "id"])
    op.create_index("ix_claims_packet_amount", "hb_claims", ["packet_id", "amount"])
    op.create_index("ix_packets_sender_time", "hb_packets", ["sender_id", "created_at", "id"])
    op.create_index("ix_entries_user_id", "hb_ledger_entries", ["user_id", "id"])
    op.drop_index("ix_hb_ledger_entries_user_id", "hb_ledger_entries")
    op.create_index("ix_entries_created", "hb_ledger_entries", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_entries_created", "hb_ledger_entries")
    op.create_index("ix_hb_ledger_entries_user_id", "hb_ledger_entries", ["user_id"])
    op.drop_index("ix_entries_user_id", "hb_ledger_entries")
    op.drop_index("ix_packets_sender_time", "hb_packets")
    op.drop_index("ix_claims_packet_amount", "hb_claims")
    op.drop_index("ix_claims_user_time", "hb_claims")

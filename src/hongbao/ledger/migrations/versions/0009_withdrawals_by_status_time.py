"""An index of the withdrawals by status and the time they were requested.

An operator lists the withdrawals still `requested`, oldest first, across all users (the
payouts the payment system never reported), and the metrics read the oldest one at each
scrape. On the index of revision 0007, on status alone, each of those reads sorts every
requested withdrawal; on (status, created_at, id) it is a range read in order. The new
index starts with status, so it serves whatever the old one did, which it replaces.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_withdrawals_status_time", "hb_withdrawals", ["status", "created_at", "id"])
    op.drop_index("ix_withdrawals_status", "hb_withdrawals")


def downgrade() -> None:
    op.create_index("ix_withdrawals_status", "hb_withdrawals", ["status"])
    op.drop_index("ix_withdrawals_status_time", "hb_withdrawals")

"""The webhook deliveries' queue index leads with the status.

A dispatcher finds the queues it may take, their heads: the first pending delivery of
each (endpoint, subject). With the index on (endpoint, subject, status, id) that meant
reading every pending delivery and asking of each whether an earlier one of its subject
was pending: in a backlog of 20,000 deliveries over 10 subjects, 28 ms on SQLite and
159 ms on PostgreSQL a lease, most of the dispatcher's database time.

On (status, endpoint, subject, id) the pending deliveries of a subject are still one
index range in id order, and the pending subjects follow each other, so the heads are
found by stepping from one subject to the next (hongbao.ledger.webhook_leases): one
index probe a subject, whatever the backlog behind it. The foreign key to the endpoints
keeps the (endpoint, event) unique index.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TABLE = "hb_webhook_deliveries"


def upgrade() -> None:
    op.create_index("ix_deliveries_queue", TABLE, ["status", "endpoint_id", "subject", "id"])
    op.drop_index("ix_deliveries_subject", TABLE)


def downgrade() -> None:
    op.create_index("ix_deliveries_subject", TABLE, ["endpoint_id", "subject", "status", "id"])
    op.drop_index("ix_deliveries_queue", TABLE)

"""A delivery to an endpoint that takes batches carries several events.

The persister writes one delivery per subject and endpoint for the events of one
transaction, up to the endpoint's `batch_size`, instead of one per event: the dispatcher
then leases, sends and settles a message's worth of events as one row. `event_id` stays
the first event (so its foreign key and `uq_delivery_endpoint_event` hold);
`more_event_ids` lists the events after it, comma-separated (NULL for one event), and
`event_count` says how many it carries (1 for every delivery written before).
A downgrade keeps only the first event of each delivery: let the queue drain first.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TABLE = "hb_webhook_deliveries"


def upgrade() -> None:
    op.add_column(TABLE, sa.Column("more_event_ids", sa.Text, nullable=True))
    op.add_column(TABLE, sa.Column("event_count", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    op.drop_column(TABLE, "event_count")
    op.drop_column(TABLE, "more_event_ids")

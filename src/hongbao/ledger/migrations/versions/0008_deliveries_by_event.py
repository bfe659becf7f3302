"""An index of the webhook deliveries by event, for pruning the webhook tables.

`hongbao webhooks prune` deletes the old events that no delivery refers to: it looks
them up by hb_webhook_deliveries.event_id, and each delete checks that foreign key.
PostgreSQL and SQLite index no foreign key by themselves, so without this index each
of those lookups reads the whole table. MariaDB/MySQL made an index of their own for the
key (named event_id), which this one replaces.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_deliveries_event", "hb_webhook_deliveries", ["event_id"])


def downgrade() -> None:
    if op.get_bind().dialect.name in ("mysql", "mariadb"):
        # the foreign key needs an index: the one MySQL made for it at revision 0007
        op.create_index("event_id", "hb_webhook_deliveries", ["event_id"])
    op.drop_index("ix_deliveries_event", "hb_webhook_deliveries")

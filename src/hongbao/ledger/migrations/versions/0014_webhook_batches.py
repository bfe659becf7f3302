"""Webhook endpoints may take several events in one message.

`batch_size` is the most events one message to the endpoint carries: 1 (every endpoint
registered before, and the default) sends one event per message; above 1 the dispatcher
sends up to that many events of one subject together, in order, as one signed message
(hongbao.webhooks.dispatcher).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

TABLE = "hb_webhook_endpoints"


def upgrade() -> None:
    op.add_column(TABLE, sa.Column("batch_size", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    op.drop_column(TABLE, "batch_size")

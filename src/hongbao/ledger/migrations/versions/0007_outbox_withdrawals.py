"""Withdrawals, the event outbox and webhook endpoints and deliveries.

- hb_withdrawals: money leaving a wallet; ledger entries of kinds 'withdrawal' (the
  debit) and 'reversal' (a failed withdrawal's money back), so the entry kind CHECK
  constraint is replaced (see hongbao.ledger.migration_ops.replace_check).
- hb_events: the transactional outbox; hb_webhook_endpoints and hb_webhook_deliveries:
  where events go and how far each got.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from hongbao.ledger.migration_ops import replace_check

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

OLD_CHECK = "kind IN ('deposit', 'send', 'claim', 'refund')"
NEW_CHECK = "kind IN ('deposit', 'send', 'claim', 'refund', 'withdrawal', 'reversal')"
CHECK_NAME = "ck_entry_kind"
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def identifier(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def upgrade() -> None:
    op.create_table(
        "hb_withdrawals",
        sa.Column("id", identifier(32), primary_key=True),
        sa.Column("user_id", identifier(64), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("idempotency_key", identifier(128), nullable=False),
        sa.Column("actor", identifier(64), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("outcome_note", sa.String(200), nullable=True),
        sa.CheckConstraint("amount > 0", name="ck_withdrawal_amount_positive"),
        sa.CheckConstraint(
            "status IN ('requested', 'completed', 'failed')", name="ck_withdrawal_status"
        ),
        sa.UniqueConstraint("user_id", "idempotency_key", name="uq_withdrawal_idempotency"),
    )
    op.create_index("ix_withdrawals_status", "hb_withdrawals", ["status"])
    op.create_index("ix_withdrawals_user_time", "hb_withdrawals", ["user_id", "created_at"])
    op.create_table(
        "hb_events",
        sa.Column("seq", RowId, primary_key=True, autoincrement=True),
        sa.Column("id", identifier(32), nullable=False, unique=True),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("subject", identifier(160), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_index("ix_events_created", "hb_events", ["created_at"])
    op.create_table(
        "hb_webhook_endpoints",
        sa.Column("id", identifier(32), primary_key=True),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("event_types", sa.Text, nullable=False),
        sa.Column("secret", sa.String(100), nullable=False),
        sa.Column("previous_secret", sa.String(100), nullable=True),
        sa.Column("previous_secret_until", Timestamp, nullable=True),
        sa.Column("enabled", sa.Boolean, nullable=False),
        sa.Column("disabled_reason", sa.String(200), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_table(
        "hb_webhook_deliveries",
        sa.Column("id", RowId, primary_key=True, autoincrement=True),
        sa.Column(
            "endpoint_id",
            identifier(32),
            sa.ForeignKey("hb_webhook_endpoints.id"),
            nullable=False,
        ),
        sa.Column("event_id", identifier(32), sa.ForeignKey("hb_events.id"), nullable=False),
        sa.Column("subject", identifier(160), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", Timestamp, nullable=False),
        sa.Column("leased_until", Timestamp, nullable=True),
        sa.Column("leased_by", sa.String(40), nullable=True),
        sa.Column("last_status", sa.Integer, nullable=True),
        sa.Column("last_error", sa.String(300), nullable=True),
        sa.Column("delivered_at", Timestamp, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("requeued_at", Timestamp, nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'parked')", name="ck_delivery_status"
        ),
        sa.UniqueConstraint("endpoint_id", "event_id", name="uq_delivery_endpoint_event"),
    )
    op.create_index("ix_deliveries_due", "hb_webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index(
        "ix_deliveries_subject",
        "hb_webhook_deliveries",
        ["endpoint_id", "subject", "status", "id"],
    )
    replace_check("hb_ledger_entries", CHECK_NAME, OLD_CHECK, NEW_CHECK)


def downgrade() -> None:
    if (
        op.get_bind()
        .execute(
            sa.text("SELECT 1 FROM hb_ledger_entries WHERE kind IN ('withdrawal', 'reversal')")
        )
        .first()
    ):
        raise RuntimeError("the ledger holds withdrawals, which revision 0006 cannot record")
    replace_check("hb_ledger_entries", CHECK_NAME, NEW_CHECK, OLD_CHECK)
    op.drop_table("hb_webhook_deliveries")
    op.drop_table("hb_webhook_endpoints")
    op.drop_table("hb_events")
    op.drop_table("hb_withdrawals")

"""Initial ledger: wallets, ledger entries, packets, pre-split shares, claims.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "hb_wallets",
        sa.Column("user_id", sa.String(64), primary_key=True),
        sa.Column("balance", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.CheckConstraint("balance >= 0", name="ck_wallet_balance_not_negative"),
    )
    op.create_table(
        "hb_ledger_entries",
        sa.Column("id", RowId, primary_key=True, autoincrement=True),
        sa.Column("reference", sa.String(160), nullable=False, unique=True),
        sa.Column("user_id", sa.String(64), nullable=False, index=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("packet_id", sa.String(32), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.CheckConstraint("kind IN ('deposit', 'send', 'claim', 'refund')", name="ck_entry_kind"),
    )
    op.create_table(
        "hb_packets",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("sender_id", sa.String(64), nullable=False),
        sa.Column("total_amount", sa.BigInteger, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("greeting", sa.String(200), nullable=False, server_default=""),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("expires_at", Timestamp, nullable=False),
        sa.Column("claimed_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("claimed_amount", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("refunded_amount", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("closed_at", Timestamp, nullable=True),
        sa.Column("idempotency_key", sa.String(128), nullable=True),
        sa.Column("request_hash", sa.String(64), nullable=True),
        sa.CheckConstraint("total_amount > 0", name="ck_packet_total_positive"),
        sa.CheckConstraint("count > 0", name="ck_packet_count_positive"),
        sa.CheckConstraint(
            "claimed_amount + refunded_amount <= total_amount", name="ck_packet_conserved"
        ),
        sa.CheckConstraint("claimed_count <= count", name="ck_packet_claims_le_count"),
        sa.CheckConstraint("status IN ('active', 'exhausted', 'expired')", name="ck_packet_status"),
        sa.UniqueConstraint("sender_id", "idempotency_key", name="uq_packet_idempotency"),
    )
    op.create_index("ix_packets_status_expires", "hb_packets", ["status", "expires_at"])
    op.create_table(
        "hb_shares",
        sa.Column("packet_id", sa.String(32), sa.ForeignKey("hb_packets.id"), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.CheckConstraint("amount > 0", name="ck_share_amount_positive"),
    )
    op.create_table(
        "hb_claims",
        sa.Column("id", RowId, primary_key=True, autoincrement=True),
        sa.Column("packet_id", sa.String(32), nullable=False),
        sa.Column("share_idx", sa.Integer, nullable=False),
        sa.Column("user_id", sa.String(64), nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("claimed_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(
            ["packet_id", "share_idx"],
            ["hb_shares.packet_id", "hb_shares.idx"],
            name="fk_claim_share",
        ),
        sa.UniqueConstraint("packet_id", "user_id", name="uq_claim_packet_user"),
        sa.UniqueConstraint("packet_id", "share_idx", name="uq_claim_packet_share"),
    )


def downgrade() -> None:
    for table in ("hb_claims", "hb_shares", "hb_packets", "hb_ledger_entries", "hb_wallets"):
        op.drop_table(table)

"""Packet rules (audience, passphrase, start time), cancelled packets, sender limits.

- hb_packet_rules: a packet's start time and passphrase digest and its audience's size,
  for the packets that have rules; hb_packet_audience: the users of an audience.
- hb_packets.status may be 'cancelled' (closed early by its sender or an admin).
- hb_sender_days: what each sender sent per UTC day (sends and fen), counted in the
  transaction that debits the send.

The status CHECK constraint is replaced (see hongbao.ledger.migration_ops.replace_check:
on SQLite, the new constraint only allows more).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from hongbao.ledger.migration_ops import replace_check

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OLD_CHECK = "status IN ('active', 'exhausted', 'expired')"
NEW_CHECK = "status IN ('active', 'exhausted', 'expired', 'cancelled')"
CHECK_NAME = "ck_packet_status"
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def identifier(length: int) -> sa.types.TypeEngine[str]:
    return sa.String(length).with_variant(
        mysql.VARCHAR(length, collation="utf8mb4_bin"), "mysql", "mariadb"
    )


def upgrade() -> None:
    op.create_table(
        "hb_packet_rules",
        sa.Column("packet_id", identifier(32), sa.ForeignKey("hb_packets.id"), primary_key=True),
        sa.Column("starts_at", Timestamp, nullable=True),
        sa.Column("passphrase_hash", sa.String(64), nullable=True),
        sa.Column("audience_size", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_table(
        "hb_packet_audience",
        sa.Column("packet_id", identifier(32), sa.ForeignKey("hb_packets.id"), primary_key=True),
        sa.Column("user_id", identifier(64), primary_key=True),
    )
    op.create_table(
        "hb_sender_days",
        sa.Column("sender_id", identifier(64), primary_key=True),
        sa.Column("day", sa.Date, primary_key=True),
        sa.Column("sends", sa.Integer, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=False),
    )
    replace_check("hb_packets", CHECK_NAME, OLD_CHECK, NEW_CHECK)


def downgrade() -> None:
    # a cancelled packet was closed and refunded, as an expired one is
    op.execute("UPDATE hb_packets SET status = 'expired' WHERE status = 'cancelled'")
    replace_check("hb_packets", CHECK_NAME, NEW_CHECK, OLD_CHECK)
    op.drop_table("hb_sender_days")
    op.drop_table("hb_packet_audience")
    op.drop_table("hb_packet_rules")

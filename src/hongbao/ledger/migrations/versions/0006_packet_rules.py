"""Packet rules (audience, passphrase, start time), cancelled packets, sender limits.

- hb_packet_rules: a packet's start time and passphrase digest and its audience's size,
  for the packets that have rules; hb_packet_audience: the users of an audience.
- hb_packets.status may be 'cancelled' (closed early by its sender or an admin).
- hb_sender_days: what each sender sent per UTC day (sends and fen), counted in the
  transaction that debits the send.

The status CHECK constraint is replaced on PostgreSQL and MySQL/MariaDB. SQLite cannot
alter a constraint, and rebuilding hb_packets would break the foreign keys of the
tables that refer to it; since the new constraint only allows more, its text is
rewritten in the schema, the procedure SQLite's documentation gives for loosening a
CHECK constraint (ALTER TABLE, "Making Other Kinds Of Table Schema Changes").

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

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
    _replace_check(OLD_CHECK, NEW_CHECK)


def downgrade() -> None:
    # a cancelled packet was closed and refunded, as an expired one is
    op.execute("UPDATE hb_packets SET status = 'expired' WHERE status = 'cancelled'")
    _replace_check(NEW_CHECK, OLD_CHECK)
    op.drop_table("hb_sender_days")
    op.drop_table("hb_packet_audience")
    op.drop_table("hb_packet_rules")


def _replace_check(old: str, new: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint(CHECK_NAME, "hb_packets", type_="check")
        op.create_check_constraint(CHECK_NAME, "hb_packets", new)
        return
    table_sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'hb_packets'"
    ).scalar_one()
    if old not in table_sql:
        raise RuntimeError(f"hb_packets has no CHECK ({old}) to replace: {table_sql}")
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        bind.exec_driver_sql(
            "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = 'hb_packets'",
            (table_sql.replace(old, new),),
        )
        # other connections read the schema again when its version changes
        bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")

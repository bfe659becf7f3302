"""Ledger entries record who acted for the user.

An admin deposits into a user's wallet, and the host app's backend (a token with the
hongbao:service role) sends and grabs for its users. hb_ledger_entries.actor holds the
``sub`` of the token that acted, NULL when users act for themselves (and for every
entry made before this revision).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

USER_ID_LENGTH = 64
Actor = sa.String(USER_ID_LENGTH).with_variant(
    mysql.VARCHAR(USER_ID_LENGTH, collation="utf8mb4_bin"), "mysql", "mariadb"
)


def upgrade() -> None:
    op.add_column("hb_ledger_entries", sa.Column("actor", Actor, nullable=True))


def downgrade() -> None:
    op.drop_column("hb_ledger_entries", "actor")

"""A claim's ledger entry leaves the references' unique index.

Of the index entries a settled claim adds, the reference's is among the dearest: a
text key of some thirty bytes, checked for uniqueness on insert. In the PostgreSQL drain
of 100,000 claims, removing it took the server's CPU a claim from 46 to 38-40 us.

A claim's entry needs no index of its own to be unique. Its reference is
`claim:{packet}:{share}`, and it is only ever written by the statement that writes its
claim, from the same row, where the claims' unique key on (packet, share) refuses a
second claim of the share. `hongbao audit` also matches every packet's claim entries
against its claims. So the unique index on references becomes partial, `kind <> 'claim'`,
on PostgreSQL and SQLite; an entry of every other kind is refused a second time as
before. MySQL/MariaDB have no partial indexes: there the index only takes the name
the other databases give it.

SQLite declared the reference UNIQUE in the table itself, which only a rebuild of the
table removes (hongbao.ledger.migration_ops.rebuild_sqlite_table); no foreign key
refers to the ledger entries.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from hongbao.ledger.migration_ops import rebuild_sqlite_table

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLE = "hb_ledger_entries"
INDEX = "uq_entry_reference"
NOT_CLAIM = sa.text("kind <> 'claim'")
#: the constraint as revision 0001 created it
POSTGRES_CONSTRAINT = "hb_ledger_entries_reference_key"
MYSQL_INDEX = "reference"
SQLITE_UNIQUE = ", \n\tUNIQUE (reference)"


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect in ("mysql", "mariadb"):
        op.execute(f"ALTER TABLE {TABLE} RENAME INDEX {MYSQL_INDEX} TO {INDEX}")
        return
    if dialect == "sqlite":
        rebuild_sqlite_table(TABLE, _without_unique)
    else:
        op.drop_constraint(POSTGRES_CONSTRAINT, TABLE, type_="unique")
    op.create_index(
        INDEX, TABLE, ["reference"], unique=True, postgresql_where=NOT_CLAIM, sqlite_where=NOT_CLAIM
    )


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect in ("mysql", "mariadb"):
        op.execute(f"ALTER TABLE {TABLE} RENAME INDEX {INDEX} TO {MYSQL_INDEX}")
        return
    op.drop_index(INDEX, TABLE)
    if dialect == "sqlite":
        rebuild_sqlite_table(TABLE, _with_unique)
    else:
        op.create_unique_constraint(POSTGRES_CONSTRAINT, TABLE, ["reference"])


def _without_unique(table_sql: str) -> str:
    if SQLITE_UNIQUE not in table_sql:
        raise RuntimeError(f"{TABLE} has no UNIQUE (reference) to remove: {table_sql}")
    return table_sql.replace(SQLITE_UNIQUE, "")


def _with_unique(table_sql: str) -> str:
    body, close = table_sql.rsplit("\n)", 1)
    return body + SQLITE_UNIQUE + "\n)" + close

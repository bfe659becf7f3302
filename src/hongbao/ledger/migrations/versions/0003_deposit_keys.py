"""Deposits keep their idempotency key in a column of their own.

A deposit's reference was "deposit:<user>:<key>". User ids may contain ':', so two
(user, key) pairs could make one reference, and a long id with a long key did not
fit the column. The key now sits in hb_ledger_entries.deposit_key, unique per
user, and the reference is "deposit:" + SHA-256 of the length-prefixed pair.
Existing deposits get their key back from their reference (the entry's user_id
says where the key starts), so a retried old deposit is still recognised.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

import hashlib
from collections.abc import Callable

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

KEY_LENGTH = 128
REFERENCE_LENGTH = 160
DepositKey = sa.String(KEY_LENGTH).with_variant(
    mysql.VARCHAR(KEY_LENGTH, collation="utf8mb4_bin"), "mysql", "mariadb"
)
entries = sa.table(
    "hb_ledger_entries",
    sa.column("id", sa.BigInteger),
    sa.column("user_id", sa.String),
    sa.column("kind", sa.String),
    sa.column("reference", sa.String),
    sa.column("deposit_key", sa.String),
)
#: (entry id, user id, reference, deposit key) -> (new reference, new deposit key)
Rewrite = Callable[[int, str, str, str | None], tuple[str, str | None]]


def upgrade() -> None:
    op.add_column("hb_ledger_entries", sa.Column("deposit_key", DepositKey, nullable=True))
    _rewrite_deposits(_keyed)
    op.create_index(
        "uq_entry_deposit_key", "hb_ledger_entries", ["user_id", "deposit_key"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_entry_deposit_key", "hb_ledger_entries")
    _rewrite_deposits(_joined)
    op.drop_column("hb_ledger_entries", "deposit_key")


def _keyed(entry_id: int, user_id: str, reference: str, _: str | None) -> tuple[str, str]:
    prefix = f"deposit:{user_id}:"
    key = reference.removeprefix(prefix)
    if key == reference or len(key) > KEY_LENGTH:
        raise RuntimeError(
            f"ledger entry {entry_id}: deposit reference {reference!r} is not "
            f"deposit:<user>:<key of at most {KEY_LENGTH} characters>"
        )
    pair = f"{len(user_id)}:{user_id}:{key}"
    return "deposit:" + hashlib.sha256(pair.encode()).hexdigest(), key


def _joined(entry_id: int, user_id: str, _: str, key: str | None) -> tuple[str, None]:
    reference = f"deposit:{user_id}:{key}"
    if key is None or len(reference) > REFERENCE_LENGTH:
        raise RuntimeError(f"ledger entry {entry_id}: deposit key {key!r} has no 0001 reference")
    return reference, None


def _rewrite_deposits(rewrite: Rewrite, batch: int = 1000) -> None:
    """Give every deposit entry a new reference and deposit key, in batches by id."""
    bind = op.get_bind()
    update = (
        entries.update()
        .where(entries.c.id == sa.bindparam("entry_id"))
        .values(reference=sa.bindparam("new_reference"), deposit_key=sa.bindparam("new_key"))
    )
    after = 0
    while True:
        rows = bind.execute(
            sa.select(entries.c.id, entries.c.user_id, entries.c.reference, entries.c.deposit_key)
            .where(entries.c.kind == "deposit", entries.c.id > after)
            .order_by(entries.c.id)
            .limit(batch)
        ).all()
        if not rows:
            return
        changes = []
        for entry_id, user_id, reference, key in rows:
            new_reference, new_key = rewrite(entry_id, user_id, reference, key)
            changes.append(
                {"entry_id": entry_id, "new_reference": new_reference, "new_key": new_key}
            )
        bind.execute(update, changes)
        after = rows[-1][0]

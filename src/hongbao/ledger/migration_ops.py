"""Operations the Alembic migrations share (see hongbao/ledger/migrations/versions)."""

from __future__ import annotations

from alembic import op


def replace_check(table: str, name: str, old: str, new: str) -> None:
    """Replace the CHECK constraint `name` of `table`, whose text is `old`, by `new`.

    PostgreSQL and MySQL/MariaDB drop and create it. SQLite cannot alter a constraint,
    and rebuilding a table would break the foreign keys of the tables that refer to it;
    when the new constraint only allows more, its text is rewritten in the schema, the
    procedure SQLite's documentation gives for loosening a CHECK constraint (ALTER
    TABLE, "Making Other Kinds Of Table Schema Changes").
    """
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint(name, table, type_="check")
        op.create_check_constraint(name, table, new)
        return
    table_sql = bind.exec_driver_sql(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).scalar_one()
    if old not in table_sql:
        raise RuntimeError(f"{table} has no CHECK ({old}) to replace: {table_sql}")
    version = bind.exec_driver_sql("PRAGMA schema_version").scalar_one()
    bind.exec_driver_sql("PRAGMA writable_schema = ON")
    try:
        bind.exec_driver_sql(
            "UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?",
            (table_sql.replace(old, new), table),
        )
        # other connections read the schema again when its version changes
        bind.exec_driver_sql(f"PRAGMA schema_version = {int(version) + 1}")
    finally:
        bind.exec_driver_sql("PRAGMA writable_schema = OFF")

"""Operations the Alembic migrations share (see hongbao/ledger/migrations/versions)."""

from __future__ import annotations

from collections.abc import Callable

from alembic import op


def replace_check(table: str, name: str, old: str, new: str) -> None:
    """Replace the CHECK constraint `name` of `table`, whose text is `old`, by `new`.

    PostgreSQL and MySQL/MariaDB drop and create it. SQLite cannot alter a constraint,
    and rebuilding a table would break the foreign keys of the tables that refer to it;
    when the new constraint only allows more, its text is rewritten in the schema
    (`rewrite_sqlite_table`).
    """
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint(name, table, type_="check")
        op.create_check_constraint(name, table, new)
        return
    rewrite_sqlite_table(table, old, new)


def rewrite_sqlite_table(table: str, old: str, new: str) -> None:
    """Replace the text `old` by `new` in the CREATE TABLE statement SQLite keeps for
    `table`, without rebuilding the table.

    Only for changes that leave the stored rows valid as they are: removing or loosening
    a CHECK or FOREIGN KEY constraint (SQLite's documentation, ALTER TABLE, "Making Other
    Kinds Of Table Schema Changes"), or putting one back that the rows are known to meet.
    """
    bind = op.get_bind()
    table_sql = _sqlite_table_sql(table)
    if old not in table_sql:
        raise RuntimeError(f"{table} has no {old!r} to replace: {table_sql}")
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


def rebuild_sqlite_table(table: str, edit: Callable[[str], str]) -> None:
    """Rebuild `table` with the CREATE TABLE statement `edit` makes of SQLite's: a new
    table of that schema, the rows copied into it, the old table dropped, the new one
    renamed, and the table's own indexes made again (SQLite's documentation, ALTER TABLE,
    "Making Other Kinds Of Table Schema Changes").

    For changes the rows need not be checked for but the indexes do follow, such as
    removing a UNIQUE constraint; only for a table that no foreign key refers to, with
    its columns in the same order.
    """
    bind = op.get_bind()
    table_sql = _sqlite_table_sql(table)
    if not table_sql.startswith("CREATE TABLE "):
        raise RuntimeError(f"{table} is not created as expected: {table_sql}")
    indexes = [
        sql
        for (sql,) in bind.exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ?"
            " AND sql IS NOT NULL",
            (table,),
        )
    ]
    rebuilt = f"{table}_rebuilt"
    # the statement names the table as it was created: bare, or quoted once renamed
    _, _, columns = edit(table_sql).partition("(")
    bind.exec_driver_sql(f"CREATE TABLE {rebuilt} ({columns}")
    bind.exec_driver_sql(f"INSERT INTO {rebuilt} SELECT * FROM {table}")
    bind.exec_driver_sql(f"DROP TABLE {table}")
    bind.exec_driver_sql(f"ALTER TABLE {rebuilt} RENAME TO {table}")
    for sql in indexes:
        bind.exec_driver_sql(sql)


def _sqlite_table_sql(table: str) -> str:
    """The CREATE TABLE statement SQLite keeps for `table`."""
    sql: str = (
        op.get_bind()
        .exec_driver_sql(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
        )
        .scalar_one()
    )
    return sql

"""Alembic environment. hongbao hands it a live connection (see ledger.sql.migrate)."""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from hongbao.ledger.schema import metadata

config = context.config


def run_on(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


async def run_with_own_engine(url: str) -> None:
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(run_on)
    await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported; run `hongbao migrate`")
given = config.attributes.get("connection")
if given is not None:
    run_on(given)
else:
    asyncio.run(run_with_own_engine(config.get_main_option("sqlalchemy.url") or ""))

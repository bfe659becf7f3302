"""The webhook queue's statements stay within what a database binds: SQLite as built
upstream takes at most 32,766 variables a statement, and a lease or settle of more
deliveries than that (an endpoint's long backlog, many queues settled together) goes
through in parts, in one transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.util import await_only

from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import webhook_deliveries
from hongbao.ledger.webhook_store import WebhookStore
from tests.ledger.test_outbox import add_endpoint
from tests.ledger.test_webhook_leases import emit

pytestmark = pytest.mark.parametrize("sql_url", ["sqlite"], indirect=True)

LEASE = timedelta(seconds=60)
#: more deliveries than SQLite binds variables in one statement
MANY = 40_000
#: SQLite's default SQLITE_MAX_VARIABLE_NUMBER (some distributions build it higher)
UPSTREAM_LIMIT = 32_766


@pytest.fixture
async def ledger(ledger: SqlLedger) -> AsyncIterator[SqlLedger]:
    """The ledger, its connections binding no more variables than upstream SQLite's."""

    @event.listens_for(ledger.engine.sync_engine, "connect")
    def _limit(dbapi_conn: Any, _record: Any) -> None:
        aio = dbapi_conn.driver_connection

        def limit() -> None:
            aio._conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, UPSTREAM_LIMIT)

        await_only(aio._execute(limit))

    await ledger.engine.dispose()  # the connections made so far have the build's limit
    async with ledger.engine.connect() as conn:
        with pytest.raises(sa.exc.OperationalError, match="too many SQL variables"):
            await conn.execute(sa.select(sa.literal(1)).where(sa.literal(1).in_(range(MANY))))
    yield ledger


async def held_by(ledger: SqlLedger) -> dict[str | None, int]:
    async with ledger.engine.connect() as conn:
        rows = await conn.execute(
            sa.select(webhook_deliveries.c.leased_by, sa.func.count()).group_by(
                webhook_deliveries.c.leased_by
            )
        )
        return {owner: int(n) for owner, n in rows}


async def test_leasing_and_settling_more_deliveries_than_sqlite_binds(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, MANY)  # one delivery per event, one queue

    (queue,) = await store.lease("a", heads=1, batch=MANY, lease_for=LEASE)
    assert len(queue) == MANY
    assert await held_by(ledger) == {"a": MANY}
    await store.settle("a", [], [], [d.delivery_id for d in queue])
    assert await held_by(ledger) == {None: MANY}

    (queue,) = await store.lease("b", heads=1, batch=MANY, lease_for=LEASE)
    assert len(queue) == MANY
    delivered = [(d.delivery_id, 200 if n % 2 else 204) for n, d in enumerate(queue)]
    await store.settle("b", delivered, [], [])
    stats = await store.stats()
    assert (stats.pending, stats.delivered) == (0, MANY)
    assert await held_by(ledger) == {None: MANY}


async def test_settling_many_queues_together_and_leasing_on(ledger: SqlLedger) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"])
    store = WebhookStore(ledger)
    await emit(ledger, "p1", 1, MANY)
    await emit(ledger, "p2", 1, 10)
    queues = await store.lease("a", heads=2, batch=MANY, lease_for=LEASE)
    assert sorted(len(q) for q in queues) == [10, MANY]
    await emit(ledger, "p1", MANY + 1, 3)
    finished = [([(d.delivery_id, 200) for d in q], q[-1]) for q in queues]
    nexts = await store.settle_and_lease_next("a", finished, batch=MANY, lease_for=LEASE)
    assert sorted(len(q) for q in nexts) == [0, 3]
    stats = await store.stats()
    assert (stats.pending, stats.delivered) == (3, MANY + 10)

"""A database failure inside a read (a server restarting mid-query, a connection dropped)
comes out of the ledger as StorageError, as a failure to connect does: HTTP answers 503
and the sweeper tries again, instead of a 500 and a dead task."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from hongbao.errors import StorageError
from hongbao.ledger import SqlLedger
from tests.ledger.test_ledger import record

Read = Callable[[SqlLedger, str], Awaitable[object]]

READS: dict[str, Read] = {
    "balance": lambda led, pid: led.balance("s"),
    "get_packet": lambda led, pid: led.get_packet(pid),
    "packet_rules": lambda led, pid: led.packet_rules(pid),
    "audience_of": lambda led, pid: led.audience_of(pid),
    "in_audience": lambda led, pid: led.in_audience(pid, "u"),
    "shares_of": lambda led, pid: led.shares_of(pid),
    "claims_of": lambda led, pid: led.claims_of(pid),
    "open_packets": lambda led, pid: led.open_packets(),
    "audit": lambda led, pid: led.audit(),
    "read": lambda led, pid: led.read(lambda conn: conn.scalar(sa.text("SELECT 1"))),
}

#: what drivers raise when the server goes away mid-query (asyncpg's AdminShutdown
#: becomes a plain DBAPIError, a closed connection InterfaceError, MariaDB's
#: "server has gone away" OperationalError)
FAULTS = [sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.DBAPIError]


@contextlib.contextmanager
def next_query_fails(ledger: SqlLedger, error: type[sa.exc.DBAPIError]) -> Iterator[list[str]]:
    """The next query the ledger's engine runs (not a BEGIN) raises `error`; yields the
    statements it failed (one, once it fired)."""
    failed: list[str] = []

    def fail(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if failed or statement.lstrip().upper().startswith("BEGIN"):
            return
        failed.append(statement)
        raise error(statement, None, ConnectionResetError("server closed the connection"))

    target = ledger.engine.sync_engine
    event.listen(target, "before_cursor_execute", fail)
    try:
        yield failed
    finally:
        event.remove(target, "before_cursor_execute", fail)


@pytest.mark.parametrize(
    ("name", "error"),
    # each read with one of the faults, in turn
    [(name, FAULTS[i % len(FAULTS)]) for i, name in enumerate(READS)],
    ids=list(READS),
)
async def test_a_failure_inside_a_read_is_a_storage_error(
    ledger: SqlLedger, name: str, error: type[sa.exc.DBAPIError]
) -> None:
    await ledger.deposit("s", 1000, "d")
    packet = record("s", 300, 3)
    await ledger.create_packet(packet, [100, 100, 100], None)
    read = READS[name]
    with next_query_fails(ledger, error) as failed, pytest.raises(StorageError) as raised:
        await read(ledger, packet.id)
    assert failed and isinstance(raised.value.__cause__, error)
    await read(ledger, packet.id)  # the next read finds the database again
    assert await ledger.audit() == []


async def test_other_errors_inside_a_read_stay_themselves(ledger: SqlLedger) -> None:
    async def broken(_conn: object) -> None:
        raise KeyError("a bug, not an outage")

    with pytest.raises(KeyError):
        await ledger.read(broken)

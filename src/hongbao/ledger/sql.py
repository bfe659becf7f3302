"""SQL ledger on PostgreSQL (asyncpg), MySQL/MariaDB (aiomysql) or SQLite (aiosqlite).

Every change of money is one transaction that writes a ledger entry with a unique
reference next to the balance it changes, so a retried or replayed change is a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from importlib.resources import files
from typing import Any, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event as sa_event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from hongbao.domain.money import MAX_FEN, require_amount
from hongbao.domain.rules import PacketRules, SendLimits
from hongbao.errors import (
    ConfigurationError,
    IdempotencyConflict,
    InsufficientBalance,
    InvalidRequest,
    StorageError,
)
from hongbao.ledger.apply import ApplyBatch
from hongbao.ledger.audit import audit_ledger
from hongbao.ledger.bulk import bulk_for
from hongbao.ledger.history import snapshot
from hongbao.ledger.outbox import packet_created, record_events, wallet_deposited
from hongbao.ledger.records import (
    PACKET_COLUMNS,
    ClaimEvent,
    ClaimRow,
    LedgerEvent,
    PacketRecord,
    RefundEvent,
    chunks,
    entry_row,
    from_db,
    packet_from_row,
    to_db,
    utcnow,
)
from hongbao.ledger.rules import (
    audience_of,
    count_send,
    in_audience,
    read_rules,
    write_rules,
)
from hongbao.ledger.schema import (
    IDEMPOTENCY_KEY_LENGTH,
    claims,
    entries,
    packets,
    shares,
    wallets,
)

T = TypeVar("T")
#: execution option of the connections `SqlLedger._transaction` writes on
_WRITES = "hongbao_writes"
ASYNC_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "mysql": "mysql+aiomysql",
    "mariadb": "mysql+aiomysql",
    "sqlite": "sqlite+aiosqlite",
}


def database_url(url: str) -> str:
    """Give a plain postgresql:// / mysql:// / sqlite:// URL its async driver."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # sqlalchemy raises ArgumentError with a terse message
        raise ConfigurationError(f"bad database URL: {exc}") from None
    backend = parsed.get_backend_name()
    if backend not in ASYNC_DRIVERS:
        raise ConfigurationError(
            f"unsupported database {backend!r}: use PostgreSQL, MySQL/MariaDB or SQLite"
        )
    if "+" not in parsed.drivername:
        parsed = parsed.set(drivername=ASYNC_DRIVERS[backend])
    return parsed.render_as_string(hide_password=False)


#: the database cannot be reached: the network (OSError, timeouts included), or no
#: connection of the pool came free in time while the server is slow or away
_UNREACHABLE = (OSError, PoolTimeout)


def _read_failure(exc: BaseException | None) -> StorageError | None:
    """The StorageError a database failure on a read becomes (None: `exc` is not one).

    IntegrityError stays itself, as `SqlLedger._transaction` leaves it; errors that are
    not the database's (TypeError, InvalidRequest...) stay themselves too."""
    if isinstance(exc, IntegrityError):
        return None
    if isinstance(exc, DBAPIError):
        return StorageError(f"database: {exc.orig}")
    if isinstance(exc, _UNREACHABLE):
        return StorageError(f"database unreachable: {exc}")
    return None


def _retryable(exc: DBAPIError) -> bool:
    """Conflicts between concurrent transactions: worth running the transaction again."""
    if isinstance(exc, IntegrityError):
        return True
    text = str(exc.orig).lower()
    return any(word in text for word in ("deadlock", "lock wait", "database is locked", "serializ"))


class SqlLedger:
    """Wallets, packets, shares and claims in SQL. All amounts are int fen."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._writers: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @classmethod
    def from_url(cls, url: str, pool_size: int = 10) -> SqlLedger:
        full = database_url(url)
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if full.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 30}
            # a connection keeps its page cache only while no other connection writes:
            # handing out the connection used last lets a lone writer (the persister)
            # find the pages of its previous transaction still cached
            kwargs["pool_use_lifo"] = True
        else:
            kwargs.update(pool_size=pool_size, max_overflow=pool_size)
        if full.startswith("mysql"):
            kwargs["isolation_level"] = "READ COMMITTED"
        if full.startswith("postgresql"):
            # asyncpg prepares every statement; after a few runs PostgreSQL may switch
            # to a generic plan chosen while the claims table was small, and keep
            # scanning it whole as it grows (48 ms per persister lookup at 20,000
            # claims instead of 1 ms). Planning each run with its values avoids that.
            kwargs["connect_args"] = {"server_settings": {"plan_cache_mode": "force_custom_plan"}}
        engine = create_async_engine(full, **kwargs)
        if engine.dialect.name == "sqlite":
            _create_private_file(engine.url)
            _tune_sqlite(engine)
        return cls(engine)

    async def aclose(self) -> None:
        await self.engine.dispose()

    async def migrate(self, revision: str = "head") -> None:
        """Bring the schema up to an Alembic revision, the newest by default."""
        cfg = Config(str(files("hongbao.ledger").joinpath("alembic.ini")))
        cfg.set_main_option("script_location", str(files("hongbao.ledger").joinpath("migrations")))

        def upgrade(connection: sa.Connection) -> None:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, revision)

        async with self.engine.begin() as conn:
            await conn.run_sync(upgrade)

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
            return True
        except (DBAPIError, *_UNREACHABLE):
            return False

    # -- wallets ---------------------------------------------------------------

    async def deposit(
        self, user_id: str, amount: int, reference: str, actor: str | None = None
    ) -> int:
        """Credit a wallet once per (user, reference); returns the balance after.

        The same reference with another amount is an IdempotencyConflict. `actor`, who
        made the deposit for the user (an admin), is recorded on the entry. An amount that
        is not a positive int, or that would take the balance past MAX_FEN (the
        database's BIGINT), is an InvalidRequest and changes nothing.
        """
        require_amount(amount)
        if not 1 <= len(reference) <= IDEMPOTENCY_KEY_LENGTH:
            raise InvalidRequest(
                f"a deposit reference has 1 to {IDEMPOTENCY_KEY_LENGTH} characters", "reference"
            )

        async def work(conn: AsyncConnection) -> int:
            seen = await conn.scalar(
                sa.select(entries.c.amount).where(
                    entries.c.user_id == user_id, entries.c.deposit_key == reference
                )
            )
            if seen is not None and int(seen) != amount:
                raise IdempotencyConflict(
                    "this deposit reference was used before with a different amount"
                )
            if seen is None:
                await _credit_below_limit(conn, user_id, amount)
                ref = deposit_reference(user_id, reference)
                row = entry_row(ref, user_id, "deposit", amount, actor=actor)
                row["deposit_key"] = reference
                await conn.execute(entries.insert(), [row])
            balance = int(await conn.scalar(_balance_query(user_id)) or 0)
            if seen is None:
                await record_events(conn, [wallet_deposited(user_id, amount, balance, actor)])
            return balance

        return await self._transaction(work)

    async def balance(self, user_id: str) -> int:
        async with self._connect() as conn:
            return int(await conn.scalar(_balance_query(user_id)) or 0)

    # -- packets ---------------------------------------------------------------

    async def create_packet(
        self,
        record: PacketRecord,
        amounts: Sequence[int],
        idempotency_key: str | None,
        actor: str | None = None,
        rules: PacketRules | None = None,
        limits: SendLimits | None = None,
    ) -> tuple[PacketRecord, bool]:
        """Debit the sender and write the packet, its shares and its `rules`, in one
        transaction; with `limits`, the send is counted against the sender's day first
        (SendLimitReached when it would pass one).

        With an idempotency key already used by this sender, nothing changes and the
        earlier packet is returned (created=False), unless the request differs. `actor`,
        who sent for the sender (a service), is recorded on the debit's entry.
        """

        async def work(conn: AsyncConnection) -> tuple[PacketRecord, bool]:
            found = await _sent_before(conn, record, idempotency_key)
            if found is not None:
                return found, False
            if limits is not None and limits.any:
                await count_send(
                    conn, record.sender_id, record.total_amount, limits, record.created_at
                )
            debited = await conn.execute(
                wallets.update()
                .where(
                    wallets.c.user_id == record.sender_id,
                    wallets.c.balance >= record.total_amount,
                )
                .values(balance=wallets.c.balance - record.total_amount, updated_at=utcnow())
            )
            if debited.rowcount != 1:
                # a retry that raced the first request waited for its debit of the wallet
                # row; the first has committed by then (READ COMMITTED, or SQLite's one
                # writer), and its packet is the answer, not "insufficient balance"
                found = await _sent_before(conn, record, idempotency_key)
                if found is not None:
                    return found, False
                raise InsufficientBalance(
                    f"wallet of {record.sender_id} holds less than {record.total_amount} fen"
                )
            await conn.execute(
                entries.insert(),
                [
                    entry_row(
                        f"send:{record.id}",
                        record.sender_id,
                        "send",
                        -record.total_amount,
                        record.id,
                        actor=actor,
                    )
                ],
            )
            await conn.execute(
                packets.insert().values(
                    id=record.id,
                    sender_id=record.sender_id,
                    total_amount=record.total_amount,
                    count=record.count,
                    mode=record.mode,
                    greeting=record.greeting,
                    status="active",
                    created_at=to_db(record.created_at),
                    expires_at=to_db(record.expires_at),
                    idempotency_key=idempotency_key,
                    request_hash=record.request_hash,
                )
            )
            rows = [{"packet_id": record.id, "idx": i, "amount": a} for i, a in enumerate(amounts)]
            for chunk in chunks(rows, 2000):
                await conn.execute(shares.insert(), list(chunk))
            if rules is not None:
                await write_rules(conn, record.id, rules)
            await record_events(conn, [packet_created(record, actor)])
            return record, True

        return await self._transaction(work)

    async def get_packet(self, packet_id: str) -> PacketRecord | None:
        async with self._connect() as conn:
            row = (
                await conn.execute(sa.select(*PACKET_COLUMNS).where(packets.c.id == packet_id))
            ).first()
        return packet_from_row(row) if row is not None else None

    async def packet_rules(self, packet_id: str, *, audience: bool = True) -> PacketRules:
        """A packet's rules (NO_RULES without any); its audience's users if `audience`."""
        async with self._connect() as conn:
            return await read_rules(conn, packet_id, audience=audience)

    async def audience_of(self, packet_id: str) -> list[str]:
        """The users a packet is for, by id (empty: anyone may grab)."""
        async with self._connect() as conn:
            return await audience_of(conn, packet_id)

    async def in_audience(self, packet_id: str, user_id: str) -> bool:
        """Whether a packet's audience names the user."""
        async with self._connect() as conn:
            return await in_audience(conn, packet_id, user_id)

    async def shares_of(self, packet_id: str) -> list[tuple[int, int]]:
        """All (index, amount) shares of a packet, in index order."""
        async with self._connect() as conn:
            rows = await conn.execute(
                sa.select(shares.c.idx, shares.c.amount)
                .where(shares.c.packet_id == packet_id)
                .order_by(shares.c.idx)
            )
            return [(int(i), int(a)) for i, a in rows]

    async def claims_of(self, packet_id: str) -> list[ClaimRow]:
        async with self._connect() as conn:
            rows = await conn.execute(
                sa.select(
                    claims.c.user_id, claims.c.share_idx, claims.c.amount, claims.c.claimed_at
                )
                .where(claims.c.packet_id == packet_id)
                .order_by(claims.c.claimed_at, claims.c.share_idx)
            )
            return [ClaimRow(u, int(i), int(a), from_db(t)) for u, i, a, t in rows]

    async def open_packets(
        self, *, due_before: datetime | None = None, after_id: str = "", limit: int = 500
    ) -> list[PacketRecord]:
        """Packets not yet closed (active), optionally only those expired by `due_before`."""
        query = sa.select(*PACKET_COLUMNS).where(
            packets.c.status == "active", packets.c.id > after_id
        )
        if due_before is not None:
            query = query.where(packets.c.expires_at <= to_db(due_before))
        async with self._connect() as conn:
            rows = await conn.execute(query.order_by(packets.c.id).limit(limit))
            return [packet_from_row(r) for r in rows]

    async def spent_packets(self, *, after_id: str = "", limit: int = 500) -> list[PacketRecord]:
        """Packets whose every share was claimed (exhausted), by id."""
        query = sa.select(*PACKET_COLUMNS).where(
            packets.c.status == "exhausted", packets.c.id > after_id
        )
        async with self._connect() as conn:
            rows = await conn.execute(query.order_by(packets.c.id).limit(limit))
            return [packet_from_row(r) for r in rows]

    # -- applying grab and refund events ------------------------------------------

    async def apply(self, events: Sequence[LedgerEvent]) -> list[str | None]:
        """Apply claims and refunds in one transaction.

        Returns, per event, None (applied now, or applied before: replays are
        harmless) or the reason it cannot ever be applied (the caller dead-letters it).
        """
        return await self._transaction(lambda conn: ApplyBatch(conn).run(events))

    # -- audit ---------------------------------------------------------------------

    async def audit(self) -> list[str]:
        """Invariants of the ledger; every returned line names a violation.

        All of it is read on one snapshot (REPEATABLE READ on PostgreSQL and MariaDB,
        one read transaction on SQLite): its statements see the same commits, so a
        persister, a send or a withdrawal committing meanwhile shows no false violation."""
        async with snapshot(self.engine) as (conn, _):
            return await audit_ledger(conn)

    async def transaction(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `work` in one write transaction, again on a conflict with another."""
        return await self._transaction(work)

    async def read(self, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `work` on a connection that only reads (it takes no write lock on SQLite)."""
        async with self._connect() as conn:
            return await work(conn)

    def _connect(self) -> Any:
        return _Guard(self.engine)

    def _writer_queue(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """On SQLite, the turn of this process's write transactions, first come first
        served (one lock a running event loop). SQLite lets a writer waiting for the
        write lock poll for it, sleeping ever longer, and the transaction that just
        committed begins its next one before the poll comes round: under a storm the
        persister would keep the lock for transaction after transaction while a
        dispatcher, a send or a deposit waited. Writers of other processes still poll."""
        if self.dialect != "sqlite":
            return contextlib.nullcontext()
        loop = asyncio.get_running_loop()
        if self._writers is None or self._writers[0] is not loop:
            self._writers = (loop, asyncio.Lock())
        return self._writers[1]

    async def _transaction(
        self, work: Callable[[AsyncConnection], Awaitable[T]], attempts: int = 8
    ) -> T:
        for attempt in range(attempts):
            try:
                async with self._writer_queue(), self.engine.connect() as conn:
                    await conn.execution_options(**{_WRITES: True})
                    async with conn.begin():
                        return await work(conn)
            except DBAPIError as exc:
                if attempt + 1 < attempts and _retryable(exc):
                    await asyncio.sleep(random.uniform(0, 0.01 * 2**attempt))
                    continue
                if isinstance(exc, IntegrityError):
                    raise
                raise StorageError(f"database: {exc.orig}") from exc
            except _UNREACHABLE as exc:
                raise StorageError(f"database unreachable: {exc}") from exc
        raise AssertionError("unreachable")


class _Guard:
    """`async with` a connection for reads, turning database failures into StorageError:
    connecting, closing, and the statements run inside (a server that restarts or drops
    the connection mid-query), so that callers see an outage (HTTP 503, a sweep to try
    again) rather than a driver's exception. See `_read_failure`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._cm = engine.connect()

    async def __aenter__(self) -> AsyncConnection:
        try:
            return await self._cm.__aenter__()
        except (DBAPIError, *_UNREACHABLE) as exc:
            raise StorageError(f"database unreachable: {exc}") from exc

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        try:
            await self._cm.__aexit__(kind, exc, tb)
        except (DBAPIError, *_UNREACHABLE) as err:
            raise StorageError(f"database: {err}") from err
        failure = _read_failure(exc)
        if failure is not None:
            raise failure from exc


async def _sent_before(
    conn: AsyncConnection, record: PacketRecord, idempotency_key: str | None
) -> PacketRecord | None:
    """The packet this sender sent with this Idempotency-Key before, read afresh (None:
    none, or no key); IdempotencyConflict when it was sent for another request."""
    if idempotency_key is None:
        return None
    row = (
        await conn.execute(
            sa.select(*PACKET_COLUMNS).where(
                packets.c.sender_id == record.sender_id,
                packets.c.idempotency_key == idempotency_key,
            )
        )
    ).first()
    if row is None:
        return None
    found = packet_from_row(row)
    if found.request_hash != record.request_hash:
        raise IdempotencyConflict("this Idempotency-Key was used before with a different request")
    return found


async def _credit_below_limit(conn: AsyncConnection, user_id: str, amount: int) -> None:
    """Add `amount` to the user's wallet, made if missing, unless the balance would pass
    MAX_FEN: then InvalidRequest, and the transaction's rollback undoes the wallet made.

    The wallet row is made (or locked, with 0 added) first, so the conditional UPDATE
    checks the balance every other writer has committed: a balance past BIGINT would be
    an error on PostgreSQL and MariaDB, and silently a REAL on SQLite."""
    now = utcnow()
    await bulk_for(conn).credit([user_id], [0], now)
    credited = await conn.execute(
        wallets.update()
        .where(wallets.c.user_id == user_id, wallets.c.balance <= MAX_FEN - amount)
        .values(balance=wallets.c.balance + amount, updated_at=now)
    )
    if credited.rowcount != 1:
        raise InvalidRequest(
            f"a deposit of {amount} fen would take the wallet of {user_id} past {MAX_FEN} fen",
            "amount",
        )


def deposit_reference(user_id: str, key: str) -> str:
    """The ledger reference of a deposit: one per (user, key), whatever the two hold.

    User ids may contain ':', so joining the two with it could make two deposits one
    reference; the length prefix keeps the pair apart, and the hash keeps a 64-char
    id with a 128-char key within the column.
    """
    pair = f"{len(user_id)}:{user_id}:{key}"
    return "deposit:" + hashlib.sha256(pair.encode()).hexdigest()


def _balance_query(user_id: str) -> sa.Select[tuple[int]]:
    return sa.select(wallets.c.balance).where(wallets.c.user_id == user_id)


def _create_private_file(url: sa.URL) -> None:
    """Create a new SQLite database file readable and writable by its owner only.

    Wallets and claims are nobody else's business. SQLite gives the -wal and -shm
    files the permissions of the database file. An existing file keeps its own.
    """
    path = url.database
    if not path or path == ":memory:" or path.startswith("file:") or url.query.get("uri"):
        return
    # exists already, or cannot be made: then SQLite reports the problem on connect
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _tune_sqlite(engine: AsyncEngine) -> None:
    """WAL, foreign keys, a larger page cache, and BEGIN IMMEDIATE for the transactions
    that write."""

    @sa_event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        for pragma in (
            "journal_mode=WAL",
            "synchronous=NORMAL",
            "foreign_keys=ON",
            "busy_timeout=30000",
            # up to 64 MiB of pages a connection (SQLite's default: 2 MiB), grown as
            # used: the user-ordered indexes of a large ledger change pages all over
            "cache_size=-65536",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @sa_event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # a transaction that writes takes the write lock at once (BEGIN IMMEDIATE), so
        # writers queue instead of failing on a lock upgrade; a read takes none and
        # never waits for, or holds up, a writer (WAL)
        writes = conn.get_execution_options().get(_WRITES, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")


__all__ = [
    "ClaimEvent",
    "ClaimRow",
    "LedgerEvent",
    "PacketRecord",
    "RefundEvent",
    "SqlLedger",
    "database_url",
]

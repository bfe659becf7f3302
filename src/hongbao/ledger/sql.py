"""SQL ledger on PostgreSQL (asyncpg), MySQL/MariaDB (aiomysql) or SQLite (aiosqlite).

Every change of money is one transaction that writes a ledger entry with a unique
reference next to the balance it changes, so a retried or replayed change is a no-op.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from importlib.resources import files
from typing import Any, TypeVar

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event as sa_event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from hongbao.errors import (
    ConfigurationError,
    IdempotencyConflict,
    InsufficientBalance,
    StorageError,
)
from hongbao.ledger.schema import claims, entries, packets, shares, wallets

T = TypeVar("T")
ASYNC_DRIVERS = {
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "mysql": "mysql+aiomysql",
    "mariadb": "mysql+aiomysql",
    "sqlite": "sqlite+aiosqlite",
}
CHUNK = 500  # rows per IN (...) list or executemany slice


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


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def to_db(moment: datetime) -> datetime:
    """Databases keep naive UTC."""
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def from_db(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PacketRecord:
    id: str
    sender_id: str
    total_amount: int
    count: int
    mode: str
    greeting: str
    status: str
    created_at: datetime
    expires_at: datetime
    claimed_count: int = 0
    claimed_amount: int = 0
    refunded_amount: int = 0
    closed_at: datetime | None = None
    request_hash: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimEvent:
    packet_id: str
    share_idx: int
    user_id: str
    amount: int
    claimed_at: datetime


@dataclass(frozen=True, slots=True)
class RefundEvent:
    packet_id: str
    sender_id: str
    amount: int
    shares_left: int
    closed_at: datetime


@dataclass(frozen=True, slots=True)
class ClaimRow:
    user_id: str
    share_idx: int
    amount: int
    claimed_at: datetime


LedgerEvent = ClaimEvent | RefundEvent
_PACKET_COLUMNS = [
    packets.c.id,
    packets.c.sender_id,
    packets.c.total_amount,
    packets.c.count,
    packets.c.mode,
    packets.c.greeting,
    packets.c.status,
    packets.c.created_at,
    packets.c.expires_at,
    packets.c.claimed_count,
    packets.c.claimed_amount,
    packets.c.refunded_amount,
    packets.c.closed_at,
    packets.c.request_hash,
]


def _packet(row: Any) -> PacketRecord:
    m = row._mapping
    return PacketRecord(
        id=m["id"],
        sender_id=m["sender_id"],
        total_amount=int(m["total_amount"]),
        count=int(m["count"]),
        mode=m["mode"],
        greeting=m["greeting"],
        status=m["status"],
        created_at=from_db(m["created_at"]),
        expires_at=from_db(m["expires_at"]),
        claimed_count=int(m["claimed_count"]),
        claimed_amount=int(m["claimed_amount"]),
        refunded_amount=int(m["refunded_amount"]),
        closed_at=from_db(m["closed_at"]) if m["closed_at"] else None,
        request_hash=m["request_hash"],
    )


def _chunks(items: Sequence[T], size: int = CHUNK) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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

    @classmethod
    def from_url(cls, url: str, pool_size: int = 10) -> SqlLedger:
        full = database_url(url)
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if full.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 30}
        else:
            kwargs.update(pool_size=pool_size, max_overflow=pool_size)
        if full.startswith("mysql"):
            kwargs["isolation_level"] = "READ COMMITTED"
        engine = create_async_engine(full, **kwargs)
        if engine.dialect.name == "sqlite":
            _tune_sqlite(engine)
        return cls(engine)

    async def aclose(self) -> None:
        await self.engine.dispose()

    async def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision."""
        cfg = Config(str(files("hongbao.ledger").joinpath("alembic.ini")))
        cfg.set_main_option("script_location", str(files("hongbao.ledger").joinpath("migrations")))

        def upgrade(connection: sa.Connection) -> None:
            cfg.attributes["connection"] = connection
            command.upgrade(cfg, "head")

        async with self.engine.begin() as conn:
            await conn.run_sync(upgrade)

    async def ping(self) -> bool:
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
            return True
        except (DBAPIError, OSError):
            return False

    # -- wallets ---------------------------------------------------------------

    async def deposit(self, user_id: str, amount: int, reference: str) -> int:
        """Credit a wallet once per (user, reference); returns the balance after.

        The same reference with another amount is an IdempotencyConflict.
        """

        async def work(conn: AsyncConnection) -> int:
            ref = f"deposit:{user_id}:{reference}"
            seen = await conn.scalar(sa.select(entries.c.amount).where(entries.c.reference == ref))
            if seen is not None and int(seen) != amount:
                raise IdempotencyConflict(
                    "this deposit reference was used before with a different amount"
                )
            if seen is None:
                await self._ensure_wallets(conn, [user_id])
                await self._credit(conn, {user_id: amount})
                await conn.execute(entries.insert(), [_entry(ref, user_id, "deposit", amount)])
            return int(await conn.scalar(_balance_query(user_id)) or 0)

        return await self._transaction(work)

    async def balance(self, user_id: str) -> int:
        async with self._connect() as conn:
            return int(await conn.scalar(_balance_query(user_id)) or 0)

    # -- packets ---------------------------------------------------------------

    async def create_packet(
        self, record: PacketRecord, amounts: Sequence[int], idempotency_key: str | None
    ) -> tuple[PacketRecord, bool]:
        """Debit the sender and write the packet and its shares, in one transaction.

        With an idempotency key already used by this sender, nothing changes and the
        earlier packet is returned (created=False), unless the request differs.
        """

        async def work(conn: AsyncConnection) -> tuple[PacketRecord, bool]:
            if idempotency_key is not None:
                earlier = await conn.execute(
                    sa.select(*_PACKET_COLUMNS).where(
                        packets.c.sender_id == record.sender_id,
                        packets.c.idempotency_key == idempotency_key,
                    )
                )
                row = earlier.first()
                if row is not None:
                    found = _packet(row)
                    if found.request_hash != record.request_hash:
                        raise IdempotencyConflict(
                            "this Idempotency-Key was used before with a different request"
                        )
                    return found, False
            debited = await conn.execute(
                wallets.update()
                .where(
                    wallets.c.user_id == record.sender_id,
                    wallets.c.balance >= record.total_amount,
                )
                .values(balance=wallets.c.balance - record.total_amount, updated_at=utcnow())
            )
            if debited.rowcount != 1:
                raise InsufficientBalance(
                    f"wallet of {record.sender_id} holds less than {record.total_amount} fen"
                )
            await conn.execute(
                entries.insert(),
                [
                    _entry(
                        f"send:{record.id}",
                        record.sender_id,
                        "send",
                        -record.total_amount,
                        record.id,
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
            for chunk in _chunks(rows, 2000):
                await conn.execute(shares.insert(), list(chunk))
            return record, True

        return await self._transaction(work)

    async def get_packet(self, packet_id: str) -> PacketRecord | None:
        async with self._connect() as conn:
            row = (
                await conn.execute(sa.select(*_PACKET_COLUMNS).where(packets.c.id == packet_id))
            ).first()
        return _packet(row) if row is not None else None

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
        query = sa.select(*_PACKET_COLUMNS).where(
            packets.c.status == "active", packets.c.id > after_id
        )
        if due_before is not None:
            query = query.where(packets.c.expires_at <= to_db(due_before))
        async with self._connect() as conn:
            rows = await conn.execute(query.order_by(packets.c.id).limit(limit))
            return [_packet(r) for r in rows]

    # -- applying grab and refund events ------------------------------------------

    async def apply(self, events: Sequence[LedgerEvent]) -> list[str | None]:
        """Apply claims and refunds in one transaction.

        Returns, per event, None (applied now, or applied before: replays are
        harmless) or the reason it cannot ever be applied (the caller dead-letters it).
        """
        return await self._transaction(lambda conn: _Batch(conn, self).run(events))

    # -- audit ---------------------------------------------------------------------

    async def audit(self) -> list[str]:
        """Invariants of the ledger; every returned line names a violation."""
        problems: list[str] = []
        async with self._connect() as conn:
            claim_sums = (
                sa.select(
                    claims.c.packet_id,
                    sa.func.count().label("n"),
                    sa.func.sum(claims.c.amount).label("amount"),
                )
                .group_by(claims.c.packet_id)
                .subquery()
            )
            rows = await conn.execute(
                sa.select(
                    packets.c.id,
                    packets.c.total_amount,
                    packets.c.count,
                    packets.c.status,
                    packets.c.claimed_count,
                    packets.c.claimed_amount,
                    packets.c.refunded_amount,
                    packets.c.closed_at,
                    claim_sums.c.n,
                    claim_sums.c.amount,
                ).outerjoin(claim_sums, claim_sums.c.packet_id == packets.c.id)
            )
            held = 0
            for pid, total, count, status, n_c, a_c, refunded, closed, n_real, a_real in rows:
                n_real, a_real = int(n_real or 0), int(a_real or 0)
                if (n_c, a_c) != (n_real, a_real):
                    problems.append(
                        f"packet {pid}: counters say {n_c} claims / {a_c} fen, "
                        f"claims table has {n_real} / {a_real}"
                    )
                if a_real + refunded > total:
                    problems.append(f"packet {pid}: claimed + refunded exceeds total {total}")
                if closed is not None and a_real + refunded != total:
                    problems.append(
                        f"packet {pid}: closed but claimed {a_real} + refunded {refunded} "
                        f"!= total {total}"
                    )
                if status == "exhausted" and n_real != count:
                    problems.append(f"packet {pid}: exhausted with {n_real} of {count} claims")
                if closed is None:
                    held += total - a_real - refunded
            negative = await conn.execute(sa.select(wallets.c.user_id).where(wallets.c.balance < 0))
            problems.extend(f"wallet {u}: negative balance" for (u,) in negative)
            mismatched = await conn.execute(
                sa.select(wallets.c.user_id, wallets.c.balance, sa.func.sum(entries.c.amount))
                .select_from(wallets.outerjoin(entries, entries.c.user_id == wallets.c.user_id))
                .group_by(wallets.c.user_id, wallets.c.balance)
                .having(wallets.c.balance != sa.func.coalesce(sa.func.sum(entries.c.amount), 0))
            )
            problems.extend(
                f"wallet {u}: balance {b} != sum of its ledger entries {s}"
                for u, b, s in mismatched
            )
            wallet_total = int(await conn.scalar(sa.select(sa.func.sum(wallets.c.balance))) or 0)
            deposits = int(
                await conn.scalar(
                    sa.select(sa.func.sum(entries.c.amount)).where(entries.c.kind == "deposit")
                )
                or 0
            )
        if wallet_total + held != deposits:
            problems.append(
                f"money: wallets {wallet_total} + held in open packets {held} "
                f"!= deposits {deposits}"
            )
        return problems

    # -- plumbing --------------------------------------------------------------------

    def _connect(self) -> Any:
        return _Guard(self.engine)

    async def _transaction(
        self, work: Callable[[AsyncConnection], Awaitable[T]], attempts: int = 8
    ) -> T:
        for attempt in range(attempts):
            try:
                async with self.engine.begin() as conn:
                    return await work(conn)
            except DBAPIError as exc:
                if attempt + 1 < attempts and _retryable(exc):
                    await asyncio.sleep(random.uniform(0, 0.01 * 2**attempt))
                    continue
                if isinstance(exc, IntegrityError):
                    raise
                raise StorageError(f"database: {exc.orig}") from exc
            except OSError as exc:
                raise StorageError(f"database unreachable: {exc}") from exc
        raise AssertionError("unreachable")

    async def _ensure_wallets(self, conn: AsyncConnection, users: Iterable[str]) -> None:
        wanted = sorted(set(users))
        have: set[str] = set()
        for chunk in _chunks(wanted):
            have.update(
                await conn.scalars(sa.select(wallets.c.user_id).where(wallets.c.user_id.in_(chunk)))
            )
        missing = [u for u in wanted if u not in have]
        if missing:
            now = utcnow()
            await conn.execute(
                wallets.insert(), [{"user_id": u, "balance": 0, "updated_at": now} for u in missing]
            )

    async def _credit(self, conn: AsyncConnection, amounts: dict[str, int]) -> None:
        now = utcnow()
        await conn.execute(
            wallets.update()
            .where(wallets.c.user_id == sa.bindparam("u"))
            .values(balance=wallets.c.balance + sa.bindparam("d"), updated_at=now),
            [{"u": u, "d": d} for u, d in sorted(amounts.items())],
        )


class _Guard:
    """`async with` a connection, turning driver failures into StorageError."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._cm = engine.connect()

    async def __aenter__(self) -> AsyncConnection:
        try:
            return await self._cm.__aenter__()
        except (DBAPIError, OSError) as exc:
            raise StorageError(f"database unreachable: {exc}") from exc

    async def __aexit__(self, *exc: Any) -> None:
        try:
            await self._cm.__aexit__(*exc)
        except (DBAPIError, OSError) as err:
            raise StorageError(f"database: {err}") from err


def _balance_query(user_id: str) -> sa.Select[tuple[int]]:
    return sa.select(wallets.c.balance).where(wallets.c.user_id == user_id)


def _entry(
    reference: str, user_id: str, kind: str, amount: int, packet_id: str | None = None
) -> dict[str, Any]:
    return {
        "reference": reference,
        "user_id": user_id,
        "kind": kind,
        "amount": amount,
        "packet_id": packet_id,
        "created_at": utcnow(),
    }


class _Batch:
    """One persister batch inside one transaction."""

    def __init__(self, conn: AsyncConnection, ledger: SqlLedger) -> None:
        self.conn = conn
        self.ledger = ledger

    async def run(self, events: Sequence[LedgerEvent]) -> list[str | None]:
        outcome: list[str | None] = [None] * len(events)
        packet_ids = sorted({e.packet_id for e in events})
        found = await self._lock_packets(packet_ids)
        by_packet: dict[str, list[int]] = defaultdict(list)
        for pos, ev in enumerate(events):
            if ev.packet_id not in found:
                outcome[pos] = f"packet {ev.packet_id} is not in the ledger"
            else:
                by_packet[ev.packet_id].append(pos)
        new_claims: list[ClaimEvent] = []
        for pid, positions in by_packet.items():
            items = [(p, e) for p in positions if isinstance(e := events[p], ClaimEvent)]
            accepted, rejected = await self._check_claims(pid, items)
            new_claims.extend(accepted)
            for pos, reason in rejected:
                outcome[pos] = reason
        await self._write_claims(new_claims, found)
        for pos, ev in enumerate(events):
            if isinstance(ev, RefundEvent) and outcome[pos] is None:
                outcome[pos] = await self._refund(ev, found[ev.packet_id])
        return outcome

    async def _lock_packets(self, ids: list[str]) -> dict[str, PacketRecord]:
        found: dict[str, PacketRecord] = {}
        for chunk in _chunks(ids):
            query = (
                sa.select(*_PACKET_COLUMNS)
                .where(packets.c.id.in_(chunk))
                .order_by(packets.c.id)
                .with_for_update()
            )
            found.update((r.id, _packet(r)) for r in await self.conn.execute(query))
        return found

    async def _check_claims(
        self, packet_id: str, claims_in: list[tuple[int, ClaimEvent]]
    ) -> tuple[list[ClaimEvent], list[tuple[int, str]]]:
        """Split a packet's claim events into new ones and ones that can never apply.

        Replays (the same user and share again) are in neither list.
        """
        if not claims_in:
            return [], []
        idxs = sorted({e.share_idx for _, e in claims_in})
        users = sorted({e.user_id for _, e in claims_in})
        amounts: dict[int, int] = {}
        by_idx: dict[int, str] = {}
        by_user: dict[str, int] = {}
        for chunk in _chunks(idxs):
            rows = await self.conn.execute(
                sa.select(shares.c.idx, shares.c.amount).where(
                    shares.c.packet_id == packet_id, shares.c.idx.in_(chunk)
                )
            )
            amounts.update((int(i), int(a)) for i, a in rows)
        lookups: list[tuple[Any, Sequence[Any]]] = [
            (claims.c.share_idx, idxs),
            (claims.c.user_id, users),
        ]
        for column, values in lookups:
            for chunk in _chunks(values):
                rows = await self.conn.execute(
                    sa.select(claims.c.share_idx, claims.c.user_id).where(
                        claims.c.packet_id == packet_id, column.in_(chunk)
                    )
                )
                for i, u in rows:
                    by_idx[int(i)] = u
                    by_user[u] = int(i)
        accepted: list[ClaimEvent] = []
        rejected: list[tuple[int, str]] = []
        for pos, ev in claims_in:
            if by_idx.get(ev.share_idx) == ev.user_id:
                continue  # applied before: a replay
            if ev.share_idx not in amounts:
                rejected.append((pos, f"packet {packet_id} has no share {ev.share_idx}"))
            elif amounts[ev.share_idx] != ev.amount:
                rejected.append(
                    (
                        pos,
                        f"share {ev.share_idx} of {packet_id} is "
                        f"{amounts[ev.share_idx]} fen, event says {ev.amount}",
                    )
                )
            elif ev.share_idx in by_idx:
                rejected.append(
                    (
                        pos,
                        f"share {ev.share_idx} of {packet_id} was claimed by "
                        f"{by_idx[ev.share_idx]}",
                    )
                )
            elif ev.user_id in by_user:
                rejected.append(
                    (
                        pos,
                        f"{ev.user_id} already claimed share {by_user[ev.user_id]} of {packet_id}",
                    )
                )
            else:
                by_idx[ev.share_idx] = ev.user_id
                by_user[ev.user_id] = ev.share_idx
                accepted.append(ev)
        return accepted, rejected

    async def _write_claims(self, new: list[ClaimEvent], found: dict[str, PacketRecord]) -> None:
        if not new:
            return
        await self.conn.execute(
            claims.insert(),
            [
                {
                    "packet_id": e.packet_id,
                    "share_idx": e.share_idx,
                    "user_id": e.user_id,
                    "amount": e.amount,
                    "claimed_at": to_db(e.claimed_at),
                }
                for e in new
            ],
        )
        await self.conn.execute(
            entries.insert(),
            [
                _entry(
                    f"claim:{e.packet_id}:{e.share_idx}", e.user_id, "claim", e.amount, e.packet_id
                )
                for e in new
            ],
        )
        credits: dict[str, int] = defaultdict(int)
        per_packet: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for e in new:
            credits[e.user_id] += e.amount
            per_packet[e.packet_id][0] += 1
            per_packet[e.packet_id][1] += e.amount
        await self.ledger._ensure_wallets(self.conn, credits)
        await self.ledger._credit(self.conn, credits)
        for pid, (n, amount) in sorted(per_packet.items()):
            record = found[pid]
            n_after = record.claimed_count + n
            status = "exhausted" if n_after == record.count else record.status
            await self.conn.execute(
                packets.update()
                .where(packets.c.id == pid)
                .values(
                    claimed_count=packets.c.claimed_count + n,
                    claimed_amount=packets.c.claimed_amount + amount,
                    status=status,
                )
            )
            found[pid] = replace(
                record,
                claimed_count=n_after,
                claimed_amount=record.claimed_amount + amount,
                status=status,
            )

    async def _refund(self, ev: RefundEvent, record: PacketRecord) -> str | None:
        if record.closed_at is not None:
            return None  # refunded before
        if ev.sender_id != record.sender_id:
            return f"refund of {ev.packet_id} names sender {ev.sender_id}, not {record.sender_id}"
        if record.claimed_amount + ev.amount > record.total_amount:
            return (
                f"refund of {ev.amount} fen for {ev.packet_id} would exceed its total "
                f"({record.claimed_amount} claimed of {record.total_amount})"
            )
        status = "exhausted" if ev.amount == 0 else "expired"
        await self.conn.execute(
            packets.update()
            .where(packets.c.id == ev.packet_id)
            .values(refunded_amount=ev.amount, closed_at=to_db(ev.closed_at), status=status)
        )
        if ev.amount:
            await self.ledger._ensure_wallets(self.conn, [ev.sender_id])
            await self.ledger._credit(self.conn, {ev.sender_id: ev.amount})
            await self.conn.execute(
                entries.insert(),
                [_entry(f"refund:{ev.packet_id}", ev.sender_id, "refund", ev.amount, ev.packet_id)],
            )
        return None


def _tune_sqlite(engine: AsyncEngine) -> None:
    """WAL, foreign keys, and BEGIN IMMEDIATE so writers queue instead of failing."""

    @sa_event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        for pragma in (
            "journal_mode=WAL",
            "synchronous=NORMAL",
            "foreign_keys=ON",
            "busy_timeout=30000",
        ):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @sa_event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


__all__ = [
    "ClaimEvent",
    "ClaimRow",
    "LedgerEvent",
    "PacketRecord",
    "RefundEvent",
    "SqlLedger",
    "database_url",
]

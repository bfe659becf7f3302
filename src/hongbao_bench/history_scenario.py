"""``history``: how fast a page of the red-packet record and of a wallet's entries is read.

A ledger with many claims (1,000,000 on PostgreSQL at the full size) is written straight
into the tables (COPY on PostgreSQL, multi-row INSERTs elsewhere) in a private database
of each server (PostgreSQL from ``--postgres-url``, MariaDB from ``--mysql-url``, and a
SQLite file); the best-luck indexer catches up and the tables are analysed, as in a
deployment that has run for a while. Then `hongbao.history.History` reads, in-process,
every page of this year's record of one user who grabbed 10,000 packets (received) and
sent some (sent), and of that user's wallet (entries), 50 rows a page, several times
over. Each row of the report is one endpoint on one database, with p50 and p99 of a page.
Target: p99 under 20 ms on PostgreSQL.

The ledger is consistent: packets of 10 shares spread from the start of this UTC year to
now (every 20th expired with 3 shares left and refunded, every 7th an equal split, those
of the last day still open with half their shares taken), each claim with its entry, each
send preceded by its deposit, and every wallet the sum of its entries.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from hongbao.domain.ids import new_packet_id
from hongbao.history import BestLuckIndexer, History
from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import claims, entries, packets, shares, wallets
from hongbao.runtime import settle_heap
from hongbao_bench.common import BenchContext, Outcome, admin_statement

#: the user whose record is read
ME = "bench-me"
SHARES = 10
PAGE = 50
#: p99 of a page on PostgreSQL, milliseconds (a target of the report: `history_target`)
TARGET_P99_MS = 20.0
#: packets written per batch (a batch's rows are made, written, then dropped)
BATCH = 5_000
#: senders other than ME
SENDERS = 1_000


@dataclass(frozen=True)
class Size:
    #: claims in the ledger (about: expired packets hold 7)
    claims: int
    #: packets ME grabbed
    received: int
    #: packets ME sent
    sent: int
    #: timed walks over every page, per endpoint
    walks: int


#: per profile: PostgreSQL's ledger; MariaDB and SQLite get at most `OTHER_CLAIMS`
SIZES = {
    "tiny": Size(claims=20_000, received=1_000, sent=200, walks=2),
    "quick": Size(claims=200_000, received=10_000, sent=1_000, walks=2),
    "full": Size(claims=1_000_000, received=10_000, sent=2_000, walks=3),
}
OTHER_CLAIMS = 200_000


async def history_scenario(ctx: BenchContext) -> list[Outcome]:
    size = SIZES.get(ctx.profile.name, SIZES["full"])
    out: list[Outcome] = []
    servers = [("postgresql", ctx.postgres_url), ("mariadb", ctx.mysql_url), ("sqlite", None)]
    for name, admin_url in servers:
        here = size if name == "postgresql" else _smaller(size)
        if name != "sqlite" and not admin_url:
            out.append(Outcome(f"history@{name}", "history", "skipped", note=f"no {name} URL"))
            continue
        try:
            out.extend(await _run_on(ctx, name, admin_url, here))
        except _Unreachable as exc:
            out.append(Outcome(f"history@{name}", "history", "skipped", note=str(exc)[:300]))
        except Exception as exc:
            note = f"{type(exc).__name__}: {exc}"[:300]
            out.append(Outcome(f"history@{name}", "history", "error", note=note))
    return out


class _Unreachable(Exception):
    """The database server did not let the bench make its private database."""


def _smaller(size: Size) -> Size:
    claims_n = min(size.claims, OTHER_CLAIMS)
    return Size(claims_n, min(size.received, claims_n // 20), size.sent, size.walks)


async def _run_on(ctx: BenchContext, name: str, admin_url: str | None, size: Size) -> list[Outcome]:
    private = f"hb_bench_history_{uuid.uuid4().hex[:10]}"
    if admin_url is None:
        url = f"sqlite+aiosqlite:///{ctx.work_dir / (private + '.sqlite3')}"
    else:
        url = make_url(admin_url).set(database=private).render_as_string(hide_password=False)
        try:
            await admin_statement(admin_url, f"CREATE DATABASE {private}")
        except (OSError, sa.exc.SQLAlchemyError) as exc:
            raise _Unreachable(f"unreachable: {exc}") from exc
    ledger = SqlLedger.from_url(url)
    try:
        await ledger.migrate()
        ctx.say(f"{name}: writing a ledger of ~{size.claims:,} claims")
        year_start = datetime(datetime.now(UTC).year, 1, 1)
        started = time.perf_counter()
        written = await _fill(ledger, url, size, year_start)
        load_seconds = time.perf_counter() - started
        await _analyze(ledger, url)
        ctx.say(f"{name}: indexing best luck")
        started = time.perf_counter()
        indexed = await BestLuckIndexer(ledger, batch=5_000).catch_up()
        index_seconds = time.perf_counter() - started
        await _analyze(ledger, url)
        ctx.say(f"{name}: reading pages")
        settle_heap()  # the rows made above are garbage: no collection while timing
        history = History(ledger)
        year = year_start.year
        walks: dict[str, Callable[..., Awaitable[Any]]] = {
            "received": lambda **kw: history.received(ME, year, **kw),
            "sent": lambda **kw: history.sent(ME, year, **kw),
            "entries": lambda **kw: history.entries(ME, **kw),
        }
        outcomes = []
        for endpoint, read in walks.items():
            await _walk(read)  # warm: the first walk reads the pages into the cache
            samples: list[float] = []
            rows = 0
            for _ in range(size.walks):
                rows = await _walk(read, samples)
            p50, p99 = _quantile(samples, 0.50), _quantile(samples, 0.99)
            figures = {
                "database": name,
                "endpoint": endpoint,
                "p50_ms": round(p50, 2),
                "p99_ms": round(p99, 2),
                "max_ms": round(max(samples), 2),
                "pages": len(samples),
                "rows_of_user": rows,
                "page_rows": PAGE,
                **written,
                "load_seconds": round(load_seconds, 1),
                "best_luck_indexed": indexed,
                "index_seconds": round(index_seconds, 1),
            }
            note = (
                f"{len(samples)} pages of {PAGE} ({rows:,} rows of {ME}); ledger of "
                f"{written['claims']:,} claims, {written['entries']:,} entries"
            )
            outcomes.append(
                Outcome(f"history-{endpoint}@{name}", "history", "ok", None, note, figures)
            )
        return outcomes
    finally:
        await ledger.aclose()
        if admin_url is not None:
            drop = f"DROP DATABASE {private}" + (" WITH (FORCE)" if name == "postgresql" else "")
            await admin_statement(admin_url, drop)


def history_target(outcomes: Sequence[Outcome]) -> tuple[float | None, str]:
    """The slowest endpoint's p99 on PostgreSQL, and its name (None: not measured)."""
    rows = [
        o for o in outcomes if o.group == "history" and o.figures.get("database") == "postgresql"
    ]
    worst = max(rows, key=lambda o: float(o.figures["p99_ms"]), default=None)
    if worst is None:
        return None, ""
    return float(worst.figures["p99_ms"]), str(worst.figures["endpoint"])


async def _walk(read: Callable[..., Awaitable[Any]], samples: list[float] | None = None) -> int:
    """Read every page, newest first; the rows seen. Each page's time goes to `samples`."""
    after, rows = None, 0
    clock = time.perf_counter
    while True:
        began = clock()
        page = await read(after=after, limit=PAGE)
        if samples is not None:
            samples.append((clock() - began) * 1000)
        rows += len(page.items)
        if page.next_after is None:
            return rows
        after = page.next_after


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- the ledger ---------------------------------------------------------------------------------


@dataclass
class _Rows:
    packets: list[tuple[Any, ...]]
    shares: list[tuple[Any, ...]]
    claims: list[tuple[Any, ...]]
    entries: list[tuple[Any, ...]]


PACKET_COLUMNS = [
    "id",
    "sender_id",
    "total_amount",
    "count",
    "mode",
    "greeting",
    "status",
    "created_at",
    "expires_at",
    "claimed_count",
    "claimed_amount",
    "refunded_amount",
    "closed_at",
]
SHARE_COLUMNS = ["packet_id", "idx", "amount"]
CLAIM_COLUMNS = ["packet_id", "share_idx", "user_id", "amount", "claimed_at"]
ENTRY_COLUMNS = ["reference", "user_id", "kind", "amount", "packet_id", "created_at", "deposit_key"]


def _batches(size: Size, balances: dict[str, int], start: datetime) -> Iterator[_Rows]:
    """The ledger's rows from `start` to now, `BATCH` packets at a time; `balances` gets
    every wallet's."""
    rng = random.Random(2026)
    n_packets = max(size.received, size.claims // SHARES)
    grabbers = max(1_000, size.claims // 10)
    sent_every = max(1, n_packets // size.sent)
    received_every = max(1, n_packets // size.received)
    end = datetime.now(UTC).replace(tzinfo=None) - timedelta(minutes=1)
    step = (end - start) / n_packets
    open_after = end - timedelta(days=1)
    received = 0
    rows = _Rows([], [], [], [])
    for i in range(n_packets):
        created = start + i * step
        packet_id = new_packet_id(int((created - datetime(1970, 1, 1)).total_seconds() * 1000))
        sender = ME if i % sent_every == 0 else f"s{i % SENDERS}"
        equal = i % 7 == 3
        amounts = [100] * SHARES if equal else [rng.randint(1, 300) for _ in range(SHARES)]
        total = sum(amounts)
        still_open = created > open_after
        expired = i % 20 == 19 and not still_open
        taken = SHARES // 2 if still_open else SHARES - 3 if expired else SHARES
        claimed = sum(amounts[:taken])
        refund = 0 if still_open else total - claimed
        closed = created + timedelta(days=1)
        status = "active" if still_open else "expired" if expired else "exhausted"
        rows.packets.append(
            (
                packet_id,
                sender,
                total,
                SHARES,
                "equal" if equal else "lucky",
                "恭喜发财",
                status,
                created,
                created + timedelta(days=1),
                taken,
                claimed,
                refund,
                closed if expired else None,
            )
        )
        rows.shares.extend((packet_id, j, a) for j, a in enumerate(amounts))
        mine = i % received_every == 0 and received < size.received
        received += mine
        rows.entries.append(
            (f"deposit:bench:{i}", sender, "deposit", total, None, created, f"bench-{i}")
        )
        rows.entries.append((f"send:{packet_id}", sender, "send", -total, packet_id, created, None))
        for j in range(taken):
            user = ME if mine and j == 0 else f"g{(i * SHARES + j) % grabbers}"
            at = created + timedelta(seconds=j + 1)
            rows.claims.append((packet_id, j, user, amounts[j], at))
            rows.entries.append(
                (f"claim:{packet_id}:{j}", user, "claim", amounts[j], packet_id, at, None)
            )
            balances[user] += amounts[j]
        if refund:
            rows.entries.append(
                (f"refund:{packet_id}", sender, "refund", refund, packet_id, closed, None)
            )
            balances[sender] += refund
        balances[sender] += 0  # a wallet even when nothing came back
        if len(rows.packets) >= BATCH:
            yield rows
            rows = _Rows([], [], [], [])
    if rows.packets:
        yield rows


async def _fill(ledger: SqlLedger, url: str, size: Size, start: datetime) -> dict[str, int]:
    """Write the ledger from `start` to now; how many rows of each table."""
    balances: dict[str, int] = defaultdict(int)
    counts = {"packets": 0, "claims": 0, "entries": 0, "wallets": 0}
    postgres = ledger.dialect == "postgresql"
    copy = await _copier(url) if postgres else None
    try:
        for rows in _batches(size, balances, start):
            tables = [
                (packets, PACKET_COLUMNS, rows.packets),
                (shares, SHARE_COLUMNS, rows.shares),
                (claims, CLAIM_COLUMNS, rows.claims),
                (entries, ENTRY_COLUMNS, rows.entries),
            ]
            await _write(ledger, copy, tables)
            counts["packets"] += len(rows.packets)
            counts["claims"] += len(rows.claims)
            counts["entries"] += len(rows.entries)
        now = datetime.now(UTC).replace(tzinfo=None)
        wallet_rows = [(user, balance, now) for user, balance in sorted(balances.items())]
        counts["wallets"] = len(wallet_rows)
        await _write(ledger, copy, [(wallets, ["user_id", "balance", "updated_at"], wallet_rows)])
    finally:
        if copy is not None:
            await copy.close()
    return counts


async def _analyze(ledger: SqlLedger, url: str) -> None:
    """Fresh statistics for the planner, and on PostgreSQL the visibility map that lets an
    index-only scan skip the table (autovacuum keeps it in a deployment)."""
    if ledger.dialect == "postgresql":
        copy = await _copier(url)
        try:
            await copy.execute("VACUUM ANALYZE")
        finally:
            await copy.close()
        return
    async with ledger.engine.begin() as conn:
        if ledger.dialect == "mysql":
            names = "hb_packets, hb_shares, hb_claims, hb_ledger_entries, hb_wallets, hb_best_luck"
            await conn.execute(sa.text(f"ANALYZE TABLE {names}"))
        else:
            await conn.execute(sa.text("ANALYZE"))


async def _copier(url: str) -> Any:
    """An asyncpg connection of its own for COPY (the fastest way to fill PostgreSQL)."""
    import asyncpg  # type: ignore[import-untyped]

    parts = make_url(url)
    return await asyncpg.connect(
        host=parts.host,
        port=parts.port or 5432,
        user=parts.username,
        password=parts.password,
        database=parts.database,
    )


async def _write(
    ledger: SqlLedger, copy: Any, tables: list[tuple[sa.Table, list[str], list[tuple[Any, ...]]]]
) -> None:
    if copy is not None:
        async with copy.transaction():
            for table, columns, rows in tables:
                await copy.copy_records_to_table(table.name, records=rows, columns=columns)
        return
    async with ledger.engine.begin() as conn:
        for table, columns, rows in tables:
            for start in range(0, len(rows), 2_000):
                chunk = rows[start : start + 2_000]
                await conn.execute(
                    table.insert(), [dict(zip(columns, r, strict=True)) for r in chunk]
                )

"""``settle``: how fast the persister settles claims into the ledger, and whether it keeps
pace with a storm of grabs over HTTP.

**Drain rows** (``settle-drain@postgresql``, ``@mariadb``, ``@sqlite``, and
``settle-drain-2@postgresql`` with two persisters). In a private database of each server
(PostgreSQL from ``--postgres-url``, MariaDB from ``--mysql-url``, a SQLite file) and a
Redis database of the scenario's own (`own_database`), 20 packets are sent and grabbed
`Profile.settle_claims` times by the engine's coalesced grab path while no persister
runs. Then one or two persister processes (`hongbao_bench.settle_worker`: the shipped
`Persister` with its default batch) start together and apply until the streams are
empty. claims/s = claims / the wall time from the first persister's start to the last
batch applied. Beside it, CPU microseconds per claim: the persister processes' own
(SQLite runs inside them), the database server's (PostgreSQL: the backends serving the
bench's database, from /proc; MariaDB: the whole mariadbd process, its other clients
included, since it has no per-connection CPU without performance_schema) and Redis's
(``INFO cpu``). The CPU figures move much less than the rates on a shared machine.

**Storm rows** (``settle-storm@embedded``, ``settle-storm@postgresql``). `hongbao serve
--workers 2` is loaded by ``wrk`` (64 connections, as fast as it answers) for
`Profile.settle_storm_seconds`, with the persister running as deployed: in serve's
supervising process on the embedded default (embedded Valkey and SQLite in a data folder
of the scenario's own), or as one `hongbao worker` beside ``serve --no-persister`` on
PostgreSQL + Redis. Every user grabs every packet once, the packets one after the other,
so every grab is a claim. Every `SAMPLE_SECONDS` the bench reads the claims the ledger
gained since its last read (``hb_claims`` by id, from the lowest id not seen yet and at
most `LOOKBACK_IDS` back: a persister's lanes commit out of id order) and the claims
granted so far (``HLEN`` of the packets' claims hashes in Redis).

*Grab-to-credit lag*, per claim: the start of the read that first saw its row, minus its
``claimed_at`` (the Redis server's clock when the grab script ran; the API answers within
a millisecond or two of it). A claim's row, its ledger entry and its wallet credit commit
in one transaction, so a visible row is a credited wallet. The row committed after the
previous read began, so the figure errs high by at most `SAMPLE_SECONDS`, never low.
*Backlog*: claims granted but not yet in the ledger (the ledger is read before Redis, so
it errs high), at its largest, in claims and in seconds of grabs at the storm's average
rate. The columns p50/p99 of a storm row are its lag.

Targets (`settle_targets`): one persister settles at least `DRAIN_TARGETS` claims/s; in
both storms the backlog stays within `STORM_MAX_BACKLOG_S` seconds of grabs and p99 lag
within `STORM_MAX_LAG_P99_S`.

Every row audits its money afterwards: `hongbao.audit.audit` (the ledger's invariants:
counters, wallets and totals add up, no share or user claimed twice) and, per packet, the
claims and fen in the ledger against those Redis granted: every claim settled once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import secrets
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from hongbao.audit import audit
from hongbao.keys import dead_letter_key, events_key
from hongbao.ledger import database_url
from hongbao.ledger.schema import claims
from hongbao.persister import SERVER_BATCH_FACTOR
from hongbao.service import Hongbao
from hongbao.serving.embedded import EmbeddedServer, ledger_url
from hongbao.settings import Settings
from hongbao_bench.cluster import admin_for
from hongbao_bench.common import (
    BenchContext,
    Outcome,
    admin_statement,
    forget_packets,
    free_port,
    send_packets,
)
from hongbao_bench.harness import engine_storm, percentile_ms, stop_process
from hongbao_bench.http_scenario import WRK_DONE, http_server, run_wrk
from hongbao_bench.meters import (
    CpuMeter,
    pids_named,
    process_cpu_seconds,
    tree_cpu_seconds,
)
from hongbao_bench.processes import expect_line, load_env, mint_tokens
from hongbao_bench.settle_worker import Job

#: packets of a drain row
DRAIN_PACKETS = 20
#: claims/s one persister settles, per database (targets)
DRAIN_TARGETS = {"postgresql": 40_000.0, "mariadb": 15_000.0, "sqlite": 40_000.0}
#: storm targets: the largest backlog in seconds of grabs, p99 lag in seconds
STORM_MAX_BACKLOG_S = 2.0
STORM_MAX_LAG_P99_S = 2.0
#: storm users (one token each); each grabs every packet once, so a packet has as many shares
STORM_USERS = 5_000
#: grabs/s a storm's packets are sized for (the grab endpoint has reached ~28,000)
STORM_RATE_CEILING = 35_000
STORM_CONNECTIONS = 64
#: how often the storm's lag and backlog are read, seconds
SAMPLE_SECONDS = 0.1
#: how far below the highest claim id seen a claim may still commit: each of a persister's
#: lanes holds one transaction in flight, of up to SERVER_BATCH_FACTOR batches when a
#: backlog fills them (the storms run the default settings); twice that, for a margin
LOOKBACK_IDS = 2 * Settings.persister_lanes * SERVER_BATCH_FACTOR * Settings.persister_batch
#: how long the ledger may take to catch up after a storm, seconds
CATCH_UP_TIMEOUT = 300.0
#: how long a persister process may take to start or drain, seconds
HTTP_WORKERS = 2

WRK_SCRIPT = r"""
-- hongbao bench settle: request k is user k mod U grabbing packet k div U (each user
-- grabs each packet once, the packets one after the other); args: tokens file, packets file
local tokens, paths, nt, np = {}, {}, 0, 0
local k = -1

function init(args)
  for line in io.lines(args[1]) do nt = nt + 1; tokens[nt] = "Bearer " .. line end
  for line in io.lines(args[2]) do np = np + 1; paths[np] = "/v1/packets/" .. line .. "/grab" end
  io.write("WRKREADY\n")
  io.flush()
end

function request()
  k = k + 1
  local packet = math.floor(k / nt) % np
  return wrk.format("POST", paths[packet + 1],
    {["Authorization"] = tokens[k % nt + 1], ["Content-Length"] = "0"})
end
"""


class _Unreachable(Exception):
    """The database server did not let the bench make its private database."""


async def settle_scenario(ctx: BenchContext) -> list[Outcome]:
    try:
        redis_url = own_database(ctx.redis_url)
    except ValueError as exc:
        return [Outcome("settle", "settle", "skipped", note=str(exc))]
    out: list[Outcome] = []
    drains = [
        ("postgresql", ctx.postgres_url, 1),
        ("postgresql", ctx.postgres_url, 2),
        ("mariadb", ctx.mysql_url, 1),
        ("sqlite", None, 1),
    ]
    for name, admin_url, persisters in drains:
        label = f"settle-drain{'' if persisters == 1 else f'-{persisters}'}@{name}"
        out.append(
            await _guarded(label, _drain_row(ctx, label, name, admin_url, redis_url, persisters))
        )
    if shutil.which("wrk") is None:
        for label in ("settle-storm@embedded", "settle-storm@postgresql"):
            out.append(Outcome(label, "settle", "skipped", note="wrk not found"))
        return out
    out.append(await _guarded("settle-storm@embedded", _storm_embedded(ctx)))
    out.append(await _guarded("settle-storm@postgresql", _storm_postgresql(ctx, redis_url)))
    return out


async def _guarded(label: str, row: Any) -> Outcome:
    """The row's outcome, or a skipped / error row naming why it has none."""
    try:
        outcome: Outcome = await row
        return outcome
    except _Unreachable as exc:
        return Outcome(label, "settle", "skipped", note=str(exc)[:300])
    except Exception as exc:
        return Outcome(label, "settle", "error", note=f"{type(exc).__name__}: {exc}"[:400])


def own_database(url: str) -> str:
    """The bench's Redis URL on the next database number (``redis://h:p/N``,
    ``unix:///path?db=N``): the other scenarios leave their grab events in the streams of
    the bench's database, which a persister on a private ledger would dead-letter."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = parse_qs(parts.query)
        db = int(query.get("db", ["0"])[0])
        query["db"] = [str((db + 1) % 16)]
        return f"{url.split('?', 1)[0]}?{urlencode(query, doseq=True)}"
    if parts.scheme in ("redis", "rediss"):
        path = parts.path.strip("/")
        db = int(path) if path.isdigit() else 0
        return urlunsplit(parts._replace(path=f"/{(db + 1) % 16}"))
    raise ValueError(f"needs a one-server Redis URL with database numbers, not {parts.scheme}://")


@contextlib.asynccontextmanager
async def _private_database(ctx: BenchContext, admin_url: str | None) -> AsyncIterator[str]:
    """A database of its own on the server of `admin_url`, dropped afterwards (None: a
    SQLite file)."""
    private = f"hb_bench_settle_{uuid.uuid4().hex[:10]}"
    if admin_url is None:
        yield f"sqlite+aiosqlite:///{ctx.work_dir / (private + '.sqlite3')}"
        return
    try:
        await admin_statement(admin_url, f"CREATE DATABASE {private}")
    except (OSError, sa.exc.SQLAlchemyError) as exc:
        raise _Unreachable(f"unreachable: {exc}") from exc
    try:
        yield make_url(admin_url).set(database=private).render_as_string(hide_password=False)
    finally:
        postgres = make_url(admin_url).get_backend_name() == "postgresql"
        await admin_statement(
            admin_url, f"DROP DATABASE {private}" + (" WITH (FORCE)" if postgres else "")
        )


async def _connect(ctx: BenchContext, redis_url: str, url: str, max_count: int) -> Hongbao:
    settings = replace(ctx.settings(max_count=max_count), redis_url=redis_url, database_url=url)
    return await Hongbao.connect(settings, migrate=True)


async def _clear_streams(service: Hongbao) -> None:
    """Empty the event and dead-letter streams of the scenario's Redis database."""
    store = service.store
    keys = [k for b in range(store.buckets) for k in (events_key(b), dead_letter_key(b))]
    await store.client.delete(*keys)


# -- the database server's CPU --------------------------------------------------------------------


@dataclass
class _DatabaseCpu:
    """CPU seconds the database server spends for the bench's database (see the module's
    docstring for what is counted on each server)."""

    name: str
    admin_url: str | None
    database: str
    #: backends left out: the bench's own reader
    exclude: set[int] = field(default_factory=set)
    start: dict[int, float] = field(default_factory=dict)

    @property
    def scope(self) -> str:
        return {
            "postgresql": "its backends for the bench's database",
            "mariadb": "the whole mariadbd process",
        }.get(self.name, "")

    async def _pids(self) -> list[int]:
        if self.name == "postgresql" and self.admin_url is not None:
            rows = await admin_statement(
                self.admin_url,
                f"SELECT pid FROM pg_stat_activity WHERE datname = '{self.database}'",
            )
            return [int(r[0]) for r in rows if int(r[0]) not in self.exclude]
        if self.name == "mariadb":
            return pids_named("mariadbd", "mysqld")
        return []

    async def begin(self) -> None:
        self.start = {pid: process_cpu_seconds(pid) for pid in await self._pids()}

    async def seconds(self) -> float | None:
        """CPU seconds since `begin` (None: not measurable here)."""
        pids = await self._pids()
        if not pids:
            return None
        return sum(process_cpu_seconds(pid) - self.start.get(pid, 0.0) for pid in pids)


def _us(seconds: float | None, count: int) -> float | None:
    return None if seconds is None or not count else round(seconds / count * 1e6, 2)


# -- drain rows --------------------------------------------------------------------------------


async def _drain_row(
    ctx: BenchContext,
    label: str,
    name: str,
    admin_url: str | None,
    redis_url: str,
    persisters: int,
) -> Outcome:
    if name != "sqlite" and not admin_url:
        raise _Unreachable(f"no {name} URL")
    per_packet = max(1, ctx.profile.settle_claims // DRAIN_PACKETS)
    async with _private_database(ctx, admin_url) as url:
        service = await _connect(ctx, redis_url, url, per_packet)
        try:
            await _clear_streams(service)
            shares = await send_packets(service, DRAIN_PACKETS, per_packet, random.Random(30))
            users = [f"d{k}" for k in range(1, DRAIN_PACKETS * per_packet + 1)]
            ctx.say(f"{label}: {len(users):,} grabs, no persister running")
            t0 = time.perf_counter()
            storm = await engine_storm(service, list(shares), users, 1, ctx.profile.hb_tasks)
            grab_seconds = time.perf_counter() - t0
            granted = sum(1 for won in storm.won if won is not None)
            entries = await service.store.backlog()
            ctx.say(f"{label}: {persisters} persister(s) draining {granted:,} claims")
            db = _DatabaseCpu(name, admin_url, make_url(url).database or "")
            drain = await _run_persisters(ctx, url, redis_url, persisters, db)
            problems = await _settled_once(service, shares)
            problems += [f"grab failed: {f}" for f in storm.failures[:1]]
            if drain["dead_lettered"]:
                problems.append(f"{drain['dead_lettered']} entries dead-lettered")
            await forget_packets(service, shares)
        finally:
            await service.aclose()
    seconds = drain["seconds"]
    figures: dict[str, Any] = {
        "database": name,
        "persisters": persisters,
        "claims": granted,
        "stream_entries": entries,
        "rps": round(granted / seconds, 1) if seconds else 0.0,
        "drain_seconds": round(seconds, 3),
        "persister_us_per_claim": _us(drain["persister_cpu"], granted),
        "db_us_per_claim": _us(drain["db_cpu"], granted),
        "db_cpu_scope": db.scope,
        "redis_us_per_claim": drain["redis"].get("redis_us_per_grab"),
        "machine_cpu_pct": drain["redis"].get("machine_cpu_pct"),
        "grabs_per_second_filling": round(len(users) / grab_seconds, 1),
    }
    note = f"claims/s over {granted:,} claims in {entries:,} stream entries"
    return Outcome(
        label, "settle", "failed" if problems else "ok", None, "; ".join([*problems, note]), figures
    )


async def _tell(procs: Sequence[asyncio.subprocess.Process]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
    await asyncio.gather(*(p.stdin.drain() for p in procs if p.stdin is not None))


async def _run_persisters(
    ctx: BenchContext, url: str, redis_url: str, count: int, db: _DatabaseCpu
) -> dict[str, Any]:
    """`count` persister processes started together, until the streams are empty."""
    work = ctx.work_dir / f"settle-{secrets.token_hex(4)}"
    work.mkdir(parents=True)
    procs: list[asyncio.subprocess.Process] = []
    logs = [work / f"persister{i}.log" for i in range(count)]
    admin = admin_for(redis_url)
    try:
        for i in range(count):
            Job(redis_url, url, f"bench-settle-{i}").dump(work / f"job{i}.json")
            with logs[i].open("wb") as log:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *(sys.executable, "-m", "hongbao_bench.settle_worker"),
                        *(str(work / f"job{i}.json"), str(work / f"result{i}.json")),
                        stdin=asyncio.subprocess.PIPE,
                        stdout=asyncio.subprocess.PIPE,
                        stderr=log,
                    )
                )
        await asyncio.gather(
            *(
                expect_line(p, "ready", log, "settle persister")
                for p, log in zip(procs, logs, strict=True)
            )
        )
        await db.begin()
        meter, t0 = CpuMeter(admin), time.perf_counter()
        await _tell(procs)
        await asyncio.gather(
            *(
                expect_line(p, "finished", log, "settle persister")
                for p, log in zip(procs, logs, strict=True)
            )
        )
        metered = time.perf_counter() - t0
        db_cpu = await db.seconds()
        await _tell(procs)
        await asyncio.gather(
            *(
                expect_line(p, "done", log, "settle persister")
                for p, log in zip(procs, logs, strict=True)
            )
        )
        await asyncio.gather(*(p.wait() for p in procs))
    finally:
        admin.close()
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    results = [json.loads((work / f"result{i}.json").read_text()) for i in range(count)]
    applied = sum(int(r["applied"]) for r in results)
    redis = meter.stop(metered, ops=applied)
    return {
        "seconds": max(r["last_applied"] for r in results) - min(r["began"] for r in results),
        "persister_cpu": sum(float(r["cpu_seconds"]) for r in results),
        "db_cpu": db_cpu,
        "redis": redis,
        "applied": applied,
        "dead_lettered": sum(int(r["dead_lettered"]) for r in results),
    }


async def _settled_once(service: Hongbao, shares: dict[str, list[int]]) -> list[str]:
    """What is wrong with the settlement: the ledger's invariants (`hongbao.audit.audit`),
    and per packet the claims and fen in the ledger against those Redis granted."""
    report = await audit(service, settle=0)
    problems = list(report.violations)
    if report.backlog:
        problems.append(f"{report.backlog} stream entries not settled")
    if report.dead_letters:
        problems.append(f"{len(report.dead_letters)} dead letters")
    query = sa.select(claims.c.packet_id, sa.func.count(), sa.func.sum(claims.c.amount))
    async with service.ledger.engine.connect() as conn:
        rows = await conn.execute(query.group_by(claims.c.packet_id))
        in_ledger = {str(r[0]): (int(r[1]), int(r[2])) for r in rows}
    for packet_id, amounts in shares.items():
        live = await service.store.status(service.store.keys(packet_id))
        if live is None:
            problems.append(f"packet {packet_id} vanished from Redis")
            continue
        granted = (len(amounts) - live.shares_left, sum(amounts) - live.amount_left)
        settled = in_ledger.get(packet_id, (0, 0))
        if settled != granted:
            problems.append(
                f"packet {packet_id}: {settled[0]} claims ({settled[1]} fen) in the ledger, "
                f"{granted[0]} ({granted[1]} fen) granted"
            )
    return problems


# -- storm rows --------------------------------------------------------------------------------


def _serve_args(port: int, data: Path) -> list[str]:
    args = [sys.executable, "-m", "hongbao.cli", "serve", "--port", str(port)]
    return [*args, "--data-dir", str(data), "--workers", str(HTTP_WORKERS), "--log-level", "info"]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT)


async def _storm_embedded(ctx: BenchContext) -> Outcome:
    work = ctx.work_dir / f"settle-storm-{secrets.token_hex(4)}"
    data = work / "data"
    data.mkdir(parents=True)
    env = load_env(secrets.token_hex(32))
    port = free_port()
    ctx.say("settle-storm@embedded: hongbao serve starting")
    with http_server(_serve_args(port, data), env, port, "/healthz", work / "serve.log") as serve:
        redis_url = EmbeddedServer(data).url_if_running()
        if redis_url is None:
            raise RuntimeError("hongbao serve runs without its embedded server")
        service = await _connect(ctx, redis_url, ledger_url(data), STORM_USERS)
        try:
            meters = _StormMeters(serve.pid, serve.pid, None)
            return await _storm(ctx, "settle-storm@embedded", service, port, env, work, meters)
        finally:
            await service.aclose()


async def _storm_postgresql(ctx: BenchContext, redis_url: str) -> Outcome:
    if not ctx.postgres_url:
        raise _Unreachable("no postgresql URL")
    work = ctx.work_dir / f"settle-storm-{secrets.token_hex(4)}"
    data = work / "data"
    data.mkdir(parents=True)
    env = load_env(secrets.token_hex(32))
    port = free_port()
    async with _private_database(ctx, ctx.postgres_url) as url:
        service = await _connect(ctx, redis_url, url, STORM_USERS)
        try:
            await _clear_streams(service)
            ctx.say("settle-storm@postgresql: hongbao serve and hongbao worker starting")
            urls = ["--redis-url", redis_url, "--database-url", url]
            serve_args = [*_serve_args(port, data), "--no-persister", *urls]
            worker_args = [sys.executable, "-m", "hongbao.cli", "worker", *urls]
            worker_args += ["--data-dir", str(data), "--consumer-name", "bench-settle-storm"]
            worker = _start(worker_args, env, work / "worker.log")
            try:
                with http_server(serve_args, env, port, "/healthz", work / "serve.log") as serve:
                    db = _DatabaseCpu("postgresql", ctx.postgres_url, make_url(url).database or "")
                    meters = _StormMeters(serve.pid, worker.pid, db)
                    return await _storm(
                        ctx, "settle-storm@postgresql", service, port, env, work, meters
                    )
            finally:
                stop_process(worker, 30)
        finally:
            await service.aclose()


@dataclass
class _StormMeters:
    """The processes a storm meters: the API's process tree, the persister's process (serve's
    supervising process on the embedded default), the database server's CPU."""

    serve_pid: int
    persister_pid: int
    db: _DatabaseCpu | None


@dataclass
class _Samples:
    """What the storm's sampler saw."""

    lags: list[float] = field(default_factory=list)
    seen: int = 0
    last_id: int = 0
    #: the ids seen within `LOOKBACK_IDS` of last_id
    recent: set[int] = field(default_factory=set)
    #: the lowest id within `LOOKBACK_IDS` of last_id not seen yet, where the next read
    #: starts: a row of a lane still in flight, or an id no row will ever have (a
    #: rolled-back insert used it), which holds it until it falls out of the window; ids
    #: start at 1 in the scenario's new ledger
    unseen_from: int = 1
    #: packets (in the storm's order) known to be fully claimed
    frontier: int = 0
    #: claims of the packets before the frontier
    behind: int = 0
    granted: int = 0
    max_backlog: int = 0
    reads: int = 0


async def _read_settled(reader: AsyncEngine, samples: _Samples) -> None:
    """The claims the ledger gained since the last read: each one's lag. A persister's
    lanes commit at once, so a row may commit after rows of higher ids: the read starts
    at the lowest id not seen yet, at most `LOOKBACK_IDS` back, and skips the rows it has
    seen (reading the whole window every time cost the bench and the database ~60,000
    rows a second in a storm)."""
    began = time.time()
    query = (
        sa.select(claims.c.id, claims.c.claimed_at)
        .where(claims.c.id >= samples.unseen_from)
        .order_by(claims.c.id)
    )
    async with reader.connect() as conn:
        rows = (await conn.execute(query)).all()
    for row_id, claimed_at in rows:
        if row_id in samples.recent:
            continue
        samples.recent.add(row_id)
        at = claimed_at if claimed_at.tzinfo else claimed_at.replace(tzinfo=UTC)
        samples.lags.append(began - at.timestamp())
        samples.last_id = max(samples.last_id, int(row_id))
        samples.seen += 1
    floor = samples.last_id - LOOKBACK_IDS
    samples.recent = {i for i in samples.recent if i > floor}
    start = max(samples.unseen_from, floor + 1)
    samples.unseen_from = next(
        (i for i in range(start, samples.last_id + 1) if i not in samples.recent),
        samples.last_id + 1,
    )


async def _read_granted(
    service: Hongbao, packet_ids: Sequence[str], per_packet: int, samples: _Samples
) -> None:
    """Claims granted so far. The packets are grabbed one after the other, so only the few
    after the frontier change: a packet is left behind once it is full or the packet two
    after it has claims (a grab wrk lost to a socket error leaves a packet a share short,
    and 64 connections are done with a packet long before 2 x STORM_USERS more grabs)."""
    ahead = packet_ids[samples.frontier : samples.frontier + 8]
    pipe = service.store.client.pipeline(transaction=False)
    for packet_id in ahead:
        pipe.hlen(service.store.keys(packet_id).claims)
    lengths = [int(n) for n in await pipe.execute()]
    done = 0
    while done < len(lengths) and (lengths[done] >= per_packet or any(lengths[done + 2 :])):
        done += 1
    samples.behind += sum(lengths[:done])
    samples.frontier += done
    samples.granted = samples.behind + sum(lengths[done:])


async def _sample(
    service: Hongbao,
    reader: AsyncEngine,
    packet_ids: Sequence[str],
    per_packet: int,
    samples: _Samples,
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        await _read_settled(reader, samples)  # the ledger first: the backlog errs high
        await _read_granted(service, packet_ids, per_packet, samples)
        samples.reads += 1
        samples.max_backlog = max(samples.max_backlog, samples.granted - samples.seen)
        await asyncio.sleep(max(0.0, SAMPLE_SECONDS - (time.perf_counter() - began)))


async def _storm(
    ctx: BenchContext,
    label: str,
    service: Hongbao,
    port: int,
    env: dict[str, str],
    work: Path,
    meters: _StormMeters,
) -> Outcome:
    seconds = ctx.profile.settle_storm_seconds
    packets = max(2, math.ceil(STORM_RATE_CEILING * seconds / STORM_USERS))
    ctx.say(f"{label}: opening {packets} packets of {STORM_USERS:,} shares")
    shares = await send_packets(service, packets, STORM_USERS, random.Random(31))
    packet_ids = list(shares)
    users = [f"st{k}" for k in range(1, STORM_USERS + 1)]
    tokens = await mint_tokens(users, env)
    (work / "tokens.txt").write_text("\n".join(tokens) + "\n", encoding="ascii")
    (work / "packets.txt").write_text("\n".join(packet_ids) + "\n", encoding="ascii")
    script = work / "storm.lua"
    script.write_text(WRK_SCRIPT + WRK_DONE, encoding="ascii")
    args = [str(work / "tokens.txt"), str(work / "packets.txt")]

    samples, stop = _Samples(), asyncio.Event()
    # the sampler reads the ledger on a connection of its own, left out of the server's CPU
    reader = create_async_engine(
        database_url(service.settings.database_url), pool_size=1, max_overflow=0
    )
    if meters.db is not None:
        async with reader.connect() as conn:
            pid = (await conn.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
        meters.db.exclude.add(int(pid))
    admin = admin_for(service.settings.redis_url)
    started: list[tuple[CpuMeter, float, float, float]] = []

    def ready() -> None:
        serve_cpu = tree_cpu_seconds(meters.serve_pid)
        started.append((CpuMeter(admin), time.perf_counter(), serve_cpu, persister_cpu()))

    def persister_cpu() -> float:
        return process_cpu_seconds(meters.persister_pid)

    try:
        if meters.db is not None:
            await meters.db.begin()
        sampler = asyncio.create_task(
            _sample(service, reader, packet_ids, STORM_USERS, samples, stop)
        )
        ctx.say(f"{label}: wrk {STORM_CONNECTIONS} connections for {seconds:.0f}s")
        wrk = await asyncio.to_thread(
            run_wrk, port, script, args, seconds, STORM_CONNECTIONS, ready
        )
        backlog_at_end = samples.granted - samples.seen
        storm_max_backlog = samples.max_backlog
        ctx.say(f"{label}: the ledger catching up")
        final = await _granted_total(service, packet_ids)
        ended = time.perf_counter()
        deadline = ended + CATCH_UP_TIMEOUT
        while samples.seen < final and time.perf_counter() < deadline:
            await asyncio.sleep(SAMPLE_SECONDS)
            if samples.reads % 20 == 0 and await _claim_count(service) >= final:
                await asyncio.sleep(2 * SAMPLE_SECONDS)  # the sampler's last read
                break
        caught_up = time.perf_counter() - ended
        # a read's entries are acknowledged once all its transactions committed
        while time.perf_counter() < deadline:
            if not await service.store.backlog():
                break
            await asyncio.sleep(SAMPLE_SECONDS)
        stop.set()
        await sampler
        if not started:
            raise RuntimeError("wrk ran without building its requests")
        meter, t0, serve0, persister0 = started[0]
        metered = time.perf_counter() - t0
        cpu = meter.stop(metered, ops=final)
        serve_s = tree_cpu_seconds(meters.serve_pid) - serve0
        persister_s = persister_cpu() - persister0
        db_s = await meters.db.seconds() if meters.db is not None else None
    finally:
        stop.set()
        admin.close()
        await reader.dispose()
    problems = await _settled_once(service, shares)
    in_ledger = await _claim_count(service)
    if samples.seen < in_ledger:
        problems.append(
            f"{in_ledger - samples.seen} claims committed more than {LOOKBACK_IDS} ids out of"
            " order: unseen"
        )
    if wrk["status_errors"]:
        problems.append(f"{wrk['status_errors']} non-2xx answers")
    if wrk["requests"] > packets * STORM_USERS:
        problems.append("more grabs than shares: some were repeats")
    await forget_packets(service, shares)

    wrk_seconds = wrk["duration_us"] / 1e6
    rate = final / wrk_seconds if wrk_seconds else 0.0
    lags = samples.lags
    figures: dict[str, Any] = {
        "deployment": label.split("@")[1],
        "rps": round(wrk["rps"], 1),
        "claims": final,
        "storm_seconds": round(wrk_seconds, 2),
        "p50_ms": round(percentile_ms(lags, 0.50), 1),
        "p99_ms": round(percentile_ms(lags, 0.99), 1),
        "lag_max_ms": round(max(lags, default=0.0) * 1000, 1),
        "max_backlog_claims": storm_max_backlog,
        "max_backlog_seconds": round(storm_max_backlog / rate, 3) if rate else None,
        "backlog_at_storm_end": backlog_at_end,
        "catch_up_seconds": round(caught_up, 2),
        "grab_p50_ms": round(wrk["p50_us"] / 1000, 2),
        "grab_p99_ms": round(wrk["p99_us"] / 1000, 2),
        "persister_us_per_claim": _us(persister_s, final),
        "serve_tree_us_per_claim": _us(serve_s, final),
        "db_us_per_claim": _us(db_s, final),
        "db_cpu_scope": meters.db.scope if meters.db is not None else "",
        "redis_us_per_claim": cpu.get("redis_us_per_grab"),
        "machine_cpu_pct": cpu.get("machine_cpu_pct"),
        "sample_seconds": SAMPLE_SECONDS,
        "reads": samples.reads,
    }
    note = f"{final:,} claims; columns p50/p99: grab-to-credit lag"
    status = "failed" if problems else "ok"
    return Outcome(label, "settle", status, None, "; ".join([*problems, note]), figures)


async def _granted_total(service: Hongbao, packet_ids: Sequence[str]) -> int:
    pipe = service.store.client.pipeline(transaction=False)
    for packet_id in packet_ids:
        pipe.hlen(service.store.keys(packet_id).claims)
    return sum(int(n) for n in await pipe.execute())


async def _claim_count(service: Hongbao) -> int:
    async with service.ledger.engine.connect() as conn:
        return int(
            (await conn.execute(sa.select(sa.func.count()).select_from(claims))).scalar_one()
        )


# -- targets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SettleTarget:
    name: str
    value: float | None
    goal: str
    met: bool | None
    unit: str


def settle_targets(outcomes: Sequence[Outcome]) -> list[SettleTarget]:
    """One persister's claims/s per database; each storm's largest backlog and p99 lag."""
    found: list[SettleTarget] = []
    for o in outcomes:
        if o.group != "settle" or o.status == "skipped" or o.status == "error":
            continue
        f = o.figures
        if o.scenario.startswith("settle-drain@"):
            goal = DRAIN_TARGETS[str(f["database"])]
            rate = float(f["rps"])
            found.append(
                SettleTarget(
                    f"one persister on {f['database']}, claims/s",
                    rate,
                    f">= {goal:,.0f}",
                    rate >= goal,
                    "",
                )
            )
        elif o.scenario.startswith("settle-storm@"):
            where = f["deployment"]
            backlog = f.get("max_backlog_seconds")
            found.append(
                SettleTarget(
                    f"storm on {where}: largest backlog, seconds of grabs",
                    backlog,
                    f"<= {STORM_MAX_BACKLOG_S:.0f} s",
                    None if backlog is None else backlog <= STORM_MAX_BACKLOG_S,
                    " s",
                )
            )
            p99 = float(f["p99_ms"]) / 1000
            found.append(
                SettleTarget(
                    f"storm on {where}: grab-to-credit lag p99",
                    p99,
                    f"<= {STORM_MAX_LAG_P99_S:.0f} s",
                    p99 <= STORM_MAX_LAG_P99_S,
                    " s",
                )
            )
    return found

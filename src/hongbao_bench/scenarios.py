"""The scenarios of `hongbao bench`: each one runs, audits its own money and returns `Outcome`.

Scenario names (``--scenarios``):

* ``seed-baseline``: seed 002's client (20 sync threads, one EVAL of its script per grab);
* ``redis-benchmark``: Debian's ``redis-benchmark`` running seed 002's script by EVALSHA on
  the same server, 50 clients, unpipelined and ``-P 16`` (the server's own ceiling);
* ``hongbao``: `Hongbao.grab` with coalescing, many concurrent grabbers over hot packets;
* ``hongbao-nocoalesce``: the same with ``coalesce_max_batch=1`` (one script call per grab);
* ``hongbao-spread``: the same storm spread over many packets, one grab of each in a call
  (a grab costs Redis most in that shape: the batch script's work is mostly per packet);
* ``hongbao-http``: ``hongbao serve --workers 2`` loaded by ``wrk`` (64 connections), and
  the hello-world ceiling of the same uvicorn setup, in alternating slices of the same run
  (`hongbao_bench.http_scenario`);
* ``designs``: seed 003's six designs (`hongbao_bench.designs`) on PostgreSQL and MariaDB;
* ``memory``: Redis bytes per unclaimed share and per claim for a 10,000-share packet;
* ``hongbao-cluster``: on a ``redis+cluster://`` URL, the engine's grab path with hot
  packets on the first 1, 2 ... P primaries, one client process per primary
  (`hongbao_bench.cluster_scenario`), and the same on one plain server for comparison.

On a cluster, the scenarios built on seed 002's script are skipped (its keys span slots).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import resource
import secrets
import shutil
import socket
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import redis

from hongbao.domain.splitting import SplitLimits
from hongbao.errors import (
    ConfigurationError,
)
from hongbao.runtime import settle_heap
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao_bench.cluster import (
    ONE_SERVER_DESIGN,
    ONE_SERVER_ONLY,
    Admin,
    admin_for,
    cpu_by_node,
    is_cluster_url,
)
from hongbao_bench.harness import (
    Design,
    account,
    call_shape,
    engine_storm,
    percentile_ms,
    run_scenario,
    run_seed_baseline,
)
from hongbao_bench.harness import seed002_script as _seed002_script
from hongbao_bench.results import ScenarioResult

#: groups of scenarios, in the order they run
SCENARIOS = (
    "seed-baseline",
    "redis-benchmark",
    "hongbao",
    "hongbao-nocoalesce",
    "hongbao-spread",
    "ack-modes",
    "hongbao-http",
    "designs",
    "memory",
    "hongbao-cluster",
)
#: scenario groups whose failure makes `hongbao bench` exit non-zero (hongbao-nocoalesce is a
#: comparison with coalescing off, not the shipped configuration: shown failing, not fatal)
OURS = frozenset(
    {"hongbao", "hongbao-spread", "ack-modes", "hongbao-http", "memory", "hongbao-cluster"}
)
#: --ack modes measured by the ack-modes group (replica needs a replica server)
BENCH_ACK_MODES = ("aof", "ledger")
#: ack-mode runs grab this fraction of the hongbao scenario's grabs (they are slower)
ACK_MODE_FRACTION = 8
SQL_BACKENDS = ("postgresql", "mysql")
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL_URL = "mysql://root@127.0.0.1:3306/test"
SENDER = "bench-sender"
MEMORY_SHARES = 10_000


@dataclass(frozen=True)
class Profile:
    """How big each scenario is."""

    name: str
    seed_shares: int
    seed_threads: int
    rb_requests: int
    hb_packets: int
    hb_shares: int  # per packet
    hb_tasks: int
    nocoalesce_shares: int  # per packet
    http_seconds: float
    http_connections: int
    design_shares: int
    design_grabbers: int
    design_concurrency: int
    memory_shares: int = MEMORY_SHARES
    spread_packets: int = 1_000
    spread_shares: int = 80  # per packet

    @property
    def cluster_grabs(self) -> int:
        """Grabs per targeted primary in each hongbao-cluster run."""
        return max(200, self.hb_packets * self.hb_shares // 8)


#: The quick profile's engine storm (8 x 40,000 grabs) lasts over a second. At 10,000
#: a packet it lasted ~0.4 s, and a stall as short as the AOF rewrite that the earlier
#: scenarios' writes set off (seen inside it) was a fifth of it: Redis CPU read 79-82%
#: in 4 runs after seed-baseline and redis-benchmark, 88-93% in 3 alone. Now 89-97%,
#: though a slow minute for the Python process still reads lower (76% once; see
#: docs/performance.md).
PROFILES: dict[str, Profile] = {
    "tiny": Profile(
        "tiny", 2_000, 20, 5_000, 4, 1_000, 500, 500, 1.0, 64, 20, 40, 10, 1_000, 40, 10
    ),
    "quick": Profile("quick", 40_000, 20, 60_000, 8, 40_000, 2_000, 4_000, 3.0, 64, 100, 200, 20),
    "full": Profile(
        "full", 200_000, 20, 300_000, 8, 50_000, 2_000, 12_500, 12.0, 64, 1_000, 2_000, 20
    ),
}


def profile_for(size: str | None, quick: bool) -> Profile:
    """``tiny`` / ``quick`` / ``full``, or a number: the `hongbao` scenario's grabs."""
    if size is None:
        return PROFILES["quick" if quick else "full"]
    if size in PROFILES:
        return PROFILES[size]
    try:
        grabs = int(size)
    except ValueError:
        raise ValueError(f"--size must be tiny, quick, full or a number, not {size!r}") from None
    if grabs < 100:
        raise ValueError("--size must be at least 100 grabs")
    base = PROFILES["quick" if quick else "full"]
    per = max(1, grabs // base.hb_packets)
    scale = grabs / (base.hb_packets * base.hb_shares)
    return replace(
        base,
        name=str(grabs),
        hb_shares=per,
        seed_shares=max(100, int(base.seed_shares * scale)),
        rb_requests=max(1_000, int(base.rb_requests * scale)),
        nocoalesce_shares=max(10, int(base.nocoalesce_shares * scale)),
        spread_packets=max(20, min(base.spread_packets, int(base.spread_packets * scale))),
        spread_shares=max(1, min(base.spread_shares, int(base.spread_shares * scale))),
    )


@dataclass
class Outcome:
    """One row of the report."""

    scenario: str
    group: str
    #: ok, failed, skipped or error
    status: str
    result: ScenarioResult | None = None
    note: str = ""
    #: headline figures beyond the ScenarioResult (redis_cpu_pct, grabs_per_call, ...)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def ours(self) -> bool:
        return self.group in OURS

    @property
    def grabs_per_second(self) -> float | None:
        if "rps" in self.figures:
            return float(self.figures["rps"])
        return self.result.grabs_per_second if self.result is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "group": self.group,
            "status": self.status,
            "ours": self.ours,
            "grabs_per_second": _round(self.grabs_per_second),
            "note": self.note,
            "figures": self.figures,
            "result": self.result.to_dict() if self.result is not None else None,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


@dataclass
class BenchContext:
    redis_url: str
    database_url: str
    work_dir: Path
    profile: Profile
    postgres_url: str | None = DEFAULT_POSTGRES_URL
    mysql_url: str | None = DEFAULT_MYSQL_URL
    #: called with a short text while a scenario makes progress
    say: Callable[[str], None] = lambda _: None

    @property
    def cluster(self) -> bool:
        return is_cluster_url(self.redis_url)

    def admin(self) -> Admin:
        """A client for checks and metering: a cluster client on a ``redis+cluster`` URL."""
        return admin_for(self.redis_url)

    def settings(self, max_count: int = 0, **overrides: Any) -> Settings:
        """Service settings on the bench's servers (packets up to `max_count` shares)."""
        biggest = max(max_count, self.profile.hb_shares, MEMORY_SHARES)
        return Settings.from_env(
            {},
            redis_url=self.redis_url,
            database_url=self.database_url,
            split_limits=SplitLimits(max_count=biggest),
            **overrides,
        )


# --------------------------------------------------------------------------- helpers


def _machine_busy_seconds() -> float | None:
    """CPU seconds all processes of the machine have used (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU used during a stretch of wall time, in % of one core: Redis (INFO cpu; on a
    cluster the sum over the primaries, and each primary), this Python process, the whole
    machine, and the rest (other processes: the noise)."""

    def __init__(self, client: Admin) -> None:
        self.client = client
        self.nodes0 = cpu_by_node(client)
        self.redis0 = sum(self.nodes0.values())
        self.python0 = time.process_time()
        self.machine0 = _machine_busy_seconds()
        self.wall0 = time.perf_counter()

    def stop(self, wall: float | None = None, ops: int = 0) -> dict[str, Any]:
        """Percentages; with `ops`, also CPU microseconds per operation (these do not
        depend on how busy the machine was, unlike the rates)."""
        seconds = wall if wall is not None else time.perf_counter() - self.wall0
        nodes = cpu_by_node(self.client)
        redis_s = sum(nodes.values()) - self.redis0
        python_s = time.process_time() - self.python0
        redis_pct, python_pct = redis_s / seconds * 100, python_s / seconds * 100
        out: dict[str, Any] = {
            "redis_cpu_pct": round(redis_pct, 1),
            "python_cpu_pct": round(python_pct, 1),
        }
        if len(nodes) > 1:
            out["redis_cpu_pct_by_primary"] = {
                name: round((used - self.nodes0.get(name, used)) / seconds * 100, 1)
                for name, used in nodes.items()
            }
        if ops:
            out["redis_us_per_grab"] = round(redis_s / ops * 1e6, 2)
            out["python_us_per_grab"] = round(python_s / ops * 1e6, 2)
        machine = _machine_busy_seconds()
        if machine is not None and self.machine0 is not None:
            machine_pct = (machine - self.machine0) / seconds * 100
            out["machine_cpu_pct"] = round(machine_pct, 1)
            out["other_cpu_pct"] = round(max(0.0, machine_pct - redis_pct - python_pct), 1)
        return out


def _tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and its descendants, from /proc (Linux)."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        current = todo.pop()
        try:
            stat = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(stat[11]) + int(stat[12])) / tick
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _failed(result: ScenarioResult) -> str:
    return "ok" if result.ok else "failed"


def _problems(result: ScenarioResult) -> str:
    bits = []
    if result.over_issue:
        bits.append(f"over-issue {result.over_issue}")
    if result.duplicates:
        bits.append(f"{result.duplicates} double claims")
    if not result.conserved:
        bits.append("money not conserved")
    if result.errors:
        bits.append(f"{result.errors} errors: {result.extra.get('first_error', '')}")
    return "; ".join(bits)


async def send_packets(
    service: Hongbao, packets: int, shares: int, rng: random.Random
) -> dict[str, list[int]]:
    """Open `packets` lucky packets of `shares` shares; packet id -> share amounts."""
    out: dict[str, list[int]] = {}
    for _ in range(packets):
        total = shares * rng.randint(100, 300)
        await service.deposit(SENDER, total)
        packet = await service.send(SENDER, total, shares, "lucky", expires_in=3_600)
        out[packet.id] = [amount for _, amount in await service.ledger.shares_of(packet.id)]
    return out


async def forget_packets(service: Hongbao, packet_ids: Iterable[str]) -> None:
    """Delete the bench's packets from Redis (their grab events stay in the bucket streams)."""
    for packet_id in packet_ids:
        await service.store.forget_packet(service.store.keys(packet_id))


async def audit_packets(
    service: Hongbao, shares: dict[str, list[int]], user_ids: dict[str, int]
) -> tuple[dict[int, list[int]], tuple[int, int], list[str]]:
    """Claims (by int user id) and leftover of the packets, read back from Redis."""
    claims: dict[int, list[int]] = defaultdict(list)
    left_count = left_amount = 0
    problems: list[str] = []
    for packet_id, amounts in shares.items():
        keys = service.store.keys(packet_id)
        live = await service.store.status(keys)
        if live is None:
            problems.append(f"packet {packet_id} vanished from Redis")
            continue
        left_count += live.shares_left
        left_amount += live.amount_left
        found = await service.store.claims(keys)
        seqs = Counter(c.seq for c in found.values())
        if any(n > 1 for n in seqs.values()):
            problems.append(f"packet {packet_id}: a share was handed out twice")
        for user, claim in found.items():
            if amounts[claim.seq - 1] != claim.amount:
                problems.append(f"packet {packet_id}: share {claim.seq} has the wrong amount")
            claims[user_ids.get(user, -1)].append(claim.amount)
    return dict(claims), (left_count, left_amount), problems


# --------------------------------------------------------------------------- seed 002


async def seed_baseline(ctx: BenchContext) -> list[Outcome]:
    if ctx.cluster:
        note = ONE_SERVER_ONLY["seed-baseline"]
        return [Outcome("seed-baseline", "seed-baseline", "skipped", note=note)]
    ctx.say(f"{ctx.profile.seed_shares:,} grabs, {ctx.profile.seed_threads} threads")
    result = await asyncio.to_thread(
        run_seed_baseline, ctx.redis_url, ctx.profile.seed_shares, ctx.profile.seed_threads
    )
    return [Outcome("seed-baseline", "seed-baseline", _failed(result), result, _problems(result))]


def _redis_benchmark_run(
    ctx: BenchContext, requests: int, pipeline: int, clients: int = 50
) -> Outcome:
    name = "redis-benchmark" if pipeline == 1 else f"redis-benchmark-P{pipeline}"
    binary = shutil.which("redis-benchmark") or shutil.which("valkey-benchmark")
    if binary is None:
        return Outcome(
            name, "redis-benchmark", "skipped", note="redis-benchmark not found (redis-tools)"
        )
    parts = urlsplit(ctx.redis_url)
    db = int(parts.path.strip("/") or 0)
    admin = redis.Redis.from_url(ctx.redis_url, decode_responses=True)
    prefix = f"hb:bench:rb:{secrets.token_hex(6)}:"
    keys = [prefix + "hongBaoList", prefix + "hongBaoConsumedList", prefix + "hongBaoConsumedMap"]
    try:
        sha = admin.script_load(_seed002_script())
        pipe = admin.pipeline(transaction=False)
        for j in range(requests):
            pipe.lpush(keys[0], json.dumps({"id": j, "money": j}, separators=(",", ":")))
            if len(pipe) >= 2_000:
                pipe.execute()
        pipe.execute()
        args = [binary, "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379)]
        if parts.password:
            args += ["-a", parts.password]
        args += ["--dbnum", str(db), "-c", str(clients), "-n", str(requests), "-P", str(pipeline)]
        args += ["-r", "1000000000", "--csv", "EVALSHA", sha, "4", *keys, "u:__rand_int__"]
        meter = CpuMeter(admin)
        proc = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
        cpu = meter.stop()
        cpu.pop("python_cpu_pct")  # redis-benchmark's own CPU is in other_cpu_pct
        rows = [line for line in proc.stdout.splitlines() if line.startswith('"EVALSHA')]
        if proc.returncode != 0 or not rows:
            return Outcome(
                name,
                "redis-benchmark",
                "error",
                note=f"redis-benchmark failed: {(proc.stderr or proc.stdout)[-300:]}",
            )
        cells = [c.strip('"') for c in rows[-1].split('","')]
        rps, p50, p99 = float(cells[1]), float(cells[4]), float(cells[6])
        consumed = admin.lrange(keys[1], 0, -1)
        left = [int(json.loads(raw)["money"]) for raw in admin.lrange(keys[0], 0, -1)]
        users = Counter(json.loads(raw)["userId"] for raw in consumed)
        money = [int(json.loads(raw)["money"]) for raw in consumed]
        dedupe = int(admin.hlen(keys[2]))
    finally:
        admin.delete(*keys)
        admin.close()
    total = requests * (requests - 1) // 2
    conserved = len(money) + len(left) == requests and sum(money) + sum(left) == total
    duplicates = sum(1 for n in users.values() if n > 1)
    result = ScenarioResult(
        name=name,
        backend="redis",
        grabs_attempted=requests,
        granted=len(users),
        turned_away_while_left=0,
        duplicates=duplicates,
        over_issue=max(0, len(money) - requests),
        retries_or_conflicts=requests - len(money),
        seconds=requests / rps if rps else 0.0,
        p50_ms=p50,
        p99_ms=p99,
        extra={
            "clients": clients,
            "pipeline": pipeline,
            "claims": len(money),
            "dedupe_hash_size": dedupe,
            "command": " ".join(args[args.index("EVALSHA") :]),
        },
        conserved=conserved and dedupe == len(users),
    )
    figures: dict[str, Any] = {"rps": rps, **cpu}
    return Outcome(name, "redis-benchmark", _failed(result), result, _problems(result), figures)


async def redis_benchmark(ctx: BenchContext) -> list[Outcome]:
    if ctx.cluster:
        note = ONE_SERVER_ONLY["redis-benchmark"]
        return [
            Outcome(name, "redis-benchmark", "skipped", note=note)
            for name in ("redis-benchmark", "redis-benchmark-P16")
        ]
    n = ctx.profile.rb_requests
    ctx.say(f"{n:,} EVALSHA, 50 clients, unpipelined")
    plain = await asyncio.to_thread(_redis_benchmark_run, ctx, n, 1)
    ctx.say(f"{n:,} EVALSHA, 50 clients, -P 16")
    piped = await asyncio.to_thread(_redis_benchmark_run, ctx, n, 16)
    return [plain, piped]


# --------------------------------------------------------------------------- hongbao


async def _hongbao_run(
    ctx: BenchContext,
    name: str,
    coalesce: bool,
    *,
    group: str | None = None,
    packets: int | None = None,
    per_packet: int | None = None,
    ack_mode: str = "redis",
) -> Outcome:
    p = ctx.profile
    if packets is None:
        packets = p.hb_packets
    if per_packet is None:
        per_packet = p.hb_shares if coalesce else p.nocoalesce_shares
    overrides: dict[str, Any] = {} if coalesce else {"coalesce_max_batch": 1}
    settings = ctx.settings(ack_mode=ack_mode, **overrides)
    service = await Hongbao.connect(settings, migrate=True)
    admin = ctx.admin()
    try:
        ctx.say(f"opening {packets} packets of {per_packet:,} shares")
        shares = await send_packets(service, packets, per_packet, random.Random(7))
        packet_ids = list(shares)
        n = packets * per_packet
        users = [f"u{k}" for k in range(1, n + 1)]
        user_ids = {u: k for k, u in enumerate(users, start=1)}
        clock = time.perf_counter
        await asyncio.gather(*(service.store.client.ping() for _ in range(64)))
        ctx.say(f"{n:,} grabs by {p.hb_tasks:,} tasks")
        settle_heap()  # as `hongbao serve` does after startup
        meter, t0 = CpuMeter(admin), clock()
        storm = await engine_storm(service, packet_ids, users, 1, p.hb_tasks)
        seconds = clock() - t0
        cpu = meter.stop(seconds, ops=n)
        claims, leftover, problems = await audit_packets(service, shares, user_ids)
        await forget_packets(service, shares)
        figures: dict[str, Any] = {**cpu, "tasks": p.hb_tasks, **call_shape(service)}
        result = account(
            name=name,
            backend="redis",
            shares=[a for amounts in shares.values() for a in amounts],
            answers=storm.answers,
            seconds=seconds,
            claims=claims,
            leftover=leftover,
            extra={**figures, "packets": packets, "refusals": dict(storm.refusals)},
            errors=len(storm.failures),
            first_error=storm.failures[0] if storm.failures else None,
        )
    finally:
        admin.close()
        await service.aclose()
    status = _failed(result) if not problems else "failed"
    note = "; ".join([*problems, _problems(result)]).strip("; ")
    return Outcome(name, group or name, status, result, note, figures)


async def hongbao(ctx: BenchContext) -> list[Outcome]:
    return [await _hongbao_run(ctx, "hongbao", coalesce=True)]


async def hongbao_nocoalesce(ctx: BenchContext) -> list[Outcome]:
    return [await _hongbao_run(ctx, "hongbao-nocoalesce", coalesce=False)]


async def hongbao_spread(ctx: BenchContext) -> list[Outcome]:
    packets, shares = ctx.profile.spread_packets, ctx.profile.spread_shares
    return [await _hongbao_run(ctx, "hongbao-spread", True, packets=packets, per_packet=shares)]


async def ack_modes(ctx: BenchContext) -> list[Outcome]:
    """The engine scenario in each waiting --ack mode (the `hongbao` row is mode redis)."""
    per_packet = max(10, ctx.profile.hb_shares // ACK_MODE_FRACTION)
    outcomes = []
    for mode in BENCH_ACK_MODES:
        name = f"hongbao-ack-{mode}"
        ctx.say(f"--ack {mode}")
        try:
            outcome = await _hongbao_run(
                ctx, name, coalesce=True, group="ack-modes", per_packet=per_packet, ack_mode=mode
            )
        except ConfigurationError as exc:  # e.g. WAITAOF missing on Redis < 7.2
            outcome = Outcome(name, "ack-modes", "skipped", note=str(exc))
        outcomes.append(outcome)
    return outcomes


# --------------------------------------------------------------------------- seed 003


def async_sql_url(url: str) -> str:
    """Plain postgresql:// and mysql:// URLs with the async drivers the designs need."""
    scheme, sep, rest = url.partition("://")
    if scheme in ("postgresql", "postgres"):
        return f"postgresql+asyncpg{sep}{rest}"
    if scheme in ("mysql", "mariadb"):
        return f"mysql+aiomysql{sep}{rest}"
    return url


def _reachable(url: str, default_port: int) -> str | None:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return None
    except OSError as exc:
        return str(exc)


async def designs(ctx: BenchContext) -> list[Outcome]:
    from hongbao_bench.designs import DESIGNS, make_design

    p = ctx.profile
    rng = random.Random(3)
    share_list = [rng.randint(1, 2_000) for _ in range(p.design_shares)]
    servers = {"postgresql": (ctx.postgres_url, 5432), "mysql": (ctx.mysql_url, 3306)}
    out: list[Outcome] = []
    for name, cls in DESIGNS.items():
        backends = sorted(cls.supported_backends & {"redis", *SQL_BACKENDS})
        for backend in backends:
            label = f"{name}@{'mariadb' if backend == 'mysql' else backend}"
            database_url: str | None = None
            if name.startswith("redis") and ctx.cluster:
                out.append(Outcome(label, "designs", "skipped", note=ONE_SERVER_DESIGN))
                continue
            if backend != "redis":
                url, port = servers[backend]
                if not url:
                    out.append(Outcome(label, "designs", "skipped", note=f"no {backend} URL"))
                    continue
                down = _reachable(url, port)
                if down is not None:
                    out.append(Outcome(label, "designs", "skipped", note=f"unreachable: {down}"))
                    continue
                database_url = async_sql_url(url)
            ctx.say(f"{label}: {p.design_grabbers} users x2 clicks, {p.design_shares} shares")
            try:
                # every design follows harness.Design (DesignBase only holds the counters)
                design = cast(Design, make_design(name, database_url, ctx.redis_url))
                result = await run_scenario(
                    design,
                    share_list,
                    p.design_grabbers,
                    p.design_concurrency,
                    clicks_per_user=2,
                    click_gap_ms=5.0,
                    name=label,
                )
            except Exception as exc:
                out.append(
                    Outcome(label, "designs", "error", note=f"{type(exc).__name__}: {exc}"[:300])
                )
                continue
            out.append(Outcome(label, "designs", _failed(result), result, _problems(result)))
    return out


async def memory(ctx: BenchContext) -> list[Outcome]:
    from hongbao_bench.memory import memory_scenario

    return await memory_scenario(ctx)


async def hongbao_http(ctx: BenchContext) -> list[Outcome]:
    from hongbao_bench.http_scenario import hongbao_http as run

    return await run(ctx)


async def hongbao_cluster(ctx: BenchContext) -> list[Outcome]:
    from hongbao_bench.cluster_scenario import cluster_scenario

    return await cluster_scenario(ctx)


RUNNERS: dict[str, Callable[[BenchContext], Awaitable[list[Outcome]]]] = {
    "seed-baseline": seed_baseline,
    "redis-benchmark": redis_benchmark,
    "hongbao": hongbao,
    "hongbao-nocoalesce": hongbao_nocoalesce,
    "hongbao-spread": hongbao_spread,
    "ack-modes": ack_modes,
    "hongbao-http": hongbao_http,
    "designs": designs,
    "memory": memory,
    "hongbao-cluster": hongbao_cluster,
}

__all__ = [
    "OURS",
    "PROFILES",
    "RUNNERS",
    "SCENARIOS",
    "BenchContext",
    "Outcome",
    "Profile",
    "async_sql_url",
    "peak_rss_mb",
    "percentile_ms",
    "profile_for",
]

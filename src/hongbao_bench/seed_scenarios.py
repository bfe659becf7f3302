"""The seeds' designs, measured for comparison with hongbao.

* ``seed-baseline``: seed 002's client (20 sync threads, one EVAL of its script per grab);
* ``redis-benchmark``: Debian's ``redis-benchmark`` running seed 002's script by EVALSHA on
  the same server, 50 clients, unpipelined and ``-P 16`` (the server's own ceiling);
* ``designs``: seed 003's six designs (`hongbao_bench.designs`) on PostgreSQL and MariaDB.

On a cluster, the scenarios built on seed 002's script are skipped (its keys span slots).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import shutil
import socket
import subprocess
from collections import Counter
from typing import Any, cast
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

import redis

from hongbao_bench.cluster import ONE_SERVER_DESIGN, ONE_SERVER_ONLY
from hongbao_bench.common import BenchContext, Outcome, problem_note, status_of
from hongbao_bench.harness import Design, run_scenario, run_seed_baseline, seed002_script
from hongbao_bench.meters import CpuMeter
from hongbao_bench.results import ScenarioResult

SQL_BACKENDS = ("postgresql", "mysql")


# --------------------------------------------------------------------------- seed 002


async def seed_baseline(ctx: BenchContext) -> list[Outcome]:
    if ctx.cluster:
        note = ONE_SERVER_ONLY["seed-baseline"]
        return [Outcome("seed-baseline", "seed-baseline", "skipped", note=note)]
    ctx.say(f"{ctx.profile.seed_shares:,} grabs, {ctx.profile.seed_threads} threads")
    result = await asyncio.to_thread(
        run_seed_baseline, ctx.redis_url, ctx.profile.seed_shares, ctx.profile.seed_threads
    )
    return [
        Outcome("seed-baseline", "seed-baseline", status_of(result), result, problem_note(result))
    ]


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
    db = _database_number(parts)
    admin = redis.Redis.from_url(ctx.redis_url, decode_responses=True)
    prefix = f"hb:bench:rb:{secrets.token_hex(6)}:"
    keys = [prefix + "hongBaoList", prefix + "hongBaoConsumedList", prefix + "hongBaoConsumedMap"]
    try:
        sha = admin.script_load(seed002_script())
        pipe = admin.pipeline(transaction=False)
        for j in range(requests):
            pipe.lpush(keys[0], json.dumps({"id": j, "money": j}, separators=(",", ":")))
            if len(pipe) >= 2_000:
                pipe.execute()
        pipe.execute()
        if parts.scheme == "unix":  # the embedded server listens on a socket only
            args = [binary, "-s", unquote(parts.path)]
        else:
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
    return Outcome(
        name, "redis-benchmark", status_of(result), result, problem_note(result), figures
    )


def _database_number(parts: SplitResult) -> int:
    """redis://host:port/N, or unix:///path?db=N."""
    if parts.scheme == "unix":
        return int(parse_qs(parts.query).get("db", ["0"])[0])
    return int(parts.path.strip("/") or 0)


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
            out.append(Outcome(label, "designs", status_of(result), result, problem_note(result)))
    return out

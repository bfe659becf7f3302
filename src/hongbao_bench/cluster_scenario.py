"""hongbao-cluster: does a primary keep its throughput as primaries are added?

On a cluster of P primaries, run k = 1 .. P: hot packets only on the first k primaries
(slot order), one client process per targeted primary (`cluster_worker`), so that one
Python client is not the ceiling. Each run reports, per primary, grabs/s, its Redis CPU
and grabs per CPU-second of that primary. On a small machine the total cannot grow with
k (the clients and primaries share the cores), but grabs per primary CPU-second can stay
flat: that is the figure which shows the design scales. The same worker against one plain
server (same binary, same AOF setting) gives the single-node reference.

Every run is audited like the `hongbao` scenario: claims + leftover == shares, every
amount a grabber was told is stored under its name, no user holds two claims.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hongbao.keys import bucket_of
from hongbao.service import Hongbao
from hongbao_bench.cluster import (
    Admin,
    admin_for,
    buckets_by_primary,
    cluster_admin,
    cpu_by_node,
    node_setup,
    primaries_in_slot_order,
    single_server,
)
from hongbao_bench.cluster_worker import Job, user_name
from hongbao_bench.common import (
    BenchContext,
    Outcome,
    audit_packets,
    forget_packets,
    free_port,
    problem_note,
    send_packets,
)
from hongbao_bench.harness import account
from hongbao_bench.meters import machine_busy_seconds
from hongbao_bench.processes import expect_line

GROUP = "hongbao-cluster"
#: hot packets per targeted primary (its client process spreads grabs over them)
PACKETS_PER_PRIMARY = 2
#: longest wait for one worker to connect, or to finish its grabs

Shares = dict[str, list[int]]


@dataclass
class PacketPool:
    """Packets opened through `Hongbao.send`, filed by the primary that serves them.

    A packet's id is drawn by the service, so its primary is only known once it exists;
    packets landing on a primary not needed yet are kept for a later run.
    """

    service: Hongbao
    owner: dict[int, str]  # bucket -> primary
    per_packet: int
    rng: random.Random = field(default_factory=lambda: random.Random(17))
    spare: dict[str, Shares] = field(default_factory=lambda: defaultdict(dict))

    async def take(self, primaries: list[str], count: int) -> dict[str, Shares]:
        while any(len(self.spare[p]) < count for p in primaries):
            opened = await send_packets(self.service, 1, self.per_packet, self.rng)
            for packet_id, amounts in opened.items():
                primary = self.owner[bucket_of(packet_id, self.service.settings.buckets)]
                self.spare[primary][packet_id] = amounts
        out: dict[str, Shares] = {}
        for p in primaries:
            ids = list(self.spare[p])[:count]
            out[p] = {i: self.spare[p].pop(i) for i in ids}
        return out

    async def forget(self) -> None:
        await forget_packets(self.service, [i for s in self.spare.values() for i in s])


@dataclass
class Run:
    """What the workers of one run did, and what each server's CPU was meanwhile."""

    placed: dict[str, Shares]
    results: dict[str, dict[str, Any]]
    #: seconds from the first worker's first grab to the last worker's last grab
    wall: float
    #: seconds over which `cpu` was metered (start signal to the last "finished")
    metered: float
    cpu: dict[str, float]  # CPU seconds used during the run, per server
    machine_pct: float | None


async def run_workers(
    ctx: BenchContext, admin: Admin, url: str, buckets: int, placed: dict[str, Shares], user: int
) -> Run:
    """One worker process per entry of `placed` (server name -> its packets), started
    together; users numbered from `user` upwards, one grab each."""
    work = ctx.work_dir / f"cluster-{secrets.token_hex(4)}"
    work.mkdir(parents=True)
    procs: dict[str, asyncio.subprocess.Process] = {}
    logs: dict[str, Path] = {}
    try:
        for i, (node, shares) in enumerate(placed.items()):
            grabs = sum(len(a) for a in shares.values())
            job = Job(
                url, ctx.database_url, buckets, list(shares), user, grabs, ctx.profile.hb_tasks
            )
            user += grabs
            job.dump(work / f"job{i}.json")
            logs[node] = work / f"worker{i}.log"
            with logs[node].open("wb") as log:
                procs[node] = await asyncio.create_subprocess_exec(
                    *(sys.executable, "-m", "hongbao_bench.cluster_worker"),
                    *(str(work / f"job{i}.json"), str(work / f"result{i}.json")),
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log,
                )
        await asyncio.gather(
            *(expect_line(procs[n], "ready", logs[n], "cluster worker") for n in procs)
        )
        cpu0, machine0 = cpu_by_node(admin), machine_busy_seconds()
        t0 = time.perf_counter()
        for proc in procs.values():
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
        await asyncio.gather(*(p.stdin.drain() for p in procs.values() if p.stdin))
        await asyncio.gather(
            *(expect_line(procs[n], "finished", logs[n], "cluster worker") for n in procs)
        )
        metered = time.perf_counter() - t0
        cpu1, machine1 = cpu_by_node(admin), machine_busy_seconds()
        await asyncio.gather(
            *(expect_line(procs[n], "done", logs[n], "cluster worker") for n in procs)
        )
        await asyncio.gather(*(p.wait() for p in procs.values()))
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    results = {
        node: json.loads((work / f"result{i}.json").read_text()) for i, node in enumerate(placed)
    }
    machine = None
    if machine0 is not None and machine1 is not None:
        machine = round((machine1 - machine0) / metered * 100, 1)
    cpu = {n: cpu1[n] - cpu0.get(n, cpu1[n]) for n in cpu1}
    # the grab phase: first worker's start to last worker's end (a shared wall clock)
    wall = max(r["ended"] for r in results.values()) - min(r["began"] for r in results.values())
    return Run(placed, results, wall, metered, cpu, machine)


def _per_server(run: Run) -> list[dict[str, Any]]:
    rows = []
    for node, result in run.results.items():
        grabs = len(result["answers"])
        cpu = run.cpu.get(node, 0.0)
        rows.append(
            {
                "node": node or "single",
                "grabs": grabs,
                "grabs_per_s": round(grabs / result["seconds"], 1) if result["seconds"] else 0.0,
                "redis_cpu_pct": round(cpu / run.metered * 100, 1),
                "grabs_per_cpu_s": round(grabs / cpu, 1) if cpu > 0 else None,
                "redis_us_per_grab": round(cpu / max(1, grabs) * 1e6, 2),
                "client_us_per_grab": round(result["client_cpu_seconds"] / max(1, grabs) * 1e6, 2),
                "grabs_per_call": result["grabs_per_call"],
            }
        )
    return rows


async def audited(name: str, service: Hongbao, run: Run) -> Outcome:
    """The run's figures, and its audit against what Redis holds (then its packets go)."""
    shares = {i: a for packets in run.placed.values() for i, a in packets.items()}
    answers = [tuple(a) for r in run.results.values() for a in r["answers"]]
    user_ids = {user_name(int(a[0])): int(a[0]) for a in answers}
    claims, leftover, problems = await audit_packets(service, shares, user_ids)
    await forget_packets(service, shares)
    rows = _per_server(run)
    cpu_total = sum(run.cpu.get(n, 0.0) for n in run.results)
    grabs = sum(r["grabs"] for r in rows)
    refusals: Counter[str] = Counter()
    for r in run.results.values():
        refusals.update(r["refusals"])
    failures = sum(int(r["failures"]) for r in run.results.values())
    first_error = next((r["first_error"] for r in run.results.values() if r["first_error"]), None)
    idle = {n: round(c / run.metered * 100, 1) for n, c in run.cpu.items() if n not in run.results}
    figures: dict[str, Any] = {
        "primaries": len(run.results),
        "grabs_per_s_per_primary": round(sum(r["grabs_per_s"] for r in rows) / len(rows), 1),
        "grabs_per_primary_cpu_s": round(grabs / cpu_total, 1) if cpu_total > 0 else None,
        "redis_cpu_pct": round(cpu_total / run.metered * 100, 1),
        "per_primary": rows,
        "idle_primaries_cpu_pct": idle,
        "machine_cpu_pct": run.machine_pct,
        "processes": len(run.results),
    }
    result = account(
        name=name,
        backend="redis",
        shares=[a for amounts in shares.values() for a in amounts],
        answers=[(int(u), None if w is None else int(w), float(t)) for u, w, t in answers],
        seconds=run.wall,
        claims=claims,
        leftover=leftover,
        extra={**figures, "packets": len(shares), "refusals": dict(refusals)},
        errors=failures,
        first_error=first_error,
    )
    status = "ok" if result.ok and not problems else "failed"
    note = "; ".join([*problems, problem_note(result)]).strip("; ")
    return Outcome(name, GROUP, status, result, note, figures)


async def single_node(
    ctx: BenchContext, primary: tuple[str | None, str], per_packet: int
) -> Outcome:
    """The same worker against one plain server of the primaries' binary and AOF setting."""
    executable, appendonly = primary
    name = "hongbao-cluster-single"
    if executable is None:
        note = "the primaries' server binary is not on this machine: no single-node reference"
        return Outcome(name, GROUP, "skipped", note=note)
    port = free_port()
    with single_server(executable, appendonly, ctx.work_dir / "single", port) as url:
        settings = ctx.settings(max_count=per_packet)
        service = await Hongbao.connect(replace(settings, redis_url=url), migrate=True)
        admin = admin_for(url)
        try:
            shares = await send_packets(service, PACKETS_PER_PRIMARY, per_packet, random.Random(19))
            ctx.say(f"single node: {per_packet * PACKETS_PER_PRIMARY:,} grabs, 1 process")
            run = await run_workers(ctx, admin, url, settings.buckets, {"": shares}, 1)
            outcome = await audited(name, service, run)
        finally:
            admin.close()
            await service.aclose()
    outcome.figures.update(single=True, appendonly=appendonly)
    return outcome


async def cluster_scenario(ctx: BenchContext) -> list[Outcome]:
    if not ctx.cluster:
        note = "needs --redis-url redis+cluster://host:port,..."
        return [Outcome(GROUP, GROUP, "skipped", note=note)]
    per_packet = max(1, ctx.profile.cluster_grabs // PACKETS_PER_PRIMARY)
    settings = ctx.settings(max_count=per_packet)
    admin = cluster_admin(ctx.redis_url)
    service = await Hongbao.connect(settings, migrate=True)
    outcomes: list[Outcome] = []
    try:
        owned = buckets_by_primary(admin, settings.buckets)
        # a primary serving none of the buckets gets no packets: it cannot be targeted
        order = [n for n in primaries_in_slot_order(admin) if owned.get(n)]
        owner = {b: n for n, bs in owned.items() for b in bs}
        ctx.say("single node reference")
        outcomes.append(await single_node(ctx, node_setup(admin, order[0]), per_packet))
        pool = PacketPool(service, owner, per_packet)
        user = 1
        try:
            for k in range(1, len(order) + 1):
                ctx.say(f"{k} of {len(order)} primaries: opening packets")
                placed = await pool.take(order[:k], PACKETS_PER_PRIMARY)
                ctx.say(f"{k} of {len(order)} primaries: {k} processes grabbing")
                run = await run_workers(ctx, admin, ctx.redis_url, settings.buckets, placed, user)
                user += sum(len(a) for s in placed.values() for a in s.values())
                outcomes.append(await audited(f"{GROUP}-{k}p", service, run))
        finally:
            await pool.forget()
    finally:
        admin.close()
        await service.aclose()
    compare(outcomes)
    return outcomes


def compare(outcomes: list[Outcome]) -> None:
    """Each run's per-primary figures as % of the single node's and of the 1-primary run's."""
    single = next((o for o in outcomes if o.scenario.endswith("-single") and o.result), None)
    first = next((o for o in outcomes if o.figures.get("primaries") == 1 and o is not single), None)
    for o in outcomes:
        if o.result is None or o is single:
            continue
        for label, ref in (("single", single), ("1p", first)):
            if ref is None or ref is o:
                continue
            for key in ("grabs_per_primary_cpu_s", "grabs_per_s_per_primary"):
                mine, theirs = o.figures.get(key), ref.figures.get(key)
                if mine and theirs:
                    o.figures[f"{key}_of_{label}_pct"] = round(100 * mine / theirs, 1)

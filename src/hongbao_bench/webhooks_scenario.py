"""Webhooks: a storm's claim.settled events delivered to a local receiver.

Ten packets (`Profile.webhook_events` shares over them) are grabbed at once, with the
persister and a webhook dispatcher running in this process; the receiver
(`hongbao_bench.webhook_receiver`) runs in a process of its own on a loopback port,
checks each message's signature with `standardwebhooks` and notes when it arrived.

Reported: the persister's pace (claims committed per second, from the first event's
commit to the last's), the dispatcher's (events delivered per second, from the first
commit to the last arrival), their ratio, and the lag from each event's commit (its
``timestamp``) to its arrival, p50 and p99. The dispatcher keeps pace when the ratio is
near 1: the last event arrives soon after the last claim commits. Three storms: the
in-process dispatcher alone (as `hongbao serve` and `hongbao worker` run it), then with
a `hongbao webhooks dispatch` process beside it, both one event a message; then the
in-process dispatcher to an endpoint that takes batches of up to `BATCH` events. The
``webhooks-dispatcher`` rows measure the dispatcher's own rate and CPU per event, one
event a message and in batches: the same number of events already queued, sent by a
dispatcher alone in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import aiohttp
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.errors import HongbaoError
from hongbao.ledger.outbox import OutboxEvent, packet_subject, record_events
from hongbao.persister import Persister
from hongbao.service import Hongbao
from hongbao.webhooks import Dispatcher
from hongbao.webhooks.endpoints import MAX_BATCH_SIZE
from hongbao_bench.common import BenchContext, Outcome, forget_packets, free_port, send_packets
from hongbao_bench.meters import process_cpu_seconds
from hongbao_bench.processes import expect_line, log_tail

PACKETS = 10
#: grabs of the storm in flight at once
IN_FLIGHT = 256
#: longest wait for the last event, seconds
DEADLINE = 180.0
#: the dispatcher keeps pace when it delivers at least this share of the persister's rate
KEEPS_PACE = 0.9


RECEIVER = "webhook-receiver"
#: events a message carries in the batched rows (an endpoint's largest `batch_size`)
BATCH = MAX_BATCH_SIZE
#: the storms: (name, `hongbao webhooks dispatch` processes beside the in-process
#: dispatcher, the endpoint's `batch_size`)
ROWS = (("webhooks", 0, 1), ("webhooks+dispatch", 1, 1), ("webhooks-batched", 0, BATCH))
#: the dispatcher alone: (name, the endpoint's `batch_size`)
ALONE = (("webhooks-dispatcher", 1), ("webhooks-dispatcher-batched", BATCH))


async def webhooks_scenario(ctx: BenchContext) -> list[Outcome]:
    settings = replace(ctx.settings(), webhook_poll_interval=0.02)
    service = await Hongbao.connect(settings, migrate=True)
    try:
        rows = [await _storm(ctx, service, *row) for row in ROWS]
        return [*rows, *[await _dispatcher_alone(ctx, service, *row) for row in ALONE]]
    finally:
        await service.aclose()


async def _storm(
    ctx: BenchContext, service: Hongbao, name: str, processes: int, batch_size: int
) -> Outcome:
    """One storm, its events sent by the in-process dispatcher and `processes` more, to
    an endpoint that takes `batch_size` events a message."""
    settings = service.settings
    shares_each = max(1, ctx.profile.webhook_events // PACKETS)
    expected = PACKETS * shares_each
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    persister = Persister(service.store, service.ledger, settings, consumer="bench-webhooks")
    # the grabs of earlier scenarios are settled first: their events are not this storm's
    await asyncio.wait_for(persister.drain(), DEADLINE)
    async with contextlib.AsyncExitStack() as cleanup:
        endpoint = await service.webhooks.create(
            f"{url}/hook", ["claim.settled"], batch_size=batch_size
        )
        cleanup.push_async_callback(service.webhooks.delete, endpoint.id)
        receiver = await _receiver(ctx, cleanup, port, endpoint.secret)
        dispatchers = []
        for n in range(processes):
            dispatch = [
                "-m",
                "hongbao.cli",
                "webhooks",
                "dispatch",
                "--database-url",
                settings.database_url,
            ]
            dispatchers.append(await _start(ctx, f"webhook-dispatch-{n}", dispatch))
            cleanup.push_async_callback(_stop, dispatchers[-1])
        workers = [
            asyncio.create_task(persister.run(stop)),
            asyncio.create_task(Dispatcher(service.ledger, settings).run(stop)),
        ]
        cleanup.push_async_callback(_stop_workers, stop, workers)
        shares = await send_packets(service, PACKETS, shares_each, random.Random(29))
        cleanup.push_async_callback(forget_packets, service, list(shares))
        beside = f" and {processes} dispatch process(es)" if processes else ""
        ctx.say(
            f"{name}: {expected:,} grabs over {PACKETS} packets, the dispatcher in-process{beside}"
            f", up to {batch_size} event(s) a message"
        )
        claims = iter([(p, f"w{i}") for p in shares for i in range(shares_each)])

        async def grabber() -> None:
            for packet_id, user in claims:
                # a refused grab settles nothing, and the arrivals say what did
                with contextlib.suppress(HongbaoError):
                    await service.grab(packet_id, user)

        cpu = {"bench": time.process_time(), "receiver": process_cpu_seconds(receiver.pid)}
        # IN_FLIGHT grabbers, as from that many connections: no task and semaphore
        # wake-up a grab, so the load takes little of the CPU the persister and the
        # dispatcher share in this process
        await asyncio.gather(*(grabber() for _ in range(IN_FLIGHT)))
        got = await _arrivals(url, expected)
        cpu["bench"] = time.process_time() - cpu["bench"]
        cpu["receiver"] = process_cpu_seconds(receiver.pid) - cpu["receiver"]
        cpu["dispatch processes"] = sum(process_cpu_seconds(d.pid) for d in dispatchers)
    outcome = _outcome(name, got["arrivals"], int(got["forged"]), expected)
    for who, seconds in cpu.items():
        if seconds or who != "dispatch processes":
            key = who.replace(" ", "_") + "_us_per_event"
            outcome.figures[key] = round(seconds / max(1, expected) * 1e6, 1)
    return outcome


async def _dispatcher_alone(
    ctx: BenchContext, service: Hongbao, name: str, batch_size: int
) -> Outcome:
    """The dispatcher's own rate and CPU: `Profile.webhook_events` events already queued
    (over 10 packets), sent by a dispatcher alone in this process to the receiver, up to
    `batch_size` a message."""
    expected = ctx.profile.webhook_events
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as cleanup:
        endpoint = await service.webhooks.create(
            f"{url}/hook", ["claim.settled"], batch_size=batch_size
        )
        cleanup.push_async_callback(service.webhooks.delete, endpoint.id)
        receiver = await _receiver(ctx, cleanup, port, endpoint.secret)
        await _queue_events(service, expected)
        ctx.say(
            f"{name}: {expected:,} queued events, the dispatcher alone, "
            f"up to {batch_size} a message"
        )
        started, cpu = time.time(), time.process_time()
        receiver_cpu = process_cpu_seconds(receiver.pid)
        task = asyncio.create_task(Dispatcher(service.ledger, service.settings).run(stop))
        cleanup.push_async_callback(_stop_workers, stop, [task])
        got = await _arrivals(url, expected)
        cpu = time.process_time() - cpu
        receiver_cpu = process_cpu_seconds(receiver.pid) - receiver_cpu
    count = len(got["arrivals"])
    last = max((a for a, _ in got["arrivals"]), default=started)
    figures = {
        "events": count,
        "events_per_second": round(count / max(last - started, 1e-3), 1),
        "dispatcher_us_per_event": round(cpu / max(1, count) * 1e6, 1),
        "receiver_us_per_event": round(receiver_cpu / max(1, count) * 1e6, 1),
        "forged": int(got["forged"]),
    }
    problems = [f"{count} of {expected} events arrived"] if count != expected else []
    if figures["forged"]:
        problems.append(f"{figures['forged']} messages failed verification")
    summary = (
        f"{count:,} queued events at {figures['events_per_second']:,} events/s, "
        f"{figures['dispatcher_us_per_event']} µs of dispatcher CPU each "
        f"(receiver {figures['receiver_us_per_event']} µs)"
    )
    status = "failed" if problems else "ok"
    note = "; ".join([*problems, summary])
    return Outcome(name, "webhooks", status, note=note, figures=figures)


async def _queue_events(service: Hongbao, count: int) -> None:
    """`count` claim.settled events of 10 packets in the outbox, as the persister writes
    them (a delivery each for the endpoints that receive them)."""
    for first in range(0, count, 1_000):
        batch = [
            OutboxEvent(
                "claim.settled",
                packet_subject(f"bench-{n % PACKETS}"),
                {"packet_id": f"bench-{n % PACKETS}", "user_id": f"w{n}", "seq": n, "amount": 1},
            )
            for n in range(first, min(count, first + 1_000))
        ]

        async def write(conn: AsyncConnection, batch: list[OutboxEvent] = batch) -> int:
            return await record_events(conn, batch)

        await service.ledger.transaction(write)


async def _receiver(
    ctx: BenchContext, cleanup: contextlib.AsyncExitStack, port: int, secret: str
) -> asyncio.subprocess.Process:
    """The receiver process on `port`, stopped with `cleanup`."""
    args = ["-m", "hongbao_bench.webhook_receiver", str(port), secret]
    receiver = await _start(ctx, RECEIVER, args)
    cleanup.push_async_callback(_stop, receiver)
    return receiver


async def _arrivals(url: str, expected: int) -> dict[str, Any]:
    """The receiver's arrivals once `expected` events arrived, or at the deadline."""
    async with aiohttp.ClientSession() as client:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            async with client.get(f"{url}/count") as answer:
                if (await answer.json())["count"] >= expected:
                    break
            await asyncio.sleep(0.1)
        async with client.get(f"{url}/arrivals") as answer:
            got: dict[str, Any] = await answer.json()
            return got


async def _start(ctx: BenchContext, name: str, args: list[str]) -> asyncio.subprocess.Process:
    """A Python child process; started once it says "ready" on stdout (the receiver)
    or "running" on stderr (`hongbao webhooks dispatch`)."""
    log = ctx.work_dir / f"{name}.log"
    env = {**os.environ, "HONGBAO_WEBHOOK_POLL_INTERVAL": "0.02", "PYTHONUNBUFFERED": "1"}
    with log.open("wb") as errors:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *args, stdout=asyncio.subprocess.PIPE, stderr=errors, env=env
        )
    if name == RECEIVER:
        await expect_line(proc, "ready", log, name)
        return proc
    deadline = time.monotonic() + 60
    while "running" not in log_tail(log):
        if proc.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not start: {log_tail(log)}")
        await asyncio.sleep(0.05)
    return proc


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
    await proc.wait()


async def _stop_workers(stop: asyncio.Event, workers: list[asyncio.Task[None]]) -> None:
    stop.set()
    await asyncio.gather(*workers, return_exceptions=True)


def _outcome(name: str, arrivals: list[list[float]], forged: int, expected: int) -> Outcome:
    got = len(arrivals)
    commits = sorted(c for _, c in arrivals)
    first_commit = commits[0] if commits else 0.0
    last_arrival = max((a for a, _ in arrivals), default=first_commit)
    settled_per_second = got / max(commits[-1] - first_commit, 1e-3) if commits else 0.0
    delivered_per_second = got / max(last_arrival - first_commit, 1e-3)
    lags = sorted(max(0.0, a - c) for a, c in arrivals)
    figures = {
        "events": got,
        "settled_per_second": round(settled_per_second, 1),
        "events_per_second": round(delivered_per_second, 1),
        "pace_ratio": round(delivered_per_second / max(settled_per_second, 1e-9), 2),
        "lag_p50_ms": round(_quantile(lags, 0.50) * 1000, 1),
        "lag_p99_ms": round(_quantile(lags, 0.99) * 1000, 1),
        "forged": forged,
    }
    problems = []
    if got != expected:
        problems.append(f"{got} of {expected} events arrived")
    if forged:
        problems.append(f"{forged} messages failed verification")
    summary = (
        f"{got:,} events at {figures['events_per_second']:,} events/s beside "
        f"{figures['settled_per_second']:,} claims/s settled (x{figures['pace_ratio']}); "
        f"commit to arrival p50 {figures['lag_p50_ms']:,} ms, p99 {figures['lag_p99_ms']:,} ms"
    )
    status = "failed" if problems else "ok"
    return Outcome(name, "webhooks", status, note="; ".join([*problems, summary]), figures=figures)


#: a target: (name, value, goal, met)
TargetRow = tuple[str, float | None, str, bool | None]


def webhook_targets(outcomes: Sequence[Outcome]) -> list[TargetRow]:
    """The dispatcher keeps pace with the persister, per row."""
    rows = [o for o in outcomes if o.group == "webhooks" and o.status == "ok"]
    out: list[TargetRow] = []
    for row in rows:
        ratio = row.figures.get("pace_ratio")
        if ratio is not None:
            name = f"{row.scenario}: delivered / settled per second"
            out.append((name, ratio, f">= {KEEPS_PACE}x", ratio >= KEEPS_PACE))
    return out


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(q * len(values)))]

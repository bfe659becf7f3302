"""The hongbao scenarios: `Hongbao.grab` on the service's own storage, audited.

* ``hongbao``: with coalescing, many concurrent grabbers over hot packets;
* ``hongbao-nocoalesce``: the same with ``coalesce_max_batch=1`` (one script call per grab);
* ``hongbao-spread``: the same storm spread over many packets, one grab of each in a call
  (a grab costs Redis most in that shape: the batch script's work is mostly per packet);
* ``ack-modes``: the hongbao scenario, smaller, in each waiting ``--ack`` mode;
* ``hongbao-rules``: the hongbao scenario's number of grabs on packets that each have an
  audience of 1,000 users and a passphrase that every grab sends; each packet's
  members grab it together, as a chat group does: what checking the rules inside the
  grab script costs.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from hongbao.errors import ConfigurationError
from hongbao.runtime import settle_heap
from hongbao.service import Hongbao
from hongbao_bench.common import (
    BenchContext,
    Outcome,
    audit_packets,
    forget_packets,
    problem_note,
    send_packets,
    status_of,
)
from hongbao_bench.harness import account, call_shape, engine_storm
from hongbao_bench.meters import CpuMeter

#: --ack modes measured by the ack-modes group (replica needs a replica server)
BENCH_ACK_MODES = ("aof", "ledger")
#: ack-mode runs grab this fraction of the hongbao scenario's grabs (they are slower)
ACK_MODE_FRACTION = 8
#: hongbao-rules: each packet's audience (and so its shares), its passphrase and the key
#: of the passphrase's digests
RULES_AUDIENCE = 1_000
RULES_PASSPHRASE = "恭喜发财"
RULES_KEY = b"hongbao-bench-passphrase-key-0123456789"


async def _hongbao_run(
    ctx: BenchContext,
    name: str,
    coalesce: bool,
    *,
    group: str | None = None,
    packets: int | None = None,
    per_packet: int | None = None,
    ack_mode: str = "redis",
    rules: bool = False,
) -> Outcome:
    p = ctx.profile
    if packets is None:
        packets = p.hb_packets
    if per_packet is None:
        per_packet = p.hb_shares if coalesce else p.nocoalesce_shares
    overrides: dict[str, Any] = {} if coalesce else {"coalesce_max_batch": 1}
    settings = ctx.settings(ack_mode=ack_mode, **overrides)
    service = await Hongbao.connect(settings, migrate=True, passphrase_keys=[RULES_KEY])
    admin = ctx.admin()
    try:
        n = packets * per_packet
        users = [f"u{k}" for k in range(1, n + 1)]
        # a group's members grab their group's packet together: users j*per_packet ..
        # (j+1)*per_packet - 1 are packet j's audience, and grab it one after the other
        audiences = (
            [users[j * per_packet : (j + 1) * per_packet] for j in range(packets)]
            if rules
            else None
        )
        phrase = RULES_PASSPHRASE if rules else None
        ctx.say(f"opening {packets} packets of {per_packet:,} shares")
        shares = await send_packets(
            service, packets, per_packet, random.Random(7), audiences, phrase
        )
        packet_ids = list(shares)
        if rules:  # engine_storm's grab k takes packet_ids[k % len]: one id per grab
            packet_ids = [pid for pid in packet_ids for _ in range(per_packet)]
        user_ids = {u: k for k, u in enumerate(users, start=1)}
        clock = time.perf_counter
        await asyncio.gather(*(service.store.client.ping() for _ in range(64)))
        ctx.say(f"{n:,} grabs by {p.hb_tasks:,} tasks")
        settle_heap()  # as `hongbao serve` does after startup
        meter, t0 = CpuMeter(admin), clock()
        storm = await engine_storm(service, packet_ids, users, 1, p.hb_tasks, phrase)
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
    status = status_of(result) if not problems else "failed"
    note = "; ".join([*problems, problem_note(result)]).strip("; ")
    return Outcome(name, group or name, status, result, note, figures)


async def hongbao(ctx: BenchContext) -> list[Outcome]:
    return [await _hongbao_run(ctx, "hongbao", coalesce=True)]


async def hongbao_nocoalesce(ctx: BenchContext) -> list[Outcome]:
    return [await _hongbao_run(ctx, "hongbao-nocoalesce", coalesce=False)]


async def hongbao_rules(ctx: BenchContext) -> list[Outcome]:
    """The hongbao scenario's number of grabs, on packets of RULES_AUDIENCE shares, each
    for an audience of as many users and with a passphrase every grab sends."""
    p = ctx.profile
    per_packet = min(RULES_AUDIENCE, p.hb_shares)
    packets = max(p.hb_packets, p.hb_packets * p.hb_shares // per_packet)
    return [
        await _hongbao_run(
            ctx, "hongbao-rules", True, packets=packets, per_packet=per_packet, rules=True
        )
    ]


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

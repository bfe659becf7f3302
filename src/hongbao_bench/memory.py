"""Redis memory per unclaimed share and per claim, and the Python process's peak RSS.

A packet of 10,000 shares is opened through the service; ``MEMORY USAGE`` of its shares
list divided by the share count is the cost of an unclaimed share. After 10,000 grabs,
``MEMORY USAGE`` of its claims hash divided by the claims is the cost of a claim.
Targets: at most 16 bytes per share and 96 bytes per claim.
"""

from __future__ import annotations

import asyncio
import random

from hongbao.service import Hongbao
from hongbao_bench.common import (
    BenchContext,
    Outcome,
    audit_packets,
    forget_packets,
    send_packets,
)


async def memory_scenario(ctx: BenchContext) -> list[Outcome]:
    n = ctx.profile.memory_shares
    settings = ctx.settings()
    service = await Hongbao.connect(settings, migrate=True)
    admin = ctx.admin()
    try:
        ctx.say(f"one packet of {n:,} shares")
        shares = await send_packets(service, 1, n, random.Random(5))
        (packet_id,) = shares
        keys = service.store.keys(packet_id)
        share_bytes = int(admin.memory_usage(keys.shares, samples=0) or 0)
        share_encoding = str(admin.object("encoding", keys.shares))
        ctx.say(f"{n:,} grabs")
        users = [f"m{k}" for k in range(1, n + 1)]
        queue = iter(users)

        async def grabber() -> None:
            for user in queue:
                await service.grab(packet_id, user)

        await asyncio.gather(*(grabber() for _ in range(500)))
        claims_bytes = int(admin.memory_usage(keys.claims, samples=0) or 0)
        claims_encoding = str(admin.object("encoding", keys.claims))
        sample = admin.hget(keys.claims, users[-1]) or ""
        meta_bytes = int(admin.memory_usage(keys.meta, samples=0) or 0)
        _, leftover, problems = await audit_packets(service, shares, {u: 1 for u in users})
        claimed = len(await service.store.claims(keys))
        await forget_packets(service, shares)
    finally:
        admin.close()
        await service.aclose()
    per_share = share_bytes / n
    per_claim = claims_bytes / max(1, claimed)
    figures = {
        "shares": n,
        "shares_key_bytes": share_bytes,
        "shares_encoding": share_encoding,
        "bytes_per_share": round(per_share, 2),
        "claims": claimed,
        "claims_key_bytes": claims_bytes,
        "claims_encoding": claims_encoding,
        "bytes_per_claim": round(per_claim, 2),
        "claim_value_example": sample,
        "meta_key_bytes": meta_bytes,
        "target_bytes_per_share": 16,
        "target_bytes_per_claim": 96,
    }
    if claimed != n or leftover != (0, 0):
        problems.append(f"{claimed} claims of {n}, leftover {leftover}")
    status = "failed" if problems else "ok"
    return [Outcome("memory", "memory", status, note="; ".join(problems), figures=figures)]

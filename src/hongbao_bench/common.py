"""What every scenario of `hongbao bench` shares: its context (`BenchContext`), its report
row (`Outcome`), and the packet helpers that open, audit and forget the bench's packets.

The scenario modules import this one; `scenarios` (the registry) imports them.
"""

from __future__ import annotations

import random
import socket
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from hongbao.domain.splitting import SplitLimits
from hongbao.ledger import database_url
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao_bench.cluster import Admin, admin_for, is_cluster_url
from hongbao_bench.profiles import MEMORY_SHARES, Profile
from hongbao_bench.results import ScenarioResult

#: scenario groups whose failure makes `hongbao bench` exit non-zero (hongbao-nocoalesce is a
#: comparison with coalescing off, not the shipped configuration: shown failing, not fatal)
OURS = frozenset(
    {
        "hongbao",
        "hongbao-spread",
        "ack-modes",
        "hongbao-rules",
        "hongbao-http",
        "memory",
        "history",
        "settle",
        "hongbao-cluster",
    }
)
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_MYSQL_URL = "mysql://root@127.0.0.1:3306/test"
#: the user who deposits and sends every packet of the bench
SENDER = "bench-sender"


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
        """Service settings on the bench's servers (packets up to `max_count` shares; no
        sender limits: one sender sends every packet of the bench)."""
        biggest = max(max_count, self.profile.hb_shares, MEMORY_SHARES)
        unlimited = {"max_sends_per_day": 0, "max_sent_per_day": 0}
        return Settings.from_env(
            {},
            redis_url=self.redis_url,
            database_url=self.database_url,
            split_limits=SplitLimits(max_count=biggest),
            **{**unlimited, **overrides},
        )


def status_of(result: ScenarioResult) -> str:
    """An Outcome status for a result: ok, or failed when its money did not add up."""
    return "ok" if result.ok else "failed"


def problem_note(result: ScenarioResult) -> str:
    """What went wrong in a result, as one note ("" when nothing did)."""
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


def free_port() -> int:
    """A TCP port free on loopback now (the OS picks it), for a server the bench starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def send_packets(
    service: Hongbao,
    packets: int,
    shares: int,
    rng: random.Random,
    audiences: Sequence[Sequence[str]] | None = None,
    passphrase: str | None = None,
) -> dict[str, list[int]]:
    """Open `packets` lucky packets of `shares` shares, packet j for audiences[j] when
    given, each with `passphrase` when given; packet id -> share amounts."""
    out: dict[str, list[int]] = {}
    for j in range(packets):
        total = shares * rng.randint(100, 300)
        await service.deposit(SENDER, total)
        packet = await service.send(
            SENDER,
            total,
            shares,
            "lucky",
            expires_in=3_600,
            audience=None if audiences is None else audiences[j],
            passphrase=passphrase,
        )
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


async def admin_statement(admin_url: str, statement: str) -> list[tuple[Any, ...]]:
    """Run one statement outside a transaction on a database server's admin connection
    (CREATE DATABASE, DROP DATABASE, a catalog query); the rows it returned."""
    engine = create_async_engine(database_url(admin_url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            result = await conn.execute(sa.text(statement))
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        await engine.dispose()

"""`hongbao audit` and `hongbao recover`: check every money invariant; rebuild Redis.

The audit is safe while the service runs. Per open packet it takes one atomic
snapshot of the packet in Redis (claims, shares, meta), then reads the
event streams (claims not yet persisted), then the ledger's claims, so that

- every claim Redis holds is in the ledger or still pending in a stream
  (a claim acknowledged but neither persisted nor pending is a lost claim),
- every claim the ledger holds is in Redis (re-read, for grabs made meanwhile),
- no share is issued twice and no user holds two shares,
- claimed + still grabbable (or refunded) = total, in Redis,

plus the ledger's own invariants (`SqlLedger.audit`: counters match claims,
claimed + refunded = total for closed packets, no share or user claimed twice, no
negative balance, each wallet = the sum of its entries, wallets + money held in open
packets = deposits).
Dead-letter entries are listed (they are not by themselves a violation: a claim
that was dead-lettered shows up as a Redis claim missing from the ledger).

`recover` rebuilds open packets Redis lost entirely (from the ledger: unclaimed
shares and the earlier claims) and repairs packets Redis lost part of (a claim
the ledger has but Redis forgot is put back and its share taken out of the
unclaimed list, in one script call, atomic with respect to grabs). A packet
Redis closed after forgetting claims refunded their money again, a refund the ledger
refuses; recover puts the claims back and emits the refund of what is really left.
Packets the ledger holds as spent (every share claimed) are repaired the same way while
their keys may live (Redis may have lost their last claims after the ledger had them,
and would offer those shares again), and a spent packet's claims hash without a
lifetime gets one.
It is idempotent and safe while the service runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hongbao.domain.moments import ms
from hongbao.ledger.sql import ClaimRow, PacketRecord
from hongbao.service import Hongbao
from hongbao.storage.codec import ClaimValue, Grants, decode_entries
from hongbao.storage.redis import Event, PacketSnapshot

#: how long the audit waits for the persister to drain before comparing (informational)
SETTLE_SECONDS = 10.0


@dataclass
class AuditReport:
    violations: list[str] = field(default_factory=list)
    backlog: int = 0
    dead_letters: list[Event] = field(default_factory=list)
    open_packets: int = 0
    missing_in_redis: int = 0
    pending_claims: int = 0

    @property
    def clean(self) -> bool:
        return not self.violations

    def lines(self) -> list[str]:
        out = [
            f"open packets checked: {self.open_packets}",
            f"stream backlog: {self.backlog} entries ({self.pending_claims} claims pending)",
            f"dead-letter entries: {len(self.dead_letters)}"
            + (" (`hongbao dead-letters` lists and retries them)" if self.dead_letters else ""),
        ]
        for event in self.dead_letters:
            fields = " ".join(f"{k}={v}" for k, v in event.fields.items())
            out.append(f"  dead letter {event.stream} {event.id}: {fields}")
        out.extend(f"VIOLATION {v}" for v in self.violations)
        out.append("audit: clean" if self.clean else f"audit: {len(self.violations)} violation(s)")
        return out


@dataclass
class RecoverReport:
    rebuilt: int = 0
    repaired_claims: int = 0
    conflicts: list[str] = field(default_factory=list)
    #: claims hashes of spent packets that had no lifetime and got one
    claims_lifetimes: int = 0


# -- reading ------------------------------------------------------------------------------


async def pending_claims(service: Hongbao) -> dict[tuple[str, str], ClaimValue]:
    """Claims still in the bucket streams (granted, not yet applied): (packet, user) -> claim."""
    found: dict[tuple[str, str], ClaimValue] = {}
    async for event in service.store.stream_entries():
        with contextlib.suppress(ValueError):  # a malformed entry is the persister's to park
            for entry in decode_entries(event.fields):
                if isinstance(entry, Grants):
                    for user, claim in entry.claims:
                        found[(entry.packet_id, user)] = claim
    return found


async def each_packet(
    page: Callable[..., Awaitable[list[PacketRecord]]],
) -> AsyncIterator[PacketRecord]:
    """Every packet of a ledger listing read page by page (`page(after_id=...)`, by id)."""
    after = ""
    while batch := await page(after_id=after):
        for record in batch:
            yield record
        after = batch[-1].id


def open_packets(service: Hongbao) -> AsyncIterator[PacketRecord]:
    return each_packet(service.ledger.open_packets)


def spent_packets(service: Hongbao) -> AsyncIterator[PacketRecord]:
    return each_packet(service.ledger.spent_packets)


# -- audit --------------------------------------------------------------------------------


async def audit(service: Hongbao, settle: float = SETTLE_SECONDS) -> AuditReport:
    """Every invariant; `settle` seconds are given to a running persister to drain first."""
    report = AuditReport()
    store = service.store
    deadline = asyncio.get_running_loop().time() + settle
    while True:  # polling another process's progress: no event to wait on
        backlog = await store.backlog()
        if not backlog or asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(0.2)
    report.backlog = backlog
    report.violations.extend(await service.ledger.audit())

    records = [r async for r in open_packets(service)]
    report.open_packets = len(records)
    snaps: dict[str, PacketSnapshot | None] = {}
    for record in records:
        snaps[record.id] = await store.snapshot(service.keys_of(record.id))
    pending = await pending_claims(service)
    report.pending_claims = len(pending)

    for record in records:
        snap = snaps[record.id]
        if snap is None:
            report.missing_in_redis += 1
            report.violations.append(
                f"packet {record.id}: open in the ledger but missing from Redis "
                "(run `hongbao recover`)"
            )
            continue
        report.violations.extend(
            await _compare(
                service, record, snap, await service.ledger.claims_of(record.id), pending
            )
        )
    report.dead_letters = await store.dead_letters(limit=1000)
    return report


async def _compare(
    service: Hongbao,
    record: PacketRecord,
    snap: PacketSnapshot,
    ledger_claims: list[ClaimRow],
    pending: dict[tuple[str, str], ClaimValue],
) -> list[str]:
    pid = record.id
    out: list[str] = []
    # Redis on its own
    holders: dict[int, str] = {}
    for user, claim in snap.claims.items():
        if claim.share_index in holders:
            out.append(
                f"packet {pid}: share {claim.share_index} issued twice "
                f"({holders[claim.share_index]}, {user})"
            )
        holders[claim.share_index] = user
    for index, _ in snap.shares:
        if index in holders:
            out.append(f"packet {pid}: share {index} is both claimed and still grabbable")
    if snap.claimed_amount + snap.left != record.total_amount:
        out.append(
            f"packet {pid}: Redis claimed {snap.claimed_amount} + left {snap.left} "
            f"!= total {record.total_amount}"
        )
    if not snap.closed:
        if sum(a for _, a in snap.shares) != snap.left:
            out.append(
                f"packet {pid}: Redis shares sum to {sum(a for _, a in snap.shares)}, "
                f"left says {snap.left}"
            )
        if len(snap.claims) + len(snap.shares) != record.count:
            out.append(
                f"packet {pid}: Redis has {len(snap.claims)} claims + {len(snap.shares)} shares "
                f"!= count {record.count}"
            )
    # Redis vs the ledger (+ claims pending in the streams)
    in_ledger = {c.user_id: c for c in ledger_claims}
    for user, claim in snap.claims.items():
        row = in_ledger.get(user)
        if row is not None:
            if (row.share_idx, row.amount) != (claim.share_index, claim.amount):
                out.append(
                    f"packet {pid}: {user} holds share {claim.share_index} ({claim.amount} fen) "
                    f"in Redis but share {row.share_idx} ({row.amount} fen) in the ledger"
                )
            continue
        queued = pending.get((pid, user))
        if queued is None or (queued.seq, queued.amount) != (claim.seq, claim.amount):
            out.append(
                f"packet {pid}: claim of {user} (share {claim.share_index}, {claim.amount} fen) "
                "is in Redis but neither in the ledger nor pending"
            )
    missing = [c for c in ledger_claims if c.user_id not in snap.claims]
    if missing:  # grabs made after the snapshot are in Redis by now
        fresh = await service.store.claims(service.keys_of(pid))
        for row in missing:
            found = fresh.get(row.user_id)
            if found is None:
                out.append(
                    f"packet {pid}: ledger claim of {row.user_id} (share {row.share_idx}) "
                    "is missing from Redis (run `hongbao recover`)"
                )
            elif (found.share_index, found.amount) != (row.share_idx, row.amount):
                out.append(
                    f"packet {pid}: {row.user_id} holds share {row.share_idx} in the ledger "
                    f"but share {found.share_index} in Redis"
                )
    return out


# -- recover ------------------------------------------------------------------------------


async def recover(service: Hongbao) -> RecoverReport:
    """Rebuild what Redis lost of the open and the spent packets, from the ledger.
    Idempotent."""
    report = RecoverReport()
    store = service.store
    await store.ensure_groups()  # a wiped Redis lost the streams' consumer group too
    async for record in open_packets(service):
        if await service.live_status(record.id) is None:
            report.rebuilt += await service.ensure_loaded(record.id)
            continue
        await _restore_claims(service, record, report)
    retention_ms = service.settings.retention_seconds * 1000
    now_ms = ms(datetime.now(UTC))
    async for record in spent_packets(service):
        end_of_life = ms(record.expires_at) + retention_ms
        keys = service.keys_of(record.id)
        if end_of_life > now_ms and await service.live_status(record.id) is not None:
            await _restore_claims(service, record, report)
        report.claims_lifetimes += await store.keep_spent_claims(keys, end_of_life)
    return report


async def _restore_claims(service: Hongbao, record: PacketRecord, report: RecoverReport) -> None:
    """Put back into Redis the claims of `record` the ledger has and Redis forgot."""
    ledger_claims = await service.ledger.claims_of(record.id)
    if not ledger_claims:
        return
    restored, conflicts = await service.store.restore_claims(
        service.keys_of(record.id),
        record.sender_id,
        [
            (c.user_id, ClaimValue.of_share(c.share_idx, c.amount, ms(c.claimed_at)))
            for c in ledger_claims
        ],
    )
    report.repaired_claims += restored
    report.conflicts.extend(conflicts)

"""Applying a persister batch of claim and refund events, inside one transaction.

Whatever the batch's size, the same few set-based statements (see hongbao.ledger.bulk):
lock the batch's packets, look up its shares and the claims already on them, then insert
the new claims and ledger entries, credit the wallets and update the packets. Each event
is judged in Python, in batch order, between the lookup and the writes.

The usual batch, in which every claim is new, needs no lookup of the claims: if its
claims conflict with none of each other, they are inserted in a savepoint, checked
against their shares' amounts (`Bulk.insert_new_claims`), and the ledger's unique keys
refuse the batch if any claim is not new (a replay after a crash, or a claim Redis should
never have granted). Then, and only then, the savepoint is undone and the batch looked
up and judged claim by claim.

Lock order, so that persisters sharing buckets cannot deadlock: packets in id order
(FOR UPDATE on PostgreSQL and MariaDB; SQLite locks the whole database), then wallets
in user order. Claims and entries need no lock of their own: their unique keys belong
to a packet this transaction holds.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.bulk import Columns, bulk_for
from hongbao.ledger.outbox import (
    OutboxEvent,
    claim_settled,
    packet_closed,
    packet_exhausted,
    record_made_events,
)
from hongbao.ledger.records import (
    PACKET_COLUMNS,
    ClaimEvent,
    LedgerEvent,
    PacketRecord,
    RefundEvent,
    among,
    chunks,
    map_distinct,
    packet_from_row,
    refund_reference,
    to_db,
    utcnow,
)
from hongbao.ledger.rules import refund_status
from hongbao.ledger.schema import packets


class ApplyBatch:
    """One persister batch inside one transaction."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self.bulk = bulk_for(conn)

    async def run(self, events: Sequence[LedgerEvent]) -> list[str | None]:
        outcome: list[str | None] = [None] * len(events)
        found = await self._lock_packets(sorted({e.packet_id for e in events}))
        claims_in: list[tuple[int, ClaimEvent]] = []
        for pos, ev in enumerate(events):
            if ev.packet_id not in found:
                outcome[pos] = f"packet {ev.packet_id} is not in the ledger"
            elif isinstance(ev, ClaimEvent):
                claims_in.append((pos, ev))
        now = utcnow()
        new = await self._insert_unchecked(claims_in, now)
        if new is None:
            new = await self._check_claims(claims_in, outcome)
            await self._insert_claims(new, now)
        changes = _Changes(found, new)
        for pos, ev in enumerate(events):
            if isinstance(ev, RefundEvent) and outcome[pos] is None:
                outcome[pos] = changes.refund(ev)
        await self._write(new, changes, now)
        await record_made_events(self.conn, lambda types: changes.events(new, types))
        return outcome

    async def _lock_packets(self, ids: list[str]) -> dict[str, PacketRecord]:
        found: dict[str, PacketRecord] = {}
        for chunk in chunks(ids):
            query = (
                sa.select(*PACKET_COLUMNS)
                .where(among(self.conn, packets.c.id, chunk))
                .order_by(packets.c.id)
                .with_for_update()
            )
            found.update((r.id, packet_from_row(r)) for r in await self.conn.execute(query))
        return found

    async def _insert_unchecked(
        self, claims_in: list[tuple[int, ClaimEvent]], now: datetime
    ) -> list[ClaimEvent] | None:
        """The usual batch, in which every claim is new, without the lookup: if no two
        claims conflict, all are inserted at once, in a savepoint, if each names a share
        of the amount it claims. A unique key of the ledger refusing one (a replay, or a
        share or user claimed before) undoes that, and returns None, as does a conflict
        or a share that differs: then `_check_claims` judges each."""
        if not claims_in:
            return []
        distinct = _without_conflicts(claims_in)
        if distinct is None:
            return None
        try:
            async with self.conn.begin_nested() as savepoint:
                if not await self.bulk.insert_new_claims(_claim_columns(distinct), now):
                    await savepoint.rollback()
                    return None
        except sa.exc.IntegrityError:
            return None
        return distinct

    async def _check_claims(
        self, claims_in: list[tuple[int, ClaimEvent]], outcome: list[str | None]
    ) -> list[ClaimEvent]:
        """The claims to apply now, in batch order; the refused ones get their reason in
        `outcome`. Replays (the same user and share again) are neither."""
        if not claims_in:
            return []
        keys = list(
            dict.fromkeys((e.packet_id, e.share_idx, e.user_id, e.amount) for _, e in claims_in)
        )
        # the lookup names only shares missing (None) or of another amount than some
        # event says, and shares or users claimed already: any other share exists with
        # the amount its events say, and is free
        amounts: dict[tuple[str, int], int | None] = {}
        holder: dict[tuple[str, int], str] = {}  # (packet, share) -> the user holding it
        held: dict[tuple[str, str], int] = {}  # (packet, user) -> the share this user holds
        for pid, idx, user, amount, holding, share in await self.bulk.lookup(
            list(zip(*keys, strict=True))
        ):
            amounts[pid, idx] = amount
            if holding is not None:
                holder[pid, idx] = holding
                held[pid, holding] = idx
            if share is not None:
                held[pid, user] = share
                holder[pid, share] = user
        accepted: list[ClaimEvent] = []
        for pos, ev in claims_in:
            share_key = (ev.packet_id, ev.share_idx)
            if holder.get(share_key) == ev.user_id:
                continue  # applied before: a replay
            reason = _claim_refusal(ev, amounts.get(share_key, ev.amount), holder, held)
            if reason is not None:
                outcome[pos] = reason
            else:
                holder[share_key] = ev.user_id
                held[ev.packet_id, ev.user_id] = ev.share_idx
                accepted.append(ev)
        return accepted

    async def _insert_claims(self, new: list[ClaimEvent], now: datetime) -> None:
        if new:
            await self.bulk.insert_claims(_claim_columns(new), now)

    async def _write(self, new: list[ClaimEvent], changes: _Changes, now: datetime) -> None:
        """What follows the claims: the refunds' entries, the wallets, the packets."""
        refunds = changes.refunds
        if refunds:
            n = len(refunds)
            await self.bulk.insert_entries(
                (
                    [refund_reference(r.packet_id) for r in refunds],
                    [r.sender_id for r in refunds],
                    ["refund"] * n,
                    [r.amount for r in refunds],
                    [r.packet_id for r in refunds],
                    [None] * n,
                    [now] * n,
                )
            )
        credits: dict[str, int] = {}
        for ev in new:
            credits[ev.user_id] = credits.get(ev.user_id, 0) + ev.amount
        for r in refunds:
            credits[r.sender_id] = credits.get(r.sender_id, 0) + r.amount
        if credits:
            by_user = sorted(credits.items())
            await self.bulk.credit([u for u, _ in by_user], [a for _, a in by_user], now)
        if changes.added:
            await self.bulk.update_packets(changes.columns())


def _share_key(ev: ClaimEvent) -> tuple[str, int]:
    return ev.packet_id, ev.share_idx


def _claim_columns(new: Sequence[ClaimEvent]) -> Columns:
    """CLAIMED_COLUMNS of the claims, in key order: index insertions land next to each
    other, and every batch inserts in one order."""
    new = sorted(new, key=_share_key)
    pids = [e.packet_id for e in new]
    idxs = [e.share_idx for e in new]
    return (
        pids,
        idxs,
        [e.user_id for e in new],
        [e.amount for e in new],
        map_distinct(to_db, [e.claimed_at for e in new]),
        [e.actor for e in new],
    )


def _without_conflicts(claims_in: list[tuple[int, ClaimEvent]]) -> list[ClaimEvent] | None:
    """The claims in batch order without their repeats (the same user and share again:
    a replay, with no outcome of its own), if no two of the rest claim one share or are
    one user's in one packet; None if some do (then the batch's order decides which
    applies, see `_check_claims`)."""
    first: dict[tuple[str, int, str], ClaimEvent] = {}
    for _, ev in claims_in:
        first.setdefault((ev.packet_id, ev.share_idx, ev.user_id), ev)
    shares_taken = {(pid, idx) for pid, idx, _ in first}
    users_in = {(pid, user) for pid, _, user in first}
    if len(shares_taken) != len(first) or len(users_in) != len(first):
        return None
    return list(first.values())


def _claim_refusal(
    ev: ClaimEvent,
    amount: int | None,
    holder: dict[tuple[str, int], str],
    held: dict[tuple[str, str], int],
) -> str | None:
    """Why a claim that is not a replay can never apply, or None if it can."""
    pid, idx = ev.packet_id, ev.share_idx
    if amount is None:
        return f"packet {pid} has no share {idx}"
    if amount != ev.amount:
        return f"share {idx} of {pid} is {amount} fen, event says {ev.amount}"
    if (pid, idx) in holder:
        return f"share {idx} of {pid} was claimed by {holder[pid, idx]}"
    if (pid, ev.user_id) in held:
        return f"{ev.user_id} already claimed share {held[pid, ev.user_id]} of {pid}"
    return None


@dataclass(slots=True)
class _Added:
    """What a batch adds to one packet."""

    claims: int = 0
    claimed: int = 0
    refunded: int = 0
    closed_at: datetime | None = None


class _Changes:
    """What the batch does to its packets: counters added per packet, refunds, status.

    Keeps each locked packet's record up to date in memory, so a refund is judged after
    the batch's claims and a second refund of the same packet is a replay.
    """

    def __init__(self, found: dict[str, PacketRecord], new: list[ClaimEvent]) -> None:
        self.found = found
        self.added: dict[str, _Added] = {}
        #: the refunds that move money
        self.refunds: list[RefundEvent] = []
        #: the packets this batch closes (cancelled, or expired with or without a remainder)
        self.closed: list[RefundEvent] = []
        for ev in new:
            added = self.added.get(ev.packet_id)
            if added is None:
                added = self.added[ev.packet_id] = _Added()
            added.claims += 1
            added.claimed += ev.amount
        for pid, added in self.added.items():
            record = found[pid]
            n_after = record.claimed_count + added.claims
            found[pid] = replace(
                record,
                claimed_count=n_after,
                claimed_amount=record.claimed_amount + added.claimed,
                status="exhausted" if n_after == record.count else record.status,
            )

    def refund(self, ev: RefundEvent) -> str | None:
        record = self.found[ev.packet_id]
        if record.closed_at is not None:
            return None  # refunded before
        if ev.sender_id != record.sender_id:
            return f"refund of {ev.packet_id} names sender {ev.sender_id}, not {record.sender_id}"
        if record.claimed_amount + ev.amount > record.total_amount:
            return (
                f"refund of {ev.amount} fen for {ev.packet_id} would exceed its total "
                f"({record.claimed_amount} claimed of {record.total_amount})"
            )
        added = self.added.setdefault(ev.packet_id, _Added())
        added.refunded += ev.amount
        added.closed_at = to_db(ev.closed_at)
        self.found[ev.packet_id] = replace(
            record,
            refunded_amount=record.refunded_amount + ev.amount,
            closed_at=ev.closed_at,
            status=refund_status(ev),
        )
        if ev.amount:
            self.refunds.append(ev)
        self.closed.append(ev)
        return None

    def events(self, new: list[ClaimEvent], types: Collection[str]) -> list[OutboxEvent]:
        """What the batch reports of `types`, in the order it happened per packet: each
        new claim (batch order), a packet its claims ran out (once: the claim that took
        its last share is in this batch), then the packets it closed. A replay reports
        nothing: it is neither a new claim nor a refund applied now."""
        out = [claim_settled(ev) for ev in new] if "claim.settled" in types else []
        if "packet.exhausted" in types:
            for pid, added in sorted(self.added.items()):
                record = self.found[pid]
                if added.claims and record.claimed_count == record.count:
                    out.append(packet_exhausted(record))
        # a refund of nothing at expiry closes a packet whose shares all went: it
        # reported packet.exhausted when its last claim applied
        out.extend(packet_closed(ev) for ev in self.closed if ev.cancelled or ev.amount)
        return out

    def columns(self) -> Columns:
        """PACKET_CHANGE_COLUMNS: one row per packet touched, in packet id order."""
        rows = [
            (pid, a.claims, a.claimed, a.refunded, self.found[pid].status, a.closed_at)
            for pid, a in sorted(self.added.items())
        ]
        return [list(column) for column in zip(*rows, strict=True)]

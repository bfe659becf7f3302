"""Applying a persister batch of claim and refund events, inside one transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.records import (
    PACKET_COLUMNS,
    ClaimEvent,
    LedgerEvent,
    PacketRecord,
    RefundEvent,
    among,
    chunks,
    credit,
    ensure_wallets,
    entry_row,
    packet_from_row,
    to_db,
)
from hongbao.ledger.rules import refund_status
from hongbao.ledger.schema import claims, entries, packets, shares


class ApplyBatch:
    """One persister batch inside one transaction."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def run(self, events: Sequence[LedgerEvent]) -> list[str | None]:
        outcome: list[str | None] = [None] * len(events)
        packet_ids = sorted({e.packet_id for e in events})
        found = await self._lock_packets(packet_ids)
        by_packet: dict[str, list[int]] = defaultdict(list)
        for pos, ev in enumerate(events):
            if ev.packet_id not in found:
                outcome[pos] = f"packet {ev.packet_id} is not in the ledger"
            else:
                by_packet[ev.packet_id].append(pos)
        new_claims: list[ClaimEvent] = []
        for pid, positions in by_packet.items():
            items = [(p, e) for p in positions if isinstance(e := events[p], ClaimEvent)]
            accepted, rejected = await self._check_claims(pid, items)
            new_claims.extend(accepted)
            for pos, reason in rejected:
                outcome[pos] = reason
        await self._write_claims(new_claims, found)
        for pos, ev in enumerate(events):
            if isinstance(ev, RefundEvent) and outcome[pos] is None:
                outcome[pos] = await self._refund(ev, found[ev.packet_id])
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

    async def _check_claims(
        self, packet_id: str, claims_in: list[tuple[int, ClaimEvent]]
    ) -> tuple[list[ClaimEvent], list[tuple[int, str]]]:
        """Split a packet's claim events into new ones and ones that can never apply.

        Replays (the same user and share again) are in neither list.
        """
        if not claims_in:
            return [], []
        idxs = sorted({e.share_idx for _, e in claims_in})
        users = sorted({e.user_id for _, e in claims_in})
        amounts: dict[int, int] = {}
        by_idx: dict[int, str] = {}
        by_user: dict[str, int] = {}
        for chunk in chunks(idxs):
            rows = await self.conn.execute(
                sa.select(shares.c.idx, shares.c.amount).where(
                    shares.c.packet_id == packet_id, among(self.conn, shares.c.idx, chunk)
                )
            )
            amounts.update((int(i), int(a)) for i, a in rows)
        lookups: list[tuple[Any, Sequence[Any]]] = [
            (claims.c.share_idx, idxs),
            (claims.c.user_id, users),
        ]
        for column, values in lookups:
            for chunk in chunks(values):
                rows = await self.conn.execute(
                    sa.select(claims.c.share_idx, claims.c.user_id).where(
                        claims.c.packet_id == packet_id, among(self.conn, column, chunk)
                    )
                )
                for i, u in rows:
                    by_idx[int(i)] = u
                    by_user[u] = int(i)
        accepted: list[ClaimEvent] = []
        rejected: list[tuple[int, str]] = []
        for pos, ev in claims_in:
            if by_idx.get(ev.share_idx) == ev.user_id:
                continue  # applied before: a replay
            if ev.share_idx not in amounts:
                rejected.append((pos, f"packet {packet_id} has no share {ev.share_idx}"))
            elif amounts[ev.share_idx] != ev.amount:
                rejected.append(
                    (
                        pos,
                        f"share {ev.share_idx} of {packet_id} is "
                        f"{amounts[ev.share_idx]} fen, event says {ev.amount}",
                    )
                )
            elif ev.share_idx in by_idx:
                rejected.append(
                    (
                        pos,
                        f"share {ev.share_idx} of {packet_id} was claimed by "
                        f"{by_idx[ev.share_idx]}",
                    )
                )
            elif ev.user_id in by_user:
                rejected.append(
                    (
                        pos,
                        f"{ev.user_id} already claimed share {by_user[ev.user_id]} of {packet_id}",
                    )
                )
            else:
                by_idx[ev.share_idx] = ev.user_id
                by_user[ev.user_id] = ev.share_idx
                accepted.append(ev)
        return accepted, rejected

    async def _write_claims(self, new: list[ClaimEvent], found: dict[str, PacketRecord]) -> None:
        if not new:
            return
        await self.conn.execute(
            claims.insert(),
            [
                {
                    "packet_id": e.packet_id,
                    "share_idx": e.share_idx,
                    "user_id": e.user_id,
                    "amount": e.amount,
                    "claimed_at": to_db(e.claimed_at),
                }
                for e in new
            ],
        )
        await self.conn.execute(
            entries.insert(),
            [
                entry_row(
                    f"claim:{e.packet_id}:{e.share_idx}",
                    e.user_id,
                    "claim",
                    e.amount,
                    e.packet_id,
                    e.actor,
                )
                for e in new
            ],
        )
        credits: dict[str, int] = defaultdict(int)
        per_packet: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for e in new:
            credits[e.user_id] += e.amount
            per_packet[e.packet_id][0] += 1
            per_packet[e.packet_id][1] += e.amount
        await ensure_wallets(self.conn, credits)
        await credit(self.conn, credits)
        for pid, (n, amount) in sorted(per_packet.items()):
            record = found[pid]
            n_after = record.claimed_count + n
            status = "exhausted" if n_after == record.count else record.status
            await self.conn.execute(
                packets.update()
                .where(packets.c.id == pid)
                .values(
                    claimed_count=packets.c.claimed_count + n,
                    claimed_amount=packets.c.claimed_amount + amount,
                    status=status,
                )
            )
            found[pid] = replace(
                record,
                claimed_count=n_after,
                claimed_amount=record.claimed_amount + amount,
                status=status,
            )

    async def _refund(self, ev: RefundEvent, record: PacketRecord) -> str | None:
        if record.closed_at is not None:
            return None  # refunded before
        if ev.sender_id != record.sender_id:
            return f"refund of {ev.packet_id} names sender {ev.sender_id}, not {record.sender_id}"
        if record.claimed_amount + ev.amount > record.total_amount:
            return (
                f"refund of {ev.amount} fen for {ev.packet_id} would exceed its total "
                f"({record.claimed_amount} claimed of {record.total_amount})"
            )
        status = refund_status(ev)
        await self.conn.execute(
            packets.update()
            .where(packets.c.id == ev.packet_id)
            .values(refunded_amount=ev.amount, closed_at=to_db(ev.closed_at), status=status)
        )
        if ev.amount:
            await ensure_wallets(self.conn, [ev.sender_id])
            await credit(self.conn, {ev.sender_id: ev.amount})
            await self.conn.execute(
                entries.insert(),
                [
                    entry_row(
                        f"refund:{ev.packet_id}", ev.sender_id, "refund", ev.amount, ev.packet_id
                    )
                ],
            )
        return None

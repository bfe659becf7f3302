"""Ledger invariants: every packet's money accounted for, every wallet explained, every
withdrawal matched by its entries."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.schema import CLAIM_KIND, claims, entries, packets, shares, wallets
from hongbao.ledger.withdrawals import audit_withdrawals


async def audit_ledger(conn: AsyncConnection) -> list[str]:
    """Every returned line names a violated invariant and the packet or wallet.

    `conn` must read one snapshot (`hongbao.ledger.history.snapshot`): the checks are
    several statements, and at READ COMMITTED a commit between two of them (a claim
    applied, a withdrawal requested) would make their totals disagree."""
    problems, held = await _packets(conn)
    problems.extend(await _claimed_twice(conn))
    problems.extend(await _claims_off_their_share(conn))
    problems.extend(await _claim_entries(conn))
    problems.extend(await _wallets(conn))
    withdrawal_problems, in_flight, withdrawn = await audit_withdrawals(conn)
    problems.extend(withdrawal_problems)
    wallet_total = int(await conn.scalar(sa.select(sa.func.sum(wallets.c.balance))) or 0)
    deposits = int(
        await conn.scalar(
            sa.select(sa.func.sum(entries.c.amount)).where(entries.c.kind == "deposit")
        )
        or 0
    )
    if wallet_total + held + in_flight + withdrawn != deposits:
        problems.append(
            f"money: wallets {wallet_total} + held in open packets {held} + withdrawals in "
            f"flight {in_flight} + withdrawn {withdrawn} != deposits {deposits}"
        )
    return problems


async def _packets(conn: AsyncConnection) -> tuple[list[str], int]:
    """Per-packet checks; also returns the money still held by open packets."""
    claim_sums = (
        sa.select(
            claims.c.packet_id,
            sa.func.count().label("n"),
            sa.func.sum(claims.c.amount).label("amount"),
        )
        .group_by(claims.c.packet_id)
        .subquery()
    )
    rows = await conn.execute(
        sa.select(
            packets.c.id,
            packets.c.total_amount,
            packets.c.count,
            packets.c.status,
            packets.c.claimed_count,
            packets.c.claimed_amount,
            packets.c.refunded_amount,
            packets.c.closed_at,
            claim_sums.c.n,
            claim_sums.c.amount,
        ).outerjoin(claim_sums, claim_sums.c.packet_id == packets.c.id)
    )
    problems: list[str] = []
    held = 0
    for pid, total, count, status, n_c, a_c, refunded, closed, n_real, a_real in rows:
        n_real, a_real = int(n_real or 0), int(a_real or 0)
        if (n_c, a_c) != (n_real, a_real):
            problems.append(
                f"packet {pid}: counters say {n_c} claims / {a_c} fen, "
                f"claims table has {n_real} / {a_real}"
            )
        if a_real + refunded > total:
            problems.append(f"packet {pid}: claimed + refunded exceeds total {total}")
        if closed is not None and a_real + refunded != total:
            problems.append(
                f"packet {pid}: closed but claimed {a_real} + refunded {refunded} != total {total}"
            )
        if status == "exhausted" and n_real != count:
            problems.append(f"packet {pid}: exhausted with {n_real} of {count} claims")
        if closed is None:
            held += total - a_real - refunded
    return problems, held


async def _claimed_twice(conn: AsyncConnection) -> list[str]:
    """Users with two claims, or shares claimed twice, in one packet (the schema's unique
    constraints forbid both; checked anyway, since the audit trusts nothing)."""
    out: list[str] = []
    for column, what in ((claims.c.user_id, "user"), (claims.c.share_idx, "share")):
        rows = await conn.execute(
            sa.select(claims.c.packet_id, column, sa.func.count())
            .group_by(claims.c.packet_id, column)
            .having(sa.func.count() > 1)
        )
        out.extend(f"packet {p}: {what} {v} claimed {n} times" for p, v, n in rows)
    return out


async def _claims_off_their_share(conn: AsyncConnection) -> list[str]:
    """Claims of a share the packet does not have, or of another amount than the share.
    The persister refuses both; no foreign key holds claims to shares (revision 0010)."""
    rows = await conn.execute(
        sa.select(claims.c.packet_id, claims.c.share_idx, claims.c.amount, shares.c.amount)
        .select_from(
            claims.outerjoin(
                shares,
                sa.and_(
                    shares.c.packet_id == claims.c.packet_id, shares.c.idx == claims.c.share_idx
                ),
            )
        )
        .where(shares.c.amount.is_distinct_from(claims.c.amount))
    )
    return [
        f"packet {p}: claim of share {i} "
        + ("which it does not have" if share is None else f"is {a} fen, the share {share}")
        for p, i, a, share in rows
    ]


async def _claim_entries(conn: AsyncConnection) -> list[str]:
    """Packets whose claims' ledger entries are not one per claim: as many entries as
    claims, of the same fen, and no reference twice. No unique index holds the references
    of claim entries (revision 0012): each is written with its claim, whose share is
    unique."""

    def per_packet(table: sa.Table, *where: Any) -> Any:
        return (
            sa.select(table.c.packet_id, sa.func.count().label("n"), sa.func.sum(table.c.amount))
            .where(*where)
            .group_by(table.c.packet_id)
        )

    entered = {
        p: (int(n), int(a))
        for p, n, a in await conn.execute(per_packet(entries, entries.c.kind == CLAIM_KIND))
    }
    claimed = {p: (int(n), int(a)) for p, n, a in await conn.execute(per_packet(claims))}
    out: list[str] = []
    for p in sorted(entered.keys() | claimed.keys()):
        (n_e, fen_e), (n_c, fen_c) = entered.get(p, (0, 0)), claimed.get(p, (0, 0))
        if (n_e, fen_e) != (n_c, fen_c):
            out.append(f"packet {p}: {n_e} claim entries of {fen_e} fen, {n_c} claims of {fen_c}")
    twice = await conn.execute(
        sa.select(entries.c.reference, sa.func.count())
        .where(entries.c.kind == CLAIM_KIND)
        .group_by(entries.c.reference)
        .having(sa.func.count() > 1)
    )
    out.extend(f"claim entry {r}: {n} times" for r, n in twice)
    return out


async def _wallets(conn: AsyncConnection) -> list[str]:
    negative = await conn.execute(sa.select(wallets.c.user_id).where(wallets.c.balance < 0))
    problems = [f"wallet {u}: negative balance" for (u,) in negative]
    mismatched = await conn.execute(
        sa.select(wallets.c.user_id, wallets.c.balance, sa.func.sum(entries.c.amount))
        .select_from(wallets.outerjoin(entries, entries.c.user_id == wallets.c.user_id))
        .group_by(wallets.c.user_id, wallets.c.balance)
        .having(wallets.c.balance != sa.func.coalesce(sa.func.sum(entries.c.amount), 0))
    )
    problems.extend(
        f"wallet {u}: balance {b} != sum of its ledger entries {s}" for u, b, s in mismatched
    )
    return problems

"""Packet rules and sender limits in the ledger, inside the caller's transaction.

A packet's rules are written with the packet (the same transaction as the debit), so a
packet Redis lost is rebuilt with them. The sender limits are counted per UTC day in
hb_sender_days; the sender's wallet row is locked first (SELECT … FOR UPDATE on
PostgreSQL and MariaDB; SQLite serializes writers with BEGIN IMMEDIATE), so two
concurrent sends of one sender are counted one after the other and cannot both slip
under a limit.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.domain.rules import NO_RULES, PacketRules, SendLimits, next_utc_day, utc_day
from hongbao.errors import SendLimitReached
from hongbao.ledger.records import RefundEvent, chunks, from_db, to_db
from hongbao.ledger.schema import packet_audience, packet_rules, sender_days, wallets


async def write_rules(conn: AsyncConnection, packet_id: str, rules: PacketRules) -> None:
    """The rules of a packet just written (nothing for a packet without rules)."""
    if not rules.any:
        return
    await conn.execute(
        packet_rules.insert().values(
            packet_id=packet_id,
            starts_at=None if rules.starts_at is None else to_db(rules.starts_at),
            passphrase_hash=rules.passphrase_hash,
            audience_size=len(rules.audience),
        )
    )
    rows = [{"packet_id": packet_id, "user_id": user} for user in rules.audience]
    for chunk in chunks(rows, 1000):
        await conn.execute(packet_audience.insert(), list(chunk))


async def read_rules(conn: AsyncConnection, packet_id: str, *, audience: bool) -> PacketRules:
    """A packet's rules (NO_RULES without any); the audience's users only if `audience`."""
    row = (
        await conn.execute(
            sa.select(
                packet_rules.c.starts_at,
                packet_rules.c.passphrase_hash,
                packet_rules.c.audience_size,
            ).where(packet_rules.c.packet_id == packet_id)
        )
    ).first()
    if row is None:
        return NO_RULES
    starts_at, digest, size = row
    users: tuple[str, ...] = ()
    if audience and size:
        users = tuple(await audience_of(conn, packet_id))
    return PacketRules(users, int(size), digest, None if starts_at is None else from_db(starts_at))


async def audience_of(conn: AsyncConnection, packet_id: str) -> list[str]:
    """The users of a packet's audience, by id."""
    rows = await conn.scalars(
        sa.select(packet_audience.c.user_id)
        .where(packet_audience.c.packet_id == packet_id)
        .order_by(packet_audience.c.user_id)
    )
    return list(rows)


async def in_audience(conn: AsyncConnection, packet_id: str, user_id: str) -> bool:
    """Whether a packet's audience names the user."""
    found = await conn.scalar(
        sa.select(packet_audience.c.user_id).where(
            packet_audience.c.packet_id == packet_id, packet_audience.c.user_id == user_id
        )
    )
    return found is not None


async def count_send(
    conn: AsyncConnection, sender_id: str, amount: int, limits: SendLimits, now: datetime
) -> None:
    """Count one send of `amount` fen on `now`'s UTC day for the sender, or raise
    SendLimitReached (Retry-After: the next UTC day) when it would pass a limit.

    Locks the sender's wallet row first, so the sender's sends are counted in turn."""
    await conn.execute(
        sa.select(wallets.c.balance).where(wallets.c.user_id == sender_id).with_for_update()
    )
    day = utc_day(now)
    row = (
        await conn.execute(
            sa.select(sender_days.c.sends, sender_days.c.amount).where(
                sender_days.c.sender_id == sender_id, sender_days.c.day == day
            )
        )
    ).first()
    sends, sent = (0, 0) if row is None else (int(row[0]), int(row[1]))
    wait = (next_utc_day(now) - now).total_seconds()
    if limits.sends and sends + 1 > limits.sends:
        raise SendLimitReached(
            f"{sender_id} sent {sends} packets today (UTC), the most a day allows", wait
        )
    if limits.amount and sent + amount > limits.amount:
        raise SendLimitReached(
            f"{sender_id} sent {sent} fen today (UTC); {amount} more would pass the "
            f"day's limit of {limits.amount}",
            wait,
        )
    if row is None:
        await conn.execute(
            sender_days.insert().values(sender_id=sender_id, day=day, sends=1, amount=amount)
        )
    else:
        await conn.execute(
            sender_days.update()
            .where(sender_days.c.sender_id == sender_id, sender_days.c.day == day)
            .values(sends=sender_days.c.sends + 1, amount=sender_days.c.amount + amount)
        )


def refund_status(ev: RefundEvent) -> str:
    """A packet's status once its refund applied: cancelled, or at its expiry exhausted
    (nothing left) or expired."""
    if ev.cancelled:
        return "cancelled"
    return "exhausted" if ev.amount == 0 else "expired"

"""The transactional outbox: events written in the transaction of the ledger change
they report, so an event exists exactly when its change was committed.

`record_events` runs inside that transaction. It writes an event only when some enabled
webhook endpoint subscribes to its type, and with it a pending delivery for each such
endpoint: one per event, or for an endpoint that takes batches one per subject carrying
up to its `batch_size` of the transaction's events (`deliveries`). The dispatcher
(hongbao.webhooks) sends the deliveries. An endpoint receives the events committed
after it was registered.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, Literal, get_args

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.domain.models import seq_of
from hongbao.ledger.records import ClaimEvent, PacketRecord, RefundEvent, utcnow
from hongbao.ledger.schema import events, webhook_deliveries, webhook_endpoints

#: the event types an endpoint may receive (the API's schema enumerates them too)
EventType = Literal[
    "packet.created",
    "claim.settled",
    "packet.exhausted",
    "packet.expired",
    "packet.cancelled",
    "wallet.deposited",
    "withdrawal.requested",
    "withdrawal.completed",
    "withdrawal.failed",
]
EVENT_TYPES: tuple[str, ...] = get_args(EventType)
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
#: base32 (Crockford) of every 10-bit value: two digits at a time
_DIGIT_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)
#: a ULID's 130 bits (two leading zeros) as 13 pairs of digits, most significant first
_PAIR_SHIFTS = tuple(range(120, -1, -10))


def new_event_id() -> str:
    """ "evt_" and a ULID: 48 bits of milliseconds and 80 random bits, base32 (Crockford),
    so ids sort by creation time. The persister makes one per event it records."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    return "evt_" + "".join([_DIGIT_PAIRS[(value >> shift) & 1023] for shift in _PAIR_SHIFTS])


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """An event to record: its type, its subject (deliveries of one subject to one
    endpoint are sent in order) and its JSON-able payload."""

    type: str
    subject: str
    payload: Mapping[str, Any]
    id: str = field(default_factory=new_event_id)


def packet_subject(packet_id: str) -> str:
    return f"packet:{packet_id}"


def wallet_subject(user_id: str) -> str:
    return f"wallet:{user_id}"


def withdrawal_subject(withdrawal_id: str) -> str:
    return f"withdrawal:{withdrawal_id}"


@lru_cache(maxsize=4096)
def timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC with milliseconds, as the HTTP API writes times. Cached: the claims
    a persister records share their times (to the millisecond) by the dozen, and the
    events a dispatcher sends together share their commit's."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def packet_created(record: PacketRecord, actor: str | None) -> OutboxEvent:
    return OutboxEvent(
        "packet.created",
        packet_subject(record.id),
        {
            "packet_id": record.id,
            "sender_id": record.sender_id,
            "total_amount": record.total_amount,
            "count": record.count,
            "mode": record.mode,
            "greeting": record.greeting,
            "created_at": timestamp(record.created_at),
            "expires_at": timestamp(record.expires_at),
            "actor": actor,
        },
    )


def claim_settled(claim: ClaimEvent) -> OutboxEvent:
    return OutboxEvent(
        "claim.settled",
        packet_subject(claim.packet_id),
        {
            "packet_id": claim.packet_id,
            "user_id": claim.user_id,
            "amount": claim.amount,
            "seq": seq_of(claim.share_idx),
            "claimed_at": timestamp(claim.claimed_at),
            "actor": claim.actor,
        },
    )


def packet_exhausted(record: PacketRecord) -> OutboxEvent:
    return OutboxEvent(
        "packet.exhausted",
        packet_subject(record.id),
        {
            "packet_id": record.id,
            "sender_id": record.sender_id,
            "count": record.count,
            "total_amount": record.total_amount,
        },
    )


def packet_closed(refund: RefundEvent) -> OutboxEvent:
    """packet.cancelled or packet.expired, with what went back to the sender."""
    return OutboxEvent(
        "packet.cancelled" if refund.cancelled else "packet.expired",
        packet_subject(refund.packet_id),
        {
            "packet_id": refund.packet_id,
            "sender_id": refund.sender_id,
            "refunded_amount": refund.amount,
            "shares_left": refund.shares_left,
            "closed_at": timestamp(refund.closed_at),
        },
    )


def wallet_deposited(user_id: str, amount: int, balance: int, actor: str | None) -> OutboxEvent:
    return OutboxEvent(
        "wallet.deposited",
        wallet_subject(user_id),
        {"user_id": user_id, "amount": amount, "balance": balance, "actor": actor},
    )


@dataclass(frozen=True, slots=True)
class Receiver:
    """An enabled endpoint as the outbox sees it: its id and its `batch_size`."""

    endpoint_id: str
    batch_size: int


async def subscribers(conn: AsyncConnection) -> dict[str, list[Receiver]]:
    """Event type -> the enabled endpoints that receive it."""
    found: dict[str, list[Receiver]] = {}
    rows = await conn.execute(
        sa.select(
            webhook_endpoints.c.id, webhook_endpoints.c.event_types, webhook_endpoints.c.batch_size
        )
        .where(webhook_endpoints.c.enabled.is_(True))
        .order_by(webhook_endpoints.c.id)
    )
    for endpoint_id, types, batch_size in rows:
        for event_type in json.loads(types):
            found.setdefault(event_type, []).append(Receiver(endpoint_id, int(batch_size)))
    return found


async def record_events(conn: AsyncConnection, batch: Sequence[OutboxEvent]) -> int:
    """Write the events of `batch` some endpoint receives, and their deliveries, in the
    caller's transaction; returns how many events were written."""
    if not batch:
        return 0
    return await record_made_events(conn, lambda types: batch)


async def record_made_events(
    conn: AsyncConnection, make: Callable[[Collection[str]], Sequence[OutboxEvent]]
) -> int:
    """`record_events` of what `make` returns, called with the event types some enabled
    endpoint receives, and only when there is one: a batch of a thousand claims that
    nobody subscribes to costs one SELECT, and no event is built."""
    receivers = await subscribers(conn)
    if not receivers:
        return 0
    wanted = [e for e in make(receivers.keys()) if e.type in receivers]
    if not wanted:
        return 0
    now = utcnow()
    await conn.execute(
        events.insert(),
        [
            {
                "id": e.id,
                "type": e.type,
                "subject": e.subject,
                "payload": orjson.dumps(e.payload).decode(),
                "created_at": now,
            }
            for e in wanted
        ],
    )
    await conn.execute(
        webhook_deliveries.insert(),
        [
            {
                "endpoint_id": endpoint_id,
                "event_id": carried[0].id,
                "more_event_ids": ",".join(e.id for e in carried[1:]) or None,
                "event_count": len(carried),
                "subject": carried[0].subject,
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
            for endpoint_id, carried in deliveries(wanted, receivers)
        ],
    )
    return len(wanted)


def deliveries(
    wanted: Sequence[OutboxEvent], receivers: Mapping[str, Sequence[Receiver]]
) -> list[tuple[str, list[OutboxEvent]]]:
    """The deliveries of `wanted` (in commit order): (endpoint id, the events it
    carries). An endpoint that takes one event a message gets a delivery per event; one
    that takes batches gets the events of each subject in deliveries of up to its
    `batch_size`, in order, so the dispatcher leases and settles a message's worth of
    events as one row."""
    per_endpoint: dict[Receiver, dict[str, list[OutboxEvent]]] = {}
    for event in wanted:
        for receiver in receivers[event.type]:
            subjects = per_endpoint.setdefault(receiver, {})
            subjects.setdefault(event.subject, []).append(event)
    out: list[tuple[str, list[OutboxEvent]]] = []
    for receiver, subjects in per_endpoint.items():
        size = receiver.batch_size
        for carried in subjects.values():
            out.extend(
                (receiver.endpoint_id, carried[start : start + size])
                for start in range(0, len(carried), size)
            )
    return out

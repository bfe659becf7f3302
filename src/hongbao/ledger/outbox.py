"""The transactional outbox: events written in the transaction of the ledger change
they report, so an event exists exactly when its change was committed.

`record_events` runs inside that transaction. It writes an event only when some enabled
webhook endpoint subscribes to its type, and with it one pending delivery per such
endpoint; the dispatcher (hongbao.webhooks) sends the deliveries. An endpoint receives
the events committed after it was registered.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.records import utcnow
from hongbao.ledger.schema import events, webhook_deliveries, webhook_endpoints

EVENT_TYPES = (
    "packet.created",
    "claim.settled",
    "packet.exhausted",
    "packet.expired",
    "packet.cancelled",
    "wallet.deposited",
    "withdrawal.requested",
    "withdrawal.completed",
    "withdrawal.failed",
)
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_event_id() -> str:
    """ "evt_" and a ULID: 48 bits of milliseconds and 80 random bits, base32 (Crockford),
    so ids sort by creation time."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    return "evt_" + "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


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


async def subscribers(conn: AsyncConnection) -> dict[str, list[str]]:
    """Event type -> the ids of the enabled endpoints that receive it."""
    found: dict[str, list[str]] = {}
    rows = await conn.execute(
        sa.select(webhook_endpoints.c.id, webhook_endpoints.c.event_types)
        .where(webhook_endpoints.c.enabled.is_(True))
        .order_by(webhook_endpoints.c.id)
    )
    for endpoint_id, types in rows:
        for event_type in json.loads(types):
            found.setdefault(event_type, []).append(endpoint_id)
    return found


async def record_events(conn: AsyncConnection, batch: Sequence[OutboxEvent]) -> int:
    """Write the events of `batch` some endpoint receives, and their deliveries, in the
    caller's transaction; returns how many events were written."""
    if not batch:
        return 0
    receivers = await subscribers(conn)
    wanted = [e for e in batch if e.type in receivers]
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
                "payload": json.dumps(e.payload, separators=(",", ":"), ensure_ascii=False),
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
                "event_id": e.id,
                "subject": e.subject,
                "status": "pending",
                "attempts": 0,
                "next_attempt_at": now,
                "created_at": now,
            }
            for e in wanted
            for endpoint_id in receivers[e.type]
        ],
    )
    return len(wanted)

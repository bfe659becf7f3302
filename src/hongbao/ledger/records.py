"""Ledger value types and the row-level helpers shared by the ledger's modules."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection

from hongbao.ledger.schema import packets

T = TypeVar("T")
H = TypeVar("H", bound=Hashable)
U = TypeVar("U")
CHUNK = 500  # rows per IN (...) list or executemany slice


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def to_db(moment: datetime) -> datetime:
    """Databases keep naive UTC."""
    if moment.tzinfo is UTC:  # the usual case, one call a claim: skip the conversion
        return moment.replace(tzinfo=None)
    return moment.astimezone(UTC).replace(tzinfo=None) if moment.tzinfo else moment


def map_distinct(convert: Callable[[H], U], values: Iterable[H]) -> list[U]:
    """`[convert(v) for v in values]`, converting each distinct value once: for values a
    batch repeats, such as the claim times dozens of claims share."""
    done: dict[H, U] = {}
    return [done[v] if v in done else done.setdefault(v, convert(v)) for v in values]


def from_db(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class PacketRecord:
    id: str
    sender_id: str
    total_amount: int
    count: int
    mode: str
    greeting: str
    status: str
    created_at: datetime
    expires_at: datetime
    claimed_count: int = 0
    claimed_amount: int = 0
    refunded_amount: int = 0
    closed_at: datetime | None = None
    request_hash: str | None = None


class ClaimEvent(NamedTuple):
    """A claim to settle. A named tuple, not a frozen dataclass: the persister makes one
    per claim, and a frozen dataclass's __init__ sets each field through a call."""

    packet_id: str
    share_idx: int
    user_id: str
    amount: int
    claimed_at: datetime
    #: who grabbed for the user (a service acting for them), None when they did
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class RefundEvent:
    packet_id: str
    sender_id: str
    amount: int
    shares_left: int
    closed_at: datetime
    #: closed by a cancel, not at its expiry
    cancelled: bool = False


@dataclass(frozen=True, slots=True)
class ClaimRow:
    user_id: str
    share_idx: int
    amount: int
    claimed_at: datetime


LedgerEvent = ClaimEvent | RefundEvent
PACKET_COLUMNS = [
    packets.c.id,
    packets.c.sender_id,
    packets.c.total_amount,
    packets.c.count,
    packets.c.mode,
    packets.c.greeting,
    packets.c.status,
    packets.c.created_at,
    packets.c.expires_at,
    packets.c.claimed_count,
    packets.c.claimed_amount,
    packets.c.refunded_amount,
    packets.c.closed_at,
    packets.c.request_hash,
]


def packet_from_row(row: Any) -> PacketRecord:
    """A PacketRecord from a row selected with PACKET_COLUMNS."""
    m = row._mapping
    return PacketRecord(
        id=m["id"],
        sender_id=m["sender_id"],
        total_amount=int(m["total_amount"]),
        count=int(m["count"]),
        mode=m["mode"],
        greeting=m["greeting"],
        status=m["status"],
        created_at=from_db(m["created_at"]),
        expires_at=from_db(m["expires_at"]),
        claimed_count=int(m["claimed_count"]),
        claimed_amount=int(m["claimed_amount"]),
        refunded_amount=int(m["refunded_amount"]),
        closed_at=from_db(m["closed_at"]) if m["closed_at"] else None,
        request_hash=m["request_hash"],
    )


def among(conn: AsyncConnection, column: Any, values: Sequence[Any]) -> Any:
    """`column IN values`. On PostgreSQL `= ANY(array)`: one bind parameter, so the
    statement stays prepared across batches (an IN list of n values is a new
    statement for asyncpg each time n changes, and costs a parse and plan)."""
    if conn.dialect.name == "postgresql":
        return column == sa.any_(sa.literal(list(values), ARRAY(column.type)))
    return column.in_(values)


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterable[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


#: a claim's ledger entry is `claim:{packet_id}:{share_idx}`; PostgreSQL's bulk insert
#: writes the same in SQL (hongbao.ledger.bulk)
CLAIM_REFERENCE_PREFIX = "claim:"


def claim_reference(packet_id: str, share_idx: int) -> str:
    return f"{CLAIM_REFERENCE_PREFIX}{packet_id}:{share_idx}"


def refund_reference(packet_id: str) -> str:
    return f"refund:{packet_id}"


def entry_row(
    reference: str,
    user_id: str,
    kind: str,
    amount: int,
    packet_id: str | None = None,
    actor: str | None = None,
) -> dict[str, Any]:
    """A row of hb_ledger_entries; `actor` is who acted for the user (None: the user)."""
    return {
        "reference": reference,
        "user_id": user_id,
        "kind": kind,
        "amount": amount,
        "packet_id": packet_id,
        "actor": actor,
        "created_at": utcnow(),
    }

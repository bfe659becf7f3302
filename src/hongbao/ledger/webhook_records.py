"""The rows of the webhook tables as the dispatcher and the operator's commands see them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import sqlalchemy as sa

from hongbao.ledger.records import from_db


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    id: str
    url: str
    event_types: tuple[str, ...]
    secret: str
    previous_secret: str | None
    previous_secret_until: datetime | None
    enabled: bool
    disabled_reason: str | None
    created_at: datetime
    #: the most events one message carries (1: each event alone)
    batch_size: int

    def signing_secrets(self, now: datetime) -> tuple[str, ...]:
        """The secrets that sign a message sent at `now`: the current one, and the one
        before the last rotation until it expires."""
        if self.previous_secret and self.previous_secret_until and now < self.previous_secret_until:
            return (self.secret, self.previous_secret)
        return (self.secret,)


class QueuedEvent(NamedTuple):
    """An event as a dispatcher sends it."""

    id: str
    type: str
    #: its JSON payload, as stored
    payload: str
    #: its commit
    created_at: datetime


@dataclass(frozen=True, slots=True)
class LeasedDelivery:
    """A delivery a dispatcher holds: where it goes, and the events it carries in order
    (one, or several to an endpoint that takes batches)."""

    delivery_id: int
    endpoint: EndpointRecord
    subject: str
    attempts: int
    #: when the retry window started: the events' commit, or an operator's requeue
    retry_from: datetime
    events: tuple[QueuedEvent, ...]


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed attempt: retry at `next_attempt_at`, or park (None)."""

    delivery_id: int
    status: int | None
    error: str
    next_attempt_at: datetime | None


@dataclass(frozen=True, slots=True)
class Progress:
    """A leased delivery sent in part: its first events went out in messages the
    receiver took (the last answered `status`), the others did not. Settling splits the
    delivered ones off into a delivered delivery of their own, so the next lease sends
    from the first event not taken."""

    delivery_id: int
    status: int
    #: the ids of the events the receiver took, in order
    delivered: tuple[str, ...]
    #: the ids of the others, in order
    rest: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """A delivery as the operator's commands show it."""

    id: int
    endpoint_id: str
    url: str
    #: its first event
    event_id: str
    event_type: str
    subject: str
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    created_at: datetime
    #: how many events it carries
    event_count: int


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Events waiting, delivered and parked, as the deliveries that carry them count."""

    pending: int
    delivered: int
    parked: int
    #: events of pending deliveries whose last attempt failed
    failing: int
    #: when the oldest pending delivery was created (None: nothing pending)
    oldest_pending: datetime | None


def endpoint_from_row(row: sa.Row[tuple[object, ...]]) -> EndpointRecord:
    m = row._mapping
    until = m["previous_secret_until"]
    return EndpointRecord(
        id=m["id"],
        url=m["url"],
        event_types=tuple(json.loads(m["event_types"])),
        secret=m["secret"],
        previous_secret=m["previous_secret"],
        previous_secret_until=from_db(until) if until is not None else None,
        enabled=bool(m["enabled"]),
        disabled_reason=m["disabled_reason"],
        created_at=from_db(m["created_at"]),
        batch_size=int(m["batch_size"]),
    )

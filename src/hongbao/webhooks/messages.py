"""The messages a dispatcher sends: their bodies, ids and Standard Webhooks signatures,
and how a leased queue's deliveries are cut into messages. No I/O.

An endpoint that takes one event a message gets each event's own body,
``{"id", "type", "timestamp", "data"}``. One whose `batch_size` is above 1 gets up to that
many events of one subject in ``{"id": "msg_…", "type": "batch", "timestamp", "data":
{"events": [...]}}``, each element the body its event would have alone, in order, the
id a digest of the events' ids (the same on a resend of the same events).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache

import orjson
from standardwebhooks import Webhook

from hongbao.ledger.outbox import timestamp
from hongbao.ledger.webhook_records import LeasedDelivery, QueuedEvent


def message_body(event: QueuedEvent) -> str:
    """The JSON body: ``{"id", "type", "timestamp", "data"}``, the same on every attempt."""
    head = orjson.dumps(
        {"id": event.id, "type": event.type, "timestamp": timestamp(event.created_at)}
    ).decode()
    return head[:-1] + ',"data":' + event.payload + "}"


def batch_id(events: Sequence[QueuedEvent]) -> str:
    """A batch message's id: a digest of its events' ids, so a resend of the same events
    carries the same ``webhook-id`` and a different set never does."""
    digest = hashlib.sha256(",".join(e.id for e in events).encode()).hexdigest()
    return "msg_" + digest[:32]


def message(events: Sequence[QueuedEvent], batch_size: int) -> tuple[str, str]:
    """The id and JSON body of the message that carries `events` (of one subject, in
    order) to an endpoint of `batch_size`: the event's own body when the endpoint takes
    one event a message, else ``{"id", "type": "batch", "timestamp", "data": {"events":
    [...]}}`` with the last event's commit as the timestamp."""
    if batch_size == 1:
        (only,) = events
        return only.id, message_body(only)
    message_id = batch_id(events)
    head = orjson.dumps(
        {"id": message_id, "type": "batch", "timestamp": timestamp(events[-1].created_at)}
    ).decode()
    bodies = ",".join(message_body(e) for e in events)
    return message_id, head[:-1] + ',"data":{"events":[' + bodies + "]}}"


def spans(queue: Sequence[LeasedDelivery]) -> list[tuple[LeasedDelivery, int, int]]:
    """Each delivery with where its events are among the queue's (start, end), in
    order."""
    out, start = [], 0
    for delivery in queue:
        out.append((delivery, start, start + len(delivery.events)))
        start += len(delivery.events)
    return out


def message_slices(
    placed: Sequence[tuple[LeasedDelivery, int, int]], size: int
) -> list[tuple[int, int]]:
    """How a leased queue's events go out, given its `spans`: (start, end) of each
    message among the queue's events, in order. A message carries whole deliveries up
    to `size` events; a delivery of more than `size` (an endpoint whose `batch_size` was
    lowered after it was queued) goes out in messages of `size`."""
    out: list[tuple[int, int]] = []
    start = 0
    for _, begin, end in placed:
        if end - start > size and begin > start:
            out.append((start, begin))
            start = begin
        if end - start > size:
            out.extend((at, min(at + size, end)) for at in range(start, end, size))
            start = end
    total = placed[-1][2] if placed else 0
    if total > start:
        out.append((start, total))
    return out


@lru_cache(maxsize=1024)
def signer(secret: str) -> Webhook:
    """The Standard Webhooks signer of a secret (decoded once, not on every send)."""
    return Webhook(secret)


def signature_headers(
    message_id: str, secrets_: Sequence[str], at: datetime, body: str
) -> dict[str, str]:
    """``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` (one ``v1,…``
    signature per secret, space-separated, as Standard Webhooks allows)."""
    signatures = " ".join(signer(s).sign(message_id, at, body) for s in secrets_)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signatures,
    }

"""The messages the dispatcher sends: one event alone, or a batch of one subject's events,
signed so that the `standardwebhooks` library verifies them."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks import Webhook

from hongbao.ledger.webhook_records import EndpointRecord, LeasedDelivery, QueuedEvent
from hongbao.webhooks.endpoints import new_secret
from hongbao.webhooks.messages import (
    message,
    message_body,
    message_slices,
    signature_headers,
    spans,
)

START = datetime(2026, 11, 26, 4, 20, 29, 746_000, tzinfo=UTC)


def endpoint(batch_size: int) -> EndpointRecord:
    return EndpointRecord(
        id="we_1",
        url="http://127.0.0.1:9/hook",
        event_types=("claim.settled",),
        secret=new_secret(),
        previous_secret=None,
        previous_secret_until=None,
        enabled=True,
        disabled_reason=None,
        created_at=START,
        batch_size=batch_size,
    )


def events(seqs: range) -> list[QueuedEvent]:
    return [
        QueuedEvent(
            f"evt_{seq:04d}",
            "claim.settled",
            json.dumps({"packet_id": "p1", "user_id": f"u{seq}", "seq": seq}),
            START + timedelta(milliseconds=seq),
        )
        for seq in seqs
    ]


def test_an_endpoint_of_single_events_gets_each_event_alone() -> None:
    (one,) = events(range(1, 2))
    message_id, body = message([one], 1)
    assert (message_id, body) == (one.id, message_body(one))
    assert json.loads(body) == {
        "id": "evt_0001",
        "type": "claim.settled",
        "timestamp": "2026-11-26T04:20:29.747Z",
        "data": {"packet_id": "p1", "user_id": "u1", "seq": 1},
    }


def test_a_batch_carries_each_event_as_it_would_go_alone_in_order() -> None:
    to = endpoint(3)
    batch = events(range(1, 4))
    message_id, body = message(batch, to.batch_size)
    sent = json.loads(body)
    assert sent["id"] == message_id and message_id.startswith("msg_")
    assert sent["type"] == "batch"
    assert sent["timestamp"] == "2026-11-26T04:20:29.749Z"  # the last event's commit
    assert sent["data"]["events"] == [json.loads(message_body(e)) for e in batch]
    # it verifies as any Standard Webhooks message does
    now = datetime.now(UTC)
    headers = signature_headers(message_id, (to.secret,), now, body)
    assert Webhook(to.secret).verify(body, headers) == sent


def test_a_batch_resent_keeps_its_id_and_another_set_gets_another() -> None:
    batch = events(range(1, 11))
    first_id, first_body = message(batch, 100)
    assert message(list(batch), 100) == (first_id, first_body)
    assert message(batch[:9], 100)[0] != first_id
    assert message(batch[1:], 100)[0] != first_id
    # one event in a batch endpoint's message is still a batch: one shape per endpoint
    only_id, only_body = message(batch[:1], 100)
    assert only_id != batch[0].id and json.loads(only_body)["type"] == "batch"


def carried_by(sizes: list[int]) -> list[LeasedDelivery]:
    """Deliveries of `sizes` events each (delivery ids 1, 2, ...), as a lease gives them."""
    out, first = [], 1
    for delivery_id, size in enumerate(sizes, 1):
        carried = tuple(events(range(first, first + size)))
        out.append(LeasedDelivery(delivery_id, endpoint(1), "packet:p1", 0, START, carried))
        first += size
    return out


@pytest.mark.parametrize(
    ("sizes", "batch_size", "slices"),
    [
        ([1, 1, 1, 1], 1, [(0, 1), (1, 2), (2, 3), (3, 4)]),
        ([1, 1, 1, 1], 3, [(0, 3), (3, 4)]),
        ([3, 3, 3], 5, [(0, 3), (3, 6), (6, 9)]),
        ([2, 3, 1], 6, [(0, 6)]),
        # a delivery larger than the endpoint takes now goes out in several messages
        ([2, 5, 1], 3, [(0, 2), (2, 5), (5, 7), (7, 8)]),
        ([4], 1, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ],
)
def test_messages_carry_whole_deliveries_up_to_the_batch_size(
    sizes: list[int], batch_size: int, slices: list[tuple[int, int]]
) -> None:
    placed = spans(carried_by(sizes))
    assert message_slices(placed, batch_size) == slices
    assert [(d.delivery_id, end - start) for d, start, end in placed] == list(enumerate(sizes, 1))
    assert [e.id for d, start, end in placed for e in d.events] == [
        e.id for e in events(range(1, sum(sizes) + 1))
    ]

"""The messages the dispatcher sends: one event alone, or a batch of one subject's events,
signed so that the `standardwebhooks` library verifies them."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from standardwebhooks import Webhook

from hongbao.ledger.webhook_records import EndpointRecord, LeasedDelivery
from hongbao.webhooks.dispatcher import (
    delivery_ids,
    message,
    message_body,
    message_slices,
    signature_headers,
)
from hongbao.webhooks.endpoints import new_secret

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


def deliveries(to: EndpointRecord, seqs: range) -> list[LeasedDelivery]:
    return [
        LeasedDelivery(
            id=f"evt_{seq:04d}",
            delivery_id=seq,
            endpoint=to,
            subject="packet:p1",
            attempts=0,
            retry_from=START,
            event_type="claim.settled",
            payload=json.dumps({"packet_id": "p1", "user_id": f"u{seq}", "seq": seq}),
            event_created_at=START + timedelta(milliseconds=seq),
        )
        for seq in seqs
    ]


def test_an_endpoint_of_single_events_gets_each_event_alone() -> None:
    (one,) = deliveries(endpoint(1), range(1, 2))
    message_id, body = message([one])
    assert (message_id, body) == (one.id, message_body(one))
    assert json.loads(body) == {
        "id": "evt_0001",
        "type": "claim.settled",
        "timestamp": "2026-11-26T04:20:29.747Z",
        "data": {"packet_id": "p1", "user_id": "u1", "seq": 1},
    }


def test_a_batch_carries_each_event_as_it_would_go_alone_in_order() -> None:
    to = endpoint(3)
    batch = deliveries(to, range(1, 4))
    message_id, body = message(batch)
    sent = json.loads(body)
    assert sent["id"] == message_id and message_id.startswith("msg_")
    assert sent["type"] == "batch"
    assert sent["timestamp"] == "2026-11-26T04:20:29.749Z"  # the last event's commit
    assert sent["data"]["events"] == [json.loads(message_body(d)) for d in batch]
    # it verifies as any Standard Webhooks message does
    now = datetime.now(UTC)
    headers = signature_headers(message_id, (to.secret,), now, body)
    assert Webhook(to.secret).verify(body, headers) == sent


def test_a_batch_resent_keeps_its_id_and_another_set_gets_another() -> None:
    batch = deliveries(endpoint(100), range(1, 11))
    first_id, first_body = message(batch)
    assert message(list(batch)) == (first_id, first_body)
    assert message(batch[:9])[0] != first_id
    assert message(batch[1:])[0] != first_id
    # one event in a batch endpoint's message is still a batch: one shape per endpoint
    only_id, only_body = message(batch[:1])
    assert only_id != batch[0].id and json.loads(only_body)["type"] == "batch"


def carried_by(sizes: list[int]) -> list[LeasedDelivery]:
    """Deliveries of `sizes` events each (delivery ids 1, 2, ...), as a lease gives them."""
    events = deliveries(endpoint(1), range(1, sum(sizes) + 1))
    owners = [n for n, size in enumerate(sizes, 1) for _ in range(size)]
    return [replace(e, delivery_id=owner) for e, owner in zip(events, owners, strict=True)]


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
    queue = carried_by(sizes)
    assert message_slices(queue, batch_size) == slices
    assert delivery_ids(queue) == list(range(1, len(sizes) + 1))

"""A delivery queued for an endpoint's larger `batch_size` goes out in messages of the
new size after an admin lowers it. When it needs more messages than fit in one lease (a
slow receiver), each lease records the events that got through, and the next one sends
from there, so the delivery is delivered, each event about once, in order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
import sqlalchemy as sa

from hongbao.ledger import SqlLedger
from hongbao.ledger.schema import webhook_deliveries
from hongbao.ledger.webhook_store import WebhookStore
from hongbao.settings import Settings
from hongbao.webhooks import Dispatcher
from hongbao.webhooks.dispatcher import LEASE_MARGIN
from tests.integration.test_webhooks_ops import SlowReceiver, dispatch_until
from tests.ledger.test_outbox import add_endpoint
from tests.ledger.test_webhook_leases import emit

pytestmark = [pytest.mark.integration]

#: the secret `add_endpoint` gives its endpoints
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
EVENTS = 12


@pytest.fixture
def slow_receiver() -> Iterator[SlowReceiver]:
    r = SlowReceiver()
    r.start()
    yield r
    r.stop()


@pytest.mark.parametrize("batch_size", [1, 2])
async def test_a_delivery_longer_than_a_lease_goes_on_where_the_last_one_stopped(
    slow_receiver: SlowReceiver, ledger: SqlLedger, settings: Settings, batch_size: int
) -> None:
    await add_endpoint(ledger, "we_a", ["claim.settled"], batch_size=EVENTS)
    await emit(ledger, "p1", 1, EVENTS)  # one commit: one delivery of every event
    store = WebhookStore(ledger)
    await store.update_endpoint("we_a", url=slow_receiver.url, batch_size=batch_size)
    slow_receiver.secrets = [SECRET]
    fast = replace(settings, webhook_timeout=1.0, webhook_poll_interval=0.02)
    dispatcher = Dispatcher(ledger, fast)
    # a lease leaves room for the messages of about 0.6 s, 3 of the receiver's 0.2 s
    dispatcher.lease_for = timedelta(seconds=fast.webhook_timeout + LEASE_MARGIN + 0.6)

    async def delivered() -> bool:
        return (await store.stats()).delivered == EVENTS

    await dispatch_until(dispatcher, delivered, within=30)
    assert slow_receiver.refused == []
    ns = [r.data["n"] for r in slow_receiver.got]
    assert sorted(set(ns)) == list(range(1, EVENTS + 1))
    assert [n for i, n in enumerate(ns) if n not in ns[:i]] == sorted(set(ns))  # in order
    assert len(ns) < 2 * EVENTS, ns  # not started over at every lease
    assert max(n for _, n in slow_receiver.messages) == batch_size
    async with ledger.engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(webhook_deliveries.c.status, webhook_deliveries.c.event_count)
            )
        ).all()
    # split into what each lease got through, all delivered
    assert {s for s, _ in rows} == {"delivered"} and len(rows) > 1
    assert sum(n for _, n in rows) == EVENTS

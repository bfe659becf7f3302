"""What operators see of the webhook queue: retries and parking, `hongbao webhooks` and
the /metrics gauges, on each SQL database, against a real local receiver."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace

import pytest
from starlette.requests import Request
from starlette.responses import Response

from hongbao.errors import InvalidRequest
from hongbao.ledger.webhook_store import WebhookStore
from hongbao.metrics import Metrics
from hongbao.service import Hongbao
from hongbao.settings import Settings
from hongbao.webhooks import AllowedHosts, Dispatcher, WebhookEndpoints
from tests.api.serving import run_cli
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.redis, pytest.mark.integration]


@dataclass
class SlowReceiver(Receiver):
    """A receiver that takes `delay` seconds over each message before it answers."""

    delay: float = 0.2

    async def hook(self, request: Request) -> Response:
        await asyncio.sleep(self.delay)
        return await super().hook(request)


@pytest.fixture
def slow_receiver() -> Iterator[SlowReceiver]:
    r = SlowReceiver()
    r.start()
    yield r
    r.stop()


async def dispatch_until(
    dispatcher: Dispatcher, done: Callable[[], Awaitable[bool]], within: float = 20.0
) -> None:
    """Run `dispatcher` until `done()` is true."""
    stop = asyncio.Event()
    task = asyncio.create_task(dispatcher.run(stop))
    deadline = time.monotonic() + within
    try:
        while not await done():
            assert time.monotonic() < deadline, "not reached in time"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task


async def test_failures_retry_with_backoff_then_park_and_operators_retry_them(
    receiver: Receiver, service: Hongbao, settings: Settings, sql_url: str
) -> None:
    endpoint = await service.webhooks.create(receiver.url, ["wallet.deposited"])
    receiver.secrets = [endpoint.secret]
    receiver.answer = 500
    await service.deposit("alice", 100)
    await service.deposit("bob", 100)
    store = WebhookStore(service.ledger)
    fast = replace(settings, webhook_poll_interval=0.02, webhook_retry_seconds=2)

    async def parked() -> bool:
        return (await store.stats()).parked == 2

    await dispatch_until(Dispatcher(service.ledger, fast), parked)
    # 1 s, then about 1-2 s, until the 2 s window closed: a few attempts each, each signed
    by_id: dict[str, int] = {}
    for r in receiver.got:
        by_id[r.id] = by_id.get(r.id, 0) + 1
    assert len(by_id) == 2 and all(2 <= n <= 4 for n in by_id.values()), by_id
    metrics = Metrics()
    assert await metrics.refresh_webhooks(service.ledger)
    text = metrics.render().decode()
    assert 'hongbao_webhook_deliveries{status="parked"} 2.0' in text
    assert 'hongbao_webhook_deliveries{status="pending"} 0.0' in text
    assert "hongbao_webhook_oldest_pending_seconds 0.0" in text

    url = ["--database-url", sql_url]
    failed = run_cli("webhooks", "failed", *url)
    assert failed.returncode == 1, failed.stderr
    lines = failed.stdout.splitlines()
    assert len(lines) == 2 and all("parked" in line and "HTTP 500" in line for line in lines)
    first = int(lines[0].split()[0])
    assert run_cli("webhooks", "retry", str(first), *url).returncode == 0
    again = run_cli("webhooks", "retry", "999999", *url)
    assert again.returncode == 2 and "no parked or failing delivery" in again.stderr
    listed = run_cli("webhooks", "list", *url)
    assert endpoint.id in listed.stdout and "1 pending" in listed.stdout, listed.stdout
    assert run_cli("webhooks", "retry-all", *url).returncode == 0

    receiver.answer = 200
    seen = len(receiver.got)

    async def delivered() -> bool:
        return (await store.stats()).delivered == 2

    await dispatch_until(Dispatcher(service.ledger, fast), delivered)
    assert len(receiver.got) == seen + 2 and receiver.refused == []
    assert run_cli("webhooks", "failed", *url).returncode == 0


async def test_a_failed_batch_is_resent_whole_under_its_id_until_its_events_park(
    receiver: Receiver, service: Hongbao, settings: Settings, sql_url: str
) -> None:
    endpoint = await service.webhooks.create(receiver.url, ["wallet.deposited"], batch_size=10)
    receiver.secrets = [endpoint.secret]
    receiver.answer = 500
    for n in range(5):  # one subject (alice's wallet): one queue
        await service.deposit("alice", 100 + n)
    store = WebhookStore(service.ledger)
    fast = replace(settings, webhook_poll_interval=0.02, webhook_retry_seconds=2)

    async def parked() -> bool:
        return (await store.stats()).parked == 5

    await dispatch_until(Dispatcher(service.ledger, fast), parked)
    first, again = receiver.messages[:2]
    assert first == again and first[1] == 5, receiver.messages  # the same message resent
    amounts = [r.data["amount"] for r in receiver.got]
    assert amounts[:10] == [100, 101, 102, 103, 104] * 2  # whole, in order, each time

    listed = run_cli("webhooks", "list", "--database-url", sql_url)
    assert f"{endpoint.id}  {receiver.url}" in listed.stdout, listed.stdout
    assert "batches of 10" in listed.stdout and "5 parked" in listed.stdout, listed.stdout
    assert run_cli("webhooks", "retry-all", "--database-url", sql_url).returncode == 0
    receiver.answer = 200
    receiver.messages.clear()

    async def delivered() -> bool:
        return (await store.stats()).delivered == 5

    await dispatch_until(Dispatcher(service.ledger, fast), delivered)
    assert [n for _, n in receiver.messages] == [5] and receiver.refused == []


async def test_a_host_left_out_of_the_allowed_hosts_is_neither_registered_nor_sent_to(
    receiver: Receiver, service: Hongbao, settings: Settings
) -> None:
    endpoint = await service.webhooks.create(receiver.url, ["wallet.deposited"])
    receiver.secrets = [endpoint.secret]
    await service.deposit("alice", 100)
    narrowed = replace(
        settings,
        webhook_hosts="hooks.example.com, .example.net",
        webhook_poll_interval=0.02,
        webhook_retry_seconds=1,
    )
    store = WebhookStore(service.ledger)

    async def parked() -> bool:
        return (await store.stats()).parked == 1

    await dispatch_until(Dispatcher(service.ledger, narrowed), parked)
    assert receiver.got == []
    [delivery] = await store.failed()
    assert "HONGBAO_WEBHOOK_HOSTS" in (delivery.last_error or "")

    guarded = WebhookEndpoints(service.ledger, AllowedHosts.parse(narrowed.webhook_hosts))
    with pytest.raises(InvalidRequest, match="HONGBAO_WEBHOOK_HOSTS"):
        await guarded.create(receiver.url, ["wallet.deposited"])
    made = await guarded.create("https://a.b.example.net/hook", ["wallet.deposited"])
    assert made.url == "https://a.b.example.net/hook"


@pytest.mark.parametrize("how", ["deleted", "disabled"])
async def test_a_dispatcher_stops_sending_to_an_endpoint_deleted_or_disabled_mid_lease(
    slow_receiver: SlowReceiver, service: Hongbao, settings: Settings, how: str
) -> None:
    endpoint = await service.webhooks.create(slow_receiver.url, ["wallet.deposited"])
    slow_receiver.secrets = [endpoint.secret]
    for n in range(40):  # one queue, leased whole: 40 messages, 8 s at 0.2 s each
        await service.deposit("alice", 100 + n)
    store = WebhookStore(service.ledger)
    fast = replace(settings, webhook_poll_interval=0.02)
    stop = asyncio.Event()
    task = asyncio.create_task(Dispatcher(service.ledger, fast).run(stop))
    try:
        deadline = time.monotonic() + 20
        while len(slow_receiver.got) < 2:
            assert time.monotonic() < deadline, "nothing sent"
            await asyncio.sleep(0.02)
        if how == "deleted":  # an admin's DELETE
            assert await store.delete_endpoint(endpoint.id)
        else:  # another dispatcher's 410
            await store.disable_endpoint(endpoint.id, "the receiver answered 410 Gone")
        # a second to notice, and the message in flight then
        await asyncio.sleep(1.0 + 3 * slow_receiver.delay)
        sent = len(slow_receiver.got)
        await asyncio.sleep(1.0)
        assert len(slow_receiver.got) == sent < 15, sent
    finally:
        stop.set()
        await task
    stats = await store.stats()
    assert stats.pending == 0
    if how == "disabled":  # what was not recorded delivered stays parked for a retry
        assert stats.parked + stats.delivered == 40 and stats.parked >= 40 - sent

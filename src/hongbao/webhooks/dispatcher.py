"""The webhook dispatcher: sends the outbox's deliveries, signed per Standard Webhooks.

At least once: a delivery is marked delivered only after its receiver answered 2xx, so
a dispatcher that dies between the two leaves it leased; when the lease runs out another
dispatcher (or the same one restarted) sends it again with the same ``webhook-id``,
which receivers use to drop repeats. In order per (endpoint, subject): see
hongbao.ledger.webhook_store for the lease. Several dispatchers share the queue.

A queue of one (endpoint, subject) is leased up to `LEASE_BATCH` deliveries at a time,
sent one after the other, and settled in one transaction, so a hot packet's claims
cost the database a few statements per hundred. Different queues are sent concurrently,
up to `webhook_concurrency`.

A failed attempt (no answer, or a status other than 2xx) is retried after a wait that
doubles from 1 s up to `webhook_max_backoff`, each drawn between half and all of its
value so that receivers coming back are not hit by every dispatcher at once; the rest
of the queue waits behind it. A delivery still failing `webhook_retry_seconds` after its
event is parked (`hongbao webhooks failed`, `retry`). A receiver answering 410 Gone
disables its endpoint: it receives nothing more, and its pending deliveries are parked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from standardwebhooks import Webhook

from hongbao.errors import StorageError
from hongbao.ledger import SqlLedger
from hongbao.ledger.outbox import timestamp
from hongbao.ledger.webhook_store import Failure, LeasedDelivery, WebhookStore
from hongbao.settings import Settings

log = logging.getLogger("hongbao.webhooks")

#: deliveries of one (endpoint, subject) leased and settled together
LEASE_BATCH = 100
#: the first wait after a failed attempt, seconds; each further one doubles
FIRST_RETRY = 1.0
#: a dispatcher starts no send that could outlast its lease by less than this, seconds
LEASE_MARGIN = 5.0
USER_AGENT = "hongbao-webhooks/1"


def lease_seconds(settings: Settings) -> float:
    """How long a lease holds (35 s by default): a queue starts no send with less than a
    timeout and the margin left, so every send made under a lease ends within it, and a
    dead dispatcher's deliveries are sent again that long after it leased them."""
    return 3 * settings.webhook_timeout + LEASE_MARGIN


def message_body(delivery: LeasedDelivery) -> str:
    """The JSON body: ``{"id", "type", "timestamp", "data"}``, the same on every attempt."""
    head = json.dumps(
        {
            "id": delivery.id,
            "type": delivery.event_type,
            "timestamp": timestamp(delivery.event_created_at),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return head[:-1] + ',"data":' + delivery.payload + "}"


def signature_headers(
    message_id: str, secrets_: Sequence[str], at: datetime, body: str
) -> dict[str, str]:
    """``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` (one ``v1,…``
    signature per secret, space-separated, as Standard Webhooks allows)."""
    signatures = " ".join(Webhook(s).sign(message_id, at, body) for s in secrets_)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signatures,
    }


@dataclass(frozen=True, slots=True)
class Attempt:
    """What a receiver made of one send: `status` (None: no answer) and a reason."""

    status: int | None
    error: str

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def gone(self) -> bool:
        return self.status == 410


class Dispatcher:
    """Sends due deliveries until `stop` is set (see the module's description)."""

    def __init__(self, ledger: SqlLedger, settings: Settings, *, owner: str | None = None) -> None:
        self.store = WebhookStore(ledger)
        self.settings = settings
        #: this dispatcher's name on its leases
        self.owner = owner or f"{socket.gethostname()[:24]}-{os.getpid()}-{secrets.token_hex(3)}"
        self.lease_for = timedelta(seconds=lease_seconds(settings))
        self.sent = 0
        self.failed = 0
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        timeout = httpx.Timeout(self.settings.webhook_timeout)
        limits = httpx.Limits(max_connections=max(self.settings.webhook_concurrency, 10))
        headers = {"user-agent": USER_AGENT, "content-type": "application/json"}
        async with httpx.AsyncClient(
            timeout=timeout, limits=limits, headers=headers, follow_redirects=False
        ) as client:
            running: set[asyncio.Task[None]] = set()
            stopping = asyncio.create_task(stop.wait())
            try:
                while not stop.is_set():
                    found = await self._take(client, running)
                    if found and len(running) < self.settings.webhook_concurrency:
                        continue  # there may be more
                    await asyncio.wait(
                        [stopping, *running],
                        timeout=self.settings.webhook_poll_interval,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    running = {t for t in running if not t.done()}
            finally:
                stopping.cancel()
                # the queues in hand stop before their next send and settle what they did
                if running:
                    _, late = await asyncio.wait(running, timeout=self.settings.webhook_timeout + 5)
                    for task in late:
                        task.cancel()
                    await asyncio.gather(*running, return_exceptions=True)

    async def _take(self, client: httpx.AsyncClient, running: set[asyncio.Task[None]]) -> int:
        """Lease what is due, as many queues as there is room for; start sending them."""
        room = self.settings.webhook_concurrency - len(running)
        if room <= 0:
            return 0
        try:
            queues = await self.store.lease(
                self.owner, heads=room, batch=LEASE_BATCH, lease_for=self.lease_for
            )
        except StorageError as exc:
            log.warning("webhooks: cannot lease deliveries: %s", exc)
            return 0
        started = time.monotonic()
        for queue in queues:
            task = asyncio.create_task(self.send_queue(client, queue, started))
            task.add_done_callback(_report_crash)
            running.add(task)
        return len(queues)

    async def send_queue(
        self, client: httpx.AsyncClient, queue: list[LeasedDelivery], leased_at: float
    ) -> None:
        """Send one (endpoint, subject) queue in order, stopping at the first failure,
        then settle it."""
        delivered: list[tuple[int, int]] = []
        failures: list[Failure] = []
        released: list[int] = []
        gone: str | None = None
        lease_end = leased_at + self.lease_for.total_seconds()
        for pos, delivery in enumerate(queue):
            left = lease_end - time.monotonic()
            if self._stop.is_set() or left < self.settings.webhook_timeout + LEASE_MARGIN:
                released = [d.delivery_id for d in queue[pos:]]
                break
            attempt = await self.send(client, delivery)
            if attempt.delivered:
                assert attempt.status is not None
                delivered.append((delivery.delivery_id, attempt.status))
                continue
            self.failed += 1
            if attempt.gone:
                gone = f"the receiver answered 410 Gone at {timestamp(datetime.now(UTC))}"
            retry = None if attempt.gone else self.next_attempt(delivery)
            failures.append(Failure(delivery.delivery_id, attempt.status, attempt.error, retry))
            released = [d.delivery_id for d in queue[pos + 1 :]]
            log.info(
                "webhooks: %s to %s failed (%s); %s",
                delivery.id,
                delivery.endpoint.url,
                attempt.error,
                "parked" if retry is None else f"retry at {timestamp(retry)}",
            )
            break
        self.sent += len(delivered)
        await self._settle(delivered, failures, released)
        if gone is not None:
            endpoint = queue[0].endpoint
            log.warning("webhooks: endpoint %s (%s) disabled: %s", endpoint.id, endpoint.url, gone)
            await self._retrying(lambda: self.store.disable_endpoint(endpoint.id, gone))

    async def send(self, client: httpx.AsyncClient, delivery: LeasedDelivery) -> Attempt:
        """One signed POST of a delivery."""
        body = message_body(delivery)
        now = datetime.now(UTC)
        headers = signature_headers(delivery.id, delivery.endpoint.signing_secrets(now), now, body)
        try:
            answer = await client.post(
                delivery.endpoint.url, content=body.encode(), headers=headers
            )
        except httpx.HTTPError as exc:
            return Attempt(None, f"{type(exc).__name__}: {exc}".strip().rstrip(":"))
        reason = f"HTTP {answer.status_code}"
        return Attempt(answer.status_code, reason)

    def next_attempt(self, delivery: LeasedDelivery) -> datetime | None:
        """When to try a delivery again after its failed attempt; None: park it."""
        failed = delivery.attempts + 1
        wait = min(self.settings.webhook_max_backoff, FIRST_RETRY * 2 ** min(failed - 1, 40))
        at = datetime.now(UTC) + timedelta(seconds=wait * random.uniform(0.5, 1.0))
        deadline = delivery.retry_from + timedelta(seconds=self.settings.webhook_retry_seconds)
        return at if at <= deadline else None

    async def _settle(
        self,
        delivered: list[tuple[int, int]],
        failures: list[Failure],
        released: list[int],
    ) -> None:
        if delivered or failures or released:
            await self._retrying(
                lambda: self.store.settle(self.owner, delivered, failures, released)
            )

    async def _retrying(self, write: Callable[[], Awaitable[None]]) -> None:
        """Run a settling write, again while the database is away and the lease holds;
        if it never gets through, the lease runs out and the deliveries are sent again."""
        give_up = time.monotonic() + self.lease_for.total_seconds()
        wait = 0.2
        while True:
            try:
                await write()
                return
            except StorageError as exc:
                if time.monotonic() + wait > give_up:
                    log.error("webhooks: could not record deliveries, they will be resent: %s", exc)
                    return
                log.warning("webhooks: cannot record deliveries yet: %s", exc)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("webhooks: a send task crashed", exc_info=task.exception())

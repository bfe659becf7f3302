"""The webhook dispatcher: sends the outbox's deliveries, signed per Standard Webhooks.

At least once: a delivery is marked delivered only after its receiver answered 2xx, so
a dispatcher that dies between the two leaves it leased; when the lease runs out another
dispatcher (or the same one restarted) sends it again with the same ``webhook-id``,
which receivers use to drop repeats. In order per (endpoint, subject): see
hongbao.ledger.webhook_store for the lease. Several dispatchers share the queue.

A queue of one (endpoint, subject) is leased up to `LEASE_BATCH` events at a time (or
`LEASE_MESSAGES` full messages to an endpoint that takes batches), sent one message after
the other, and settled in one transaction that also leases the queue's
next deliveries, so a hot packet's claims cost the database one transaction per batch
and the queue flows on without waiting for the next poll. Different queues are sent
concurrently, up to `webhook_concurrency`.

An endpoint whose `batch_size` is above 1 gets up to that many of a queue's events in
one message (hongbao.webhooks.messages). A message costs a receiver and the dispatcher
about the same whatever it carries, so a batch shares that cost among its events. The
outbox queues a transaction's events of one subject to such an endpoint as one delivery
of up to `batch_size` events, and a message carries whole deliveries, so under load a
message is one row to lease and settle. A message holds what waited while the one before
it was sent: messages grow with the backlog and carry one event while there is none. A
message that fails is retried as a whole: the deliveries it carries share the first
one's retry time, and each is parked once that time falls outside its own retry window.

A failed attempt (no answer, or a status other than 2xx) is retried after a wait that
doubles from 1 s up to `webhook_max_backoff`, each drawn between half and all of its
value so that receivers coming back are not hit by every dispatcher at once; the rest
of the queue waits behind it. A delivery still failing `webhook_retry_seconds` after its
event is parked (`hongbao webhooks failed`, `retry`). A receiver answering 410 Gone
disables its endpoint: it receives nothing more, and its pending deliveries are parked.
Before each message a dispatcher checks that the endpoint still receives, as read at
most `ENDPOINT_RECHECK` seconds before (by the lease, or again): a lease in hand of an
endpoint an admin deleted, or another dispatcher disabled, stops within that.

A delivery queued for a larger `batch_size` than its endpoint has now goes out in
several messages. A lease that stops part way through it (running short with a slow
receiver, a failure) records the events that got through, split off as a delivered
delivery, and the next lease goes on from the first one not taken: a delivery that
needs more messages than fit in one lease is delivered over several, not started again
at each.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar

import aiohttp

from hongbao.errors import StorageError
from hongbao.ledger import SqlLedger
from hongbao.ledger.outbox import timestamp
from hongbao.ledger.webhook_records import EndpointRecord, Failure, LeasedDelivery, Progress
from hongbao.ledger.webhook_store import WebhookStore
from hongbao.settings import Settings
from hongbao.webhooks.endpoints import MAX_BATCH_SIZE, AllowedHosts
from hongbao.webhooks.messages import message, message_slices, signature_headers, spans

log = logging.getLogger("hongbao.webhooks")
T = TypeVar("T")

#: events of one (endpoint, subject) leased and settled together, at least: a full batch
#: message fits in one lease
LEASE_BATCH = MAX_BATCH_SIZE
#: full messages of one (endpoint, subject) leased and settled together, where that is
#: more events than `LEASE_BATCH`: a persister's transaction commits up to thousands of
#: a hot packet's claims at once (10,000 claims on SQLite), and settling takes the
#: database's write lock between two of them, so a queue must move about as many events
#: a round to keep up
LEASE_MESSAGES = 50
#: the first wait after a failed attempt, seconds; each further one doubles
FIRST_RETRY = 1.0
#: a dispatcher starts no send that could outlast its lease by less than this, seconds
LEASE_MARGIN = 5.0
#: a dispatcher sends to an endpoint only while it has seen it enabled within this many
#: seconds: a deleted or disabled endpoint gets no more of the lease in hand after that
ENDPOINT_RECHECK = 1.0
USER_AGENT = "hongbao-webhooks/1"
#: bytes of a receiver's answer read (and dropped) so its connection serves the next send;
#: a longer answer closes the connection
ANSWER_LIMIT = 64 * 1024


def lease_seconds(settings: Settings) -> float:
    """How long a lease holds (35 s by default): a queue starts no send with less than a
    timeout and the margin left, so every send made under a lease ends within it, and a
    dead dispatcher's deliveries are sent again that long after it leased them."""
    return 3 * settings.webhook_timeout + LEASE_MARGIN


@dataclass(slots=True)
class BatchOutcome:
    """What became of a leased batch: delivered (id, HTTP status), the events they
    carried, the failed attempt, the deliveries given back unsent, the events that got
    through of one sent in part, why the endpoint is gone (410), and whether every
    delivery got through."""

    delivered: list[tuple[int, int]] = field(default_factory=list)
    events: int = 0
    failures: list[Failure] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    #: the events that got through of a delivery sent in part
    progress: list[Progress] = field(default_factory=list)
    gone: str | None = None
    complete: bool = False


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
        #: checked before every send too: the setting may have narrowed since an
        #: endpoint was registered
        self.hosts = AllowedHosts.parse(settings.webhook_hosts)
        self.sent = 0
        self.failed = 0
        self._stop = asyncio.Event()
        self._continuations = _Continuations(self)
        #: endpoint id -> (time.monotonic() when read, whether it still receives)
        self._receiving: dict[str, tuple[float, bool]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.webhook_timeout),
            connector=aiohttp.TCPConnector(limit=max(self.settings.webhook_concurrency, 10)),
            headers={"user-agent": USER_AGENT, "content-type": "application/json"},
            cookie_jar=aiohttp.DummyCookieJar(),
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

    async def _take(self, client: aiohttp.ClientSession, running: set[asyncio.Task[None]]) -> int:
        """Lease what is due, as many queues as there is room for; start sending them."""
        room = self.settings.webhook_concurrency - len(running)
        if room <= 0:
            return 0
        started = time.monotonic()  # no later than the lease's start, which the database sets
        try:
            queues = await self.store.lease(
                self.owner,
                heads=room,
                batch=LEASE_BATCH,
                messages=LEASE_MESSAGES,
                lease_for=self.lease_for,
            )
        except StorageError as exc:
            log.warning("webhooks: cannot lease deliveries: %s", exc)
            return 0
        for queue in queues:
            task = asyncio.create_task(self.send_queue(client, queue, started))
            task.add_done_callback(_report_crash)
            running.add(task)
        return len(queues)

    async def send_queue(
        self, client: aiohttp.ClientSession, queue: list[LeasedDelivery], leased_at: float
    ) -> None:
        """Send one (endpoint, subject) queue in order, batch after batch, until it is
        empty, a send fails, or the dispatcher stops."""
        while queue:
            outcome = await self.send_batch(client, queue, leased_at)
            self.sent += outcome.events
            if not outcome.complete or self._stop.is_set():
                await self._finish(queue[-1].endpoint, outcome)
                return
            leased_at = time.monotonic()  # before the lease, as in _take
            queue = await self._continuations.next(outcome.delivered, queue[-1])

    async def _finish(self, endpoint: EndpointRecord, outcome: BatchOutcome) -> None:
        """Settle the last batch of a queue; disable its endpoint if it is gone."""
        settle = partial(
            self.store.settle,
            self.owner,
            outcome.delivered,
            outcome.failures,
            outcome.released,
            outcome.progress,
        )
        await self.retrying(settle, None)
        if outcome.gone is not None:
            # this dispatcher's other queues to it stop before their next message
            self._receiving[endpoint.id] = (time.monotonic(), False)
            log.warning(
                "webhooks: endpoint %s (%s) disabled: %s", endpoint.id, endpoint.url, outcome.gone
            )
            await self.retrying(
                partial(self.store.disable_endpoint, endpoint.id, outcome.gone), None
            )

    async def send_batch(
        self, client: aiohttp.ClientSession, queue: list[LeasedDelivery], leased_at: float
    ) -> BatchOutcome:
        """Send a leased batch in order, stopping at the first failure, before a send
        that could outlast the lease, or once the endpoint is deleted or disabled.

        A delivery of more events than the endpoint's `batch_size` (lowered since it was
        queued) goes out in several messages. When it stops part way, the events that
        got through are recorded (`Progress`), so the next lease sends from the first
        one not taken: a delivery needing more messages than fit in one lease (a slow
        receiver) still gets through, a lease at a time, rather than starting over."""
        outcome = BatchOutcome()
        lease_end = leased_at + self.lease_for.total_seconds()
        endpoint = queue[0].endpoint
        events = [e for d in queue for e in d.events]
        placed = spans(queue)
        status = 0  # the last 2xx, of the messages before `start`
        for start, end in message_slices(placed, endpoint.batch_size):
            left = lease_end - time.monotonic()
            if (
                self._stop.is_set()
                or left < self.settings.webhook_timeout + LEASE_MARGIN
                or not await self.receiving(endpoint, leased_at)
            ):
                outcome.released = [d.delivery_id for d, _, e in placed if e > start]
                outcome.progress = _progress(placed, start, status)
                return outcome
            carried = events[start:end]
            message_id, body = message(carried, endpoint.batch_size)
            attempt = await self.send(client, endpoint, message_id, body)
            if attempt.delivered:
                assert attempt.status is not None
                status = attempt.status
                outcome.events += len(carried)
                # a delivery is delivered with the message that carries its last event
                outcome.delivered.extend(
                    (d.delivery_id, attempt.status) for d, _, e in placed if start < e <= end
                )
                continue
            self.failed += 1
            if attempt.gone:
                outcome.gone = f"the receiver answered 410 Gone at {timestamp(datetime.now(UTC))}"
            # the deliveries a message carries (some of) retry together, at the first one's
            # time; each parks once the time falls outside its own retry window
            touched = [d for d, b, e in placed if b < end and e > start]
            at = None if attempt.gone else self.retry_at(touched[0])
            retries = [self.within_window(d, at) for d in touched]
            outcome.failures.extend(
                Failure(d.delivery_id, attempt.status, attempt.error, retry)
                for d, retry in zip(touched, retries, strict=True)
            )
            outcome.released = [d.delivery_id for d, b, _ in placed if b >= end]
            outcome.progress = _progress(placed, start, status)
            retry = next((r for r in retries if r is not None), None)
            log.info(
                "webhooks: %s to %s failed (%s); %s",
                message_id,
                endpoint.url,
                attempt.error,
                "parked" if retry is None else f"retry at {timestamp(retry)}",
            )
            return outcome
        outcome.complete = True
        return outcome

    async def send(
        self, client: aiohttp.ClientSession, endpoint: EndpointRecord, message_id: str, body: str
    ) -> Attempt:
        """One signed POST of a message to `endpoint`."""
        if not self.hosts.allows_url(endpoint.url):
            return Attempt(None, "the endpoint's host is not in HONGBAO_WEBHOOK_HOSTS")
        now = datetime.now(UTC)
        headers = signature_headers(message_id, endpoint.signing_secrets(now), now, body)
        try:
            async with client.post(
                endpoint.url, data=body.encode(), headers=headers, allow_redirects=False
            ) as answer:
                await _drain(answer)
                return Attempt(answer.status, f"HTTP {answer.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = str(exc) or ("timed out" if isinstance(exc, TimeoutError) else "")
            return Attempt(None, f"{type(exc).__name__}: {reason}".strip().rstrip(":"))

    async def receiving(self, endpoint: EndpointRecord, leased_at: float) -> bool:
        """Whether `endpoint` still receives (neither deleted nor disabled), as read at
        most `ENDPOINT_RECHECK` seconds ago: by the lease (at `leased_at` or after), by
        this check, or as this dispatcher disabled it. A database that cannot be read
        leaves the last answer standing."""
        now = time.monotonic()
        seen = self._receiving.get(endpoint.id)
        if seen is None or seen[0] < leased_at:
            seen = (leased_at, endpoint.enabled)
        if now - seen[0] >= ENDPOINT_RECHECK:
            try:
                found = await self.store.endpoint(endpoint.id)
            except StorageError as exc:
                log.warning("webhooks: cannot read endpoint %s: %s", endpoint.id, exc)
                seen = (now, seen[1])  # asked again after as long, not at every message
            else:
                seen = (now, found is not None and found.enabled)
        self._receiving[endpoint.id] = seen
        if not seen[1]:
            log.info("webhooks: endpoint %s is gone or disabled; its sends stop", endpoint.id)
        return seen[1]

    def retry_at(self, delivery: LeasedDelivery) -> datetime:
        """The backoff after the delivery's failed attempt: from now, doubling with each
        attempt up to `webhook_max_backoff`, drawn between half and all of it."""
        failed = delivery.attempts + 1
        wait = min(self.settings.webhook_max_backoff, FIRST_RETRY * 2 ** min(failed - 1, 40))
        return datetime.now(UTC) + timedelta(seconds=wait * random.uniform(0.5, 1.0))

    def within_window(self, delivery: LeasedDelivery, at: datetime | None) -> datetime | None:
        """`at` if it falls inside the delivery's retry window, else None (park it)."""
        deadline = delivery.retry_from + timedelta(seconds=self.settings.webhook_retry_seconds)
        return at if at is not None and at <= deadline else None

    async def retrying(self, write: Callable[[], Awaitable[T]], fallback: T) -> T:
        """Run a settling write, again while the database is away and the lease holds;
        if it never gets through, the lease runs out and the deliveries are sent again
        (`fallback` is returned)."""
        give_up = time.monotonic() + self.lease_for.total_seconds()
        wait = 0.2
        while True:
            try:
                return await write()
            except StorageError as exc:
                if time.monotonic() + wait > give_up:
                    log.error("webhooks: could not record deliveries, they will be resent: %s", exc)
                    return fallback
                log.warning("webhooks: cannot record deliveries yet: %s", exc)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)


def _progress(
    placed: list[tuple[LeasedDelivery, int, int]], start: int, status: int
) -> list[Progress]:
    """The delivery the queue's events before `start` end inside, if any, with the
    events of it they hold: they went out in messages answered 2xx (the last `status`)."""
    return [
        Progress(
            d.delivery_id,
            status,
            tuple(e.id for e in d.events[: start - b]),
            tuple(e.id for e in d.events[start - b :]),
        )
        for d, b, e in placed
        if b < start < e
    ]


async def _drain(answer: aiohttp.ClientResponse) -> None:
    """Read a receiver's answer up to `ANSWER_LIMIT` bytes (and drop it)."""
    read = 0
    while read < ANSWER_LIMIT:
        chunk = await answer.content.readany()
        if not chunk:
            return
        read += len(chunk)


class _Continuations:
    """Settles the finished batches of this dispatcher's queues and leases their next
    deliveries, the queues that finish while one such transaction is written going
    together in the next (one transaction for many queues, not one each)."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.waiting: list[Continuation] = []
        self.lock = asyncio.Lock()

    async def next(
        self, delivered: list[tuple[int, int]], last: LeasedDelivery
    ) -> list[LeasedDelivery]:
        """Settle a queue's batch `delivered` (ending with `last`); its next batch."""
        mine = Continuation(delivered, last, asyncio.get_running_loop().create_future())
        self.waiting.append(mine)
        async with self.lock:
            if not mine.next.done():
                together, self.waiting = self.waiting, []
                await self._write(together)
        return mine.next.result()

    async def _write(self, together: list[Continuation]) -> None:
        d = self.dispatcher
        try:
            write = partial(
                d.store.settle_and_lease_next,
                d.owner,
                [(c.delivered, c.last) for c in together],
                batch=LEASE_BATCH,
                messages=LEASE_MESSAGES,
                lease_for=d.lease_for,
            )
            none: list[list[LeasedDelivery]] = [[] for _ in together]
            nexts = await d.retrying(write, none)
            for continuation, queue in zip(together, nexts, strict=True):
                continuation.next.set_result(queue)
        finally:
            # on cancellation, a queue whose write did not happen ends; its lease runs out
            for continuation in together:
                if not continuation.next.done():
                    continuation.next.set_result([])


@dataclass(frozen=True, slots=True)
class Continuation:
    """A queue's finished batch, waiting for its next one."""

    delivered: list[tuple[int, int]]
    last: LeasedDelivery
    next: asyncio.Future[list[LeasedDelivery]]


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("webhooks: a send task crashed", exc_info=task.exception())

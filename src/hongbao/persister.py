"""The persister: bucket event streams -> SQL ledger, in batches.

It reads with a consumer group, applies a batch in SQL transactions, and acknowledges
only after the commits. The batch's packets are divided among `Settings.persister_lanes`
transactions that run at once, each on packets of its own, so that one packet's events
apply in stream order and no two lanes wait for each other's packets (their wallets
they lock in user order); SQLite, which has one writer, runs one. A replay is harmless
(unique claims, unique ledger references). Entries of a consumer that died are
reclaimed after an idle timeout; an entry that can never be applied is moved, with its
reason, to the bucket's dead-letter stream.

A persister that starts takes over at once what its previous run left pending (the
same consumer name: `Settings.persister_consumer`, or the embedded server's fixed one)
and what consumers named ``<this host>-<pid>`` whose process is gone left pending:
those cannot be at work on them, so waiting out the idle timeout would only delay
the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from hongbao.domain.moments import from_ms
from hongbao.errors import StorageError
from hongbao.ledger import SqlLedger
from hongbao.ledger.sql import ClaimEvent, LedgerEvent, RefundEvent
from hongbao.pace import REPORT_TTL_MS
from hongbao.settings import Settings
from hongbao.storage.codec import Refund, decode_entries
from hongbao.storage.redis import Event, Pending, RedisStore

log = logging.getLogger("hongbao.persister")

#: A persister transaction applies up to this many times `Settings.persister_batch` claims
#: (one this large happens only with a backlog). A transaction has a fixed cost (its
#: statements' round trips, the pool's ping, the commit: about a millisecond of the
#: persister's CPU on PostgreSQL), so larger ones cost less a claim; lanes lock the
#: wallets of a transaction in user order, so a larger one holds them longer but never
#: deadlocks another.
SERVER_BATCH_FACTOR = 4
#: The same on SQLite, which writes every page a transaction changed to its WAL whole (and
#: copies it back at the checkpoint). Claims of users spread over the user-ordered
#: indexes change a page each unless many share a transaction, and SQLite has one
#: writer, so no lanes overlap its work. One transaction holds the write lock for up to
#: about half a second under a storm, which a send or deposit waits out
#: (docs/performance.md, Settlement).
SQLITE_BATCH_FACTOR = 10


_paused = 0
_paused_lock = threading.Lock()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off while a batch is parsed, applied and acknowledged.

    A batch allocates a few objects a claim (entries, claim events, column lists), none in
    a reference cycle: reference counting frees each when the batch is done. Collections
    that so many allocations would set off walk them all for nothing. Cycles that other
    code of the process makes meanwhile wait for the next collection. Nests, and holds
    across threads: the collector is back on when the last batch in the process is done."""
    global _paused
    with _paused_lock:
        # switched off by someone else: theirs to switch on
        ours = _paused > 0 or gc.isenabled()
        if ours:
            _paused += 1
            gc.disable()
    try:
        yield
    finally:
        if ours:
            with _paused_lock:
                _paused -= 1
                if _paused == 0:
                    gc.enable()


def default_consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def gone_from_this_host(consumer: str) -> bool:
    """True for a default consumer name (``<hostname>-<pid>``) of this host whose process
    no longer runs: its pending entries have nobody working on them."""
    host, _, pid = consumer.rpartition("-")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def packet_lanes(events: Sequence[LedgerEvent], count: int) -> list[list[int]]:
    """The events' positions divided into at most `count` lanes, each packet's events in
    one lane, in stream order; the packets with most events first, each to the lane
    with fewest events so far."""
    per_packet = Counter(ev.packet_id for ev in events)
    load = [0] * min(count, len(per_packet))
    lane_of: dict[str, int] = {}
    for packet_id, n in per_packet.most_common():
        lane = load.index(min(load))
        lane_of[packet_id] = lane
        load[lane] += n
    out: list[list[int]] = [[] for _ in load]
    for pos, ev in enumerate(events):
        out[lane_of[ev.packet_id]].append(pos)
    return out


#: `from_ms`, one datetime per millisecond: in a storm dozens of claims share each one
claim_moment = lru_cache(maxsize=4096)(from_ms)


def parse_event(event: Event) -> list[LedgerEvent]:
    """The ledger events of a stream entry (a grants entry holds several, a grouped one
    several packets' grants); ValueError says why it is malformed."""
    out: list[LedgerEvent] = []
    for entry in decode_entries(event.fields):
        if isinstance(entry, Refund):
            out.append(
                RefundEvent(
                    entry.packet_id,
                    entry.sender_id,
                    entry.amount,
                    entry.shares_left,
                    from_ms(entry.closed_at_ms),
                    entry.cancelled,
                )
            )
            continue
        actors = entry.actors
        out += [
            ClaimEvent(
                entry.packet_id,
                claim.share_index,
                user,
                claim.amount,
                claim_moment(claim.claimed_at_ms),
                actors.get(user) if actors else None,
            )
            for user, claim in entry.claims
        ]
    return out


@dataclass
class PersisterStats:
    batches: int = 0
    applied: int = 0  # ledger events (claims, refunds), not stream entries
    dead_lettered: int = 0
    reclaimed: int = 0
    db_failures: int = 0
    #: steps that failed with an unexpected (not a storage) error
    failures: int = 0


class Persister:
    """One persister process (or task). Several may run; the group divides the work."""

    def __init__(
        self,
        store: RedisStore,
        ledger: SqlLedger,
        settings: Settings,
        consumer: str | None = None,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.settings = settings
        self.consumer = consumer or settings.persister_consumer or default_consumer_name()
        self.stats = PersisterStats()
        sqlite = ledger.dialect == "sqlite"
        self.lanes = 1 if sqlite else settings.persister_lanes
        #: claims per transaction, at most
        factor = SQLITE_BATCH_FACTOR if sqlite else SERVER_BATCH_FACTOR
        self.transaction_claims = settings.persister_batch * factor
        self.healthy = True
        self._loop_turns = 0
        #: the next read, sent while a batch applies (see `step`)
        self._read_ahead: asyncio.Task[list[Event]] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set; finishes the batch in hand before returning.

        A step that fails is tried again after a backoff, whatever the error: a
        StorageError (Redis or the database away) is logged as a warning, anything else
        with its traceback. The entries of a failed batch stay pending: `reclaim` brings
        them back, and parks one delivered `persister_max_deliveries` times, so no entry
        stops the persister for good."""
        backoff = 0.05
        ready = taken_over = False
        try:
            while not stop.is_set():
                try:
                    if not ready:
                        await self.store.ensure_groups()
                        ready = True
                    if not taken_over:
                        await self.take_over()
                        taken_over = True
                    await self.step()
                    backoff = 0.05
                    self.healthy = True
                except Exception as exc:
                    self.healthy = False
                    if isinstance(exc, StorageError):
                        self.stats.db_failures += 1
                        log.warning("persister: %s; retrying in %.2fs", exc, backoff)
                    else:
                        self.stats.failures += 1
                        log.exception("persister: step failed; retrying in %.2fs", backoff)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), backoff)
                    backoff = min(backoff * 2, 5.0)
            with contextlib.suppress(StorageError):
                await self.handle(await self._take_read_ahead())
        finally:
            if self._read_ahead is not None:  # cancelled: what it read stays pending
                self._read_ahead.cancel()

    async def step(self) -> int:
        """Reclaim from dead consumers now and then, read one batch and apply it.

        While a batch applies, the next one is read without waiting for new entries
        (Redis's round trip and the reply's decoding overlap the database's work); the
        next step applies it. Those entries are this consumer's from the moment they are
        read, so a persister that stops applies them first (`run`, `drain`), and one that
        dies leaves them pending for `take_over` like any other."""
        self._loop_turns += 1
        handled = 0
        if self._loop_turns % 20 == 1:
            handled += await self.reclaim()
        events = await self._take_read_ahead() or await self._read(self.settings.persister_block_ms)
        if events:
            self._read_ahead = asyncio.ensure_future(self._read(None))
            handled += await self.handle(events)
            await self._report_lag(events)
        return handled

    async def _read(self, block_ms: int | None) -> list[Event]:
        return await self.store.read_events(self.consumer, self.settings.persister_batch, block_ms)

    async def _take_read_ahead(self) -> list[Event]:
        """The entries of the read sent during the last batch, if any."""
        ahead, self._read_ahead = self._read_ahead, None
        return await ahead if ahead is not None else []

    async def drain(self) -> None:
        """Apply until every bucket stream is empty (tests, shutdown); wrap in a timeout."""
        while True:
            await self.step()
            if await self.store.backlog() == 0:
                left = await self._take_read_ahead()
                if not left:
                    return
                await self.handle(left)

    async def handle(self, events: Sequence[Event]) -> int:
        """Apply a batch; on success acknowledge it. StorageError leaves it pending.

        Shielded: a cancelled persister finishes the batch in hand (commit and ack)
        instead of abandoning an open transaction that would hold database locks.
        """
        if not events:
            return 0
        return await asyncio.shield(self._handle(events))

    async def _handle(self, events: Sequence[Event]) -> int:
        with collector_paused():
            return await self._handle_batch(events)

    async def _handle_batch(self, events: Sequence[Event]) -> int:
        parsed: list[tuple[Event, list[LedgerEvent]]] = []
        for event in events:
            try:
                parsed.append((event, parse_event(event)))
            except ValueError as exc:
                await self._dead_letter(event, str(exc))
        if parsed:
            outcomes = iter(await self._apply_in_slices([e for _, entry in parsed for e in entry]))
            done: dict[str, list[str]] = defaultdict(list)
            for event, entry in parsed:
                # an entry's good grants stay applied (a replay would be harmless); the
                # entry is parked with the reasons of the ones that could not be
                reasons = [r for r in (next(outcomes) for _ in entry) if r is not None]
                if not reasons:
                    done[event.stream].append(event.id)
                    self.stats.applied += len(entry)
                else:
                    await self._dead_letter(event, "; ".join(reasons))
            for stream, ids in done.items():
                await self.store.ack(stream, ids)
            self.stats.batches += 1
        return len(events)

    async def _report_lag(self, events: Sequence[Event]) -> None:
        """Report how far behind the grabs the ledger is (hongbao.pace): the age of the
        oldest entry of a batch just read and applied, from the time in its stream id.
        Entries taken over from a dead consumer are old for another reason, and say
        nothing of the pace."""
        oldest = min(int(e.id.partition("-")[0]) for e in events)
        lag_ms = max(0, int(time.time() * 1000) - oldest)
        with contextlib.suppress(StorageError):
            await self.store.report_settle_lag(lag_ms, REPORT_TTL_MS)

    async def _apply_in_slices(self, events: list[LedgerEvent]) -> list[str | None]:
        """The events in `self.lanes` lanes at once (`packet_lanes`), each lane's in slices of
        at most `transaction_claims`: a grant entry holds up to a coalesced batch of
        claims, and transactions stay bounded. Waits for every lane before it raises."""
        size = self.transaction_claims

        async def lane(part: list[LedgerEvent]) -> list[str | None]:
            outcomes: list[str | None] = []
            for start in range(0, len(part), size):
                outcomes += await self._apply(part[start : start + size])
            return outcomes

        positions = packet_lanes(events, self.lanes)
        done = await asyncio.gather(
            *(lane([events[p] for p in part]) for part in positions), return_exceptions=True
        )
        outcome: list[str | None] = [None] * len(events)
        for part, result in zip(positions, done, strict=True):
            if isinstance(result, BaseException):
                raise result
            for pos, reason in zip(part, result, strict=True):
                outcome[pos] = reason
        return outcome

    async def _apply(self, events: list[LedgerEvent]) -> list[str | None]:
        """The batch in one transaction; if it fails for a non-storage reason, one by one."""
        try:
            return await self.ledger.apply(events)
        except StorageError:
            raise
        except Exception as exc:
            if len(events) == 1:
                return [f"cannot apply: {type(exc).__name__}: {exc}"]
            log.warning("persister: batch failed (%s); applying entries one by one", exc)
            return [(await self._apply([e]))[0] for e in events]

    async def take_over(self) -> int:
        """Apply now the entries pending for this consumer (its previous run) and for the
        same-host consumers whose process is gone (see `gone_from_this_host`)."""
        handled = 0
        for bucket in range(self.store.buckets):
            for name in await self.store.pending_consumers(bucket):
                if name == self.consumer or gone_from_this_host(name):
                    handled += await self._take_all(bucket, name)
        return handled

    async def _take_all(self, bucket: int, consumer: str) -> int:
        handled = 0
        seen: set[str] = set()
        while True:
            pending = await self.store.pending(
                bucket, 0, self.settings.persister_batch, consumer=consumer
            )
            fresh = [p for p in pending if p.id not in seen]
            if not fresh:  # none left (or only entries whose data is gone)
                return handled
            seen.update(p.id for p in fresh)
            if consumer != self.consumer:
                log.info("persister: taking over %d entries of %s", len(fresh), consumer)
            handled += await self._claim_and_apply(bucket, fresh, 0)

    async def reclaim(self) -> int:
        """Take over entries idle too long in dead consumers; dead-letter over-delivered ones."""
        idle = self.settings.persister_claim_idle_ms
        handled = 0
        for bucket in range(self.store.buckets):
            pending = await self.store.pending(bucket, idle, self.settings.persister_batch)
            if pending:
                handled += await self._claim_and_apply(bucket, pending, idle)
        return handled

    async def _claim_and_apply(self, bucket: int, pending: list[Pending], idle_ms: int) -> int:
        """Claim `pending` entries for this consumer and apply them; an entry delivered
        persister_max_deliveries times already goes to the dead-letter stream."""
        taken = await self.store.claim_entries(
            bucket, self.consumer, idle_ms, [p.id for p in pending]
        )
        deliveries = {p.id: p.deliveries for p in pending}
        fresh: list[Event] = []
        for event in taken:
            if deliveries.get(event.id, 0) >= self.settings.persister_max_deliveries:
                await self._dead_letter(
                    event, f"not applied after {deliveries[event.id]} deliveries"
                )
            else:
                fresh.append(event)
        self.stats.reclaimed += len(taken)
        return await self.handle(fresh)

    async def _dead_letter(self, event: Event, reason: str) -> None:
        log.error("persister: dead-lettering %s %s: %s", event.stream, event.id, reason)
        await self.store.dead_letter(event, reason)
        self.stats.dead_lettered += 1

"""When is a grab acknowledged? The `--ack` modes (setting `ack_mode`).

=========  ============================================  ==========================================
mode       the answer is sent after                      an acknowledged grab can be lost when
=========  ============================================  ==========================================
redis      the grab script ran (fastest)                 Redis dies before its AOF fsync (up to
                                                         ~1 s with ``appendfsync everysec``) or a
                                                         failover promotes a replica that lagged
aof        ``WAITAOF 1 0``: the local AOF fsynced it     the Redis host's disk is lost (a failover
           (Redis >= 7.2 / Valkey, ``appendonly yes``)   to a lagging replica still loses it)
replica    ``WAIT 1``: one replica has it in memory      primary and that replica die together
                                                         before either fsyncs
ledger     the claim is committed in the SQL ledger      the SQL database loses a commit (never,
                                                         with a durable database)
=========  ============================================  ==========================================

Group commit keeps the waiting modes fast. ``WAIT``/``WAITAOF`` cover every write
made on the server before them (they wait for a replication/fsync offset), so one
call answers all grabs that finished before it was sent: a waiter
issues one call for everything that is waiting and, while it is in flight,
collects the next group; concurrent grabs (and coalesced batches) share calls
(one waiter per process on one server or a Sentinel primary; on Redis Cluster one
per bucket, asking the primary that holds the bucket).
To make the offset cover other connections' writes, each call first writes a
tiny probe key on its own connection (``INCR``) in the same pipeline.

``ledger`` mode commits the claims in the grabbing process: granted claims queue
up and one flusher per process applies them with `SqlLedger.apply` in a single
transaction (the persister's idempotent path; the persister later sees the same
stream entries as harmless replays). Cost: every claim is written twice (once
here, once replayed by the persister as a no-op) and the grab's latency includes
an SQL commit; the throughput stays high because one transaction carries every
claim that arrived while the previous one committed.

A repeated grab (the same user again) waits too: its first answer may have
failed after the Redis script ran, so the repeat must not be the first answer
that skips the durability step.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from hongbao.domain.moments import from_ms
from hongbao.errors import ConfigurationError, StorageError
from hongbao.keys import PREFIX, PacketKeys, bucket_tag
from hongbao.ledger import SqlLedger
from hongbao.ledger.sql import ClaimEvent
from hongbao.settings import ACK_MODES, Settings
from hongbao.storage.codec import ClaimValue
from hongbao.storage.redis import RedisStore

log = logging.getLogger("hongbao.durability")


#: the start-up check runs twice (a preflight, then the service): say it once
_warned_no_replica = False


def _warn_no_replica() -> None:
    global _warned_no_replica
    _warned_no_replica = True
    log.warning("--ack replica: no replica connected yet; grabs will fail")


def probe_key(bucket: int) -> str:
    """A counter in the bucket's slot, written just before each WAIT/WAITAOF."""
    return f"{PREFIX}:{bucket_tag(bucket)}:durable"


class Durability:
    """Acknowledgement policy. The base class is mode ``redis``: nothing to wait for."""

    mode = "redis"
    #: False when confirm() has nothing to wait for (the grab path then skips the call)
    waits = False

    async def check(self) -> None:
        """Refuse (ConfigurationError) a server that cannot give this guarantee."""

    async def confirm(
        self, keys: PacketKeys, user_id: str, claim: ClaimValue, actor: str | None = None
    ) -> None:
        """Return once `claim` is as durable as the mode promises; StorageError if not.
        `actor` is the service that grabbed for the user, if one did."""

    async def aclose(self) -> None:
        """Finish what is in flight."""


@dataclass
class _Round:
    """Grabs waiting for the next WAIT/WAITAOF call of one bucket."""

    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class RedisWaitDurability(Durability):
    """``aof`` (WAITAOF 1 0 timeout) and ``replica`` (WAIT 1 timeout), group-committed."""

    waits = True

    def __init__(self, store: RedisStore, mode: str, timeout_ms: int) -> None:
        self.store = store
        self.mode = mode
        self.timeout_ms = timeout_ms
        self._next: dict[int, _Round] = {}
        self._busy: dict[int, bool] = defaultdict(bool)
        self._tasks: set[asyncio.Task[None]] = set()
        #: calls made and grabs confirmed, to see the group commit at work
        self.calls = 0
        self.confirmed = 0

    async def check(self) -> None:
        try:
            if self.mode == "aof":
                await self._probe_and_wait(0, 100)
            elif not self.store.cluster:  # a cluster's slot owners are primaries by definition
                role, replicas = await self.store.replication()
                if role != "master":
                    raise ConfigurationError("--ack replica needs the Redis primary")
                if replicas < 1 and not _warned_no_replica:
                    _warn_no_replica()
        except StorageError as exc:
            text = str(exc)
            if "unknown command" in text.lower():
                raise ConfigurationError(
                    "--ack aof needs WAITAOF (Redis >= 7.2 or Valkey); this server lacks it"
                ) from None
            raise ConfigurationError(f"--ack {self.mode}: {text}") from None

    async def confirm(
        self, keys: PacketKeys, user_id: str, claim: ClaimValue, actor: str | None = None
    ) -> None:
        # one server: one waiter covers every bucket's writes; on a cluster each
        # bucket's primary is asked about its own writes
        bucket = keys.bucket if self.store.cluster else 0
        round_ = self._next.setdefault(bucket, _Round())
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        round_.waiters.append(done)
        if not self._busy[bucket]:
            self._busy[bucket] = True
            task = asyncio.create_task(self._flush(bucket))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await done

    async def _flush(self, bucket: int) -> None:
        try:
            while (round_ := self._next.pop(bucket, None)) is not None:
                try:
                    await self._wait(bucket)
                except Exception as exc:
                    for fut in round_.waiters:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                self.confirmed += len(round_.waiters)
                for fut in round_.waiters:
                    if not fut.done():
                        fut.set_result(None)
        finally:
            self._busy[bucket] = False

    async def _wait(self, bucket: int) -> None:
        self.calls += 1
        answer = await self._probe_and_wait(bucket, self.timeout_ms)
        if self.mode == "aof":
            if int(answer[0]) < 1:
                raise StorageError("redis: the AOF fsync was not confirmed in time")
        elif int(answer) < 1:
            raise StorageError("redis: no replica confirmed the grab in time")

    async def _probe_and_wait(self, bucket: int, timeout_ms: int) -> Any:
        """Write the bucket's probe key, then WAIT/WAITAOF on that same connection."""
        wait: tuple[Any, ...] = (
            ("WAITAOF", 1, 0, timeout_ms) if self.mode == "aof" else ("WAIT", 1, timeout_ms)
        )
        return await self.store.write_then_wait(probe_key(bucket), *wait)


class LedgerDurability(Durability):
    """``ledger``: claims are committed to SQL in batches by this process before answering."""

    mode = "ledger"
    waits = True

    def __init__(self, ledger: SqlLedger, max_batch: int) -> None:
        self.ledger = ledger
        self.max_batch = max_batch
        self._queue: list[tuple[ClaimEvent, asyncio.Future[None]]] = []
        self._busy = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        self.confirmed = 0

    async def confirm(
        self, keys: PacketKeys, user_id: str, claim: ClaimValue, actor: str | None = None
    ) -> None:
        # the persister's copy of this claim is a replay once this one is in the ledger:
        # this one carries the actor
        event = ClaimEvent(
            keys.packet_id,
            claim.share_index,
            user_id,
            claim.amount,
            from_ms(claim.claimed_at_ms),
            actor,
        )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((event, done))
        if not self._busy:
            self._busy = True
            task = asyncio.create_task(self._flush())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        await done

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
                self.calls += 1
                try:
                    outcomes = await self.ledger.apply([e for e, _ in batch])
                except Exception as exc:
                    error = exc if isinstance(exc, StorageError) else StorageError(str(exc))
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(error)
                    continue
                for (event, fut), reason in zip(batch, outcomes, strict=True):
                    if fut.done():
                        continue
                    if reason is None:
                        self.confirmed += 1
                        fut.set_result(None)
                    else:
                        log.error("ledger ack: claim %s refused: %s", event, reason)
                        fut.set_exception(StorageError(f"the ledger refused the claim: {reason}"))
        finally:
            self._busy = False

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def make_durability(settings: Settings, store: RedisStore, ledger: SqlLedger) -> Durability:
    mode = settings.ack_mode.lower()
    if mode not in ACK_MODES:
        raise ConfigurationError(f"ack mode must be one of {', '.join(ACK_MODES)}, not {mode!r}")
    if mode in ("aof", "replica"):
        return RedisWaitDurability(store, mode, settings.ack_timeout_ms)
    if mode == "ledger":
        return LedgerDurability(ledger, settings.ledger_ack_batch)
    return Durability()

"""Redis Cluster store: the same scripts, run on the primary of their slot.

Every script's keys carry one bucket's hash tag (see hongbao.keys), so each call
is single-slot and redis-py routes it to the slot's primary, following MOVED and
ASK (and TRYAGAIN while a slot migrates) on its own. What differs from one server:

- a node that never saw a script (a fresh primary after a failover or a
  resharding, a restarted node) answers NOSCRIPT; the script is then sent with
  EVAL to that node only (which caches it there), not SCRIPT LOAD to every primary,
  which would fail while any other primary is down;
- one XREADGROUP cannot span slots, so the persister reads each bucket stream on
  its own (concurrently);
- the cluster client's per-node pool fails instead of waiting when it is full, so
  commands in flight are capped at the pool size here (a burst queues, as on one
  server with its blocking pool).
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, ClassVar

from redis.asyncio.cluster import PipelineCommand, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import AskError, MovedError, NoScriptError, RedisClusterException

from hongbao.errors import StorageError
from hongbao.keys import PERSISTER_GROUP, dead_letter_key, events_key
from hongbao.storage.redis import Event, RedisClient, RedisStore, events_of_reply


def _only(stream: str) -> dict[Any, Any]:
    return {stream: ">"}


class RedisClusterStore(RedisStore):
    """On a cluster one XREADGROUP cannot span slots, so each bucket is read on its own."""

    cluster: ClassVar[bool] = True

    def __init__(
        self,
        client: RedisClient,
        buckets: int,
        max_connections: int = 64,
        *,
        allow_eviction: bool = False,
    ) -> None:
        super().__init__(client, buckets, allow_eviction=allow_eviction)
        self._gate = asyncio.Semaphore(max_connections)
        self._init_lock = asyncio.Lock()
        #: NOSCRIPT answers seen (scripts sent again with EVAL), for tests and metrics
        self.noscript_fallbacks = 0

    async def read_events(self, consumer: str, count: int, block_ms: int | None) -> list[Event]:
        """New entries from every bucket stream, each read on its own node, concurrently.

        If some nodes fail (a failover under way), the entries read from the others
        are still returned: they are delivered to this consumer now, and dropping
        them would leave them pending until the idle-timeout reclaim. Only when
        nothing was read does the first error surface.
        """
        per_bucket = max(1, count // self.buckets)
        replies = await asyncio.gather(
            *(
                self._call(
                    self.client.xreadgroup(PERSISTER_GROUP, consumer, _only(s), count=per_bucket)
                )
                for s in self.streams()
            ),
            return_exceptions=True,
        )
        failures = [r for r in replies if isinstance(r, BaseException)]
        if unexpected := [r for r in failures if not isinstance(r, StorageError)]:
            raise unexpected[0]  # cancellation, or a bug: never swallowed
        events = [
            e for r in replies if not isinstance(r, BaseException) for e in events_of_reply(r)
        ]
        if failures and not events:
            raise failures[0]
        if not events and block_ms:
            await asyncio.sleep(min(block_ms, 50) / 1000)
        return events

    async def ensure_groups(self) -> None:
        """Create the persister group on every bucket stream (idempotent, each on its node)."""

        async def one(stream: str) -> None:
            try:
                await self._call(
                    self.client.xgroup_create(stream, PERSISTER_GROUP, id="0", mkstream=True)
                )
            except StorageError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise StorageError(f"cannot create consumer group on {stream}: {exc}") from exc

        await self.check_server()
        await asyncio.gather(*(one(s) for s in self.streams()))

    async def stream_lengths(self) -> tuple[int, int]:
        """(event stream entries, dead-letter entries): each stream asked on its own node."""
        keys = [k for b in range(self.buckets) for k in (events_key(b), dead_letter_key(b))]
        lengths = await asyncio.gather(*(self._call(self.client.xlen(k)) for k in keys))
        return sum(int(n) for n in lengths[0::2]), sum(int(n) for n in lengths[1::2])

    async def write_then_wait(self, probe_key: str, *wait: Any) -> Any:
        """INCR `probe_key`, then `wait` (e.g. WAIT 1 1000), on one connection of its primary.

        WAIT / WAITAOF count from the calling connection's last write, and a cluster
        client would send a keyless WAIT to every primary on pooled connections; so
        both go, pipelined, to the primary serving the probe key's slot (the
        bucket's slot, when the probe key carries the bucket's hash tag).
        """

        async def run() -> Any:
            client = self.client
            assert isinstance(client, RedisCluster)
            node = client.get_node_from_key(probe_key)
            if node is None:
                raise StorageError(f"redis cluster: no primary serves {probe_key!r}")
            commands = [PipelineCommand(0, "INCR", probe_key), PipelineCommand(1, *wait)]
            await node.execute_pipeline(commands)
            for command in commands:
                if isinstance(command.result, MovedError | AskError):
                    await client.nodes_manager.move_slot(command.result)
                if isinstance(command.result, Exception):
                    raise command.result
            return commands[1].result

        return await self._call(run())

    async def _infos(self, section: str) -> list[dict[str, Any]]:
        """INFO `section` of every node the client knows (the primaries)."""
        info = await self._call(self.client.info(section, target_nodes=RedisCluster.ALL_NODES))
        # several nodes answer {node name: their INFO}; a cluster of one, its INFO
        if all(isinstance(v, dict) for v in info.values()):
            return list(info.values())
        return [info]

    async def _evalsha(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """On NOSCRIPT, EVAL on that node only (see the module's docstring)."""
        try:
            return await self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.noscript_fallbacks += 1
            return await self.client.eval(script.script, len(keys), *keys, *args)  # type: ignore[arg-type]

    async def _call(self, awaitable: Any) -> Any:  # type: ignore[override]
        try:
            await self._gate.acquire()
        except BaseException:
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # cancelled while queued: the command was never sent
            raise
        try:
            if getattr(self.client, "_initialize", False):
                await self._call_initialize()
            return await RedisStore._call(awaitable)
        except (RedisClusterException, AttributeError) as exc:
            # RedisClusterException (e.g. SlotNotCoveredError) is no RedisError; and
            # while a failover reinitializes the client, redis-py can close a
            # connection under a command in flight ('NoneType' has no 'writelines')
            raise StorageError(f"redis cluster: {type(exc).__name__}: {exc}") from exc
        finally:
            if inspect.iscoroutine(awaitable) and awaitable.cr_frame is not None:
                awaitable.close()  # initialization failed: the command was never sent
            self._gate.release()

    async def _call_initialize(self) -> None:
        """Learn the slot map once: redis-py races when many first commands run at once."""
        async with self._init_lock:
            await RedisStore._call(self.client.initialize())


__all__ = ["RedisClusterStore"]

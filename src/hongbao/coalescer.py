"""Coalescing concurrent grabs into batch-script calls.

Grabs are queued in one lane (on Redis Cluster, one lane per bucket = slot). A grab
that finds no call outstanding for its lane is sent at once, so light load adds no
wait; grabs that arrive while a call is in flight ride together in the next call (at
most `max_batch` of them). A further call starts in parallel, up to `max_in_flight`,
only while `parallel_at` grabs per call in flight are waiting: a storm from one
process keeps Redis busy with several full calls, while HTTP workers, whose own CPU
is the limit, send fewer and fuller calls (each call costs both sides far more than
a grab in it). Each caller gets its own answer; a failed call fails only its grabs.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from dataclasses import dataclass, field

from hongbao.errors import StorageError
from hongbao.keys import PacketKeys
from hongbao.storage.codec import grabber
from hongbao.storage.redis import Answer, RedisStore

#: after a call, while grabs wait but fewer than FILL_TO, the next call waits up to
#: FILL_TURNS turns of the event loop for the requests being read meanwhile to join: each
#: call costs both the worker and Redis far more than a grab in it, so fuller calls are
#: cheaper (see docs/performance.md). Nothing waits when the lane is empty, so light load
#: adds no wait.
FILL_TURNS = 3
FILL_TO = 32


@dataclass
class _Lane:
    waiting: deque[tuple[PacketKeys, str, asyncio.Future[Answer]]] = field(default_factory=deque)
    in_flight: int = 0


class GrabCoalescer:
    def __init__(
        self,
        store: RedisStore,
        max_batch: int = 64,
        max_in_flight: int = 4,
        parallel_at: int = 16,
    ) -> None:
        self.store = store
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.parallel_at = parallel_at
        if max_batch == 1:  # coalescing off: every grab is a script call of its own, at once
            self.max_in_flight, self.parallel_at = sys.maxsize, 0
        #: a cluster script call stays in one slot, so grabs queue per bucket there; one
        #: server takes any mix of packets in one call, so there is a single lane
        self.per_bucket = store.cluster
        self._lanes: dict[int, _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: grabs sent, packets they were for (counted once a call) and script calls made,
        #: to see the coalescing at work
        self.grabs = 0
        self.packets = 0
        self.calls = 0

    def submit(
        self,
        keys: PacketKeys,
        user_id: str,
        actor: str | None = None,
        digests: str | None = None,
    ) -> asyncio.Future[Answer]:
        """Queue one grab (by `actor` for the user, when given; carrying a passphrase's
        `digests`, when given); the future gets its answer, or the StorageError of its call.
        Grabs with and without an actor or a passphrase ride together."""
        if actor is not None or digests is not None:
            user_id = grabber(user_id, actor, digests)
        lane_key = keys.bucket if self.per_bucket else 0
        lane = self._lanes.get(lane_key)
        if lane is None:
            lane = self._lanes[lane_key] = _Lane()
        answer: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        waiting = lane.waiting
        waiting.append((keys, user_id, answer))
        in_flight = lane.in_flight
        if in_flight == 0 or (
            in_flight < self.max_in_flight and len(waiting) >= self.parallel_at * in_flight
        ):
            lane.in_flight += 1
            task = asyncio.create_task(self._send(lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return answer

    async def _send(self, lane: _Lane) -> None:
        """Send batches from the lane until it is empty."""
        try:
            waiting = lane.waiting
            while waiting:
                batch = [waiting.popleft() for _ in range(min(self.max_batch, len(waiting)))]
                # one group per packet, users and answers in arrival order
                groups: dict[str, tuple[PacketKeys, list[str], list[asyncio.Future[Answer]]]] = {}
                for keys, user, fut in batch:
                    group = groups.get(keys.packet_id)
                    if group is None:
                        group = groups[keys.packet_id] = (keys, [], [])
                    group[1].append(user)
                    group[2].append(fut)
                self.calls += 1
                self.grabs += len(batch)
                self.packets += len(groups)
                try:
                    answers = await self.store.grab_batch([(k, u) for k, u, _ in groups.values()])
                except Exception as exc:
                    for _, _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                futures = [fut for _, _, futs in groups.values() for fut in futs]
                for fut, answer in zip(futures, answers, strict=True):
                    if fut.done():
                        continue
                    if isinstance(answer, StorageError):
                        fut.set_exception(answer)
                    else:
                        fut.set_result(answer)
                for _ in range(FILL_TURNS):
                    if not waiting or len(waiting) >= FILL_TO:
                        break
                    # a few grabs came in during the call: let the requests the next turns
                    # of the event loop read join them (fewer, fuller calls)
                    await asyncio.sleep(0)
        finally:
            lane.in_flight -= 1

"""Redis Cluster store: the same scripts, but stream reads go slot by slot."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from hongbao.keys import PERSISTER_GROUP
from hongbao.storage.redis import Event, RedisStore, _events


def _only(stream: str) -> dict[Any, Any]:
    return {stream: ">"}


class RedisClusterStore(RedisStore):
    """On a cluster one XREADGROUP cannot span slots, so each bucket is read on its own."""

    cluster: ClassVar[bool] = True

    async def read_events(self, consumer: str, count: int, block_ms: int) -> list[Event]:
        per_bucket = max(1, count // self.buckets)
        replies = await asyncio.gather(
            *(
                self._call(
                    self.client.xreadgroup(PERSISTER_GROUP, consumer, _only(s), count=per_bucket)
                )
                for s in self.streams()
            )
        )
        events = [e for reply in replies for e in _events(reply)]
        if not events and block_ms:
            await asyncio.sleep(min(block_ms, 50) / 1000)
        return events

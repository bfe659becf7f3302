"""The expiry sweeper: closes packets past their expiry; the refund flows via the persister."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from hongbao.errors import StorageError
from hongbao.service import Hongbao

log = logging.getLogger("hongbao.sweeper")

CLOSED_NOW, NOT_IN_REDIS = 1, 0


class Sweeper:
    """Finds open packets past `expires_at` in the ledger and closes them in Redis.

    close.lua checks the expiry against the Redis server's clock (the same clock
    grabs use) and appends the refund event in the same atomic step. A packet
    Redis lost is rebuilt from the ledger first, so its remainder is refunded too.
    """

    def __init__(self, service: Hongbao) -> None:
        self.service = service
        self.closed = 0

    async def sweep_once(self) -> int:
        store, ledger = self.service.store, self.service.ledger
        retention_ms = self.service.settings.retention_seconds * 1000
        closed, after = 0, ""
        now = datetime.now(UTC)
        while due := await ledger.open_packets(due_before=now, after_id=after):
            for record in due:
                keys = store.keys(record.id)
                status, _, _ = await store.close_packet(keys, record.sender_id, retention_ms)
                if status == NOT_IN_REDIS and await self.service.ensure_loaded(record.id):
                    status, _, _ = await store.close_packet(keys, record.sender_id, retention_ms)
                closed += status == CLOSED_NOW
            after = due[-1].id
        self.closed += closed
        return closed

    async def run(self, stop: asyncio.Event) -> None:
        interval = self.service.settings.sweep_interval
        while not stop.is_set():
            try:
                await self.sweep_once()
            except StorageError as exc:
                log.warning("sweeper: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
